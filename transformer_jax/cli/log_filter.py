"""What the command line logs of the libraries it runs: their warnings, not their chatter."""

import logging as std_logging
import os
import sys

from absl import logging

_QUIET_PACKAGES = ("orbax", "grain", "asyncio")
_QUIET_FILES = (os.path.join("jax", "_src", "xla_bridge.py"),)  # "Unable to initialize backend"
# gcsfs warns at every request where it cannot look up a bucket's type (a server without Google's
# storage-control API, or no permission to ask it): thousands of lines in a run.
_ONCE_PACKAGES = ("gcsfs",)  # Its errors show every time.
_MAX_SHOWN = 1000


class LibraryLogFilter(std_logging.Filter):
  """Drops INFO and below from Orbax and Grain, which log every checkpoint file they touch, and
  JAX's probe of backends that are not there; shows each warning of gcsfs once.

  Below verbosity 1 it also drops the tracebacks that Orbax and asyncio attach
  to the errors of a failed background checkpoint write (their message
  stays); `recovery.CheckpointWriter` reports the failure itself.
  """

  def __init__(self):
    super().__init__()
    self._shown: set[str] = set()

  def filter(self, record):
    if record.levelno < std_logging.ERROR and any(
      f"{os.sep}{package}{os.sep}" in record.pathname for package in _ONCE_PACKAGES
    ):
      message = record.getMessage()
      if message in self._shown:
        return False
      if len(self._shown) < _MAX_SHOWN:  # Beyond it, repeats show again rather than grow it.
        self._shown.add(message)
    quiet = any(
      f"{os.sep}{package}{os.sep}" in record.pathname for package in _QUIET_PACKAGES
    ) or record.pathname.endswith(_QUIET_FILES)
    if not quiet:
      return True
    if record.levelno < std_logging.WARNING:
      return False
    if logging.get_verbosity() < 1:
      record.exc_info, record.exc_text = None, None
    return True


def unraisable_at_verbosity_1(unraisable) -> None:
  """Show the errors that Python can only report, not raise, at `--verbosity=1` only: here they
  come from the background reads of a broken checkpoint file, still completing after the read
  failed (and was reported) when the program ends."""
  if logging.get_verbosity() >= 1:
    sys.__unraisablehook__(unraisable)


def install() -> None:
  """Filter absl's log handler and Python's unraisable-error hook as above."""
  logging.get_absl_handler().addFilter(LibraryLogFilter())
  sys.unraisablehook = unraisable_at_verbosity_1
