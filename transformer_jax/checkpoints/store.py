"""Orbax checkpoints: a manager over a directory, save and restore onto any mesh, and every read of
what a checkpoint holds.

A train checkpoint step holds three items: `state` (any pytree of arrays,
here the train state), `data` (a Grain iterator's position, one file per
process) and `integrity` (fingerprints of both, see `integrity.py`, checked on
restore). A params-only checkpoint (averaged, best) holds `state` =
`{"params": ...}`, its fingerprint, and `info`, a JSON record of where it
came from. Nothing here knows about training; restoring takes the target
structure, shapes and shardings from an abstract tree, so a checkpoint
written on one mesh loads onto another.

What a step holds is read here only: `saved_arrays` (names, shapes and
dtypes, without reading the arrays), `saved_fingerprints`,
`saved_data_positions`, `saved_info`, `read_state_on_host`; `check_layout`
compares the arrays with what a run expects.
"""

import glob
import json
import os

from absl import logging
from etils import epath
import grain
import jax
import orbax.checkpoint as ocp

from transformer_jax.checkpoints import integrity
from transformer_jax.errors import UserError
from transformer_jax.workdir import absolute

STATE = "state"
DATA = "data"
INTEGRITY = "integrity"
INFO = "info"
PARAMS = "params"


class CorruptCheckpointError(UserError):
  """A checkpoint step that cannot be read back as it was written."""


class CheckpointMismatchError(UserError):
  """A checkpoint holds arrays of other names or shapes than the run expects."""


