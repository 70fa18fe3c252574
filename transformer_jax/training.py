"""Training: label-smoothed loss, the paper's schedule, Adam, and the sharded train step.

The train step is a pure function of `(state, batch)`, jit-compiled once per
mesh with explicit in/out shardings and the state donated. Its dropout key is
`fold_in(key(seed), step)`, so a resumed run draws the same masks.
"""

from collections.abc import Mapping
import dataclasses
import datetime
import functools
import os
import signal
import sys
import threading
import time
from typing import Any

from absl import logging
import flax.linen as nn
from flax import struct
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict
import numpy as np
import optax
import tensorboardX
import tqdm

from transformer_jax import checkpointing, data, recovery, sharding, translate, validation
from transformer_jax.model import PRESETS, Transformer, TransformerConfig, count_params

BATCH_KEYS = ("inputs", "targets", "inputs_segmentation", "targets_segmentation",
              "inputs_position", "targets_position")
LOSS_SUMS = ("loss", "nll", "tokens", "source_tokens")  # What `loss_sums` returns.


class TrainState(struct.PyTreeNode):
  """What a train step changes: `step` (int32 scalar), float32 `params` and `opt_state`."""

  step: jax.Array
  params: Any
  opt_state: Any


def paper_learning_rate(step, *, d_model: int, warmup_steps: int, scale: float = 1.0):
  """`scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)` at the 1-based `step`."""
  step = jnp.asarray(step, jnp.float32)
  return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)


def learning_rate_schedule(*, d_model: int, warmup_steps: int, scale: float = 1.0):
  """Optax schedule of the paper's rate.

  Optax counts updates from 0; the paper counts steps from 1. Update `count`
  uses the paper's step `count + 1`, so the first update has a small nonzero
  rate and the peak comes at update `warmup_steps - 1` (paper step
  `warmup_steps`).
  """
  return lambda count: paper_learning_rate(
      count + 1, d_model=d_model, warmup_steps=warmup_steps, scale=scale)


def make_optimizer(schedule, *, b1: float, b2: float, eps: float, grad_clip_norm: float = 0.0):
  """Adam with the given schedule, after global-norm clipping when `grad_clip_norm > 0`."""
  adam = optax.adam(schedule, b1=b1, b2=b2, eps=eps)
  if grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(grad_clip_norm), adam)
  return adam


def cross_entropy(logits, targets, label_smoothing: float):
  """Per-token losses from logits `[batch, length, vocab]` and targets `[batch, length]`.

  Returns `(smoothed, nll)`, both float32 `[batch, length]`. `nll` is
  `-log p(target)`. `smoothed` is the cross entropy against the smoothed
  target distribution: `1 - eps` on the target and `eps / (vocab - 1)` on each
  other token. It is not shifted by that distribution's entropy (its minimum
  is the entropy, not 0); perplexity comes from `nll` instead.
  """
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  log_z = jax.nn.logsumexp(logits, axis=-1)
  nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  if label_smoothing == 0:
    return nll, nll
  # Sum over all tokens of -log p = vocab * log_z - sum(logits).
  others = vocab * (log_z - jnp.mean(logits, axis=-1)) - nll
  smoothed = (1 - label_smoothing) * nll + label_smoothing / (vocab - 1) * others
  return smoothed, nll


def loss_sums(model: nn.Module, params, batch: Mapping[str, jax.Array], *, label_smoothing: float,
              dropout_key=None):
  """Sums over the non-padding target tokens of one batch.

  Returns a dict of float32 scalars: `loss` (smoothed cross entropy), `nll`,
  `tokens` (target tokens, `targets_segmentation > 0`) and `source_tokens`.
  Dropout is on when `dropout_key` is given.
  """
  logits = model.apply(
      {"params": params}, *(batch[k] for k in BATCH_KEYS),
      train=dropout_key is not None,
      rngs=None if dropout_key is None else {"dropout": dropout_key})
  smoothed, nll = cross_entropy(logits, batch["targets"], label_smoothing)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  return {
      "loss": jnp.sum(smoothed * weights),
      "nll": jnp.sum(nll * weights),
      "tokens": jnp.sum(weights),
      "source_tokens": jnp.sum(batch["inputs_segmentation"] > 0).astype(jnp.float32),
  }


