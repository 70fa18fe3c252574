"""Reading a checkpoint on every process of a run: all of them use it, or none does.

Each process reads its own shards and data position; `agree` is the one
point where they compare how that went, so that all go on with the same
checkpoint or all skip it, and all run the same collectives after.
"""

import asyncio
import contextlib
import warnings

import jax

from transformer_jax.checkpoints import integrity
from transformer_jax.errors import UserError, first_line


class CorruptCheckpointError(UserError):
  """A checkpoint step that cannot be read back as it was written."""


class CheckpointMismatchError(UserError):
  """A checkpoint holds arrays of other names or shapes than the run expects."""


_READ, _BROKEN, _MISMATCHED = range(3)  # How a read went, for `agree`.


def agree(path, local_error: UserError | None) -> None:
  """Raise on every process when the read of the checkpoint at `path` failed on any. Each process
  read its own shards and data position and says how that went (`local_error`); every process
  calls this at the same point, so all go on, or all skip the checkpoint, and all run the same
  collectives after."""
  code = (
    _READ
    if local_error is None
    else _MISMATCHED
    if isinstance(local_error, CheckpointMismatchError)
    else _BROKEN
  )
  codes = integrity.gather_codes(code)
  failed = [process for process, other in enumerate(codes) if other != _READ]
  if failed:
    kind = CheckpointMismatchError if _MISMATCHED in codes else CorruptCheckpointError
    raise kind(
      str(local_error)
      if local_error is not None
      else (
        f"checkpoint {path} cannot be read on process {', '.join(map(str, failed))} (see its "
        "log), so no process uses it"
      )
    )


class _FinishingLoop(asyncio.SelectorEventLoop):
  """An event loop that, closed with tasks still pending, cancels them and waits for them."""

  def close(self):
    if not self.is_closed() and not self.is_running():
      pending = [task for task in asyncio.all_tasks(self) if not task.done()]
      for task in pending:
        task.cancel()
      if pending:
        self.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    super().close()


class _FinishingPolicy(asyncio.DefaultEventLoopPolicy):
  def new_event_loop(self):
    return _FinishingLoop()


@contextlib.contextmanager
def _reads_that_finish():
  """Orbax runs a read in an event loop of its own and closes it as soon as one array fails,
  leaving the other arrays' reads pending: they end later as "Exception ignored" noise. Within
  this block, its event loops cancel and wait for them before they close."""
  with warnings.catch_warnings():  # Python 3.14 deprecates event loop policies.
    warnings.simplefilter("ignore", DeprecationWarning)
    previous = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_FinishingPolicy())
  try:
    yield
  finally:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      asyncio.set_event_loop_policy(previous)


def storage_failure(action, passes: tuple[type[Exception], ...] = ()):
  """`(action(), None)`, or `(None, error)` for whatever the storage raised. A failed computation
  or collective (`JaxRuntimeError`: another process is gone, and the command line ends this one)
  and the errors in `passes` propagate."""
  try:
    return action(), None
  except (jax.errors.JaxRuntimeError, *passes):
    raise
  except Exception as error:  # pylint: disable=broad-except  # Whatever the storage raised.
    return None, error


def verified_read(path, read, what: str):
  """`read()`'s `(tree, extra)` once every process has read its part (`agree`) and `tree`
  matches the fingerprint `read()` found for it: `read()` returns `(fingerprint, tree, extra)`.
  CorruptCheckpointError naming `what` when the two differ."""
  with _reads_that_finish():
    result, error = storage_failure(read)
  if error is not None and not isinstance(error, UserError):  # The files do not read back.
    error = CorruptCheckpointError(f"checkpoint {path} cannot be read: {first_line(error)}")
  agree(path, error)
  expected, tree, extra = result
  if integrity.tree_fingerprint(tree) != expected:  # The same on every process.
    raise CorruptCheckpointError(
      f"checkpoint {path}: the {what} read back differ from those saved (fingerprint mismatch)"
    )
  return tree, extra
