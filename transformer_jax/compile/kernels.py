"""The kernels a GPU program launches, read off its optimized HLO, with the bytes and FLOPs of
each and a roofline floor: figures derived from the compiler's output, estimates, never
measurements.

A kernel is a top-level instruction that launches work on the GPU: a fusion
(XLA's own kernels and Triton's), a custom call (cuBLAS GEMMs, cuDNN's fused
attention, ...), a copy, a collective. Parameters, constants, tuples,
get-tuple-element, bitcasts, the `-done` halves of asynchronous pairs and the
control flow itself launch nothing. The top level is the ENTRY computation and
the bodies of its while loops, counted once per trip where the HLO gives the
trip count (`known_trip_count`: XLA then runs the body that many times and not
the condition), else once each with the condition, and said so (`loops`).
Called computations and conditional branches count once each, every branch.

Per kernel:
* bytes: its distinct operands' and its outputs' shapes (element type sizes; a
  tuple summed; the scratch workspace that a custom call returns last, a
  `u8`/`s8` array, left out). One rule for an operand read in part: a fusion's
  operand that its fused computation reads only through `slice` and
  `dynamic-slice` instructions (as their sliced operand, directly or through
  bitcasts) counts the bytes of those slices' outputs, summed, at most the
  operand's (the `wrapped_slice` copies of Q, K and V out of a joined GEMM's
  output). Any other read counts the operand whole: one sliced after other
  work (a reduce, a convert), gathered, or read by a called computation, and
  an output updated in place.
* FLOPs: 2·M·N·K of each dot in it (every batch dimension counted; from the
  shapes and the dot dimension numbers, or the GEMM custom call's
  `dot_dimension_numbers`), 2 per multiply-add of a convolution, and for
  cuDNN's fused attention 4·|Q|·Lk forward (two matmuls over the score matrix)
  and 10·|Q|·Lk backward (five: the scores recomputed, then four gradients),
  |Q| the query's elements and Lk the keys' length. Elementwise work is not
  counted.
* floor: max(FLOPs / peak FLOP/s, bytes / memory bandwidth) on the chip.
* grid: the blocks it is launched on, from the compiler's thunk sequence
  (`thunks.py`) where it is given. Without it, a kernel counts as launched on a
  1x1x1 grid by a rule: a fusion XLA emits itself (kLoop or kInput: not a GEMM,
  not Triton) whose every output array has at most `ONE_BLOCK_ELEMENTS` (128)
  elements. It agrees with the thunk sequence on `wmt14.py:base`'s train step
  and misses reductions to a few thousand values in smaller models
  (docs/compile.md gives the counts).
"""

import dataclasses
import math

from transformer_jax.compile import hlo, thunks

ONE_BLOCK_ELEMENTS = 128  # The rule's largest output of a kernel on one block, without grids.
_QUIET = {
  "parameter",
  "constant",
  "tuple",
  "get-tuple-element",
  "bitcast",
  "after-all",
  "add-dependency",
  "opt-barrier",
  "partition-id",
  "replica-id",
  "domain",
  "async-update",
}
_COLLECTIVES = (
  "all-reduce",
  "all-gather",
  "reduce-scatter",
  "collective-permute",
  "all-to-all",
  "ragged-all-to-all",
  "collective-broadcast",
  "send",
  "recv",
)
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
TOP = 10  # kernels listed by bytes and by FLOPs


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel of the program: what it is, where it comes from and what one launch moves."""

  name: str  # the HLO instruction
  category: str  # gemm, cudnn, fusion, custom-call, copy, collective, other
  launches: int  # per call of the program: its loop's trips (1 outside loops)
  bytes: int  # per launch
  flops: float  # per launch
  grid: tuple[int, int, int] | None  # blocks, where the thunk sequence gives them
  one_block: bool  # launched on a 1x1x1 grid (see the module docstring)
  source: str  # file:line (function) of the Python that made it
  op_name: str
  where: str  # "ENTRY" or the while loop it runs in

  def floor_seconds(self, peak_flops: float, bandwidth: float) -> float:
    """The time of all its launches at the chip's peak or its memory bandwidth, whichever is
    longer: a lower bound, an estimate."""
    return self.launches * max(self.flops / peak_flops, self.bytes / bandwidth)


def _dot_flops(lhs: str, rhs: str, rhs_batch: list[int], rhs_contracting: list[int]) -> float:
  """2 x every lhs element x the rhs's free elements: 2·M·N·K for each batch element."""
  lhs_arrays, rhs_arrays = hlo.arrays(lhs), hlo.arrays(rhs)
  if not lhs_arrays or not rhs_arrays:
    return 0.0
  rhs_dims = rhs_arrays[0][1]
  free = [d for i, d in enumerate(rhs_dims) if i not in set(rhs_batch) | set(rhs_contracting)]
  return 2.0 * math.prod(lhs_arrays[0][1]) * math.prod(free)


