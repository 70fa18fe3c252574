"""The device report's `correctness:tests` step: its tests in several processes under
pytest-xdist or in one without, each test's outcome written once, and the tests a stopped run
never reached (or a dead worker took with it) named."""

import json
import pathlib
import signal
import subprocess
import time

import pytest

from tools.device_report import correctness, markdown, pytest_log

QUICK_TESTS = (
  "import json, os, pathlib, pytest\n\n"
  "@pytest.mark.parametrize('n', range(5))\ndef test_passes(n):\n"
  "  names = ('JAX_PLATFORMS', 'XLA_PYTHON_CLIENT_PREALLOCATE', 'XLA_PYTHON_CLIENT_MEM_FRACTION')\n"
  "  seen = {name: os.environ.get(name) for name in names}\n"
  "  pathlib.Path(__file__).with_name(f'env_{n}.json').write_text(json.dumps(seen))\n\n"
  "def test_fails():\n  assert 1 == 2, 'one is not two'\n"
)


def _lines(log: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _dead(pid: int) -> bool:
  try:
    status = pathlib.Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
  except FileNotFoundError:
    return True
  return "\nState:\tZ" in status  # Ended, not yet reaped by whoever took it over.


def _run(tests, seconds, test_timeout, platform="cpu", workers=2) -> dict:
  """`run_device_tests` over the generated file `tests`, its log beside it; the inner pytest's
  rootdir is the file's folder, so its ids do not depend on where the checkout is."""
  folder = tests.parent
  return correctness.run_device_tests(
    [str(tests), f"--rootdir={folder}"],
    seconds,
    folder / "log.jsonl",
    test_timeout,
    platform,
    workers=workers,
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "workers, platform, fraction", [(2, "gpu", "0.450"), (2, "cpu", None), (1, "cpu", None)]
)
def test_each_test_ends_once_with_or_without_xdist(tmp_path, workers, platform, fraction):
  tests = tmp_path / "test_quick.py"
  tests.write_text(QUICK_TESTS)  # Imports no JAX: runs on a machine without the platform too.
  log = tmp_path / "log.jsonl"
  record = _run(tests, 120, 60, platform, workers)
  assert record["workers"] == workers and record["memory_fraction"] == fraction
  for n in range(5):  # What each test's process saw.
    seen = json.loads((tmp_path / f"env_{n}.json").read_text())
    assert seen == {
      "JAX_PLATFORMS": {"gpu": "cuda"}.get(platform, platform),
      "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
      "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
    }
  assert (f"-n {workers}" in record["command"]) == (workers > 1)
  assert ("no:xdist" in record["command"]) == (workers == 1)
  assert record["status"] == "finished" and record["exit_status"] == 1
  assert record["collected"] == 6 and record["not_run"] == [] and record["not_run_count"] == 0
  assert record["counts"] == {"passed": 5, "failed": 1}
  assert [f["test"] for f in record["failures"]] == ["test_quick.py::test_fails"]
  assert "one is not two" in record["failures"][0]["message"]
  lines = _lines(log)
  collected = [line for line in lines if "collected" in line]
  assert len(collected) == 1 and len(collected[0]["ids"]) == 6
  ended = [line["nodeid"] for line in lines if "nodeid" in line]
  assert sorted(ended) == sorted(collected[0]["ids"])  # Each once, the workers writing none.


@pytest.mark.slow
def test_a_stopped_run_names_the_tests_that_did_not_run_and_leaves_no_worker(tmp_path):
  tests = tmp_path / "test_stopped.py"
  tests.write_text(  # Each test leaves its process's id; test_slow holds its worker past the end.
    "import os, pathlib, time, pytest\n\n"
    "@pytest.fixture(autouse=True)\n"
    "def pid(request):\n"
    "  name = f'pid_{request.node.name}'\n"
    "  pathlib.Path(__file__).with_name(name).write_text(str(os.getpid()))\n\n"
    "def test_quick():\n  pass\n\n"
    "def test_slow():\n  time.sleep(600)\n\n"
    "def test_after_1():\n  pass\n\n"
    "def test_after_2():\n  pass\n\n"
    "def test_after_3():\n  pass\n\n"
    "def test_after_4():\n  pass\n"
  )
  record = _run(tests, 12, 900)
  assert record["status"] == "stopped after 12 s" and record["exit_status"] is None
  assert correctness._tests_status(record) == "incomplete"
  assert record["collected"] == 6 and not record["failures"]
  # The tests queued behind test_slow on its worker (xdist keeps the next one there) never ran.
  assert "test_stopped.py::test_slow" in record["not_run"]
  assert record["not_run_count"] == len(record["not_run"]) == 6 - record["counts"]["passed"]
  pids = {int(path.read_text()) for path in tmp_path.glob("pid_*")}
  assert len(pids) == 2 and all(_dead(pid) for pid in pids)  # Both workers, ended with the run.


@pytest.mark.slow
def test_a_test_that_kills_its_worker_counts_as_failed(tmp_path):
  tests = tmp_path / "test_crash.py"
  tests.write_text(
    "import os\n\n"
    "def test_before():\n  pass\n\n"
    "def test_crashes():\n  os._exit(3)\n\n"
    "def test_after_1():\n  pass\n\n"
    "def test_after_2():\n  pass\n"
  )
  record = _run(tests, 120, 60)
  assert record["status"] == "finished" and record["exit_status"] == 1
  assert record["counts"] == {"passed": 3, "failed": 1} and record["not_run_count"] == 0
  (failure,) = record["failures"]
  assert failure["test"] == "test_crash.py::test_crashes" and "crashed" in failure["message"]
  assert correctness._tests_status(record) == "problems found"


def test_the_summary_names_the_collected_tests_that_never_ended(tmp_path, monkeypatch):
  monkeypatch.setattr(pytest_log, "NOT_RUN_LISTED", 3)
  log = tmp_path / "log.jsonl"
  ids = [f"t.py::test_{i}" for i in range(6)]
  lines = [
    {"collected": 6, "ids": ids},
    {"nodeid": ids[1], "outcome": "passed", "seconds": 0.1},
    {"collected": 6, "ids": ids[::-1]},  # A restarted worker's collection: the first counts.
    {"nodeid": ids[3], "outcome": "failed", "seconds": 0.1, "message": "no"},
  ]
  log.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"nodeid": "t.py::te')
  summary = pytest_log.summary(log)
  assert summary["collected"] == 6 and summary["counts"] == {"passed": 1, "failed": 1}
  assert summary["not_run"] == [ids[0], ids[2], ids[4]] and summary["not_run_count"] == 4
  assert pytest_log.summary(tmp_path / "none.jsonl")["not_run_count"] is None


def test_only_the_controller_writes_and_a_dead_workers_test_is_a_failure(tmp_path, monkeypatch):
  log = tmp_path / "log.jsonl"
  monkeypatch.setenv(pytest_log.ENV, str(log))
  monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)

  def report(when, outcome, longrepr=None):
    return pytest.TestReport("t.py::test", ("t.py", 0, "test"), {}, outcome, longrepr, when)

  crashed = "worker 'gw1' crashed while running 't.py::test'"
  for when, outcome, longrepr in [
    ("setup", "passed", None),
    ("call", "passed", None),
    ("teardown", "failed", "broken"),
    ("???", "failed", crashed),  # What xdist's controller reports for a test its worker died in.
  ]:
    pytest_log.pytest_runtest_logreport(report(when, outcome, longrepr))
  monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
  pytest_log.pytest_runtest_logreport(report("call", "failed", "in a worker"))
  outcomes = [(line["outcome"], line.get("message")) for line in _lines(log)]
  assert outcomes == [("passed", None), ("error", "broken"), ("failed", crashed)]


