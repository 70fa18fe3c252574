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

import functools

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer_jax import fileio
from transformer_jax.checkpoints import integrity
from transformer_jax.checkpoints.reading import (
  CheckpointMismatchError,
  CorruptCheckpointError,
  reads_that_finish,
  verified_read,
)
from transformer_jax.errors import UserError, first_line

STATE = "state"
DATA = "data"
INTEGRITY = "integrity"
INFO = "info"
PARAMS = "params"
COMMIT_MARKER = "commit_success.txt"  # Orbax's, in object stores.


def make_manager(
  directory: str,
  *,
  max_to_keep: int | None = None,
  async_save: bool = True,
  read_only: bool = False,
) -> ocp.CheckpointManager:
  """A CheckpointManager over `directory` (made absolute), keeping the last `max_to_keep` steps.

  `max_to_keep=None` keeps every step. The caller decides when to save.
  """
  options = ocp.CheckpointManagerOptions(
    max_to_keep=max_to_keep,
    enable_async_checkpointing=async_save,
    create=not read_only,
    read_only=read_only,
  )
  return ocp.CheckpointManager(
    epath.Path(fileio.absolute(directory)),
    options=options,
    item_names=(STATE, DATA, INTEGRITY, INFO),
  )


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None) -> bool:
  """Save `state` (and the iterator's position) as `step`; returns whether a save started.

  A step that already exists is not saved again. The fingerprints of both
  are saved with them, and one of the state's `params` alone
  (`restore_params`). Asynchronous: call `manager.wait_until_finished()`
  before reading the files.
  """
  if manager.latest_step() == step:
    return False
  fingerprints = {
    STATE: integrity.tree_fingerprint(state),
    PARAMS: integrity.tree_fingerprint({PARAMS: _params_of(state)}),
  }
  items = {STATE: ocp.args.StandardSave(state)}
  if data_iterator is not None:
    items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
    fingerprints[DATA] = integrity.iterator_fingerprints(data_iterator)
  items[INTEGRITY] = ocp.args.JsonSave(fingerprints)
  return manager.save(step, args=ocp.args.Composite(**items), force=True)


def committed_steps(directory: str) -> list[int]:
  """The committed steps under `directory`, sorted, read from the listing alone (no manager, so
  without touching the devices): a step's directory appears at commit (in an object store, it has
  Orbax's commit marker)."""
  path = epath.Path(fileio.absolute(directory))
  try:
    names = [p.name for p in path.iterdir()]
  except OSError:
    return []
  url = fileio.is_url(path)
  return sorted(
    int(name)
    for name in names
    if name.isdigit() and (not url or (path / name / COMMIT_MARKER).exists())
  )


def _latest(manager: ocp.CheckpointManager, step: int | None) -> int:
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {manager.directory}")
  return step


def _params_of(state):
  return state[PARAMS] if isinstance(state, dict) else getattr(state, PARAMS)


def _fingerprints(manager: ocp.CheckpointManager, step: int) -> dict:
  """The fingerprints saved with `step`; CorruptCheckpointError when it has none."""
  saved = saved_fingerprints(manager, step)
  if saved is None:
    raise CorruptCheckpointError(
      f"checkpoint {manager.directory / str(step)} has no fingerprints: its writing did not finish"
    )
  return saved


def _position_file(process, count) -> str:
  """The name of a process's data position in a step's `data` item (Grain's naming); a glob
  pattern for `"*"`."""
  return f"process_{process}-of-{count}.json"


def _read_data_position(path, saved: dict):
  """This process's saved data position in step directory `path`, checked against `saved`."""
  try:
    position = fileio.read_json(
      path / DATA / _position_file(jax.process_index(), jax.process_count())
    )
  except UserError as error:  # Missing or damaged: the checkpoint is, whatever the reason.
    raise CorruptCheckpointError(f"checkpoint {path}: {error}") from None
  if DATA not in saved:
    raise CorruptCheckpointError(f"checkpoint {path} was saved without a data position")
  if integrity.data_fingerprint(position) != saved[DATA][jax.process_index()]:
    raise CorruptCheckpointError(
      f"checkpoint {path}: the data position read back differs from the one saved"
    )
  return position


