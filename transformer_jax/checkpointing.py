"""Orbax checkpoints: a manager over a work directory, save and restore onto any mesh.

A checkpoint step holds two items: `state` (any pytree of arrays, here the
train state) and, when given, `data` (a Grain iterator's position, one file
per process). Nothing here knows about training; restoring takes the target
structure, shapes and shardings from an abstract tree, so a checkpoint
written on one mesh loads onto another.
"""

import os

from etils import epath
import grain
import jax
import orbax.checkpoint as ocp

STATE = "state"
DATA = "data"


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
                               item_names=(STATE, DATA))


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None) -> bool:
  """Save `state` (and the iterator's position) as `step`; returns whether a save started.

  A step that already exists is not saved again. Asynchronous: call
  `manager.wait_until_finished()` before reading the files.
  """
  if manager.latest_step() == step:
    return False
  items = {STATE: ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
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
  in place. Raises FileNotFoundError when there is no checkpoint.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  items = {STATE: ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointRestore(data_iterator)
  restored = manager.restore(step, args=ocp.args.Composite(**items))
  return restored[STATE]