def test_the_workers_follow_the_cores():
  assert [correctness.device_test_workers(n) for n in (1, 2, 3, 6, 16, 64)] == [1, 1, 1, 3, 8, 8]


def test_the_report_names_the_tests_that_did_not_run():
  not_run = [f"tests/test_search.py::test_{i}" for i in range(25)]
  tests = {
    "status": "stopped after 118 s",
    "workers": 8,
    "collected": 40,
    "counts": {"passed": 14, "failed": 1},
    "failures": [{"test": "tests/test_loss.py::test_x", "message": "no"}],
    "not_run": not_run,
    "not_run_count": 25,
  }
  lines = markdown._correctness({"correctness": {"steps": {"tests": {"device_tests": tests}}}})
  text = "\n".join(lines)
  assert "1 failed, 14 passed of 40 collected (stopped after 118 s), in 8 processes." in text
  assert "- failed: `tests/test_loss.py::test_x`" in text
  assert [line for line in lines if "did not run" in line][-2:] == [
    "- did not run: `tests/test_search.py::test_19`",
    "- and 5 more that did not run",
  ]
  assert "test_20" not in text and text.count("did not run: ") == 20


def test_ending_the_run_ends_every_process_of_its_group():
  shell = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60"], start_new_session=True)
  deadline = time.monotonic() + 10
  while not correctness._running_in_group(shell.pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert correctness._running_in_group(shell.pid)
  correctness._end_group(shell)
  assert shell.returncode == -signal.SIGKILL
  assert not correctness._running_in_group(shell.pid)  # The background sleep too.
