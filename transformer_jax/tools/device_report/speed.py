"""Stage c, fast on the device: the train steps of `experiments/wmt14.py` on packed batches.

A train step is compiled ahead of time (its compile time, and the compiler's
per-device memory for this device: the local prediction), run once, then
`warmup_steps` untimed and `timed_steps` timed steps, each to its end on the
device. Throughput counts the batch's non-padding target tokens; MFU is the
model's FLOPs (`train.objective.train_flops`) against a bf16 matmul measured
in the same process and against the chip's datasheet peak. Peak memory is the
device's own count (`memory_stats()`), one process per variant so that it is
that variant's, read before the matmul is measured. A few more steps are traced
with the profiler, and their time summed by XLA op.
"""

import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import config as config_lib
from transformer_jax.compile import analysis, targets
from transformer_jax.conventions import EOS_ID, UNK_ID
from transformer_jax.experiment import Experiment, make_trainer
from transformer_jax.tools.device_report import op_times
from transformer_jax.tools.timing import batch_flops, peak_memory_bytes, summary, timed


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
  batch = {
    key: np.zeros((rows, length), np.int32)
    for key in (
      "inputs",
      "targets",
      "inputs_segmentation",
      "targets_segmentation",
      "inputs_position",
      "targets_position",
    )
  }
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


def matmul_rate(size: int, runs: int = 10, dtype=jnp.bfloat16) -> float:
  """FLOP/s of a `size`^3 matmul of random `dtype` matrices: the median of `runs` after two."""
  keys = jax.random.split(jax.random.key(0))
  a, b = (jax.random.normal(key, (size, size), dtype) for key in keys)
  matmul = jax.jit(jnp.matmul)
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


def train_speed(
  experiment: Experiment, rows: int, length: int, *, timed_steps: int, warmup_steps: int
) -> tuple[dict, Callable[[int], dict]]:
  """Compile, run and time the train step of `experiment` on a packed `rows` x `length` batch;
  the device's peak memory is read right after. Returns the figures, and a function that traces
  that many more steps and sums their time by XLA op (`op_times`)."""
  trainer, _ = make_trainer(experiment, vocab_size=experiment.data.vocab_size)
  placement = trainer.placement
  cfg = placement.model.config
  local = packed_batch(rows, length, cfg.vocab_size)
  state = trainer.init()
  batch = placement.global_batch(local)
  start = time.perf_counter()
  compiled = placement.run(lambda: trainer.jitted_step.lower(state, batch).compile())
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
  times = [timed(step) for _ in range(timed_steps)]
  peak, kind = peak_memory_bytes()
  peak = peak if kind == "device peak" else None  # Not the process's RSS, where no device counts.
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
    "model_flops_per_step": batch_flops(cfg, local),
    "loss_first_last": per_token,
    "nonfinite_steps": int(sum(float(m["nonfinite"]) for m in metrics)),
    "peak_bytes": peak,
    "predicted_local": {
      "total_bytes": predicted.total_bytes,
      "temp_bytes": predicted.temp_bytes,
      "argument_bytes": predicted.argument_bytes,
      "cudnn_attention_calls": predicted.cudnn_attention_calls,
    },
  }
  return figures, functools.partial(_op_times, step, compiled=compiled)


def _op_times(step, steps: int, compiled) -> dict:
  """`steps` of `step` traced and summed by op; a profiler that fails here (no CUPTI, say) costs
  only this record: {"error": ...}."""
  try:
    trace = op_times.trace(step, steps)
    return op_times.summarize(trace.planes, steps, described=op_times.describe(compiled.as_text()))
  except Exception as error:  # Whatever it is, the timed figures stay.
    return {"error": f"{type(error).__name__}: {error}"[:500]}


def measure(
  plan, name: str, rows: int, length: int, timed_steps: int, result, profile_steps: int = 0
) -> None:
  """The train step of variant `name` at `rows` x `length`, then the matmul rate (after the peak
  memory was read) and the MFU against it and against the chip's datasheet peak; then, with the
  figures kept, `profile_steps` more steps traced where the step's time allows."""
  spec, overrides = plan.variants[name]
  kind = jax.local_devices()[0].device_kind
  result.put(variant=name, experiment=spec, overrides=overrides, device_kind=kind)
  figures, trace = train_speed(
    experiment_of(spec, overrides),
    rows,
    length,
    timed_steps=timed_steps,
    warmup_steps=plan.warmup_steps,
  )
  result.put(**figures)
  rate = matmul_rate(plan.matmul_size)
  chip = chip_of(kind)
  flops_per_second = figures["model_flops_per_step"] / figures["step_seconds"]["median"]
  result.put(
    matmul_size=plan.matmul_size,
    matmul_flops_per_second=rate,
    spec_flops_per_second=chip.peak_flops if chip else None,
    mfu_vs_measured_matmul=flops_per_second / rate,
    mfu_vs_spec=flops_per_second / chip.peak_flops if chip else None,
  )
  if not profile_steps:
    return
  if result.left() < MIN_PROFILE_SECONDS:
    result.put(op_times={"skipped": f"{result.left():.0f} s left of the step's limit"})
  else:
    result.put(op_times=trace(profile_steps))


# The least time left of a step's limit for tracing (the profiler's start, the steps, the export
# and reading the trace).
MIN_PROFILE_SECONDS = 15.0


def run(plan, step, result, context) -> None:
  del context
  measure(plan, step.part, plan.rows, plan.length, plan.timed_steps, result, plan.profile_steps)
