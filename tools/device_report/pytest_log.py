"""A pytest plugin that appends each test's outcome to the file named by $TJ_REPORT_PYTEST_LOG
as it ends, one JSON line each, so that a run stopped at its time limit still says what ran
(`pytest -p tools.device_report.pytest_log`)."""

import json
import os
import pathlib

ENV = "TJ_REPORT_PYTEST_LOG"


def _append(entry: dict) -> None:
  path = os.environ.get(ENV)
  if path:
    with open(path, "a", encoding="utf-8") as file:
      file.write(json.dumps(entry) + "\n")


def pytest_collection_finish(session):
  _append({"collected": len(session.items)})


def pytest_runtest_logreport(report):
  """One line per test: its outcome (an error in set-up or tear-down counts as `error`)."""
  if report.when == "call" or report.outcome != "passed" and report.when in ("setup", "teardown"):
    outcome = report.outcome if report.when == "call" or report.skipped else "error"
    entry = {"nodeid": report.nodeid, "outcome": outcome, "seconds": round(report.duration, 3)}
    if report.failed:
      entry["message"] = str(report.longrepr)[-1500:]
    _append(entry)


def summary(path: pathlib.Path) -> dict:
  """Counts by outcome, the tests collected and the failures, from the file this plugin wrote (a
  line cut short by a stopped run is left out)."""
  counts, failures, collected = {}, [], None
  lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
  for line in lines:
    try:
      entry = json.loads(line)
    except ValueError:
      continue
    if "collected" in entry:
      collected = entry["collected"]
      continue
    counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    if entry["outcome"] in ("failed", "error"):
      failures.append({"test": entry["nodeid"], "message": entry.get("message", "")})
  return {"collected": collected, "counts": counts, "failures": failures[:50]}
