"""Orbax checkpoints: a manager over a work directory, save and restore onto any mesh.

A checkpoint step holds up to three items: `state` (any pytree of arrays,
here the train state), `data` (a Grain iterator's position, one file per
process) and `integrity` (fingerprints of both, see `integrity.py`, checked on
restore). Nothing here knows about training; restoring takes the target
structure, shapes and shardings from an abstract tree, so a checkpoint
written on one mesh loads onto another.

Params-only checkpoints (averaged, best) hold `state` = `{"params": ...}`;
`restore_params` reads the parameters of either kind, and `average_params`
averages several checkpoints on sharded arrays.
"""

import os

from absl import logging

from etils import epath
import grain
import jax
import jax.numpy as jnp
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


# Parameters only: averaged and best checkpoints, and reading the parameters
# out of a train checkpoint without its optimizer state.

PARAMS = "params"


def make_params_manager(directory: str) -> ocp.CheckpointManager:
  """A manager over `directory` that holds one params-only checkpoint (averaged or best)."""
  return make_manager(directory, max_to_keep=1, async_save=False)


def save_params(manager: ocp.CheckpointManager, step: int, params, **metadata) -> None:
  """Save `params` alone as `step`, replacing a checkpoint of that step; `metadata` is
  JSON kept with it (`manager.metadata(step).custom_metadata`)."""
  if step in manager.all_steps():
    manager.delete(step)
  manager.save(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardSave({PARAMS: params})}),
               custom_metadata=metadata, force=True)
  manager.wait_until_finished()


def _read_state(manager: ocp.CheckpointManager, step: int, read):
  """`read(handler, path)` on the `state` item of `step`, through a PyTree handler of its own
  (the manager's may be registered for StandardSave, which cannot restore a part)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    return read(handler, manager.directory / str(step) / STATE)
  finally:
    handler.close()


def params_metadata(manager: ocp.CheckpointManager, step: int):
  """The saved parameters of `step`: a tree of Orbax array metadata (`.shape`, `.dtype`)."""
  return _read_state(manager, step, lambda handler, path: handler.metadata(path).tree[PARAMS])


def restore_params(manager: ocp.CheckpointManager, abstract_params, *, step: int | None = None):
  """The parameters saved at `step` (default: the latest), laid out as `abstract_params` says.

  Reads a train checkpoint (skipping its optimizer state) or a params-only
  one. `abstract_params` is a tree of `jax.ShapeDtypeStruct` with shardings;
  every process reads only its shards.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  item = {PARAMS: abstract_params}
  args = ocp.args.PyTreeRestore(
      item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)
  return _read_state(manager, step, lambda handler, path: handler.restore(path, args=args))[PARAMS]


_accumulate = jax.jit(
    lambda total, params: jax.tree.map(lambda t, p: t + p.astype(jnp.float32), total, params),
    donate_argnums=0)
_divide = jax.jit(lambda total, n: jax.tree.map(lambda t: t / n, total), donate_argnums=0)


def average_params(manager: ocp.CheckpointManager, steps, abstract_params):
  """The float32 mean of the parameters of checkpoints `steps`, parameter by parameter.

  Checkpoints are restored one at a time onto the shardings of
  `abstract_params` and added to a running sum that stays on the devices, so
  a process never holds more than its shards of two copies of the model.
  """
  if not steps:
    raise ValueError("average_params needs at least one step")
  as_float32 = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding), abstract_params)
  total = None
  for step in steps:
    params = restore_params(manager, as_float32, step=step)
    total = params if total is None else _accumulate(total, params)
  return _divide(total, float(len(steps)))


def saved_fingerprints(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The fingerprints saved with `step` ({'state': int, 'data': [one per process]}), or None."""
  if not (manager.directory / str(step) / INTEGRITY).exists():
    return None
  restored = manager.restore(step, args=ocp.args.Composite(
      **{INTEGRITY: ocp.args.JsonRestore()}))
  return restored[INTEGRITY]