def make_manager(directory: str, *, max_to_keep: int | None = None, async_save: bool = True,
                 read_only: bool = False) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory` (made absolute), keeping the last `max_to_keep` steps.

  `max_to_keep=None` keeps every step. The caller decides when to save.
  """
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=not read_only,
      read_only=read_only)
  return ocp.CheckpointManager(epath.Path(absolute(directory)), options=options,
                               item_names=(STATE, DATA, INTEGRITY, INFO))


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


def _latest(manager: ocp.CheckpointManager, step: int | None) -> int:
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  return step


def restore(manager: ocp.CheckpointManager, abstract_state, data_iterator=None, *,
            step: int | None = None):
  """The state saved at `step` (default: the latest), laid out as `abstract_state` says.

  `abstract_state` is a tree of `jax.ShapeDtypeStruct` with shardings (see
  `sharding.abstract_tree`). A given `data_iterator` is moved to the saved
  position in place. Raises FileNotFoundError when there is no checkpoint,
  and CorruptCheckpointError when what was read disagrees with the
  fingerprints saved with it (a step saved without them is restored with a
  warning).
  """
  step = _latest(manager, step)
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


def make_params_manager(directory: str) -> ocp.CheckpointManager:
  """A manager over `directory` that holds one params-only checkpoint (averaged or best)."""
  return make_manager(directory, max_to_keep=1, async_save=False)


def save_params(manager: ocp.CheckpointManager, step: int, params, **info) -> None:
  """Save `params` alone as `step`, replacing a checkpoint of that step; `info` is a JSON record
  kept with it (`saved_info`)."""
  if step in manager.all_steps():
    manager.delete(step)
  state = {PARAMS: params}
  manager.save(step, args=ocp.args.Composite(**{
      STATE: ocp.args.StandardSave(state),
      INTEGRITY: ocp.args.JsonSave({STATE: integrity.tree_fingerprint(state)}),
      INFO: ocp.args.JsonSave(info)}), force=True)
  manager.wait_until_finished()


def restore_params(manager: ocp.CheckpointManager, abstract_params, *, step: int | None = None):
  """The parameters saved at `step` (default: the latest), laid out as `abstract_params` says.

  Reads a train checkpoint (skipping its optimizer state) or a params-only
  one, which is checked against its fingerprint (CorruptCheckpointError).
  `abstract_params` is a tree of `jax.ShapeDtypeStruct` with shardings;
  every process reads only its shards.
  """
  step = _latest(manager, step)
  item = {PARAMS: abstract_params}
  args = ocp.args.PyTreeRestore(
      item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)
  restored = _on_state(manager, step, lambda handler, path: handler.restore(path, args=args))
  saved = saved_fingerprints(manager, step) if is_params_only(manager, step) else None
  if saved and integrity.tree_fingerprint(restored) != saved[STATE]:
    raise CorruptCheckpointError(
        f"checkpoint {manager.directory / str(step)}: the parameters read back differ from those "
        "saved (fingerprint mismatch)")
  return restored[PARAMS]


def is_params_only(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether `step` is a params-only checkpoint (`save_params`), not a train checkpoint."""
  return (manager.directory / str(step) / INFO).exists()


def _on_state(manager: ocp.CheckpointManager, step: int, read):
  """`read(handler, path)` on the `state` item of `step`, through a PyTree handler of its own
  (the manager's may be registered for StandardSave, which cannot read a part)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    return read(handler, manager.directory / str(step) / STATE)
  finally:
    handler.close()


def saved_arrays(manager: ocp.CheckpointManager, step: int) -> dict:
  """`{name: metadata}` of every array saved in `step`'s state, named by `integrity.leaf_name`
  ('params/embed/embedding'); each metadata has `.shape` and `.dtype`. Reads no array data."""
  tree = _on_state(manager, step, lambda handler, path: handler.metadata(path).tree)
  return {integrity.leaf_name(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def read_state_on_host(manager: ocp.CheckpointManager, step: int):
  """The whole state saved at `step` as numpy arrays in nested dicts and lists (no target)."""
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(manager.directory / str(step) / STATE)


def saved_data_positions(manager: ocp.CheckpointManager, step: int) -> list:
  """The data-iterator position of each process saved in `step`, in process order ([] if none)."""
  pattern = os.path.join(manager.directory, str(step), DATA, "process_*-of-*.json")
  files = sorted(glob.glob(pattern),
                 key=lambda f: int(os.path.basename(f).split("_")[1].split("-")[0]))
  positions = []
  for name in files:
    with open(name) as f:
      positions.append(json.load(f))
  return positions


def _read_json(manager: ocp.CheckpointManager, step: int, item: str):
  if not (manager.directory / str(step) / item).exists():
    return None
  return manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]


def saved_fingerprints(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The fingerprints saved with `step` ({'state': int, 'data': [one per process]}), or None."""
  return _read_json(manager, step, INTEGRITY)


def saved_info(manager: ocp.CheckpointManager, step: int) -> dict:
  """The JSON record saved with params-only checkpoint `step` (`save_params`); {} if none."""
  return _read_json(manager, step, INFO) or {}


def check_layout(manager: ocp.CheckpointManager, step: int, abstract_tree, *,
                 under: str = "", hint: str = "") -> None:
  """Raise CheckpointMismatchError unless `step` holds the arrays of `abstract_tree`, by name and
  shape.

  With `under` (e.g. 'params'), `abstract_tree` is compared with the saved
  arrays below that name only (the parameters of a train checkpoint). Errors
  reading the checkpoint's metadata propagate as they are (a broken
  checkpoint, not a mismatch). `hint` ends the message: what the user may
  have changed.
  """
  prefix = f"{under}/" if under else ""
  saved = {name: tuple(leaf.shape) for name, leaf in saved_arrays(manager, step).items()
           if name.startswith(prefix)}
  wanted = {prefix + integrity.leaf_name(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_tree)[0]}
  if saved == wanted:
    return
  differences = [f"{key}: {saved.get(key, 'absent')} in the checkpoint, "
                 f"{wanted.get(key, 'absent')} expected"
                 for key in sorted(set(saved) | set(wanted)) if saved.get(key) != wanted.get(key)]
  raise CheckpointMismatchError(
      f"checkpoint {manager.directory / str(step)} does not fit the model ({len(differences)} "
      f"arrays differ; first: {'; '.join(differences[:3])}){'. ' + hint if hint else ''}")
