"""Orbax checkpoints: a manager over a work directory, save and restore onto any mesh.

A checkpoint step holds up to three items: `state` (any pytree of arrays,
here the train state), `data` (a Grain iterator's position, one file per
process) and `integrity` (fingerprints of both, see `integrity.py`, checked on
restore). Nothing here knows about training; restoring takes the target
structure, shapes and shardings from an abstract tree, so a checkpoint
written on one mesh loads onto another.
"""

import os

from absl import logging

from etils import epath
import grain
import jax
import orbax.checkpoint as ocp

from transformer_jax import integrity

STATE = "state"
DATA = "data"
INTEGRITY = "integrity"


class CorruptCheckpointError(RuntimeError):
  """A checkpoint step that cannot be read back as it was written."""


def absolute(path: str) -> str:
  """`path` made absolute, unless it is a URL such as `gs://bucket/dir` (Orbax needs absolute paths)."""
  return path if "://" in path else os.path.abspath(path)


def make_manager(directory: str, *, max_to_keep: int | None = None,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory` (made absolute), keeping the last `max_to_keep` steps.

  `max_to_keep=None` keeps every step. The caller decides when to save.
  """
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True)
  return ocp.CheckpointManager(epath.Path(absolute(directory)), options=options,
                               item_names=(STATE, DATA, INTEGRITY))


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None) -> bool:
  """Save `state` (and the iterator's position) as `step`; returns whether a save started.

  A step that already exists is not saved again. The fingerprints of both
are saved with them. Asynchronous: call `manager.wait_until_finished()`
before reading the files.
  """
  if manager.latest_step() == step:
    return False
  fingerprints = {STATE: integrity.tree_fingerprint(state)}
  items = {STATE: ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
    fingerprints[DATA] = integrity.iterator_fingerprints(data_iterator)
  items[INTEGRITY] = ocp.args.JsonSave(fingerprints)
  return manager.save(step, args=ocp.args.Composite(**items), force=True)


def abstract_tree(tree, shardings=None):
  """`jax.ShapeDtypeStruct` leaves of `tree` (arrays or abstract leaves), with `shardings` if given."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def restore(manager: ocp.CheckpointManager, abstract_state, data_iterator=None, *,
            step: int | None = None):
  """The state saved at `step` (default: the latest), laid out as `abstract_state` says.

  `abstract_state` is a tree of `jax.ShapeDtypeStruct` with shardings (see
  `abstract_tree`). A given `data_iterator` is moved to the saved position
  in place. Raises FileNotFoundError when there is no checkpoint, and
  CorruptCheckpointError when what was read disagrees with the fingerprints
  saved with it (a step saved without them is restored with a warning).
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  path = os.path.join(manager.directory, str(step))
  items = {STATE: ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointRestore(data_iterator)
  saved = saved_fingerprints(manager, step)
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  if saved is None:
    logging.warning("checkpoint %s has no fingerprints (older format): restored unverified", path)
    return restored[STATE]
  if integrity.tree_fingerprint(restored[STATE]) != saved[STATE]:
    raise CorruptCheckpointError(
        f"checkpoint {path}: the arrays read back differ from those saved (fingerprint mismatch)")
  if data_iterator is not None:
    if DATA not in saved:
      raise CorruptCheckpointError(f"checkpoint {path} was saved without a data position")
    if integrity.iterator_fingerprints(data_iterator) != saved[DATA]:
      raise CorruptCheckpointError(
          f"checkpoint {path}: the data position read back differs from the one saved")
  return restored[STATE]


def saved_fingerprints(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The fingerprints saved with `step` ({'state': int, 'data': [one per process]}), or None."""
  if not (manager.directory / str(step) / INTEGRITY).exists():
    return None
  restored = manager.restore(step, args=ocp.args.Composite(
      **{INTEGRITY: ocp.args.JsonRestore()}))
  return restored[INTEGRITY]
