"""Lists the checkpoints of a work directory and checks them, without the experiment's config.

    ./launch.sh inspect --workdir=/path/to/workdir [--verify]
    python -m transformer_jax.cli.inspect_checkpoints --workdir=/path/to/workdir [--verify]

One line per entry of <workdir>/checkpoints (a local directory or a
bucket's): committed steps with their size, arrays, parameters and data
position; interrupted writes (the next run removes them); steps moved aside
as unusable. `--verify` reads every committed step back into host memory and
checks it against the fingerprints saved with it. Reads only. Exit status 1
when a committed step fails.
"""

import json
import os

import numpy as np
from absl import app, flags, logging
from etils import epath

from transformer_jax import fileio
from transformer_jax.checkpoints import integrity, recovery, store
from transformer_jax.workdir import Workdir


def _bytes(path: epath.Path) -> int:
  """The bytes of the files under `path`, one listing per directory (epath refuses `**` in a
  bucket)."""
  return sum(_bytes(p) if p.is_dir() else p.stat().length for p in path.iterdir())


def _size(path: str) -> str:
  return f"{_bytes(epath.Path(path)) / 1e6:.1f} MB"


def _problem(manager, step: int, positions: list) -> str | None:
  """Why `step` does not read back as saved, or None."""
  saved = store.saved_fingerprints(manager, step)
  if saved is None:
    return "saved without fingerprints"
  if integrity.tree_fingerprint(store.read_state_on_host(manager, step)) != saved[store.STATE]:
    return "the arrays differ from those saved"
  if [integrity.data_fingerprint(p) for p in positions] != saved.get(store.DATA, []):
    return "the data position differs from the one saved"
  return None


def describe_step(manager, step: int, *, verify: bool) -> tuple[str, bool]:
  """One line about committed `step`, and whether it is good (unverified steps count as good)."""
  path = os.path.join(manager.directory, str(step))
  try:
    arrays = store.saved_arrays(manager, step)
    params = sum(
      int(np.prod(leaf.shape))
      for name, leaf in arrays.items()
      if name.startswith(f"{store.PARAMS}/")
    )
    positions = store.saved_data_positions(manager, step)
    text = (
      f"step {step}: {_size(path)}, {len(arrays)} arrays ({params:,} parameters), data "
      f"position {json.dumps(positions[0]) if positions else 'not saved'}"
    )
    problem = _problem(manager, step, positions) if verify else None
  except Exception as error:  # Whatever a broken checkpoint raises.
    problem = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
    text = f"step {step}: {_size(path)}"
  if problem:
    return f"{text}, UNUSABLE: {problem}", False
  return text + (", verified" if verify else ""), True


def _order(name: str):
  """Entries by step number, then name; names without a step first."""
  head = name.split(".")[0]
  return (int(head) if head.isdigit() else -1, name)


def describe(directory: str, *, verify: bool = False) -> tuple[list[str], bool]:
  """Lines about every entry of checkpoint `directory`, and whether all committed steps are good."""
  if not epath.Path(directory).is_dir():
    return [f"{directory}: no such directory"], True
  manager = store.make_manager(directory, read_only=True)
  committed = set(manager.all_steps())
  lines, good = [], True
  for name in sorted((p.name for p in epath.Path(directory).iterdir()), key=_order):
    if name.isdigit() and int(name) in committed:
      line, ok = describe_step(manager, int(name), verify=verify)
      good &= ok
    elif recovery.uncommitted(directory, name):
      line = f"{name}: an interrupted write (the next run removes it)"
    elif recovery.UNUSABLE_MARK in name:
      line = f"{name}: moved aside as unusable"
    else:
      line = f"{name}: not a checkpoint"
    lines.append(line)
  return lines or [f"{directory}: no checkpoints"], good


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not flags.FLAGS["verbosity"].present:  # Orbax logs every file it reads at INFO.
    logging.set_verbosity(logging.WARNING)
  fileio.list_stores_afresh()  # Steps that runs committed since this process last looked.
  lines, good = describe(Workdir(flags.FLAGS.workdir).checkpoints, verify=flags.FLAGS.verify)
  print("\n".join(lines))
  if not good:
    raise SystemExit(1)


if __name__ == "__main__":  # Flags defined here only: main.py has a --workdir too.
  flags.DEFINE_string("workdir", None, "The work directory of a run.")
  flags.DEFINE_bool(
    "verify",
    False,
    "Read each committed step back and check its fingerprints "
    "(loads the whole state into host memory).",
  )
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
