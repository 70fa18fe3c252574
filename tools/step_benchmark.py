"""The train-step benchmark: one model on a fixed synthetic batch, its step timed (optionally
against the same model in PyTorch), with its MFU, peak memory and decoding speed."""

import dataclasses

import jax
import numpy as np

from tools import decode_benchmark
from tools.timing import batch_flops, peak_memory_bytes, real_tokens, summary, time_alternating
from transformer_jax.conventions import PAD_ID, UNK_ID
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement
from transformer_jax.train import objective
from transformer_jax.train.reporting import measure_matmul_flops
from transformer_jax.train.step import Trainer


@dataclasses.dataclass(frozen=True)
class Workload:
  """A model and the shape of its benchmark batch (`batch` pairs, 75% of tokens real)."""

  model: dict
  batch: int
  source_length: int
  target_length: int


WORKLOADS = {
  "small": Workload(
    dict(vocab_size=8192, num_layers=3, d_model=256, d_ff=1024, num_heads=4),
    batch=16,
    source_length=64,
    target_length=64,
  ),
  "base": Workload(
    dict(preset="base", vocab_size=32768), batch=8, source_length=128, target_length=128
  ),
  "big": Workload(
    dict(preset="big", vocab_size=32768), batch=8, source_length=128, target_length=128
  ),
}
REAL_FRACTION = 0.75


def model_config(
  workload: Workload, *, dtype: str, scan_layers: bool, remat: str, max_len: int | None = None
):
  """The TransformerConfig measured, with dropout as in training (0.1); positions up to `max_len`,
  by default the workload's longest row or decoding's output, whichever is longer."""
  fields = dict(workload.model)
  preset = fields.pop("preset", None)
  fields.update(
    dtype=dtype,
    scan_layers=scan_layers,
    remat=remat,
    max_len=max_len
    or max(workload.source_length, workload.target_length, decode_benchmark.OUTPUT_LENGTH),
  )
  if preset:
    return TransformerConfig.preset(preset, **fields)
  return TransformerConfig(**fields)


def paper_trainer(cfg: TransformerConfig) -> Trainer:
  """A Trainer of `cfg`, data parallel over every device, with the paper's Adam and label
  smoothing 0.1."""
  placement = Placement.data_parallel(cfg)
  optimizer, _ = objective.OptimizerSettings().make(cfg.d_model)
  return Trainer(placement, optimizer, transformer_loss(0.1))


def synthetic_batch(workload: Workload, vocab_size: int, seed: int = 0) -> dict:
  """A fixed batch with REAL_FRACTION of each row real tokens, the rest padding."""
  rng = np.random.default_rng(seed)
  batch = {}
  for side, length in (("inputs", workload.source_length), ("targets", workload.target_length)):
    real = int(round(REAL_FRACTION * length))
    ids = rng.integers(UNK_ID + 1, vocab_size, (workload.batch, length)).astype(np.int32)
    ids[:, real:] = PAD_ID
    batch[side] = ids
    batch[f"{side}_segmentation"] = (ids != PAD_ID).astype(np.int32)
    batch[f"{side}_position"] = np.where(ids != PAD_ID, np.arange(length, dtype=np.int32), 0)
  return batch


def run(
  workload: Workload,
  *,
  steps: int,
  warmup: int,
  decode_runs: int,
  dtype: str,
  scan_layers: bool = False,
  remat: str = "none",
  vs: str | None = None,
  block: int = 5,
) -> dict:
  """Measure everything for one workload; returns the results as a JSON-ready dict."""
  cfg = model_config(workload, dtype=dtype, scan_layers=scan_layers, remat=remat)
  matmul_rate = measure_matmul_flops(cfg.compute_dtype)
  trainer = paper_trainer(cfg)
  batch = synthetic_batch(workload, cfg.vocab_size)
  state = trainer.init()

  def ours():
    nonlocal state
    state, metrics = trainer.train_step(state, batch)
    return metrics["loss"]

  runs = {"ours": ours}
  if vs == "torch":
    from tools import torch_reference  # pylint: disable=g-import-not-at-top

    torch_step = torch_reference.build(cfg, label_smoothing=0.1)
    runs["torch"] = lambda: torch_step(batch)
  first, times = time_alternating(runs, steps=steps, warmup=warmup, block=block)

  tokens, flops = real_tokens(batch), batch_flops(cfg, batch)
  results = {
    "config": cfg.record(),
    "workload": dataclasses.asdict(workload),
    "device": str(jax.local_devices()[0].device_kind),
    "devices": jax.device_count(),
    "matmul_flops_per_s": matmul_rate,
    "train_flops_per_step": flops,
    "real_tokens_per_step": tokens,
  }
  devices = {"ours": jax.device_count(), "torch": 1}  # torch runs on the host's CPU
  for name in runs:
    step = summary(times[name])
    results[name] = {
      "first_step_s": first[name],
      "step_s": step,
      "tokens_per_s": tokens / step["median"],
      "mfu": flops / step["median"] / (matmul_rate * devices[name]),
    }
  memory, memory_kind = peak_memory_bytes()
  results["ours"]["peak_memory_bytes"], results["peak_memory_kind"] = memory, memory_kind
  results["ours"]["decode_s"] = decode_benchmark.measure_decoding(
    trainer.placement.model, state.params, decode_runs
  )
  return results


def format_table(results: dict) -> str:
  """The results as a plain-text table (ours, torch and ours/torch where measured)."""
  ours, torch = results["ours"], results.get("torch")
  rows = [
    ("train step, median (s)", ours["step_s"]["median"], torch and torch["step_s"]["median"]),
    ("train step, min (s)", ours["step_s"]["min"], torch and torch["step_s"]["min"]),
    ("train step, max (s)", ours["step_s"]["max"], torch and torch["step_s"]["max"]),
    ("first step (s)", ours["first_step_s"], torch and torch["first_step_s"]),
    ("real tokens/s", ours["tokens_per_s"], torch and torch["tokens_per_s"]),
    ("MFU (%)", 100 * ours["mfu"], torch and 100 * torch["mfu"]),
    (f"{results['peak_memory_kind']} (MiB)", ours["peak_memory_bytes"] / 2**20, None),
    ("beam 4, s/batch (median)", ours["decode_s"]["beam4"]["median"], None),
    ("beam 4, first call (s)", ours["decode_s"]["beam4"]["first"], None),
    ("greedy, s/batch (median)", ours["decode_s"]["greedy"]["median"], None),
  ]
  lines = [f"{'figure':<30}{'ours':>12}" + (f"{'torch':>12}{'ours/torch':>12}" if torch else "")]
  for name, value, other in rows:
    line = f"{name:<30}{value:>12.4g}"
    if torch:
      line += f"{other:>12.4g}{value / other:>12.3f}" if other else f"{'':>12}{'':>12}"
    lines.append(line)
  lines.append(
    f"matmul rate: {results['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s on "
    f"{results['device']}; {results['train_flops_per_step'] / 1e9:.2f} GFLOP/step"
  )
  return "\n".join(lines)