def restore(
  manager: ocp.CheckpointManager, abstract_state, data_iterator=None, *, step: int | None = None
):
  """The state saved at `step` (default: the latest), laid out as `abstract_state` says.

  `abstract_state` is a tree of `jax.ShapeDtypeStruct` with shardings (see
  `sharding.abstract_tree`). A given `data_iterator` is moved to the saved
  position. Raises FileNotFoundError when there is no checkpoint,
  CheckpointMismatchError when the arrays do not fit `abstract_state`, and
  CorruptCheckpointError when the files cannot be read or what was read
  disagrees with the fingerprints saved with them. Each process reads its
  shards and its data position; when any of them fails, every process raises
  (`agree`).
  """
  step = _latest(manager, step)
  path = manager.directory / str(step)

  def read():
    check_layout(manager, step, abstract_state)
    saved = _fingerprints(manager, step)
    state = _reader(ocp.StandardCheckpointHandler).restore(
      path / STATE, args=ocp.args.StandardRestore(abstract_state)
    )
    position = None if data_iterator is None else _read_data_position(path, saved)
    return saved[STATE], state, position

  state, position = verified_read(path, read, "arrays")
  if data_iterator is not None:
    data_iterator.set_state(position)
  return state


def make_params_manager(directory: str) -> ocp.CheckpointManager:
  """A manager over `directory` that holds one params-only checkpoint (averaged or best)."""
  return make_manager(directory, max_to_keep=1, async_save=False)


def save_params(manager: ocp.CheckpointManager, step: int, params, **info) -> None:
  """Save `params` alone as `step`, replacing a checkpoint of that step; `info` is a JSON record
  kept with it (`saved_info`)."""
  if step in manager.all_steps():
    manager.delete(step)
  state = {PARAMS: params}
  manager.save(
    step,
    args=ocp.args.Composite(
      **{
        STATE: ocp.args.StandardSave(state),
        INTEGRITY: ocp.args.JsonSave({STATE: integrity.tree_fingerprint(state)}),
        INFO: ocp.args.JsonSave(info),
      }
    ),
    force=True,
  )
  manager.wait_until_finished()


def restore_params(
  manager: ocp.CheckpointManager, abstract_params, *, step: int | None = None, hint: str = ""
):
  """The parameters saved at `step` (default: the latest), laid out as `abstract_params` says.

  Reads a train checkpoint (skipping its optimizer state) or a params-only
  one, and checks them against the fingerprint saved with them
  (CorruptCheckpointError, as when the files cannot be read).
  CheckpointMismatchError, ending with `hint`, when the saved parameters have
  other names or shapes. `abstract_params` is a tree of
  `jax.ShapeDtypeStruct` with shardings; every process reads only its shards,
  and all raise when any fails (`agree`).
  """
  step = _latest(manager, step)
  path = manager.directory / str(step)
  item = {PARAMS: abstract_params}
  args = ocp.args.PyTreeRestore(
    item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True
  )

  def read():
    check_layout(manager, step, abstract_params, under=PARAMS, hint=hint)
    saved = _fingerprints(manager, step)
    # A train step fingerprints its parameters apart; a params-only step's state is them.
    expected = saved.get(STATE if is_params_only(manager, step) else PARAMS)
    if expected is None:
      raise CorruptCheckpointError(f"checkpoint {path} has no fingerprint of its parameters")
    restored = _reader(ocp.PyTreeCheckpointHandler).restore(path / STATE, args=args)
    return expected, restored, None

  restored, _ = verified_read(path, read, "parameters")
  return restored[PARAMS]


