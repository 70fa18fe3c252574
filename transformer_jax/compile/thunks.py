"""The launch grids of a GPU program's kernels, from the thunk sequence that XLA's GPU compiler
writes where it dumps (`xla_dump_to`): `*.thunk_sequence.txt` gives each thunk's id, kind and
grid, `*.thunk_metadata.txt` the HLO instruction of each id.

The optimized HLO (`Compiled.as_text()`) does not carry launch dimensions; this
is where the compiler writes them. `compile_with_grids` compiles with a dump
into a temporary directory and reads them back.
"""

import glob
import os
import re
import tempfile

_THUNK = re.compile(r"\s*(\d+): (\w+)\s.*?grid: \[(\d+), (\d+), (\d+)\]")
_METADATA = re.compile(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)')


def launch_grids(sequence: str, metadata: str) -> dict[str, tuple[int, int, int]]:
  """HLO instruction name -> the grid (blocks in x, y, z) its kernel is launched on, for every
  thunk of the sequence that gives one (kernels; not copies, cuBLAS or cuDNN calls)."""
  names = {int(number): name for name, number in _METADATA.findall(metadata)}
  grids = {}
  for line in sequence.splitlines():
    match = _THUNK.match(line)
    if match and int(match[1]) in names:
      grids[names[int(match[1])]] = (int(match[3]), int(match[4]), int(match[5]))
  return grids


def read_grids(directory: str) -> dict[str, tuple[int, int, int]] | None:
  """The launch grids of the one program dumped into `directory`; None when it holds no thunk
  sequence (another XLA, or not a GPU program)."""
  sequences = glob.glob(os.path.join(directory, "*.thunk_sequence.txt"))
  if len(sequences) != 1:
    return None
  metadata = sequences[0].replace(".thunk_sequence.txt", ".thunk_metadata.txt")
  if not os.path.exists(metadata):
    return None
  with open(sequences[0], encoding="utf-8") as file:
    sequence = file.read()
  with open(metadata, encoding="utf-8") as file:
    return launch_grids(sequence, file.read())


def compile_with_grids(lowered, compiler_options: dict | None = None):
  """`(compiled, grids)`: `lowered` compiled for a GPU with a dump of the compiler's output into
  a temporary directory (removed after), and the launch grids read from it (None if absent)."""
  with tempfile.TemporaryDirectory(prefix="transformer_jax_thunks_") as directory:
    compiled = lowered.compile({**(compiler_options or {}), "xla_dump_to": directory})
    return compiled, read_grids(directory)