def train_flops(cfg: TransformerConfig, *, source_tokens: float, target_tokens: float,
                source_length: int, target_length: int) -> float:
  """Model FLOPs of one training step: 3 x the forward pass (backward = 2 x forward).

  Forward, 2 FLOPs per multiply-add:
  - weights: each non-padding source token meets every encoder layer's
    attention projections and feed-forward and every decoder layer's
    cross-attention key/value projections; each non-padding target token
    meets every decoder layer's self-attention projections, cross-attention
    query/output projections and feed-forward, and the output projection
    (vocab x d_model);
  - attention: `Q K^T` and `weights V` cost `2 * heads * (d_k + d_v)` per
    (query, key) pair; each non-padding query is charged the padded row
    length of keys (`source_length` or `target_length`), the full square,
    as computed (the causal half is not subtracted).
  Embedding lookups, layer norms, softmaxes and the loss are left out (under
  1% at the paper's sizes).
  """
  d, h, n = cfg.d_model, cfg.num_heads, cfg.num_layers
  self_attention = d * h * (2 * cfg.d_k + cfg.d_v) + h * cfg.d_v * d
  feed_forward = 2 * d * cfg.d_ff
  cross_query_out = d * h * cfg.d_k + h * cfg.d_v * d
  cross_key_value = d * h * (cfg.d_k + cfg.d_v)
  per_source_token = n * (self_attention + feed_forward + cross_key_value)
  per_target_token = n * (self_attention + cross_query_out + feed_forward) + cfg.vocab_size * d
  weights = 2.0 * (per_source_token * source_tokens + per_target_token * target_tokens)
  per_pair = 2.0 * h * (cfg.d_k + cfg.d_v)
  attention = n * per_pair * (source_tokens * source_length
                              + target_tokens * (target_length + source_length))
  return 3.0 * (weights + attention)


def split_micro_batches(array, num_micro: int):
  """`[batch, ...]` -> `[num_micro, batch / num_micro, ...]`; row `i * num_micro + j` goes to micro-batch j.

  Each device's consecutive block of rows stays on that device in every
  micro-batch.
  """
  rows = array.shape[0]
  return jnp.swapaxes(array.reshape(rows // num_micro, num_micro, *array.shape[1:]), 0, 1)


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation, *,
                    label_smoothing: float, grad_accum_steps: int = 1, seed: int = 0,
                    batch_sharding: NamedSharding | None = None):
  """The pure train step `(state, batch) -> (state, metrics)`.

  The gradient is that of the mean smoothed loss over all non-padding target
  tokens of the batch. With `grad_accum_steps > 1` the batch is split into
  that many micro-batches (`split_micro_batches`) run one after another with
  `lax.scan`; token sums and gradient sums are added and divided once by the
  total token count, so the update equals the one from the whole batch.
  Micro-batch j draws dropout from `fold_in(step_key, j)`. `metrics` holds
  the sums of `loss_sums`, `grad_norm` and `flops` (`train_flops`), float32
  scalars, and `nonfinite`: 1.0 when the loss or the gradient norm is NaN or
  infinite. Such an update is skipped (`skip_nonfinite`): params and
  optimizer state stay as they were, only `step` advances, and the step's
  loss sums and gradient norm count as 0.
  """
  dropout_base = jax.random.fold_in(jax.random.key(seed), 1)

  def loss_and_sums(params, batch, key):
    sums = loss_sums(model, params, batch, label_smoothing=label_smoothing, dropout_key=key)
    return sums["loss"], sums

  grad_fn = jax.grad(loss_and_sums, has_aux=True)

  def train_step(state: TrainState, batch):
    key = jax.random.fold_in(dropout_base, state.step)
    if grad_accum_steps == 1:
      grads, sums = grad_fn(state.params, batch, key)
    else:
      micro = jax.tree.map(functools.partial(split_micro_batches, num_micro=grad_accum_steps),
                           batch)

      def accumulate(carry, xs):
        index, micro_batch = xs
        if batch_sharding is not None:
          micro_batch = jax.lax.with_sharding_constraint(micro_batch, batch_sharding)
        grads, sums = grad_fn(state.params, micro_batch, jax.random.fold_in(key, index))
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

      zeros = (jax.tree.map(jnp.zeros_like, state.params),
               {k: jnp.zeros((), jnp.float32) for k in LOSS_SUMS})
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    flops = train_flops(model.config, source_tokens=sums["source_tokens"],
                        target_tokens=sums["tokens"], source_length=batch["inputs"].shape[1],
                        target_length=batch["targets"].shape[1])
    metrics = {**sums, "grad_norm": optax.tree.norm(grads), "flops": flops}
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    return skip_nonfinite(state, new_state, metrics)

  return train_step


def skip_nonfinite(state: TrainState, new_state: TrainState, metrics: dict):
  """`(new_state, metrics)`, or `state` with its step advanced if the loss or gradient norm is not finite.

  Decided on the device (`jnp.where`, no host sync). Adds `metrics["nonfinite"]`
  (1.0 for a skipped update, else 0.0); a skipped step's `loss`, `nll` and
  `grad_norm` become 0 and its `tokens` too, so logged averages cover the
  applied updates only.
  """
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
  keep = lambda new, old: jnp.where(finite, new, old)
  state = TrainState(step=new_state.step, params=jax.tree.map(keep, new_state.params, state.params),
                     opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state))
  zeroed = ("loss", "nll", "tokens", "grad_norm")
  metrics = {k: jnp.where(finite, v, jnp.zeros_like(v)) if k in zeroed else v
             for k, v in metrics.items()}
  metrics["nonfinite"] = 1.0 - finite.astype(jnp.float32)
  return state, metrics


