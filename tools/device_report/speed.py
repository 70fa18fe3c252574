"""Stage c, fast on the device: the train steps of `experiments/wmt14.py` on packed batches.

A train step is compiled ahead of time (its compile time, and the compiler's
per-device memory for this device: the local prediction), run once, then
`warmup_steps` untimed; the device's peak memory is read (its own count,
`memory_stats()`, one process per variant so that it is that variant's). Then a
bf16 matmul is measured, right before the timing, so that MFU is held to the
chip's clocks of that moment; then `timed_steps` steps, each to its end on the
device, and `chained_steps` dispatched back to back with one wait at the end
(the training loop's pattern); then the matmul again. Throughput counts the
batch's non-padding target tokens; MFU is the model's FLOPs
(`model.config.train_flops`) against the matmul and the chip's datasheet peak.
The executable that ran is read for its kernels, bytes, FLOPs and roofline floor
(`roofline.py`, estimates) beside the measured step; for the variants the plan
profiles, a few more steps are traced and their time summed by XLA op, each op
beside its kernel's floor.
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tools.device_report import op_times, roofline
from tools.timing import batch_flops, peak_memory_bytes, summary, timed
from transformer_jax import config as config_lib
from transformer_jax.compile import analysis, targets, thunks
from transformer_jax.conventions import BATCH_KEYS, EOS_ID, UNK_ID
from transformer_jax.experiment import Experiment, make_trainer


def experiment_of(spec: str, overrides: dict) -> Experiment:
  """The experiment of config file `spec` with `overrides` ({"model.remat": "full", ...})."""
  config = config_lib.load_file(spec)
  for path, value in overrides.items():
    *sections, field = path.split(".")
    node = config
    for section in sections:
      node = node[section]
    node[field] = value
  return config_lib.parse(config)


def packed_batch(
  rows: int, length: int, vocab_size: int, seed: int = 0, pair_lengths=(8, 64), tries: int = 8
) -> dict:
  """A packed batch of random pairs (each side `pair_lengths[0]` to `[1]` tokens, EOS last): a row
  takes pairs until `tries` draws in a row fit it on neither side; padding after them."""
  rng = np.random.default_rng(seed)
  batch = {key: np.zeros((rows, length), np.int32) for key in BATCH_KEYS}
  for row in range(rows):
    used, segment, misses = {"inputs": 0, "targets": 0}, 1, 0
    while misses < tries:
      sizes = {side: int(rng.integers(pair_lengths[0], pair_lengths[1] + 1)) for side in used}
      if any(used[side] + sizes[side] > length for side in used):
        misses += 1
        continue
      for side, size in sizes.items():
        span = slice(used[side], used[side] + size)
        batch[side][row, span] = rng.integers(UNK_ID + 1, vocab_size, size)
        batch[side][row, span.stop - 1] = EOS_ID
        batch[f"{side}_segmentation"][row, span] = segment
        batch[f"{side}_position"][row, span] = np.arange(size)
        used[side] += size
      segment, misses = segment + 1, 0
  return batch


# One jitted matmul, so that the matmul after a step's timing reuses the compile of the one before.
_MATMUL = jax.jit(jnp.matmul)


def matmul_rate(size: int, runs: int = 10, dtype=jnp.bfloat16) -> float:
  """FLOP/s of a `size`^3 matmul of random `dtype` matrices: the median of `runs` after two. Its
  matrices are freed on return."""
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(key, (size, size), dtype) for key in keys)
  matmul = _MATMUL
  for _ in range(2):
    matmul(a, b).block_until_ready()
  return 2.0 * size**3 / statistics.median(timed(lambda: matmul(a, b)) for _ in range(runs))


# The device kinds (as JAX names them) of the parts whose datasheet figures targets.CHIPS holds:
# the SXM boards, not the PCIe or NVL ones, whose peaks are lower.
_SXM_KINDS = {
  "NVIDIA H100 80GB HBM3": "h100",
  "NVIDIA H200": "h200",
  "NVIDIA A100-SXM4-80GB": "a100",
}


def chip_of(device_kind: str) -> targets.Chip | None:
  """The datasheet chip of a device (None: not one whose peak is known here)."""
  name = _SXM_KINDS.get(device_kind.strip())
  return targets.CHIPS[name] if name else None


def floor_chip(device_kind: str, target: str) -> tuple[targets.Chip, str]:
  """The chip whose peak and bandwidth the roofline floor is taken at, and why: this device's
  where its datasheet is known here, else the compile mode's target's (a CPU dry run, a PCIe
  board), said so."""
  chip = chip_of(device_kind)
  if chip is not None:
    return chip, f"this device's ({device_kind})"
  named = targets.parse_target(target).chip
  return named, f"the target {target}'s: no datasheet here for {device_kind or 'this device'}"


@dataclasses.dataclass
class Ran:
  """What a timed train step leaves for the figures that follow: one more step, the executable
  and the thunk sequences its compiler wrote (None: not a GPU, or none found)."""

  step: object
  compiled: object
  read: thunks.Thunks | None


def _compile(lowered):
  """`(executable, thunks)`: on a GPU, compiled with a dump of the compiler's output, from
  which its thunk sequences are read (`compile/thunks.py`); the executable is the same."""
  if jax.default_backend() == "gpu":
    return thunks.compile_with_thunks(lowered)
  return lowered.compile(), None


def train_speed(
  experiment: Experiment,
  rows: int,
  length: int,
  *,
  timed_steps: int,
  warmup_steps: int,
  chained_steps: int,
  matmul_size: int,
) -> tuple[dict, Ran]:
  """Compile, run and time the train step of `experiment` on a packed `rows` x `length` batch,
  in the order of the module's docstring. Returns the figures and what the step left (`Ran`)."""
  trainer, _ = make_trainer(experiment, vocab_size=experiment.data.vocab.size)
  placement = trainer.placement
  cfg = placement.model.config
  local = packed_batch(rows, length, cfg.vocab_size)
  state = trainer.init()
  batch = placement.global_batch(local)
  start = time.perf_counter()
  compiled, read = placement.run(lambda: _compile(trainer.jitted_step.lower(state, batch)))
  predicted = analysis.measure_compiled(compiled, time.perf_counter() - start)
  metrics = []

  def step():
    nonlocal state
    state, step_metrics = compiled(state, batch)
    metrics.append(step_metrics)
    return state, step_metrics

  first = timed(step)
  for _ in range(warmup_steps):
    jax.block_until_ready(step())
  peak, kind = peak_memory_bytes()  # The step's own peak: before the matmul's matrices.
  peak = peak if kind == "device peak" else None  # Not the process's RSS, where no device counts.
  before = matmul_rate(matmul_size)
  times = [timed(step) for _ in range(timed_steps)]
  chained = timed(lambda: [step() for _ in range(chained_steps)][-1])
  after = matmul_rate(matmul_size)
  per_token = [float(m["loss"]) / max(float(m["tokens"]), 1.0) for m in (metrics[0], metrics[-1])]
  target_tokens = int(np.sum(local["targets_segmentation"] > 0))
  median = statistics.median(times)
  figures = {
    "model": {
      "d_model": cfg.d_model,
      "num_layers": cfg.num_layers,
      "num_decoder_layers": cfg.decoder_depth,
      "heads": cfg.num_heads,
      "d_ff": cfg.d_ff,
      "vocab_size": cfg.vocab_size,
      "dtype": cfg.dtype,
      "attention": cfg.attention_impl,
      "remat": cfg.remat,
    },
    "rows": rows,
    "length": length,
    "target_tokens": target_tokens,
    "real_fraction": float(np.mean(local["targets_segmentation"] > 0)),
    "compile_seconds": predicted.compile_seconds,
    "first_step_seconds": first,
    "step_seconds": summary(times),
    "timed_steps": len(times),
    "target_tokens_per_second": target_tokens / median,
    "back_to_back": {
      "steps": chained_steps,
      "seconds": chained,
      "step_seconds": chained / chained_steps,
      "target_tokens_per_second": target_tokens * chained_steps / chained,
    },
    "model_flops_per_step": batch_flops(cfg, local),
    "loss_first_last": per_token,
    "nonfinite_steps": int(sum(float(m["nonfinite"]) for m in metrics)),
    "peak_bytes": peak,
    "matmul_size": matmul_size,
    "matmul_flops_per_second": before,
    "matmul_after_flops_per_second": after,
    "predicted_local": {
      "total_bytes": predicted.total_bytes,
      "temp_bytes": predicted.temp_bytes,
      "argument_bytes": predicted.argument_bytes,
      "cudnn_attention_calls": predicted.cudnn_attention_calls,
    },
  }
  return figures, Ran(step, compiled, read)


