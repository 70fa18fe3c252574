"""What the command line shows of the libraries' logs (`cli.log_filter`)."""

import logging
import os

from transformer_jax.cli import log_filter


def _record(package: str, level: int, message: str) -> logging.LogRecord:
  path = os.path.join(os.sep, "site-packages", package, "module.py")
  return logging.LogRecord(package, level, path, 1, message, None, None)


def test_orbax_chatter_is_dropped_and_its_warnings_kept():
  shown = log_filter.LibraryLogFilter()
  assert not shown.filter(_record("orbax", logging.INFO, "wrote a file"))
  assert shown.filter(_record("orbax", logging.WARNING, "a warning"))
  assert shown.filter(_record("transformer_jax", logging.INFO, "step 1"))


def test_a_gcsfs_message_is_shown_once():
  shown = log_filter.LibraryLogFilter()
  repeated = "Could not determine bucket type for bucket name b: no credentials"
  assert shown.filter(_record("gcsfs", logging.WARNING, repeated))
  assert not shown.filter(_record("gcsfs", logging.WARNING, repeated))
  assert shown.filter(_record("gcsfs", logging.WARNING, repeated.replace(" b:", " c:")))
  assert shown.filter(_record("transformer_jax", logging.WARNING, repeated))
  assert shown.filter(_record("transformer_jax", logging.WARNING, repeated))