def _dims(text: str) -> list[int]:
  return [int(d) for d in text.strip("{}").split(",") if d.strip()]


def _convolution_flops(instruction: hlo.Instruction, computation: hlo.Computation) -> float:
  """2 x every output element x the kernel's elements per output feature."""
  kernel = hlo.arrays(computation.shape_of(instruction.operands[1]))
  output = hlo.arrays(instruction.shape)
  labels = instruction.attribute("dim_labels").split("_")
  if not kernel or not output or len(labels) < 2:
    return 0.0
  kernel_labels = labels[1].split("->")[0]
  features = kernel[0][1][kernel_labels.index("o")] if "o" in kernel_labels else 1
  return 2.0 * math.prod(output[0][1]) * math.prod(kernel[0][1]) / max(features, 1)


def _computation_flops(module: hlo.Module, name: str, seen: frozenset = frozenset()) -> float:
  """FLOPs of the dots and convolutions of a computation and the computations it calls."""
  computation = module.computations.get(name)
  if computation is None or name in seen:
    return 0.0
  total = 0.0
  for instruction in computation.instructions:
    if instruction.opcode == "dot":
      total += _dot_flops(
        computation.shape_of(instruction.operands[0]),
        computation.shape_of(instruction.operands[1]),
        _dims(instruction.attribute("rhs_batch_dims")),
        _dims(instruction.attribute("rhs_contracting_dims")),
      )
    elif instruction.opcode == "convolution":
      total += _convolution_flops(instruction, computation)
    for called in instruction.called("calls"):
      total += _computation_flops(module, called, seen | {name})
  return total


def _custom_call_flops(instruction: hlo.Instruction, computation: hlo.Computation) -> float:
  target = instruction.attribute("custom_call_target").strip('"')
  config = instruction.json_attribute("backend_config")
  operands = [computation.shape_of(name) for name in instruction.operands]
  if target.startswith(_GEMM_TARGETS) and len(operands) >= 2:
    numbers = config.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
    return _dot_flops(
      operands[0],
      operands[1],
      [int(d) for d in numbers.get("rhs_batch_dimensions", [])],
      [int(d) for d in numbers.get("rhs_contracting_dimensions", [])],
    )
  if target.startswith("__cudnn$fmha") and operands:
    scores = config.get("cudnn_fmha_backend_config", {}).get("intermediate_tensor_shape", {})
    keys = int((scores.get("dimensions") or [0])[-1])
    query = hlo.arrays(operands[0])
    matmuls = 5 if target.endswith("Backward") else 2
    return 2.0 * matmuls * math.prod(query[0][1]) * keys if query else 0.0
  return 0.0


def _output_bytes(instruction: hlo.Instruction) -> int:
  parts = hlo.arrays(instruction.shape)
  if instruction.opcode == "custom-call" and len(parts) > 1 and parts[-1][0] in ("u8", "s8"):
    parts = parts[:-1]  # The scratch workspace.
  return sum(math.ceil(math.prod(d) * hlo.element_bits(t) / 8) for t, d in parts)