class Trainer:
  """The model and optimizer on a mesh: sharded init, train step and eval step, each jit-compiled.

  Parameters and optimizer state are sharded by their logical axis names
  through `rules`; batches are `[batch, length]` along the mesh axes of
  `batch`. Calls run inside the mesh and rules contexts, so the model's
  activation constraints apply.
  """

  def __init__(self, model_config: TransformerConfig, optimizer: optax.GradientTransformation,
               mesh: Mesh, rules: sharding.Rules, *, label_smoothing: float,
               grad_accum_steps: int = 1, seed: int = 0):
    self.model_config = model_config
    self.model = Transformer(model_config)
    self.optimizer = optimizer
    self.mesh, self.rules = mesh, rules
    self.seed = seed
    self.grad_accum_steps = grad_accum_steps
    boxed = jax.eval_shape(self._init_boxed, jax.random.key(0))
    self.state_shardings = sharding.tree_shardings(boxed, mesh, rules)
    sharding.check_divisible(boxed, self.state_shardings)
    self.abstract_state = checkpointing.abstract_tree(nn.unbox(boxed), self.state_shardings)
    self.batch_sharding = sharding.batch_sharding(mesh, rules)
    self.batch_shards = sharding.num_batch_shards(dict(mesh.shape), rules)
    self.data_shard = sharding.data_shard(self.batch_sharding)
    replicated = NamedSharding(mesh, PartitionSpec())
    self._init = jax.jit(lambda key: nn.unbox(self._init_boxed(key)),
                         out_shardings=self.state_shardings)
    step = make_train_step(self.model, optimizer, label_smoothing=label_smoothing,
                           grad_accum_steps=grad_accum_steps, seed=seed,
                           batch_sharding=self.batch_sharding)
    self._train_step = jax.jit(step, in_shardings=(self.state_shardings, self.batch_sharding),
                               out_shardings=(self.state_shardings, replicated),
                               donate_argnums=0)
    self._eval_step = jax.jit(
        functools.partial(loss_sums, self.model, label_smoothing=label_smoothing),
        in_shardings=(self.state_shardings.params, self.batch_sharding),
        out_shardings=replicated)

  def _init_boxed(self, key):
    """Initial state with parameters boxed by logical axis names (the optimizer state inherits them)."""
    dummy = jnp.ones((1, 1), jnp.int32)
    params = self.model.init({"params": key}, dummy, dummy)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=self.optimizer.init(params))

  def _run(self, fn, *args):
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return fn(*args)

  def init(self) -> TrainState:
    """Freshly initialized, sharded state; parameters from `key(seed)`."""
    return self._run(self._init, jax.random.fold_in(jax.random.key(self.seed), 0))

  def check_batch(self, local_batch: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError if this process's `[rows, length]` batch cannot be split as configured."""
    missing = set(BATCH_KEYS) - set(local_batch)
    if missing:
      raise ValueError(f"batch lacks {sorted(missing)}; a batch has keys {', '.join(BATCH_KEYS)}")
    rows = local_batch["targets"].shape[0] * self.data_shard[1]
    need = self.batch_shards * self.grad_accum_steps
    if rows % need:
      raise ValueError(
          f"the global batch has {rows} rows, not a multiple of {need} = "
          f"{self.batch_shards} batch shards (config.mesh, config.sharding_rules) x "
          f"{self.grad_accum_steps} micro-batches (config.grad_accum_steps); change the "
          "batch size in config.data, the mesh or config.grad_accum_steps")

  def global_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict:
    """This process's numpy rows -> the sharded global batch."""
    return sharding.global_batch({k: local_batch[k] for k in BATCH_KEYS}, self.batch_sharding)

  def train_step(self, state: TrainState, local_batch: Mapping[str, np.ndarray]):
    """One update from this process's rows of the batch; `state` is donated. Returns `(state, metrics)`."""
    return self._run(self._train_step, state, self.global_batch(local_batch))

  def eval_step(self, params, local_batch: Mapping[str, np.ndarray]) -> dict:
    """Loss sums (`loss_sums`, no dropout) of one batch under `params`."""
    return self._run(self._eval_step, params, self.global_batch(local_batch))


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


_add_metrics = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))


