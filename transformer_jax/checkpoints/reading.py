"""Reading a checkpoint on every process of a run: all of them use it, or none does.

Each process reads its own shards and data position; `agree` is the one
point where they compare how that went, so that all go on with the same
checkpoint or all skip it, and all run the same collectives after.
"""

import asyncio
import logging

import jax

from transformer_jax.checkpoints import integrity
from transformer_jax.errors import UserError, first_line


class CorruptCheckpointError(UserError):
  """A checkpoint step that cannot be read back as it was written."""


class CheckpointMismatchError(UserError):
  """A checkpoint holds arrays of other names or shapes than the run expects."""


log = logging.getLogger(__name__)

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


def reads_that_finish(handler):
  """`handler` (an Orbax StandardCheckpointHandler or PyTreeCheckpointHandler), whose array
  reads all end before a failed read returns. Orbax reads the arrays of a tree side by side in
  an event loop of its own and closes that loop as soon as one of them fails, leaving the
  others pending: they end later as "Exception ignored" noise (a TensorStore read that
  completes into the closed loop, a read dropped unfinished). This cancels and awaits them
  while the loop still runs. It changes this handler alone: no event loop policy, nothing
  else of the process."""
  impl = handler
  for name in ("_impl", "_handler_impl"):  # Standard -> PyTree -> base handler (Orbax 0.12).
    impl = getattr(impl, name, impl)
  engine = getattr(impl, "_async_io_engine", None)  # What runs the reads of the arrays.
  execute_restore = getattr(engine, "execute_restore", None)
  if execute_restore is None:  # Another Orbax: its reads are left as they are.
    log.warning(
      "%s has no array reads where Orbax 0.12 has them: a failed read may leave others "
      "pending, which end as 'Exception ignored' noise",
      type(handler).__name__,
    )
    return handler

  async def execute_restore_to_the_end(*args, **kwargs):
    before = asyncio.all_tasks()
    try:
      return await execute_restore(*args, **kwargs)
    except BaseException:
      started = [task for task in asyncio.all_tasks() - before if not task.done()]
      for task in started:
        task.cancel()
      await asyncio.gather(*started, return_exceptions=True)
      raise

  engine.execute_restore = execute_restore_to_the_end
  return handler


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