def _category(instruction: hlo.Instruction, flops: float) -> str:
  opcode = instruction.opcode
  target = instruction.attribute("custom_call_target").strip('"')
  if opcode == "custom-call":
    if target.startswith("__cudnn$"):
      return "cudnn"
    return "gemm" if target.startswith(_GEMM_TARGETS) else "custom-call"
  if opcode == "fusion":
    return "gemm" if flops else "fusion"
  if opcode in ("copy", "copy-start"):
    return "copy"
  if opcode.removesuffix("-start") in _COLLECTIVES:
    return "collective"
  return "other"


def _one_block_by_rule(instruction: hlo.Instruction, category: str) -> bool:
  """The rule without launch grids (see the module docstring)."""
  kind = instruction.json_attribute("backend_config").get("fusion_backend_config", {}).get("kind")
  if category != "fusion" or instruction.attribute("kind") == "kCustom" or kind:
    return False
  return all(math.prod(dims) <= ONE_BLOCK_ELEMENTS for _, dims in hlo.arrays(instruction.shape))


def _sliced_bytes(fused: hlo.Computation, name: str) -> int | None:
  """The bytes of the slices through which alone a fused computation reads the value `name`
  (looking through bitcasts), or None where anything else reads it."""
  users = fused.users.get(name, [])
  total = 0
  for user in users:
    if user.opcode == "bitcast":
      inner = _sliced_bytes(fused, user.name)
      if inner is None:
        return None
      total += inner
    elif user.opcode in ("slice", "dynamic-slice") and user.operands[0] == name:
      total += hlo.shape_bytes(user.shape)
    else:
      return None
  return total if users else None


def _operand_bytes(instruction: hlo.Instruction, computation, module: hlo.Module) -> int:
  """The bytes a kernel reads: each distinct operand whole, except a fusion's operand that its
  computation reads only through slices (`slice`, `dynamic-slice`, through bitcasts): the
  sliced regions' bytes, at most the operand's."""
  whole = {name: hlo.shape_bytes(computation.shape_of(name)) for name in instruction.operands}
  fused = [module.computations.get(c) for c in instruction.called("calls")]
  if instruction.opcode != "fusion" or len(fused) != 1 or fused[0] is None:
    return sum(whole.values())
  read = dict.fromkeys(whole, 0)
  parameters = fused[0].parameters()
  for number, name in enumerate(instruction.operands):
    parameter = parameters.get(number)
    sliced = None if parameter is None else _sliced_bytes(fused[0], parameter.name)
    read[name] += whole[name] if sliced is None else sliced
  return sum(min(read[name], whole[name]) for name in whole)


@dataclasses.dataclass
class _Reader:
  module: hlo.Module
  grids: dict | None
  kernels: list = dataclasses.field(default_factory=list)
  loops: list = dataclasses.field(default_factory=list)

  def read(self, name: str, launches: int, where: str, seen: frozenset = frozenset()) -> None:
    computation = self.module.computations.get(name)
    if computation is None or name in seen:
      return
    seen = seen | {name}
    for instruction in computation.instructions:
      opcode = instruction.opcode
      if opcode == "while":
        trips = instruction.json_attribute("backend_config").get("known_trip_count", {}).get("n")
        self.loops.append({"instruction": instruction.name, "trips": trips and int(trips)})
        for body in instruction.called("body"):
          self.read(body, launches * int(trips or 1), instruction.name, seen)
        if not trips:
          for condition in instruction.called("condition"):
            self.read(condition, launches, instruction.name, seen)
      elif opcode in ("call", "conditional", "async-start"):
        for key in ("to_apply", "calls", "branch_computations"):
          for called in instruction.called(key):
            self.read(called, launches, where, seen)
        for key in ("true_computation", "false_computation"):
          for called in instruction.called(key):
            self.read(called, launches, where, seen)
      elif opcode not in _QUIET and not opcode.endswith("-done"):  # -done halves: no launch
        self.kernels.append(self._kernel(instruction, computation, launches, where))

  def _kernel(self, instruction, computation, launches: int, where: str) -> Kernel:
    if instruction.opcode == "custom-call":
      flops = _custom_call_flops(instruction, computation)
    elif instruction.opcode == "fusion":
      flops = sum(_computation_flops(self.module, c) for c in instruction.called("calls"))
    else:
      flops = 0.0
    category = _category(instruction, flops)
    operand_bytes = _operand_bytes(instruction, computation, self.module)
    if category == "copy":
      output_bytes = operand_bytes
    else:
      output_bytes = _output_bytes(instruction)
    grid = self.grids.get(instruction.name) if self.grids is not None else None
    if self.grids is not None:
      one_block = grid == (1, 1, 1)
    else:
      one_block = _one_block_by_rule(instruction, category)
    metadata = instruction.metadata()
    return Kernel(
      name=instruction.name,
      category=category,
      launches=launches,
      bytes=operand_bytes + output_bytes,
      flops=flops,
      grid=grid,
      one_block=one_block,
      source=self.module.source(metadata),
      op_name=metadata.get("op_name", ""),
      where=where,
    )


