"""Run reporting: log lines, TensorBoard scalars, a progress bar, MFU against a measured peak."""

import datetime
import logging
import sys
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import tqdm

from transformer_jax.model.loss import perplexity
from transformer_jax.train.events import EventWriter

log = logging.getLogger(__name__)


def measure_matmul_flops(dtype=jnp.float32, device: jax.Device | None = None) -> float:
  """FLOP/s of a square matmul on one device, best of 3 (a stand-in for the peak)."""
  device = device or jax.local_devices()[0]
  n = 1024 if device.platform == "cpu" else 8192
  x = jax.device_put(jnp.ones((n, n), dtype), device)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    matmul(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * n**3 / best


# Metrics of a step that are not averaged per token.
NOT_PER_TOKEN = ("tokens", "source_tokens", "grad_norm", "flops", "nonfinite", "bleu")


def per_token(sums: Mapping[str, float]) -> dict:
  """Every summed loss metric per target token (`loss`, `nll` and whatever else the loss
  function sums), and the perplexity where there is an `nll`."""
  tokens = max(float(sums["tokens"]), 1.0)
  scalars = {k: float(v) / tokens for k, v in sums.items() if k not in NOT_PER_TOKEN}
  if "nll" in sums:
    scalars["perplexity"] = perplexity(float(sums["nll"]), tokens)
  return scalars


class TrainLogger:
  """What the user sees of a run: log lines, TensorBoard scalars and a terminal progress bar.

  Every process logs lines through Python's logging; process 0 also writes TensorBoard
  event files (`events.EventWriter`) into `tensorboard_dir` and,
  when stderr is a terminal, draws a progress bar.
  """

  def __init__(
    self,
    tensorboard_dir: str,
    *,
    total_steps: int,
    start_step: int,
    learning_rate_fn,
    peak_flops: float,
    peak_measured: bool = False,
  ):
    """`peak_flops`: of all devices together; `peak_measured`: it is `measure_matmul_flops`'s
    start-up measurement, not a given peak."""
    self.total_steps = total_steps
    self.learning_rate_fn, self.peak_flops = learning_rate_fn, peak_flops
    self.peak_measured, self.warned_about_peak = peak_measured, False
    self.last_train, self.last_eval, self.tokens = {}, {}, 0.0
    self.skipped = 0  # Non-finite updates skipped in this run.
    main = jax.process_index() == 0
    self.writer = EventWriter(tensorboard_dir, purge_step=start_step) if main else None
    self.bar = (
      tqdm.tqdm(total=total_steps, initial=start_step, unit="step", leave=False, dynamic_ncols=True)
      if main and sys.stderr.isatty()
      else None
    )

  def advance(self):
    if self.bar is not None:
      self.bar.update(1)

  def _line(self, text: str):
    if self.bar is not None:
      self.bar.clear()
    log.info("%s", text)
    if self.bar is not None:
      self.bar.refresh()

  def train(
    self,
    step: int,
    sums: Mapping[str, float],
    steps: int,
    seconds: float,
    *,
    compiling: bool = False,
  ) -> dict:
    """Report `steps` steps ending at `step` that took `seconds`; returns the derived scalars.

    `sums` are the summed step metrics. With `compiling`, the time includes
    compilation, so speeds are not reported.
    """
    self.tokens += float(sums["tokens"])
    skipped = int(sums.get("nonfinite", 0))
    self.skipped += skipped
    scalars = {
      **per_token(sums),
      "learning_rate": float(self.learning_rate_fn(step - 1)),
      "grad_norm": float(sums["grad_norm"]) / max(steps - skipped, 1),
      "nonfinite_steps": float(skipped),
    }
    line = (
      f"step {step}/{self.total_steps} | loss {scalars['loss']:.4f}{_ppl(scalars)} | "
      f"lr {scalars['learning_rate']:.3e} | grad_norm {scalars['grad_norm']:.3f}"
    )
    if skipped:
      line += (
        f" | skipped {skipped} non-finite update{'s' * (skipped > 1)} ({self.skipped} this run)"
      )
    if compiling:
      line += f" | compiled and ran step {step} in {seconds:.1f} s"
    else:
      scalars["tokens_per_s"] = float(sums["tokens"]) / seconds
      if "source_tokens" in sums:
        scalars["source_tokens_per_s"] = float(sums["source_tokens"]) / seconds
      scalars["s_per_step"] = seconds / steps
      line += f" | {scalars['tokens_per_s']:,.0f} tok/s | {scalars['s_per_step']:.3f} s/step"
      if "flops" in sums:
        scalars["mfu"] = float(sums["flops"]) / (seconds * self.peak_flops)
        self._check_peak(scalars["mfu"])
        line += f" | MFU {100 * scalars['mfu']:.1f}%"
      eta = datetime.timedelta(seconds=round((self.total_steps - step) * seconds / steps))
      line += f" | ETA {eta}"
    self.last_train = scalars
    self._line(line)
    self._write("train", step, scalars)
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{scalars['loss']:.3f}", refresh=False)
    return scalars

  def _check_peak(self, mfu: float):
    """Warn once when the model outruns the peak measured at start-up (which a busy machine
    measures low), so that MFU above 100% is not taken for a figure."""
    if mfu <= 1.0 or not self.peak_measured or self.warned_about_peak:
      return
    self.warned_about_peak = True
    if self.bar is not None:
      self.bar.clear()
    log.warning(
      "MFU %.0f%%: the model ran faster than the square matmul measured at start-up "
      "(%.3g FLOP/s over all devices), so that measurement was low (a busy machine?) and this "
      "run's MFU figures are relative to it; give the device's peak as "
      "--config.peak_flops_per_device",
      100 * mfu,
      self.peak_flops,
    )

  def evaluation(self, step: int, split: str, sums: Mapping[str, float]) -> dict:
    """Report dev-set loss sums (and `bleu`, if there) at `step`; returns loss, nll, perplexity
    (and bleu)."""
    scalars = per_token(sums)
    line = (
      f"eval ({split}) at step {step} | loss {scalars['loss']:.4f}{_ppl(scalars)} | "
      f"{int(sums['tokens']):,} target tokens"
    )
    if "bleu" in sums:
      scalars["bleu"] = float(sums["bleu"])
      line += f" | BLEU {scalars['bleu']:.2f}"
    self._line(line)
    self._write(f"eval_{split}", step, scalars)
    self.last_eval = {"split": split, **scalars}
    return scalars

  def _write(self, prefix: str, step: int, scalars: Mapping[str, float]):
    if self.writer is not None:
      for name, value in scalars.items():
        self.writer.scalar(f"{prefix}/{name}", value, step)
      self.writer.flush()

  def close(
    self,
    step: int,
    *,
    seconds: float,
    steps: int,
    checkpoints: str,
    phases: Mapping[str, float] | None = None,
  ):
    """Log the final summary line (`steps` steps of this run took `seconds`, of which `phases`
    maps phase names to seconds); close the writer and bar."""
    if self.bar is not None:
      self.bar.close()
    text = (
      f"done: step {step}/{self.total_steps}; this run {steps} steps in "
      f"{datetime.timedelta(seconds=round(seconds))}, {self.tokens / seconds:,.0f} "
      "target tok/s overall (compilation and evaluation included)"
    )
    if self.last_train:
      text += f"; last train loss {self.last_train['loss']:.4f}{_ppl(self.last_train, ', ')}"
    if self.last_eval:
      text += (
        f"; {self.last_eval['split']} loss {self.last_eval['loss']:.4f}{_ppl(self.last_eval, ', ')}"
      )
      if "bleu" in self.last_eval:
        text += f", BLEU {self.last_eval['bleu']:.2f}"
    if self.skipped:
      text += f"; {self.skipped} non-finite updates skipped"
    if phases:
      text += "; " + ", ".join(
        f"{name.replace('_', ' ')} {value:.1f} s" for name, value in phases.items()
      )
    log.info("%s; checkpoints in %s", text, checkpoints)
    if self.writer is not None:
      self.writer.close()


def _ppl(scalars: Mapping[str, float], separator: str = " | ") -> str:
  """The perplexity's part of a log line, where there is one."""
  return f"{separator}ppl {scalars['perplexity']:.2f}" if "perplexity" in scalars else ""
