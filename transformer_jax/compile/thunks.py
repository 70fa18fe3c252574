"""How a GPU program's kernels are launched, from the thunk sequences that XLA's GPU compiler
writes where it dumps (`xla_dump_to`): `*.thunk_sequence.txt` gives each thunk's id, kind and
grid, `*.thunk_metadata.txt` the HLO instruction of each id, and
`*.thunk_sequence_after_thunk_passes.txt` the same thunks with runs of them gathered into
command buffers (CUDA graphs, `kCommandBuffer`), their commands indented beneath them.

The optimized HLO (`Compiled.as_text()`) carries neither; this is where the
compiler writes them. `compile_with_thunks` compiles with a dump into a
temporary directory and reads them back.
"""

import dataclasses
import glob
import os
import re
import tempfile

_THUNK = re.compile(r"\s*(\d+): (\w+)\s.*?grid: \[(\d+), (\d+), (\d+)\]")
_ENTRY = re.compile(r"( *)\d+: (\w+)")
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


def host_launches(sequence: str) -> dict[str, int]:
  """The thunks the host runs per call of the program (thunks, not kernels: a cuDNN call may
  launch several), from the thunk sequence after the thunk passes: `{"launches", "graphs",
  "graph_commands"}`.

  A thunk with thunks indented beneath it holds them: a command buffer is one
  graph launch for all of its commands (`graph_commands`), any other holder
  (a while loop, a conditional) counts nothing itself. Every other thunk
  outside a command buffer (a kernel, a cuBLAS or cuDNN call, a copy) is a
  launch of its own. A loop's condition and body count once, whatever its
  trips; the loop's own copy of its predicate to the host at each trip is not
  counted.
  """
  entries = [(len(m[1]), m[2]) for m in map(_ENTRY.match, sequence.splitlines()) if m]
  launches = graphs = commands = 0
  holders = []  # (indent, kind) of the thunks holding the current one
  for index, (indent, kind) in enumerate(entries):
    while holders and holders[-1][0] >= indent:
      holders.pop()
    in_graph = any(k == "kCommandBuffer" for _, k in holders)
    holds = index + 1 < len(entries) and entries[index + 1][0] > indent
    if kind == "kCommandBuffer" and not in_graph:
      graphs += 1
      launches += 1
    elif in_graph and not holds:
      commands += 1
    elif not holds:
      launches += 1
    if holds:
      holders.append((indent, kind))
  return {"launches": launches, "graphs": graphs, "graph_commands": commands}


def launches_cell(counts: dict[str, int] | None) -> str:
  """`launches (graphs)`, a table's cell of `host_launches`'s counts; `-` without them."""
  return "-" if counts is None else f"{counts['launches']:,} ({counts['graphs']:,})"


@dataclasses.dataclass(frozen=True)
class Thunks:
  """What the thunk sequences of one program say: each kernel's grid (HLO instruction -> blocks
  in x, y, z) and what the host runs (`host_launches` of the sequence after the thunk passes,
  which the compiler writes where they changed it, else of the sequence itself)."""

  grids: dict[str, tuple[int, int, int]]
  host_launches: dict[str, int]


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as file:
    return file.read()


def read_thunks(directory: str) -> Thunks | None:
  """The `Thunks` of the one program dumped into `directory`; None when it holds no thunk
  sequence (another XLA, or not a GPU program)."""
  sequences = glob.glob(os.path.join(directory, "*.thunk_sequence.txt"))
  if len(sequences) != 1:
    return None
  metadata = sequences[0].replace(".thunk_sequence.txt", ".thunk_metadata.txt")
  if not os.path.exists(metadata):
    return None
  sequence = _read(sequences[0])
  after = sequences[0].replace(".thunk_sequence.txt", ".thunk_sequence_after_thunk_passes.txt")
  # The compiler writes the sequence after its passes where they changed it.
  final = _read(after) if os.path.exists(after) else sequence
  return Thunks(launch_grids(sequence, _read(metadata)), host_launches(final))


def compile_with_thunks(lowered, compiler_options: dict | None = None):
  """`(compiled, thunks)`: `lowered` compiled for a GPU with a dump of the compiler's output into
  a temporary directory (removed after), and its `Thunks` read from it (None if absent)."""
  with tempfile.TemporaryDirectory(prefix="transformer_jax_thunks_") as directory:
    compiled = lowered.compile({**(compiler_options or {}), "xla_dump_to": directory})
    return compiled, read_thunks(directory)