def predicted_kernels(ran: Ran, chip: targets.Chip, chip_basis: str) -> tuple[dict, dict]:
  """The kernels of the executable that ran, with their bytes, FLOPs and roofline floor at
  `chip` (`roofline.program_kernels`: estimates), and the kernels by name."""
  program = f"the executable that ran ({jax.default_backend()})"
  return roofline.program_kernels(ran.compiled.as_text(), chip, chip_basis, program, ran.read)


def _op_times(step, steps: int, compiled, kernels: dict | None = None) -> dict:
  """`steps` of `step` traced and summed by op, each op beside its kernel's floor where `kernels`
  (`roofline.by_name`) are given; a profiler that fails here (no CUPTI, say) costs only this
  record: {"error": ...}."""
  try:
    trace = op_times.trace(step, steps)
    ops = op_times.summarize(
      trace.planes, steps, top=None, described=op_times.describe(compiled.as_text())
    )
    if kernels is None:
      ops["ops"] = ops["ops"][: roofline.TOP_OPS]
      return ops
    return {**ops, **roofline.attribute(ops["ops"], ops["busy_seconds_per_step"], kernels)}
  except Exception as error:  # Whatever it is, the timed figures stay.
    return {"error": f"{type(error).__name__}: {error}"[:500]}


def measure(
  plan,
  name: str,
  rows: int,
  length: int,
  timed_steps: int,
  result,
  profile_steps: int = 0,
  *,
  chained_steps: int | None = None,
  target: str = "1xh100",
) -> None:
  """The train step of variant `name` at `rows` x `length` (the matmul right before its timing
  and right after), the MFU against the matmul and the chip's datasheet peak; then the kernels
  and roofline floor of its executable beside the measured step (`target`: the compile mode's,
  whose chip the floor takes where this device's is not known); then, with the figures kept,
  `profile_steps` more steps traced where the step's time allows."""
  spec, overrides = plan.variants[name]
  kind = jax.local_devices()[0].device_kind
  result.put(variant=name, experiment=spec, overrides=overrides, device_kind=kind)
  figures, ran = train_speed(
    experiment_of(spec, overrides),
    rows,
    length,
    timed_steps=timed_steps,
    warmup_steps=plan.warmup_steps,
    chained_steps=chained_steps or plan.chained_steps,
    matmul_size=plan.matmul_size,
  )
  result.put(**figures)
  chip = chip_of(kind)
  flops_per_second = figures["model_flops_per_step"] / figures["step_seconds"]["median"]
  result.put(
    spec_flops_per_second=chip.peak_flops if chip else None,
    mfu_vs_measured_matmul=flops_per_second / figures["matmul_flops_per_second"],
    mfu_vs_spec=flops_per_second / chip.peak_flops if chip else None,
  )
  floor, basis = floor_chip(kind, target)
  kernels = None
  try:
    record, kernels = predicted_kernels(ran, floor, basis)
    result.put(
      predicted_kernels=record,
      measured_over_floor=roofline.over(figures["step_seconds"]["median"], record["floor_seconds"]),
      back_to_back_over_floor=roofline.over(
        figures["back_to_back"]["step_seconds"], record["floor_seconds"]
      ),
    )
  except Exception as error:  # The reader's failure costs only its own record.
    result.put(predicted_kernels={"error": f"{type(error).__name__}: {error}"[:500]})
  if not profile_steps:
    return
  if result.left() < MIN_PROFILE_SECONDS:
    result.put(op_times={"skipped": f"{result.left():.0f} s left of the step's limit"})
  else:
    result.put(op_times=_op_times(ran.step, profile_steps, ran.compiled, kernels))


# The least time left of a step's limit for tracing (the profiler's start, the steps, the export
# and reading the trace).
MIN_PROFILE_SECONDS = 15.0


def run(plan, step, result, context) -> None:
  name = step.part
  profile = plan.profile_steps if name in plan.profiled else 0
  measure(
    plan, name, plan.rows, plan.length, plan.timed_steps, result, profile, target=context.target
  )
