"""What a run does when its checkpoints are broken or cannot be written.

Resuming (`resume`): leftovers of interrupted writes (on a file system,
Orbax's `<step>.orbax-checkpoint-tmp*` directories, renamed to `<step>` at
commit; in a gs:// bucket, `<step>` directories without Orbax's commit
marker, written last) are reported and removed; committed steps are tried
newest first, each restored and checked against its fingerprints; a step
that fails is reported and skipped, and once a good one is found the bad ones
are moved aside to `<step>.unusable-<time>` for inspection. When no step is
good the run stops, unless asked to start over.

Saving (`CheckpointWriter`): a save that fails (full disk, read-only or vanished
directory) is reported naming the step and directory; its partial files are
removed, the earlier checkpoints stay as they were, and the run stops or goes
on as configured. Old steps are deleted only after a newer one is committed,
and so that a kill midway leaves a partial write, never a half-deleted step.
"""

import datetime
import errno
import logging
import os
import time

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from transformer_jax import fileio
from transformer_jax.checkpoints import integrity, reading, store
from transformer_jax.errors import UserError, first_line

log = logging.getLogger(__name__)

PARTIAL_MARK = ".orbax-checkpoint-tmp"
UNUSABLE_MARK = ".unusable-"


class UnusableCheckpointsError(UserError):
  """Checkpoints exist but none of them can be restored."""


class CheckpointSaveError(UserError):
  """A checkpoint could not be written."""


def _on_main_process(fn):
  """Run `fn()` on process 0 only; every process waits for it."""
  if jax.process_index() == 0:
    fn()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"recovery:{fn.__name__}")


def uncommitted(directory, name: str) -> bool:
  """Whether `name` in the checkpoint `directory` is a write that was never committed."""
  if PARTIAL_MARK in name:
    return True
  return (
    str(directory).startswith("gs://")  # Where Orbax commits with its marker, not a rename.
    and name.isdigit()
    and not (epath.Path(directory) / name / store.COMMIT_MARKER).exists()
  )


def remove_partial_writes(directory, step: int | None = None) -> list[str]:
  """Delete the uncommitted writes in `directory` (of `step` only, if given); return their paths."""
  try:
    names = [p.name for p in epath.Path(directory).iterdir()]
  except OSError:  # Missing, or not a directory: nothing to remove.
    return []
  found = sorted(
    os.path.join(directory, name)
    for name in names
    if (step is None or name.split(".", 1)[0] == str(step)) and uncommitted(directory, name)
  )

  def remove():
    for path in found:
      try:
        epath.Path(path).rmtree()
      except OSError as error:
        log.warning("could not remove the partial checkpoint %s: %s", path, error)

  _on_main_process(remove)
  return found


def _quarantine(manager: ocp.CheckpointManager, steps) -> list[str]:
  """Rename the step directories of `steps` to `<step>.unusable-<UTC time>`; return new paths."""
  stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
  moves = [
    (manager.directory / str(s), manager.directory / f"{s}{UNUSABLE_MARK}{stamp}") for s in steps
  ]

  def move():
    for source, target in moves:
      source.rename(target)

  _on_main_process(move)
  manager.reload()
  return [str(target) for _, target in moves]


def delete_steps(manager: ocp.CheckpointManager, steps) -> None:
  """Delete committed `steps`, each first renamed to an uncommitted name.

  A run killed meanwhile leaves a partial write (which the next run removes),
  never a half-deleted step that looks committed. Failures are logged only.
  """

  def delete():
    for step in steps:
      doomed = manager.directory / f"{step}{PARTIAL_MARK}-deleting"
      try:
        (manager.directory / str(step)).rename(doomed)
        doomed.rmtree()
      except OSError as error:
        log.warning(
          "could not delete the old checkpoint %s: %s", manager.directory / str(step), error
        )

  if steps:
    _on_main_process(delete)
    manager.reload()