def _per_token(sums: Mapping[str, float]) -> dict:
  """Loss and NLL per target token and the perplexity, from summed metrics."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll"]) / tokens
  return {"loss": float(sums["loss"]) / tokens, "nll": nll,
          "perplexity": float(np.exp(min(nll, 50.0)))}


class TrainLogger:
  """What the user sees of a run: log lines, TensorBoard scalars and a terminal progress bar.

  Every process logs lines through absl; process 0 also writes TensorBoard
  event files (tensorboardX, no TensorFlow) under `workdir/tensorboard` and,
  when stderr is a terminal, draws a progress bar.
  """

  def __init__(self, workdir: str, *, total_steps: int, start_step: int, learning_rate_fn,
               peak_flops: float):
    self.total_steps = total_steps
    self.learning_rate_fn, self.peak_flops = learning_rate_fn, peak_flops
    self.last_train, self.last_eval, self.tokens = {}, {}, 0.0
    self.skipped = 0  # Non-finite updates skipped in this run.
    main = jax.process_index() == 0
    self.writer = (tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"),
                                              purge_step=start_step) if main else None)
    self.bar = (tqdm.tqdm(total=total_steps, initial=start_step, unit="step", leave=False,
                          dynamic_ncols=True) if main and sys.stderr.isatty() else None)

  def advance(self):
    if self.bar is not None:
      self.bar.update(1)

  def _line(self, text: str):
    if self.bar is not None:
      self.bar.clear()
    logging.info("%s", text)
    if self.bar is not None:
      self.bar.refresh()

  def train(self, step: int, sums: Mapping[str, float], steps: int, seconds: float, *,
            compiling: bool = False) -> dict:
    """Report `steps` steps ending at `step` that took `seconds`; returns the derived scalars.

    `sums` are the summed step metrics. With `compiling`, the time includes
    compilation, so speeds are not reported.
    """
    self.tokens += float(sums["tokens"])
    skipped = int(sums.get("nonfinite", 0))
    self.skipped += skipped
    scalars = {
        **_per_token(sums),
        "learning_rate": float(self.learning_rate_fn(step - 1)),
        "grad_norm": float(sums["grad_norm"]) / max(steps - skipped, 1),
        "nonfinite_steps": float(skipped),
    }
    line = (f"step {step}/{self.total_steps} | loss {scalars['loss']:.4f} | "
            f"ppl {scalars['perplexity']:.2f} | lr {scalars['learning_rate']:.3e} | "
            f"grad_norm {scalars['grad_norm']:.3f}")
    if skipped:
      line += (f" | skipped {skipped} non-finite update{'s' * (skipped > 1)} "
               f"({self.skipped} this run)")
    if compiling:
      line += f" | compiled and ran step {step} in {seconds:.1f} s"
    else:
      scalars.update({
          "tokens_per_s": float(sums["tokens"]) / seconds,
          "source_tokens_per_s": float(sums["source_tokens"]) / seconds,
          "s_per_step": seconds / steps,
          "mfu": float(sums["flops"]) / (seconds * self.peak_flops),
      })
      eta = datetime.timedelta(seconds=round((self.total_steps - step) * seconds / steps))
      line += (f" | {scalars['tokens_per_s']:,.0f} tok/s | {scalars['s_per_step']:.3f} s/step | "
               f"MFU {100 * scalars['mfu']:.1f}% | ETA {eta}")
    self.last_train = scalars
    self._line(line)
    self._write("train", step, scalars)
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{scalars['loss']:.3f}", refresh=False)
    return scalars

  def evaluation(self, step: int, split: str, sums: Mapping[str, float]) -> dict:
    """Report dev-set loss sums (and `bleu`, if there) at `step`; returns loss, nll, perplexity
    (and bleu)."""
    scalars = _per_token(sums)
    line = (f"eval ({split}) at step {step} | loss {scalars['loss']:.4f} | "
            f"ppl {scalars['perplexity']:.2f} | {int(sums['tokens']):,} target tokens")
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
        self.writer.add_scalar(f"{prefix}/{name}", value, step)
      self.writer.flush()

  def close(self, step: int, *, seconds: float, steps: int, checkpoints: str):
    """Log the final summary line (`steps` steps of this run took `seconds`); close the writer and bar."""
    if self.bar is not None:
      self.bar.close()
    text = (f"done: step {step}/{self.total_steps}; this run {steps} steps in "
            f"{datetime.timedelta(seconds=round(seconds))}, {self.tokens / seconds:,.0f} "
            "target tok/s overall (compilation and evaluation included)")
    if self.last_train:
      text += (f"; last train loss {self.last_train['loss']:.4f}, "
               f"ppl {self.last_train['perplexity']:.2f}")
    if self.last_eval:
      text += (f"; {self.last_eval['split']} loss {self.last_eval['loss']:.4f}, "
               f"ppl {self.last_eval['perplexity']:.2f}")
      if "bleu" in self.last_eval:
        text += f", BLEU {self.last_eval['bleu']:.2f}"
    if self.skipped:
      text += f"; {self.skipped} non-finite updates skipped"
    logging.info("%s; checkpoints in %s", text, checkpoints)
    if self.writer is not None:
      self.writer.close()


class PreemptionWatch:
  """Tells the loop to checkpoint and stop: on SIGTERM in a one-process run, or at the
  preemption sync point that JAX's distributed runtime sets when any host is preempted.

  Use as a context manager; the previous SIGTERM handler comes back on exit.
  If the process is still running `grace_seconds` after SIGTERM (a step,
  compilation, data read or save that does not end), it logs why and exits
  with status 143 (killed by SIGTERM) through `exit_fn`, without a checkpoint
  of the steps since the last one. `grace_seconds=0` waits indefinitely.
  """

  def __init__(self, manager, *, grace_seconds: float = 0.0, exit_fn=os._exit):
    self.manager = manager
    self.grace_seconds, self.exit_fn = grace_seconds, exit_fn
    self.signalled = False
    self._previous = None
    self._timer = None

  def __enter__(self):
    if jax.process_count() == 1:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    if self.signalled:
      return
    logging.warning("SIGTERM: saving a checkpoint after this step, then stopping")
    self.signalled = True
    if self.grace_seconds > 0:
      self._timer = threading.Timer(self.grace_seconds, self._expire)
      self._timer.daemon = True
      self._timer.start()

  def _expire(self):
    logging.error("no checkpoint within %g s of SIGTERM (config.preemption_grace_seconds); "
                  "exiting without one: the steps since the latest checkpoint in %s are lost",
                  self.grace_seconds, self.manager.directory)
    logging.flush()
    self.exit_fn(128 + signal.SIGTERM)

  def __call__(self, step: int) -> bool:
    return self.signalled or self.manager.reached_preemption(step)

  def __exit__(self, *exc):
    if self._timer is not None:
      self._timer.cancel()
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class NonFiniteError(RuntimeError):
  """Too many updates in a row had a non-finite loss or gradient."""


@jax.jit
def _nonfinite_streak(streak, longest, nonfinite):
  """The current run of non-finite steps, and the longest since the last reset."""
  streak = jnp.where(nonfinite > 0, streak + 1, 0)
  return streak, jnp.maximum(longest, streak)


def fit(trainer: Trainer, state: TrainState, train_iter, *, num_train_steps: int,
        log_every_steps: int, checkpoint_every_steps: int, logger: TrainLogger, manager,
        stop_requested=lambda step: False, evaluate=None,
        eval_every_steps: int = 0, max_consecutive_nonfinite: int = 0,
        on_save_error: str = "stop", keep_checkpoints: int = 0) -> TrainState:
  """Run train steps from `state.step` to `num_train_steps`, logging and checkpointing.

  `train_iter` yields this process's numpy batches and has Grain's
  checkpointable state, saved with every checkpoint. Metrics stay on the
  device, summed, and are fetched only at log steps. The first step of the
  run (which compiles) is reported on its own, and every new batch shape
  (which compiles again) is announced. A checkpoint is written every
  `checkpoint_every_steps` steps, when `stop_requested(step)` (then the loop
  ends; it is also asked once before the first step) and after the last
  step; a save that fails is handled as `on_save_error` says, and the
  newest `keep_checkpoints` are kept (0: all; `recovery.CheckpointWriter`;
  give `manager` no limit of its own). `evaluate(state)`, if given, returns
  `(split, sums)`; it runs every `eval_every_steps` steps (0: never) and after
  the last step, and its time is left out of the training speed. Updates
  with a non-finite loss or gradient are skipped (`skip_nonfinite`); after
  `max_consecutive_nonfinite` of them in a row (0: no limit), seen at the
  next log step, NonFiniteError is raised.
  """
  step = int(jax.device_get(state.step))
  start_step, start = step, time.perf_counter()
  sums, interval_steps, interval_start = None, 0, None
  streak = longest = jnp.zeros((), jnp.int32)
  writer = recovery.CheckpointWriter(manager, on_error=on_save_error, keep=keep_checkpoints)
  shapes = set()
  stop = step < num_train_steps and stop_requested(step)
  if stop:
    logging.warning("stopped before the first step of this run (step %d); nothing new to save",
                    step)
  while step < num_train_steps and not stop:
    try:
      batch = next(train_iter)
    except StopIteration:
      raise RuntimeError(f"the training data ran out at step {step}") from None
    shape = (batch["inputs"].shape, batch["targets"].shape)
    if shape not in shapes:
      trainer.check_batch(batch)
      shapes.add(shape)
      logging.info("step %d: compiling the train step for batch shape %s (inputs) %s (targets)",
                   step + 1, *shape)
    state, metrics = trainer.train_step(state, batch)
    step += 1
    sums = metrics if sums is None else _add_metrics(sums, metrics)
    streak, longest = _nonfinite_streak(streak, longest, metrics["nonfinite"])
    interval_steps += 1
    logger.advance()
    if interval_start is None or step % log_every_steps == 0 or step == num_train_steps:
      fetched, in_a_row = jax.device_get((sums, longest))
      now = time.perf_counter()
      logger.train(step, fetched, interval_steps,
                   now - (start if interval_start is None else interval_start),
                   compiling=interval_start is None)
      sums, interval_steps, interval_start = None, 0, now
      longest = jnp.zeros((), jnp.int32)
      if max_consecutive_nonfinite and in_a_row >= max_consecutive_nonfinite:
        writer.finish()
        raise NonFiniteError(
            f"{in_a_row} updates in a row, the last at step {step}, had a non-finite loss or "
            f"gradient and were skipped (the limit is config.max_consecutive_nonfinite_steps="
            f"{max_consecutive_nonfinite}); the latest checkpoint in {manager.directory} is step "
            f"{manager.latest_step()}. Lower config.learning_rate, set config.grad_clip_norm or "
            "check the training data")
    stop = stop_requested(step)
    if stop or step % checkpoint_every_steps == 0 or step == num_train_steps:
      writer.save(step, state, train_iter)
    if not stop and evaluate is not None and eval_every_steps and (
        step % eval_every_steps == 0 or step == num_train_steps):
      eval_start = time.perf_counter()
      logger.evaluation(step, *evaluate(state))
      interval_start += time.perf_counter() - eval_start
  writer.finish()
  if stop and step > start_step:
    logging.warning("stopped at step %d for preemption; checkpoint saved", step)
  logger.close(step, seconds=time.perf_counter() - start, steps=step - start_step,
               checkpoints=f"{manager.directory} (latest {manager.latest_step()})")
  return state


def evaluate(trainer: Trainer, params, batches) -> dict:
  """Loss sums (`loss_sums`) over `(batch, source_texts, target_texts)` items, fetched to the host.

  Every process passes its rows of the same global batches, in the same order.
  """
  total = None
  for batch, _, _ in batches:
    sums = trainer.eval_step(params, batch)
    total = sums if total is None else _add_metrics(total, sums)
  if total is None:
    raise ValueError("the evaluation split has no batches")
  return jax.device_get(total)


def make_trainer(config: ml_collections.ConfigDict, *, vocab_size: int):
  """`(trainer, learning-rate schedule)` of experiment `config` over all devices, for a vocabulary
  of `vocab_size` tokens."""
  mesh = sharding.make_mesh(dict(config.mesh))
  rules = sharding.logical_rules(config.sharding_rules)
  model_cfg = build_model_config(config.model, vocab_size=vocab_size)
  schedule = learning_rate_schedule(d_model=model_cfg.d_model, warmup_steps=config.warmup_steps,
                                    scale=config.learning_rate)
  optimizer = make_optimizer(schedule, b1=config.adam_b1, b2=config.adam_b2,
                             eps=config.adam_eps, grad_clip_norm=config.grad_clip_norm)
  trainer = Trainer(model_cfg, optimizer, mesh, rules, label_smoothing=config.label_smoothing,
                    grad_accum_steps=config.grad_accum_steps, seed=config.seed)
  return trainer, schedule


def train(config: ml_collections.ConfigDict, workdir: str) -> TrainState:
  """Train the experiment `config` in `workdir`, resuming from its latest checkpoint.

  Writes `workdir/checkpoints` (Orbax) and `workdir/tensorboard`; the data
  pipeline keeps its tokenizer there too. Each evaluation also scores BLEU
  on the first `config.eval_bleu_sentences` sentences and keeps the best
  parameters in `workdir/best` with `workdir/best.json` (`validation`).
  Returns the final state. SIGTERM from here on stops the run at the next
  step boundary with a checkpoint (`PreemptionWatch`); broken checkpoints
  are skipped (`recovery.resume`).
  """
  validate_config(config)
  workdir = checkpointing.absolute(workdir)
  # No limit of its own: fit deletes old steps, safely (recovery.delete_steps).
  manager = checkpointing.make_manager(os.path.join(workdir, "checkpoints"))
  with PreemptionWatch(manager, grace_seconds=config.preemption_grace_seconds) as preemption:
    state = _train(config, workdir, manager, preemption)
  manager.close()
  return state


def _train(config, workdir, manager, preemption) -> TrainState:
  tokenizer = data.get_tokenizer(config.data, workdir)
  trainer, schedule = make_trainer(config, vocab_size=tokenizer.vocab_size)
  model_cfg, mesh, rules = trainer.model_config, trainer.mesh, trainer.rules
  logging.info("model: %s, %s parameters; mesh %s; sharding rules %s", model_cfg,
               f"{count_params(model_cfg):,}", dict(mesh.shape), rules)
  shard_index, shard_count = trainer.data_shard
  train_iter = iter(data.make_train_loader(config.data, tokenizer, seed=config.seed,
                                           shard_index=shard_index, shard_count=shard_count))
  state = recovery.resume(manager, trainer.abstract_state, train_iter,
                          start_over=config.on_bad_checkpoints == "start_over")
  if state is None:
    state = trainer.init()
  else:
    logging.info("resumed from %s at step %d", manager.directory, int(state.step))
  peak = config.peak_flops_per_device or measure_matmul_flops(model_cfg.compute_dtype)
  logging.info("peak FLOP/s per device for MFU: %.3g (%s)", peak,
               "config.peak_flops_per_device" if config.peak_flops_per_device else
               "measured on a square matmul")
  logger = TrainLogger(workdir, total_steps=config.num_train_steps,
                       start_step=int(state.step), learning_rate_fn=schedule,
                       peak_flops=peak * jax.device_count())

  eval_batches = []  # Read and tokenized at the first evaluation.
  validation_bleu = validation.ValidationBleu(
      translate.Translator(trainer.model, tokenizer, mesh, rules,
                           beam_size=config.eval_bleu_beam_size, alpha=config.decode.alpha,
                           max_extra=config.decode.max_extra,
                           batch_size=config.decode.batch_size),
      config.data, workdir, split=config.data.eval_split, sentences=config.eval_bleu_sentences)

  def run_eval(state):
    if not eval_batches:
      eval_batches.extend(data.make_eval_batches(
          config.data, tokenizer, config.data.eval_split, shard_index=shard_index,
          shard_count=shard_count))
    sums = evaluate(trainer, state.params, eval_batches)
    if config.eval_bleu_sentences:
      sums = {**sums, "bleu": validation_bleu(int(state.step), state.params)}
    return config.data.eval_split, sums

  return fit(trainer, state, train_iter, num_train_steps=config.num_train_steps,
             log_every_steps=config.log_every_steps,
             checkpoint_every_steps=config.checkpoint_every_steps, logger=logger, manager=manager,
             stop_requested=preemption, evaluate=run_eval,
             eval_every_steps=config.eval_every_steps,
             max_consecutive_nonfinite=config.max_consecutive_nonfinite_steps,
             on_save_error=config.on_checkpoint_save_error,
             keep_checkpoints=config.keep_checkpoints)


def model_config(preset: str = "base", **overrides) -> ml_collections.ConfigDict:
  """`config.model`: every `TransformerConfig` field except `vocab_size` (the tokenizer sets it).

  Values come from the paper's `preset` (`base`, `big`, a Table 3 row) and
  `overrides`.
  """
  if preset not in PRESETS:
    raise ValueError(f"unknown model preset {preset!r}; allowed: {', '.join(PRESETS)}")
  fields = {f.name: f.default for f in dataclasses.fields(TransformerConfig)
            if f.name != "vocab_size"}
  unknown = set(overrides) - set(fields)
  if unknown:
    raise ValueError(f"unknown model fields {sorted(unknown)}; allowed: {', '.join(fields)}")
  fields.update(PRESETS[preset], **overrides)
  config = ml_collections.ConfigDict()
  for name, value in fields.items():
    config[name] = config_dict.placeholder(int) if value is None else value
  return config


def default_config() -> ml_collections.ConfigDict:
  """Every field an experiment has, with the paper's base training settings."""
  config = ml_collections.ConfigDict()
  config.model = model_config("base")
  config.data = data.default_config()
  config.seed = 0
  config.num_train_steps = 100_000
  config.warmup_steps = 4000
  config.learning_rate = 1.0  # Scale on the paper's schedule.
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9
  config.label_smoothing = 0.1
  config.grad_clip_norm = 0.0  # 0 = no clipping (the paper does not clip).
  config.grad_accum_steps = 1
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 20  # 0 = keep all.
  config.log_every_steps = 100
  config.eval_every_steps = 0  # And after the last step; 0 = never (split: config.data.eval_split).
  config.eval_bleu_sentences = 1000  # Each evaluation: BLEU on this many sentences (0 = no BLEU).
  config.eval_bleu_beam_size = 1  # The search of that BLEU: 1 = greedy (cheap), else beam search.
  config.average_last = 5  # --mode=average: mean of the last K checkpoints (paper: 5 base, 20 big).
  config.decode = decode_config()
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  config.sharding_rules = "dp"
  config.peak_flops_per_device = 0.0  # 0 = measure a matmul at start-up.
  # Failure handling (README "Failure and recovery").
  config.max_consecutive_nonfinite_steps = 10  # Stop after this many skipped updates in a row.
  config.on_checkpoint_save_error = "stop"  # Or 'continue' (retry at the next checkpoint step).
  config.on_bad_checkpoints = "stop"  # When no checkpoint restores: or 'start_over' from step 0.
  config.preemption_grace_seconds = 120.0  # Exit this long after SIGTERM at the latest; 0 = never.
  return config


