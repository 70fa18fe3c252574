"""The device report's command line (docs/gpu.md):

./launch.sh device-report --out=DIR [--deadline=375] [--bundle=DIR] [--multi30k=DIR]
./launch.sh device-report --out=DIR2 --stages=... --deadline=355 --earlier=DIR  # what DIR missed
python -m tools.device_report --out=DIR --platform=cpu --tiny   # dry run
"""

import os
import pathlib
import sys
import time

from absl import app, flags

from tools.device_report import bundle, bundle_data
from tools.device_report.plan import DEADLINE_SECONDS, PLANS, STAGES
from tools.device_report.runner import Runner

_OUT = flags.DEFINE_string(
  "out", None, "Where the stages' JSON files, log.txt and report.md go (at most 9 files)."
)
_DEADLINE = flags.DEFINE_float(
  "deadline",
  DEADLINE_SECONDS,
  "Seconds for the whole report; each step gets at most its own cap and what is left of this.",
  lower_bound=10.0,
)
_PLATFORM = flags.DEFINE_enum(
  "platform",
  "auto",
  ["auto", "cpu", "cuda", "gpu", "tpu"],
  "JAX_PLATFORMS of the steps; auto: what JAX picks (the full report stops if that is the CPU).",
)
_TINY = flags.DEFINE_bool(
  "tiny",
  False,
  "Tiny shapes and a few tests: a dry run of every stage (with --platform=cpu, about a minute).",
)
_BUNDLE = flags.DEFINE_string(
  "bundle",
  None,
  "A directory made by ./launch.sh device-bundle: "
  "its wheels are installed offline into --bundle_target first.",
)
_BUNDLE_TARGET = flags.DEFINE_string(
  "bundle_target",
  "/tmp/transformer_jax_bundle",
  "The private directory the bundle is installed into.",
)
_STAGES = flags.DEFINE_list(
  "stages",
  list(STAGES),
  f"The stages to run, of: {', '.join(STAGES)}; or single steps, as in speed:base_xla (a "
  "second try runs what the first missed).",
)
_MULTI30K = flags.DEFINE_string(
  "multi30k",
  None,
  "The directory holding Multi30k's data/task1 (its tok files) for the multi30k stage; default "
  "<--bundle>/multi30k where the bundle carries it.",
)
_COMPILATION_CACHE = flags.DEFINE_string(
  "compilation_cache",
  "/tmp/transformer_jax_report_cache",
  "The persistent XLA compilation cache of the end_to_end and multi30k stages, kept for a "
  "second call on the same machine (made for this user alone); '' for none.",
)
_EARLIER = flags.DEFINE_string(
  "earlier",
  None,
  "The --out of an earlier call on this machine: its records stand in for the steps this call "
  "does not run (prediction:largest reads speed:base and prediction:compile from them).",
)
_TARGET = flags.DEFINE_string(
  "target",
  None,
  "The compile mode's target for the prediction (default: 1xh200 on an H200, else 1xh100).",
)


_STEP_NAMES = {s.name for plan in PLANS.values() for s in plan.steps}


@flags.validator(
  "stages",
  message=f"--stages takes some of the stages {', '.join(STAGES)} or of the steps "
  f"{', '.join(sorted(_STEP_NAMES - set(STAGES)))}",
)
def _known_stages(stages):
  return bool(stages) and set(stages) <= set(STAGES) | _STEP_NAMES


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  deadline = time.monotonic() + _DEADLINE.value
  record, extra_path = None, ""
  if _BUNDLE.value:
    try:
      record = bundle.install(_BUNDLE.value, _BUNDLE_TARGET.value)
    except bundle.BundleError as error:
      sys.exit(f"error: {error}")
    ours = [(r, "transformer-jax") for r in bundle.project_requirements()]
    record["unmet"] = bundle.unmet(
      ours + bundle.bundled_requirements([_BUNDLE_TARGET.value]), [_BUNDLE_TARGET.value]
    )
    extra_path = _BUNDLE_TARGET.value
    if changed := bundle_data.changed(_BUNDLE.value, record.get("data", [])):
      sys.exit(
        f"error: {', '.join(changed)} in {_BUNDLE.value} differ from its {bundle.LIST_NAME} "
        "(a copy cut short?): copy the bundle again"
      )
    print(
      f"installed {len(record['wheels'])} wheels into {record['target']} in "
      f"{record['seconds']:.1f} s (already here: "
      f"{', '.join(record['skipped']) or 'none'})",
      flush=True,
    )
  platform = {"gpu": "cuda"}.get(_PLATFORM.value, _PLATFORM.value)
  multi30k = _MULTI30K.value
  if multi30k is None and _BUNDLE.value and os.path.isdir(os.path.join(_BUNDLE.value, "multi30k")):
    multi30k = os.path.join(_BUNDLE.value, "multi30k")
  if multi30k and (lacking := bundle_data.missing_multi30k(multi30k)):
    sys.exit(f"error: --multi30k={multi30k} lacks {', '.join(lacking)}")
  if not multi30k and not _TINY.value and "multi30k" in _STAGES.value:
    print(
      "warning: no Multi30k text (--multi30k, or a bundle made with --multi30k): the multi30k "
      "stage will say not applicable",
      flush=True,
    )
  if _EARLIER.value and not any(pathlib.Path(_EARLIER.value).glob("*.json")):
    sys.exit(f"error: --earlier={_EARLIER.value} holds no report's files (its *.json)")
  runner = Runner(
    PLANS["tiny" if _TINY.value else "full"],
    _OUT.value,
    deadline=deadline,
    platform=platform,
    stages=_STAGES.value,
    bundle_record=record,
    extra_path=extra_path,
    target=_TARGET.value,
    multi30k=os.path.abspath(multi30k) if multi30k else "",
    compilation_cache=_COMPILATION_CACHE.value,
    earlier=_EARLIER.value or "",
    repeat_flags=_repeated_flags(),
  )
  records = runner.run()
  failed = 0
  for stage, stage_record in records.items():
    for part, step in stage_record["steps"].items():
      name = stage if part == stage else f"{stage}:{part}"
      print(f"{name:<22} {step['status']:<28} {step['seconds']:6.1f} s", flush=True)
      failed += step["status"] not in ("ok", "not applicable")
  missed, second = runner.missed(), runner.second_call()
  if missed:
    print(f"did not end ok: {', '.join(missed)}")
  if second:
    print(f"a second call: {second}")
  print(f"report: {runner.out / 'report.md'}")
  return 1 if failed else 0


def _repeated_flags() -> list[str]:
  """The flags of this call, other than its output, stages, deadline and earlier call, that a
  second call repeats."""
  repeated = [f"--bundle={_BUNDLE.value}"] if _BUNDLE.value else []
  for flag in (_BUNDLE_TARGET, _PLATFORM, _TINY, _MULTI30K, _COMPILATION_CACHE, _TARGET):
    if flag.present:
      value = flag.value
      repeated.append(f"--{flag.name}" if value is True else f"--{flag.name}={value}")
  return repeated


if __name__ == "__main__":
  flags.mark_flag_as_required("out")
  app.run(main)