def resume(
  manager: ocp.CheckpointManager, abstract_state, data_iterator=None, *, start_over: bool = False
):
  """The newest checkpointed state that restores and verifies, or None when there is none to resume.

  `data_iterator` is moved to that checkpoint's data position (and left at
  its initial position when None is returned). Raises UnusableCheckpointsError
  when steps exist but none is good, unless `start_over`: then they are moved
  aside and None is returned. Raises `store.CheckpointMismatchError` when a
  step's arrays do not fit `abstract_state` (a changed config, not a broken
  file).
  """
  for path in remove_partial_writes(manager.directory):
    log.warning("removed %s, left by a checkpoint write (or deletion) that was interrupted", path)
  manager.reload()
  steps = sorted(integrity.process_zero_steps(manager.all_steps()), reverse=True)
  if not steps:
    return None
  bad = []
  for step in steps:
    state, error = reading.storage_failure(
      lambda step=step: store.restore(manager, abstract_state, data_iterator, step=step),
      passes=(store.CheckpointMismatchError,),
    )  # A changed config, not a broken file.
    if error is not None:  # Any failure to read it back makes the step unusable.
      log.warning(
        "checkpoint %s is unusable, skipping it: %s",
        manager.directory / str(step),
        first_line(error),
      )
      bad.append(step)
      continue
    if bad:
      moved = _quarantine(manager, bad)
      log.warning(
        "resuming from step %d, the newest good checkpoint; the unusable ones were moved aside: %s",
        step,
        ", ".join(moved),
      )
    return state
  if not start_over:
    raise UnusableCheckpointsError(
      f"none of the {len(steps)} checkpoints in {manager.directory} (steps "
      f"{', '.join(map(str, sorted(steps)))}) can be restored; see the warnings above. Move "
      "them away or fix them, or start over (start_over) to move them aside and train from "
      "step 0"
    )
  moved = _quarantine(manager, steps)
  log.warning(
    "starting over from step 0 (start_over); the unusable checkpoints were moved aside: %s",
    ", ".join(moved),
  )
  return None


def _check_writable(directory) -> None:
  """Raise OSError unless the local `directory` is a directory this process may write in.

  Orbax waits 5 minutes before it reports a step directory it could not
  create; this check reports a vanished, replaced or read-only directory at once.
  """
  path = str(directory)
  if fileio.is_url(path):
    return
  if not os.path.isdir(path):
    raise NotADirectoryError(
      errno.ENOTDIR, "the checkpoint directory is gone or not a directory", path
    )
  if not os.access(path, os.W_OK):
    raise PermissionError(errno.EACCES, "the checkpoint directory is not writable", path)


class CheckpointWriter:
  """Saves checkpoints (`store.save`) and deals with saves that fail.

  A save is asynchronous: its failure shows when the next save starts or in
  `finish`. On a failure the partial files of that step are removed and the
  error is logged with the step, the directory and the latest good step; then
  with `on_error='stop'` CheckpointSaveError is raised, and with 'continue'
  training goes on and the next checkpoint step tries again. `finish` raises
  CheckpointSaveError if the last save failed, whatever `on_error` says, so a
  run never ends without its final checkpoint unnoticed. Once a save is
  committed, the steps before the newest `keep` (0: none) are deleted
  (`delete_steps`); a failed save deletes nothing.
  """

  def __init__(self, manager: ocp.CheckpointManager, *, on_error: str = "stop", keep: int = 0):
    if on_error not in ("stop", "continue"):
      raise ValueError(f"on_error must be 'stop' or 'continue'; got {on_error!r}")
    self.manager, self.on_error, self.keep = manager, on_error, keep
    self.failed_step = None  # The last save, if it failed.
    self._pending = None  # The step being written in the background.

  def save(self, step: int, state, data_iterator=None) -> None:
    """Start saving `state` (and the iterator's position) as `step`."""
    self._wait()
    started, error = reading.storage_failure(lambda: self._start(step, state, data_iterator))
    if error is not None:
      self._failed(step, error)
    elif started:
      self._pending = step

  def _start(self, step: int, state, data_iterator) -> bool:
    _check_writable(self.manager.directory)
    return store.save(self.manager, step, state, data_iterator)

  def finish(self) -> None:
    """Wait for the last save; raise CheckpointSaveError if it failed."""
    self._wait()
    if self.failed_step is not None:
      raise CheckpointSaveError(
        f"the checkpoint of step {self.failed_step} could not be written (see the errors "
        f"above); the latest good checkpoint in {self.manager.directory} is step "
        f"{self.manager.latest_step()}"
      )

  def _wait(self):
    step, self._pending = self._pending, None
    _, error = reading.storage_failure(self.manager.wait_until_finished)
    if error is not None:  # The background write failed.
      self._failed(step, error)
      return
    if step is not None:
      self.failed_step = None
      if self.keep:
        delete_steps(self.manager, self.manager.all_steps()[: -self.keep])

  def _failed(self, step, error):
    # Writes of the failed save that were still under way may recreate its directory.
    for _ in range(10):
      if not remove_partial_writes(self.manager.directory, step):
        break
      time.sleep(0.2)
    if epath.Path(self.manager.directory).is_dir():  # Else keep what the manager knew.
      self.manager.reload()
    self.failed_step = step
    message = (
      f"could not save the checkpoint of step {step} in {self.manager.directory}: "
      f"{first_line(error)}. The latest good checkpoint is step "
      f"{self.manager.latest_step()}"
    )
    if self.on_error == "stop":
      raise CheckpointSaveError(f"{message}; stopping (on_error='stop')") from error
    log.error(
      "%s; training goes on and tries again at the next checkpoint step (on_error='continue')",
      message,
    )
