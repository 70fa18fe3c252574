"""The report's stages, each step a child process under its own time limit within one deadline.

Every step runs as `python -m tools.device_report.stage`, so a
step that crashes, runs out of memory or out of time ends alone: the runner
kills its process group at its limit (and when it ends, so that nothing it
started keeps the device), keeps what it had written (`Result`) and goes on
with the next. `<out>/<stage>.json` is written the moment each of
its steps ends; `<out>/log.txt` holds every step's output; `<out>/report.md`
comes last. Nothing here imports JAX.
"""

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

from tools.device_report import bundle, markdown
from tools.device_report.plan import SECOND_DEADLINE_SECONDS, STAGES, Plan, Step

RESERVE_SECONDS = 15.0  # kept back from the deadline: a stopped step's grace, then report.md
GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL
MIN_STEP_SECONDS = 3.0  # a step offered less is skipped
LOG_NAME, REPORT_NAME, PLAN_NAME = "log.txt", "report.md", "plan.json"
MAX_LOG_BYTES = 15 * 2**20


def write_json(path: pathlib.Path, record: dict) -> None:
  """Write `record` to `path` whole (a reader sees the old file or the new one)."""
  temporary = path.with_name(f".{path.name}.{os.getpid()}")
  temporary.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
  os.replace(temporary, path)


def step_file(work: pathlib.Path, step_name: str, suffix: str = ".json") -> pathlib.Path:
  """Where step `step_name` writes its result (or, with `suffix` '.log', its output) in `work`."""
  return work / f"{step_name.replace(':', '_')}{suffix}"


def read_json(path: pathlib.Path) -> dict | None:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None


def _status(code: int | None, timed_out: bool, result: dict | None) -> str:
  if result and result.get("not_applicable"):
    return "not applicable"
  if result and result.get("skipped"):
    return "skipped"
  if timed_out:
    return "timed out"
  if code:
    return f"failed (exit status {code})"
  if not result or not result.get("complete"):
    return "failed (no complete result)"
  return result.get("status", "ok")


class _Child:
  """One step's process: its whole process group is killed at `limit` seconds after its start;
  its output goes to `log_path`."""

  def __init__(self, command: list[str], env: dict, limit: float, log_path: pathlib.Path):
    self.limit, self.log_path = limit, log_path
    self.start = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
      self.process = subprocess.Popen(
        command,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=bundle.REPO,
      )

  def wait(self) -> tuple[int | None, bool]:
    """(exit status, timed out), once it has ended or been stopped; either way, then, whatever
    is left of its process group is killed."""
    try:
      code = self.process.wait(timeout=max(0.0, self.start + self.limit - time.monotonic()))
      timed_out = False
    except subprocess.TimeoutExpired:
      _signal_group(self.process.pid, signal.SIGTERM)
      try:
        self.process.wait(timeout=GRACE_SECONDS)
      except subprocess.TimeoutExpired:
        pass
      code, timed_out = None, True
    _signal_group(self.process.pid, signal.SIGKILL)
    self.process.wait()
    return code, timed_out

  def stop(self) -> None:
    _signal_group(self.process.pid, signal.SIGKILL)


class Stopped(Exception):
  """The report was told to stop (SIGTERM)."""


def _raise_stopped(signum, frame):
  del signum, frame
  raise Stopped()


def _signal_group(pid: int, signum: int) -> None:
  try:
    os.killpg(pid, signum)
  except ProcessLookupError:  # Already gone, with everything it started.
    pass


