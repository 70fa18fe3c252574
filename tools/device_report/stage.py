"""One step of the device report, in its own process (the runner starts it):

    python -m tools.device_report.stage --step=speed:base --work=DIR \
        --result=FILE --seconds=60 [--multi30k=DIR] [--compilation_cache=DIR]

The plan is the runner's, read from DIR/plan.json.

Each step writes its figures to FILE as it gets them (`Result`), so a step
stopped at its limit leaves the ones it had; `complete` marks a step that ran
to its end.
"""

import argparse
import dataclasses
import importlib
import logging
import os
import pathlib
import sys
import time
import traceback

from tools.device_report.plan import Plan
from tools.device_report.runner import PLAN_NAME, read_json, step_file, write_json


@dataclasses.dataclass
class Result:
  """A step's JSON record, written whole at every `put`; `until` is its time.monotonic() end."""

  path: pathlib.Path
  until: float
  record: dict = dataclasses.field(default_factory=dict)

  def put(self, **fields) -> None:
    self.record.update(fields)
    write_json(self.path, self.record)

  def left(self) -> float:
    """Seconds left before the step's limit."""
    return self.until - time.monotonic()

  def not_applicable(self, reason: str) -> None:
    self.put(not_applicable=reason, complete=True)


# The module of each step, or else of its stage; its `run(plan, step, result, context)` runs it.
_MODULES = {
  "environment": "environment",
  "correctness": "correctness",
  "speed": "speed",
  "prediction": "prediction",
  "prediction:largest": "largest",
  "decoding": "decoding",
  "end_to_end": "end_to_end",
  "multi30k": "multi30k",
}


@dataclasses.dataclass(frozen=True)
class Context:
  """What a step knows beyond its plan: the runner's work directory, the compile target, the
  Multi30k copy ('' for none), the compilation cache's directory ('' for none) and the
  time.monotonic() of the step process's start."""

  work: pathlib.Path
  target: str
  multi30k: str = ""
  compilation_cache: str = ""
  started: float = 0.0

  def earlier(self, step: str) -> dict:
    """What an earlier step of this report wrote (empty if it wrote nothing)."""
    return read_json(step_file(self.work, step)) or {}


def _keep_to_a_quarter_of_the_cores() -> None:
  """On a machine of 8 cores or more, run on the last quarter of them (XLA sizes its thread pools
  by them), leaving the rest to the device's steps, which run beside this one."""
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) >= 8:
    os.sched_setaffinity(0, cores[-(len(cores) // 4) :])


def main(argv: list[str]) -> int:
  started = time.monotonic()
  parser = argparse.ArgumentParser(prog="tools.device_report.stage")
  parser.add_argument("--step", required=True)
  parser.add_argument("--work", required=True)
  parser.add_argument("--result", required=True)
  parser.add_argument("--seconds", type=float, required=True)
  parser.add_argument("--target", default="1xh100")
  parser.add_argument("--multi30k", default="")
  parser.add_argument("--compilation_cache", default="")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("orbax", "grain", "absl", "jax", "asyncio"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  plan = Plan.from_json(read_json(pathlib.Path(args.work) / PLAN_NAME))
  step = plan.step(args.step)
  if step.runs_on == "cpu":
    _keep_to_a_quarter_of_the_cores()
  result = Result(pathlib.Path(args.result), time.monotonic() + args.seconds - 1.0)
  result.put(step=step.name)
  try:  # The import too: it fails where a package is missing.
    module = importlib.import_module(
      f"tools.device_report.{_MODULES.get(step.name, _MODULES[step.stage])}"
    )
    context = Context(
      pathlib.Path(args.work), args.target, args.multi30k, args.compilation_cache, started
    )
    module.run(plan, step, result, context)
  except Exception as error:  # pylint: disable=broad-except  # Recorded, then the status says so.
    result.put(
      error=f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
      traceback=traceback.format_exc()[-4000:],
      process_seconds=time.monotonic() - started,
    )
    traceback.print_exc()
    return 1
  result.put(process_seconds=time.monotonic() - started, complete=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