@functools.cache
def _reader(handler_type) -> ocp.Checkpointer:
  """A checkpointer of `handler_type` that reads for this process alone (no barrier with the
  others: `agree` is the one meeting point). One per process, never closed: closing one while
  reads of a broken file are still completing makes them fail noisily. A failed read of one
  array ends the others before it returns (`reads_that_finish`)."""
  alone = ocp.options.MultiprocessingOptions(
    primary_host=None, active_processes={jax.process_index()}
  )
  return ocp.Checkpointer(reads_that_finish(handler_type()), multiprocessing_options=alone)


def is_params_only(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether `step` is a params-only checkpoint (`save_params`), not a train checkpoint."""
  return (manager.directory / str(step) / INFO).exists()


def saved_arrays(manager: ocp.CheckpointManager, step: int) -> dict:
  """`{name: metadata}` of every array saved in `step`'s state, named by `integrity.leaf_name`
  ('params/embed/embedding'); each metadata has `.shape` and `.dtype`. Reads no array data."""
  handler = ocp.PyTreeCheckpointHandler()  # The manager's may be registered for StandardSave.
  try:
    tree = handler.metadata(manager.directory / str(step) / STATE).tree
  finally:
    handler.close()
  return {
    integrity.leaf_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def read_state_on_host(manager: ocp.CheckpointManager, step: int):
  """The whole state saved at `step` as numpy arrays in nested dicts and lists (no target)."""
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(manager.directory / str(step) / STATE)


def saved_data_positions(manager: ocp.CheckpointManager, step: int) -> list:
  """The data-iterator position of each process saved in `step`, in process order ([] if none)."""
  directory = epath.Path(manager.directory) / str(step) / DATA
  files = sorted(
    directory.glob(_position_file("*", "*")), key=lambda f: int(f.name.split("_")[1].split("-")[0])
  )
  return [fileio.read_json(f) for f in files]


def _read_json(manager: ocp.CheckpointManager, step: int, item: str):
  """A JSON item of `step`, or None; read by this process alone (no barrier of the manager)."""
  directory = manager.directory / str(step) / item
  if not directory.exists():
    return None
  return ocp.JsonCheckpointHandler().restore(directory)


def saved_fingerprints(manager: ocp.CheckpointManager, step: int) -> dict | None:
  """The fingerprints saved with `step` ({'state': int, 'data': [one per process]}), or None."""
  return _read_json(manager, step, INTEGRITY)


def saved_info(manager: ocp.CheckpointManager, step: int) -> dict:
  """The JSON record saved with params-only checkpoint `step` (`save_params`); {} if none."""
  return _read_json(manager, step, INFO) or {}


def check_layout(
  manager: ocp.CheckpointManager, step: int, abstract_tree, *, under: str = "", hint: str = ""
) -> None:
  """Raise CheckpointMismatchError unless `step` holds the arrays of `abstract_tree`, by name and
  shape.

  With `under` (e.g. 'params'), `abstract_tree` is compared with the saved
  arrays below that name only (the parameters of a train checkpoint). Metadata
  that cannot be read is a broken checkpoint, not a mismatch:
  CorruptCheckpointError. `hint` ends the message: what the user may have
  changed.
  """
  prefix = f"{under}/" if under else ""
  try:
    arrays = saved_arrays(manager, step)
  except Exception as error:  # Whatever the metadata's reader raised.
    raise CorruptCheckpointError(
      f"checkpoint {manager.directory / str(step)} cannot be read: {first_line(error)}"
    ) from error
  saved = {name: tuple(leaf.shape) for name, leaf in arrays.items() if name.startswith(prefix)}
  wanted = {
    prefix + integrity.leaf_name(path): tuple(leaf.shape)
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_tree)[0]
  }
  if saved == wanted:
    return
  differences = [
    f"{key}: {saved.get(key, 'absent')} in the checkpoint, {wanted.get(key, 'absent')} expected"
    for key in sorted(set(saved) | set(wanted))
    if saved.get(key) != wanted.get(key)
  ]
  raise CheckpointMismatchError(
    f"checkpoint {manager.directory / str(step)} does not fit the model ({len(differences)} "
    f"arrays differ; first: {'; '.join(differences[:3])}){'. ' + hint if hint else ''}"
  )
