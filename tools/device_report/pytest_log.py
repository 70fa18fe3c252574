"""A pytest plugin that appends each test's outcome to the file named by $TJ_REPORT_PYTEST_LOG
as it ends, one JSON line each, so that a run stopped at its time limit still says what ran
and what did not (`pytest -p tools.device_report.pytest_log`).

Under pytest-xdist only the controller writes: it collects nothing itself but hears each worker's
collection (`pytest_xdist_node_collection_finished`) and every worker's reports; the workers,
which load the plugin too, write nothing."""

import json
import os
import pathlib

import pytest

ENV = "TJ_REPORT_PYTEST_LOG"
NOT_RUN_LISTED = 200  # The tests that did not run, by name, at most; their count is whole.

_collection_written = False


def _worker() -> bool:
  return "PYTEST_XDIST_WORKER" in os.environ


def _append(entry: dict) -> None:
  path = os.environ.get(ENV)
  if path:
    with open(path, "a", encoding="utf-8") as file:
      file.write(json.dumps(entry) + "\n")


def _collected(ids) -> None:
  """The collected tests' ids, once (xdist's restarted workers collect again)."""
  global _collection_written  # pylint: disable=global-statement
  if not _collection_written:
    _collection_written = True
    _append({"collected": len(ids), "ids": list(ids)})


def pytest_collection_finish(session):
  if not _worker():  # Without xdist; an xdist controller does not collect.
    _collected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown, and never called, without it.
def pytest_xdist_node_collection_finished(node, ids):  # pylint: disable=unused-argument
  _collected(ids)  # Every worker collects the same tests (xdist aborts otherwise).


def pytest_runtest_logreport(report):
  """One line per test: its outcome (an error in set-up or tear-down counts as `error`; a test
  its xdist worker died running comes as a `failed` report of its own, `when` "???")."""
  if _worker() or report.when != "call" and report.outcome == "passed":
    return
  failed_around = report.when in ("setup", "teardown") and report.failed
  entry = {
    "nodeid": report.nodeid,
    "outcome": "error" if failed_around else report.outcome,
    "seconds": round(report.duration, 3),
  }
  if report.failed:
    entry["message"] = str(report.longrepr)[-1500:]
  _append(entry)


def summary(path: pathlib.Path) -> dict:
  """Counts by outcome, the tests collected, the failures and the tests collected that never
  ended (`not_run`: stopped by the time limit; the first NOT_RUN_LISTED, and their count), from
  the file this plugin wrote (a line cut short by a stopped run is left out)."""
  counts, failures, collected, ids, ended = {}, [], None, None, set()
  lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
  for line in lines:
    try:
      entry = json.loads(line)
    except ValueError:
      continue
    if "collected" in entry:
      if collected is None:
        collected, ids = entry["collected"], entry.get("ids")
      continue
    ended.add(entry["nodeid"])
    counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    if entry["outcome"] in ("failed", "error"):
      failures.append({"test": entry["nodeid"], "message": entry.get("message", "")})
  not_run = [i for i in ids if i not in ended] if ids is not None else []
  return {
    "collected": collected,
    "counts": counts,
    "failures": failures[:50],
    "not_run": not_run[:NOT_RUN_LISTED],
    "not_run_count": None if ids is None else len(not_run),
  }
