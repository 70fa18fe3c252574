"""What every benchmark shares: timing a call to its end on the device, summaries of the times,
timing several step functions in alternating blocks, peak memory, and a batch's real tokens and
training FLOPs."""

import resource
import statistics
import time

import jax
import numpy as np

from transformer_jax.model.config import train_flops
from transformer_jax.model.transformer import TransformerConfig


def timed(fn) -> float:
  """Seconds of `fn()` until its result is ready on the device."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def summary(times) -> dict:
  """Median, min and max of `times`."""
  return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def peak_memory_bytes() -> tuple[int, str]:
  """Peak device memory where the backend reports it, else the process's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def time_alternating(runs: dict, *, steps: int, warmup: int, block: int) -> tuple[dict, dict]:
  """`(first, times)`: each of `runs` (name -> step function) timed on its first call (compile
  included), then `steps` times after `warmup` untimed calls.

  The runs alternate in blocks of `block` timed steps, so all see the same
  machine conditions; each block starts with an untimed step, since a step
  right after another framework's (or any pause) runs slower (docs/performance.md).
  """
  first = {name: timed(fn) for name, fn in runs.items()}
  for _ in range(warmup):
    for fn in runs.values():
      fn()
  times = {name: [] for name in runs}
  while any(len(t) < steps for t in times.values()):
    for name, fn in runs.items():
      fn()
      times[name] += [timed(fn) for _ in range(min(block, steps - len(times[name])))]
  return first, times


def real_tokens(batch) -> int:
  """The batch's tokens that are not padding, both sides."""
  return int(np.sum(batch["inputs_segmentation"] > 0) + np.sum(batch["targets_segmentation"] > 0))


def batch_flops(cfg: TransformerConfig, batch) -> float:
  """The model FLOPs of one training step of `cfg` on `batch` (`model.config.train_flops`)."""
  return train_flops(
    cfg,
    source_tokens=float(np.sum(batch["inputs_segmentation"] > 0)),
    target_tokens=float(np.sum(batch["targets_segmentation"] > 0)),
    source_length=batch["inputs"].shape[1],
    target_length=batch["targets"].shape[1],
  )
