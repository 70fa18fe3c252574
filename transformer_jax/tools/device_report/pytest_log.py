"""A pytest plugin that appends each test's outcome to the file named by $TJ_REPORT_PYTEST_LOG
as it ends, one JSON line each, so that a run stopped at its time limit still says what ran
(`pytest -p transformer_jax.tools.device_report.pytest_log`)."""

import json
import os

_ENV = "TJ_REPORT_PYTEST_LOG"


def _append(entry: dict) -> None:
  path = os.environ.get(_ENV)
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
