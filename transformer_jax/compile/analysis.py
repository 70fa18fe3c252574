"""What one compiled program needs per device and what the compiler estimates it costs.

Bytes come from `Compiled.memory_analysis()`; FLOPs, bytes accessed and the
estimated seconds from `Compiled.cost_analysis()`, which XLA's TPU compiler
fills in and its GPU compiler, without a device, leaves empty.

XLA's TPU estimate (`optimal_seconds`) comes out negative for large programs:
it counts -1 s for each `ConcatBitcast` custom call (the prefetches the
compiler inserts) in the module. That is read off its figures, not a
documented rule: `estimated_seconds` adds those seconds back and keeps the
result only when it is at least the time the compiler's own FLOPs take at
the chip's peak (a roofline, which no program can beat). The caller drops the
estimate of a program built around a loop (scanned layers, gradient
accumulation, a search): XLA's cost analysis counts a loop's body once.

For a GPU target, where the cost analysis is empty, `kernels` holds what the
optimized HLO says of the kernels the program launches, their bytes, FLOPs and
roofline floor (`kernels.py`: estimates read off the compiler's output).
"""

import dataclasses
import re
import time

from transformer_jax.compile import kernels, thunks
from transformer_jax.compile.targets import Chip

_PREFETCH = re.compile(r'custom_call_target="ConcatBitcast"')
_CUDNN_ATTENTION = re.compile(r'custom_call_target="__cudnn\$fmha')


def cudnn_attention_calls(hlo_text: str) -> int:
  """How many cuDNN fused attention kernels (forward and backward) a compiled module calls."""
  return len(_CUDNN_ATTENTION.findall(hlo_text))


@dataclasses.dataclass(frozen=True)
class ProgramCost:
  """Per-device bytes of a compiled program and the compiler's cost figures (None: not given)."""

  compile_seconds: float
  argument_bytes: int
  output_bytes: int
  alias_bytes: int  # Output bytes that reuse donated argument buffers.
  temp_bytes: int
  code_bytes: int
  flops: float | None
  bytes_accessed: float | None
  optimal_seconds: float | None  # The compiler's raw figure.
  prefetch_calls: int
  cudnn_attention_calls: int  # cuDNN fused attention kernels, forward and backward
  refused: str = ""  # The compiler's own out-of-memory error: then only temp_bytes is known.
  kernels: dict | None = None  # GPU targets: `kernels.summary` of the optimized HLO

  @property
  def total_bytes(self) -> int:
    """Arguments, outputs that do not reuse an argument, temporaries and code."""
    return (
      self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes
    )

  def estimated_seconds(self, peak_flops: float, loop: str = "") -> tuple[float | None, str]:
    """`(seconds, why)`: the compiler's estimate corrected for its prefetch calls, or None and
    the reason it cannot be used (`loop` names the loop the program runs, if any)."""
    if self.refused:
      return None, "the compiler refused the program: it does not fit"
    if self.optimal_seconds is None:
      return None, "the compiler gives no cost estimate for this target"
    if loop:
      return None, f"{loop} run as a loop, whose body XLA's cost analysis counts once"
    seconds = self.optimal_seconds + self.prefetch_calls
    floor = (self.flops or 0.0) / peak_flops
    if seconds <= 0 or seconds < floor:
      return None, "the compiler's estimate, corrected, is below the FLOP roofline"
    return seconds, "the compiler's optimal_seconds + 1 s per prefetch call"

  def fits(self, usable_bytes: int) -> bool:
    """Whether the program fits in `usable_bytes` per device (and its compiler took it)."""
    return not self.refused and self.total_bytes <= usable_bytes

  def record(self) -> dict:
    """The figures as a JSON-ready dict."""
    return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


_OUT_OF_MEMORY = re.compile(
  r"RESOURCE_EXHAUSTED: Ran out of memory.*?temporaries \(([\d.]+)([KMGT]?)\)"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def refused_cost(message: str, seconds: float) -> ProgramCost | None:
  """The cost of a program that the compiler refused for lack of memory (XLA's TPU compiler
  does, naming the temporaries it needed), or None for any other error."""
  match = _OUT_OF_MEMORY.search(message)
  if match is None:
    return None
  temp = int(float(match[1]) * _UNITS[match[2]])
  return ProgramCost(
    compile_seconds=seconds,
    argument_bytes=0,
    output_bytes=0,
    alias_bytes=0,
    temp_bytes=temp,
    code_bytes=0,
    flops=None,
    bytes_accessed=None,
    optimal_seconds=None,
    prefetch_calls=0,
    cudnn_attention_calls=0,
    refused=message.strip().splitlines()[0],
  )


def compile_and_measure(lowered, compiler_options=None, chip: Chip | None = None) -> ProgramCost:
  """The `ProgramCost` of a `jax.stages.Lowered`, timing its compile. For a GPU `chip`, the
  compiler's thunk sequences are read from a dump of its output (`thunks.py`) and the kernels
  summed up against the chip's peak and bandwidth."""
  start = time.perf_counter()
  read = None
  try:
    if chip is not None and chip.platform == "gpu":
      compiled, read = thunks.compile_with_thunks(lowered, compiler_options)
    else:
      compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()
  except Exception as error:  # pylint: disable=broad-except  # XLA's errors are JaxRuntimeError.
    refused = refused_cost(str(error), time.perf_counter() - start)
    if refused is None:
      raise
    return refused
  return measure_compiled(compiled, time.perf_counter() - start, chip, read)


def measure_compiled(
  compiled, compile_seconds: float, chip: Chip | None = None, read: thunks.Thunks | None = None
) -> ProgramCost:
  """The `ProgramCost` of a `jax.stages.Compiled` that took `compile_seconds` to compile; for a
  GPU `chip`, with its kernels (launch grids and host launches from the thunk sequences `read`,
  else the grids by `kernels.py`'s rule)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, list):  # Older JAX: one dict per module.
    cost = cost[0] if cost else {}
  text = compiled.as_text()
  return ProgramCost(
    compile_seconds=compile_seconds,
    argument_bytes=int(memory.argument_size_in_bytes),
    output_bytes=int(memory.output_size_in_bytes),
    alias_bytes=int(memory.alias_size_in_bytes),
    temp_bytes=int(memory.temp_size_in_bytes),
    code_bytes=int(memory.generated_code_size_in_bytes),
    flops=cost.get("flops"),
    bytes_accessed=cost.get("bytes accessed"),
    optimal_seconds=cost.get("optimal_seconds"),
    prefetch_calls=len(_PREFETCH.findall(text)),
    cudnn_attention_calls=cudnn_attention_calls(text),
    kernels=kernel_summary(text, chip, read) if chip and chip.platform == "gpu" else None,
  )


def kernel_summary(hlo_text: str, chip: Chip, read: thunks.Thunks | None = None) -> dict:
  """`kernels.summary` of a GPU program's optimized HLO text on `chip`."""
  found, loops = kernels.read_kernels(hlo_text, read)
  return kernels.summary(found, loops, chip.peak_flops, chip.memory_bandwidth, read)