def decode_config() -> ml_collections.ConfigDict:
  """`config.decode`: how --mode=eval and --mode=translate decode (the paper's beam search)."""
  return ml_collections.ConfigDict({
      "beam_size": 4,  # 1 = greedy decoding.
      "alpha": 0.6,  # GNMT length penalty ((5 + len) / 6) ** alpha.
      "max_extra": 50,  # Output tokens <= source tokens + max_extra (and <= model.max_len).
      "batch_size": 128,  # Sentences per decoding batch (rounded up to the batch shards).
      "split": "test",  # --mode=eval decodes this split of config.data.
      "tokenized_bleu": False,  # --mode=eval also reports the paper's tokenized BLEU.
  })


_DECODE_CHECKS = {
    "beam_size": (lambda v: _is_int(v) and v > 0, "a positive integer (1 = greedy)"),
    "alpha": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "max_extra": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "batch_size": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "split": (lambda v: isinstance(v, str) and v != "", "a split name such as test"),
    "tokenized_bleu": (lambda v: isinstance(v, bool), "True or False"),
}

_CHECKS = {
    "seed": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "num_train_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "warmup_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "learning_rate": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "adam_b1": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "adam_b2": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "adam_eps": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "label_smoothing": (lambda v: _is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "grad_clip_norm": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0 = off)"),
    "grad_accum_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "checkpoint_every_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "keep_checkpoints": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = keep all)"),
    "log_every_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "eval_every_steps": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = never)"),
    "eval_bleu_sentences": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0 = no BLEU)"),
    "eval_bleu_beam_size": (lambda v: _is_int(v) and v > 0, "a positive integer (1 = greedy)"),
    "average_last": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "peak_flops_per_device": (lambda v: _is_number(v) and v >= 0,
                              "a number >= 0 (0 = measure)"),
    "max_consecutive_nonfinite_steps": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "on_checkpoint_save_error": (lambda v: v in ("stop", "continue"), "'stop' or 'continue'"),
    "on_bad_checkpoints": (lambda v: v in ("stop", "start_over"), "'stop' or 'start_over'"),
    "preemption_grace_seconds": (lambda v: _is_number(v) and v >= 0,
                                 "a number >= 0 (0 = no limit)"),
}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raise ValueError naming the first unknown or invalid field (`config.xxx`) and what is allowed.

  Checks the training fields, `config.model` (against `TransformerConfig`),
  `config.data`, `config.mesh` (against the devices present),
  `config.sharding_rules`, and that batches split evenly over the devices.
  Compiles nothing.
  """
  known = default_config()
  for name in config:
    if name not in known:
      raise ValueError(f"config.{name} is not a known field; known fields: {', '.join(known)}")
  for name in known:
    if name not in config:
      raise ValueError(f"config.{name} is missing")
  for name, (check, allowed) in _CHECKS.items():
    if not check(config[name]):
      raise ValueError(f"config.{name} must be {allowed}; got {config[name]!r}")
  for name in ("model", "data", "mesh"):
    if not isinstance(config[name], (Mapping, ml_collections.ConfigDict)):
      raise ValueError(f"config.{name} must be a ConfigDict of fields; got {config[name]!r}")
  if not isinstance(config.sharding_rules, str):
    raise ValueError("config.sharding_rules must be a string (a preset such as 'dp', or pairs "
                     f"like 'batch=data+fsdp,embed=fsdp'); got {config.sharding_rules!r}")
  for name, (check, allowed) in _DECODE_CHECKS.items():
    if name not in config.decode:
      raise ValueError(f"config.decode.{name} is missing")
    if not check(config.decode[name]):
      raise ValueError(f"config.decode.{name} must be {allowed}; got {config.decode[name]!r}")
  unknown = set(config.decode) - set(_DECODE_CHECKS)
  if unknown:
    raise ValueError(f"config.decode.{sorted(unknown)[0]} is not a known field; known fields: "
                     f"{', '.join(_DECODE_CHECKS)}")
  model_cfg = build_model_config(config.model, vocab_size=8)
  try:
    data.validate_config(config.data)
  except ValueError as error:
    raise ValueError(f"config.{error}") from None
  _check_lengths(config.data, model_cfg.max_len)
  mesh_shape = sharding.resolve_mesh_shape(dict(config.mesh), jax.device_count())
  shards = sharding.num_batch_shards(dict(zip(sharding.MESH_AXES, mesh_shape)),
                                     sharding.logical_rules(config.sharding_rules))
  if config.data.batch_multiple % (shards * config.grad_accum_steps):
    raise ValueError(
        f"config.data.batch_multiple={config.data.batch_multiple} must be a multiple of "
        f"{shards * config.grad_accum_steps} = {shards} batch shards (config.mesh with "
        f"config.sharding_rules) x config.grad_accum_steps={config.grad_accum_steps}, so that "
        "every batch splits evenly")


def _check_lengths(data_config, max_len: int) -> None:
  """Training rows must fit the model's positions (`config.model.max_len`)."""
  if data_config.batch_mode == "packed":
    fields = ("max_length",)
  else:
    fields = ("max_source_length", "max_target_length")
  for field in fields:
    if data_config[field] > max_len:
      raise ValueError(
          f"config.data.{field}={data_config[field]} is longer than config.model.max_len="
          f"{max_len}, the positions the model has; lower it or raise config.model.max_len")


def build_model_config(model: ml_collections.ConfigDict, *, vocab_size: int) -> TransformerConfig:
  """`TransformerConfig` from `config.model`; errors name the field as `config.model.xxx`."""
  fields = {f.name for f in dataclasses.fields(TransformerConfig)} - {"vocab_size"}
  for name in model:
    if name not in fields:
      raise ValueError(f"config.model.{name} is not a model field; fields: "
                       f"{', '.join(sorted(fields))}")
  try:
    return TransformerConfig(vocab_size=vocab_size, **model.to_dict())
  except ValueError as error:
    raise ValueError(f"config.model: {error}".replace("TransformerConfig.", "config.model.")) \
        from None