class Runner:
  """Runs the steps of a `Plan` into `out` before `deadline` (a time.monotonic() value)."""

  def __init__(
    self,
    plan: Plan,
    out: str,
    *,
    deadline: float,
    platform: str,
    stages=STAGES,
    bundle_record: dict | None = None,
    extra_path: str = "",
    target: str | None = None,
    multi30k: str = "",
    compilation_cache: str = "",
    earlier: str = "",
    repeat_flags: tuple[str, ...] = (),
  ):
    """`multi30k`: the directory holding Multi30k's data/task1 ('' for none); `compilation_cache`:
    the steps' persistent compilation cache ('' for none); `earlier`: the --out of an earlier
    call, whose records stand in for the steps this one does not run; `repeat_flags`: the flags
    of this call that a second one repeats (`second_call`)."""
    self.plan, self.deadline, self.platform = plan, deadline, platform
    self.multi30k, self.compilation_cache = multi30k, compilation_cache
    self.earlier, self.repeat_flags = earlier, tuple(repeat_flags)
    self.out = pathlib.Path(out).resolve()
    self.out.mkdir(parents=True, exist_ok=True)
    self.work = pathlib.Path(tempfile.mkdtemp(prefix="transformer_jax_report_"))
    write_json(self.work / PLAN_NAME, plan.to_json())
    # Stages or single steps ("speed:base_xla"). The environment always runs: the other steps
    # need its platform and device.
    self.selected = {"environment", *stages}
    self.bundle_record, self.target = bundle_record, target
    self.records: dict[str, dict] = {}
    self.env = dict(os.environ, PYTHONUNBUFFERED="1")
    self.env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(bundle.REPO), extra_path, os.environ.get("PYTHONPATH", "")) if p
    )
    self.stop_reason = ""
    self._live: set[_Child] = set()
    if earlier:
      self._take_earlier(pathlib.Path(earlier))

  def _take_earlier(self, earlier: pathlib.Path) -> None:
    """Each step record of the report in `earlier` that ended (ok, not applicable, or with what it
    is for brought back) and whose step this call does not run, written where this call's steps
    read what an earlier one wrote (`stage.Context.earlier`)."""
    for path in sorted(earlier.glob("*.json")):
      stage = read_json(path) or {}
      for part, record in (stage.get("steps") or {}).items():
        name = part if part == stage.get("stage") else f"{stage.get('stage')}:{part}"
        ran = record.get("status") in ("ok", "not applicable") or record.get("brought_back")
        if ran and name != "environment" and not self._selected(Step(name, "device", 0)):
          write_json(step_file(self.work, name), {**record, "from_earlier_call": str(earlier)})

  def _selected(self, step: Step) -> bool:
    return step.stage in self.selected or step.name in self.selected

  def _child_env(self, step: Step) -> dict:
    env = dict(self.env)
    if step.runs_on == "cpu" or self.platform == "cpu":
      env["JAX_PLATFORMS"] = "cpu"
    elif self.platform != "auto":
      env["JAX_PLATFORMS"] = self.platform
    return env

  def _result_path(self, step: Step) -> pathlib.Path:
    return step_file(self.work, step.name)

  def _start(self, step: Step, log_path: pathlib.Path) -> _Child | dict:
    """The process of `step`, started; or its record when there is no time (or reason) left."""
    left = self.deadline - time.monotonic() - RESERVE_SECONDS
    if self.stop_reason or left < MIN_STEP_SECONDS:
      reason = self.stop_reason or f"no time left under the deadline ({left:.0f} s)"
      return {"status": "skipped", "reason": reason, "seconds": 0.0, "limit_seconds": 0.0}
    limit = min(step.cap_seconds, left)
    command = [
      sys.executable,
      "-m",
      "tools.device_report.stage",
      "--step",
      step.name,
      "--work",
      str(self.work),
      "--result",
      str(self._result_path(step)),
      "--seconds",
      f"{limit:.1f}",
    ]
    if self.target:
      command += ["--target", self.target]
    command += ["--multi30k", self.multi30k, "--compilation_cache", self.compilation_cache]
    with open(log_path, "a", encoding="utf-8") as log:
      log.write(f"\n===== {step.name} (limit {limit:.0f} s) =====\n")
    child = _Child(command, self._child_env(step), limit, log_path)
    self._live.add(child)
    return child

  def _finish(self, step: Step, child: _Child | dict) -> dict:
    """The record of `step` once its process `child` has ended (or was stopped)."""
    if isinstance(child, dict):
      return child
    code, timed_out = child.wait()
    self._live.discard(child)
    result = read_json(self._result_path(step)) or {}
    record = {
      "status": _status(code, timed_out, result),
      # A background step may have ended well before it is collected.
      "seconds": round(result.get("process_seconds", time.monotonic() - child.start), 2),
      "limit_seconds": round(child.limit, 1),
      **{k: v for k, v in result.items() if k != "complete"},
    }
    if timed_out:
      record["reason"] = f"ran past its limit of {child.limit:.0f} s and was stopped"
    if child.log_path != self.out / LOG_NAME:  # A background step's own log, now appended.
      with open(self.out / LOG_NAME, "a", encoding="utf-8") as log:
        log.write(child.log_path.read_text(encoding="utf-8"))
    return record

  def run_step(self, step: Step) -> dict:
    """Run `step` to its end and return its record: status, seconds, limit and what it wrote."""
    return self._finish(step, self._start(step, self.out / LOG_NAME))

  def run(self) -> dict:
    """Every step of the selected stages, in order; then report.md. Returns the stage records.

    The steps that run on the CPU backend (the compile mode's) start in the
    background once the environment is known, beside the device's steps, and
    are collected in their turn. SIGTERM stops every step's process group and
    still writes report.md.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_stopped) if main else None
    try:
      self._run_steps()
    except Stopped:
      self.stop_reason = "the report was stopped (SIGTERM)"
    finally:
      for child in self._live:
        child.stop()
      if main:
        signal.signal(signal.SIGTERM, previous)
      self.finish()
    return self.records

  def _run_steps(self) -> None:
    background = {}
    for step in (s for s in self.plan.steps if self._selected(s)):
      if step.stage != "environment" and not self.records.keys() - {"environment"}:
        background = {
          s.name: self._start(s, step_file(self.work, s.name, ".log"))
          for s in self.plan.steps
          if s.runs_on == "cpu" and self._selected(s)
        }
      if step.name in background:
        record = self._finish(step, background.pop(step.name))
        if record["status"] != "skipped":
          record["ran_beside_other_steps"] = True
      else:
        record = self.run_step(step)
      stage = self.records.setdefault(step.stage, {"stage": step.stage, "steps": {}})
      stage["steps"][step.part or step.stage] = record
      stage["status"] = _stage_status(stage["steps"])
      if step.stage == "environment":
        self._after_environment(record)
      write_json(self.out / f"{step.stage}.json", stage)

  def _after_environment(self, record: dict) -> None:
    if self.bundle_record is not None:
      record["bundle"] = self.bundle_record
    backend = record.get("backend")
    if self.platform == "auto" and backend == "cpu" and self.plan.name == "full":
      self.stop_reason = (
        "JAX found no accelerator and runs on the CPU; the full report needs "
        "one (for a dry run on the CPU: --platform=cpu --tiny)"
      )
    if record.get("status") not in ("ok", "skipped") and not backend:
      self.stop_reason = "the environment stage failed: JAX may not start here (see log.txt)"
    if not self.target:
      self.target = target_for(record.get("device_kind", ""))

  def finish(self) -> None:
    """report.md from the records; log.txt cut to its last MAX_LOG_BYTES."""
    log = self.out / LOG_NAME
    if log.exists() and log.stat().st_size > MAX_LOG_BYTES:
      data = log.read_bytes()[-MAX_LOG_BYTES:]
      log.write_bytes(b"[... the beginning was cut ...]\n" + data)
    page = markdown.render(self.records, self.plan, self.missed(), self.second_call())
    (self.out / REPORT_NAME).write_text(page, encoding="utf-8")

  def missed(self) -> list[str]:
    """The steps of this call that did not end `ok` or `not applicable`, in the plan's order."""
    ended = {
      (stage if part == stage else f"{stage}:{part}"): step["status"]
      for stage, record in self.records.items()
      for part, step in record["steps"].items()
    }
    return [
      s.name
      for s in self.plan.steps
      if s.name in ended and ended[s.name] not in ("ok", "not applicable")
    ]

  def second_call(self) -> str:
    """The command of a second call that runs what this one missed (its output in another
    directory, this one's records beside it), or '' when nothing was missed. Left out: a step that
    brought back what it is for before it was stopped (`brought_back`: Multi30k's test BLEU), and
    the compile mode's step: a CPU step, it holds the device's steps when its turn comes while
    compiling anew what the first call compiled (`./launch.sh compile` runs it on any machine)."""
    kept = {
      f"{stage}:{part}" if part != stage else stage
      for stage, record in self.records.items()
      for part, step in record["steps"].items()
      if step.get("brought_back")
    }
    skip = {"environment", "prediction:compile", *kept}
    steps = [name for name in self.missed() if name not in skip]
    if not steps:
      return ""
    return " ".join(
      [
        "./launch.sh device-report",
        *map(shlex.quote, self.repeat_flags),
        "--out=<another dir>",
        f"--stages={','.join(steps)}",
        f"--deadline={SECOND_DEADLINE_SECONDS:.0f}",
        shlex.quote(f"--earlier={self.out}"),
      ]
    )


def _stage_status(steps: dict) -> str:
  statuses = {s["status"] for s in steps.values()}
  if statuses <= {"ok"}:
    return "ok"
  if statuses <= {"ok", "not applicable"}:
    return "ok" if "ok" in statuses else "not applicable"
  return "incomplete"


def target_for(device_kind: str) -> str:
  """The compile mode's one-GPU target for a device of `device_kind` (an H200 or else an H100)."""
  return "1xh200" if "h200" in device_kind.lower() else "1xh100"