def read_kernels(text: str, read: thunks.Thunks | None = None) -> tuple[list[Kernel], list[dict]]:
  """`(kernels, loops)` of an optimized GPU HLO module's text, in launch order; the grids of
  `read` (the program's thunk sequences) decide which run on one block, else the rule does.
  `loops`: `{"instruction", "trips"}` per while loop (trips None: not known, its body counted
  once)."""
  module = hlo.parse_module(text)
  reader = _Reader(module, read.grids if read is not None else None)
  reader.read(module.entry.name, 1, "ENTRY")
  return reader.kernels, reader.loops


def _listed(kernel: Kernel, peak_flops: float, bandwidth: float) -> dict:
  return {
    "name": kernel.name,
    "category": kernel.category,
    "launches": kernel.launches,
    "bytes": kernel.bytes * kernel.launches,
    "flops": kernel.flops * kernel.launches,
    "floor_seconds": kernel.floor_seconds(peak_flops, bandwidth),
    "grid": list(kernel.grid) if kernel.grid else None,
    "source": kernel.source,
    "op_name": kernel.op_name,
  }


def summary(
  kernels: list[Kernel],
  loops: list[dict],
  peak_flops: float,
  bandwidth: float,
  read: thunks.Thunks | None = None,
) -> dict:
  """The totals of a program's kernels (every figure per call of the program, loop bodies
  times their trips) and the `TOP` largest by bytes and by FLOPs: a JSON-ready dict. `read`:
  the thunk sequences the kernels' grids came from (None: the rule decided), and with them
  what the host launches (`thunks.host_launches`)."""
  count = lambda test: sum(k.launches for k in kernels if test(k))
  floors = [k.floor_seconds(peak_flops, bandwidth) for k in kernels]
  memory_bound = [k.bytes / bandwidth >= k.flops / peak_flops for k in kernels]
  listed = lambda key: [
    _listed(k, peak_flops, bandwidth)
    for k in sorted(kernels, key=lambda k: -key(k) * k.launches)[:TOP]
  ]
  return {
    "basis": "estimate from the optimized HLO's shapes (not a measurement)",
    "kernels": count(lambda k: True),
    "one_block_kernels": count(lambda k: k.one_block),
    "one_block_basis": (
      "the compiler's thunk sequence (launch grids)"
      if read is not None
      else f"rule: an XLA fusion whose outputs have at most {ONE_BLOCK_ELEMENTS} element(s)"
    ),
    "host_launches": read.host_launches if read is not None else None,
    "gemms": count(lambda k: k.category == "gemm"),
    "cudnn_calls": count(lambda k: k.category == "cudnn"),
    "copies": count(lambda k: k.category == "copy"),
    "collectives": count(lambda k: k.category == "collective"),
    "bytes": sum(k.bytes * k.launches for k in kernels),
    "flops": sum(k.flops * k.launches for k in kernels),
    "attention_flops": sum(k.flops * k.launches for k in kernels if k.category == "cudnn"),
    "floor_seconds": sum(floors),
    "memory_bound_floor_seconds": sum(f for f, m in zip(floors, memory_bound) if m),
    "loops": loops,
    "largest_by_bytes": listed(lambda k: k.bytes),
    "largest_by_flops": [x for x in listed(lambda k: k.flops) if x["flops"]],
  }
