"""The paper's training recipe: the learning-rate schedule and Adam (`OptimizerSettings`), with
optional clipping by the gradients' `global_norm` (which the train step also logs); the FLOPs of a
step are the model's (`model.config.train_flops`).

(The loss itself, label-smoothed cross entropy, is `transformer_jax.model.loss`:
evaluation sums it too.)
"""

import dataclasses
import itertools
import operator

import jax
import jax.numpy as jnp
import optax

from transformer_jax import schema


def paper_learning_rate(step, *, d_model: int, warmup_steps: int, scale: float = 1.0):
  """`scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)` at the 1-based `step`."""
  step = jnp.asarray(step, jnp.float32)
  return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)


def cooldown_problem(cooldown_steps: int, num_train_steps: int | None) -> str | None:
  """Why a cooldown of `cooldown_steps` cannot end a run of `num_train_steps` updates, as the
  words that follow its value in a message; or None."""
  if num_train_steps and cooldown_steps > num_train_steps:
    return f" is longer than the run (num_train_steps={num_train_steps})"
  return None


def learning_rate_schedule(
  *,
  d_model: int,
  warmup_steps: int,
  scale: float = 1.0,
  cooldown_steps: int = 0,
  num_train_steps: int | None = None,
):
  """Optax schedule of the paper's rate, with an optional cooldown.

  Optax counts updates from 0; the paper counts steps from 1. Update `count`
  uses the paper's step `count + 1`, so the first update has a small nonzero
  rate and the peak comes at update `warmup_steps - 1` (paper step
  `warmup_steps`). With `cooldown_steps` the last that many of the run's
  `num_train_steps` updates scale the rate by `(num_train_steps - count) /
  cooldown_steps`, linearly down to `1 / cooldown_steps` at the last update.
  `count` is the optimizer's: an update skipped for a non-finite loss does
  not advance it, so each skip moves the cooldown one update later.
  """
  if cooldown_steps and not num_train_steps:
    raise ValueError("a cooldown needs the run's num_train_steps")
  problem = cooldown_problem(cooldown_steps, num_train_steps)
  if problem:
    raise ValueError(f"cooldown_steps={cooldown_steps}{problem}")

  def schedule(count):
    rate = paper_learning_rate(count + 1, d_model=d_model, warmup_steps=warmup_steps, scale=scale)
    if not cooldown_steps:
      return rate
    left = jnp.asarray(num_train_steps - count, jnp.float32)
    return rate * jnp.clip(left / cooldown_steps, 0.0, 1.0)

  return schedule


NORM_ROWS = 64  # a leaf's fewest leading axes that give at least this many row sums


def global_norm(tree):
  """The L2 norm of all of `tree`'s leaves together: `optax.tree.norm`'s value, summed in
  another order (its last bits may differ).

  Each leaf is read as `[rows, -1]`, `rows` the product of its fewest leading axes that reach
  `NORM_ROWS` (all of them for a smaller leaf), and the squares of each row summed; all
  leaves' row sums are concatenated and summed once. The optimization barrier keeps XLA from
  turning that sum back into one reduction per leaf. On a GPU the row sums fuse into the
  kernels that make the gradients and one kernel adds them all up, where a sum per leaf ended
  in a one-block kernel per leaf; with parameters sharded (`fsdp`) the row sums are gathered
  (a few all-gathers more; docs/performance.md gives the compile mode's figures).
  """

  def row_sums(leaf):
    leaf = jnp.asarray(leaf)
    sizes = itertools.accumulate(leaf.shape, operator.mul)
    rows = next((n for n in sizes if n >= NORM_ROWS), leaf.size)
    return jnp.sum(jnp.square(leaf).reshape(rows, -1), axis=1)

  parts = [row_sums(leaf) for leaf in jax.tree.leaves(tree)]
  total = jnp.sum(jax.lax.optimization_barrier(jnp.concatenate(parts))) if parts else 0.0
  return jnp.sqrt(total)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """`optax.clip_by_global_norm(max_norm)` with the norm of `global_norm`: where the train step
  also takes that norm (for its metrics), the two are one computation in the compiled step,
  where optax's own norm would add a reduction per parameter array."""

  def update(updates, state, params=None):
    del params
    norm = global_norm(updates)
    clip = lambda t: jnp.where(norm < max_norm, t, t / norm.astype(t.dtype) * max_norm)
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
  """The paper's Adam and learning-rate schedule (`config.learning_rate` ...
  `config.grad_clip_norm`); validated on construction (FieldError naming `optimizer.<field>`)."""

  learning_rate: float = schema.setting(
    1.0, "scale on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)", gt=0
  )
  warmup_steps: int = schema.setting(4000, "warmup of the paper's learning-rate schedule", ge=1)
  adam_b1: float = schema.setting(0.9, "Adam's beta1", ge=0, lt=1)
  adam_b2: float = schema.setting(0.98, "Adam's beta2", ge=0, lt=1)
  adam_eps: float = schema.setting(1e-9, "Adam's epsilon", gt=0)
  grad_clip_norm: float = schema.setting(
    0.0, "global-norm gradient clipping (the paper does not clip)", ge=0, means={0: "off"}
  )
  cooldown_steps: int = schema.setting(
    0,
    "the last N of the run's num_train_steps updates take the rate linearly towards 0 (the "
    "last at 1/N of it); a resumed run with more steps moves them",
    ge=0,
    means={0: "off: the paper's schedule to the end"},
  )

  def __post_init__(self):
    schema.check(self, "optimizer")

  def make(self, d_model: int, num_train_steps: int | None = None):
    """`(optax optimizer, learning-rate schedule)` for a model of width `d_model` trained for
    `num_train_steps` (needed by a cooldown): Adam on the schedule, after global-norm clipping
    when `grad_clip_norm > 0`."""
    schedule = learning_rate_schedule(
      d_model=d_model,
      warmup_steps=self.warmup_steps,
      scale=self.learning_rate,
      cooldown_steps=self.cooldown_steps,
      num_train_steps=num_train_steps,
    )
    adam = optax.adam(schedule, b1=self.adam_b1, b2=self.adam_b2, eps=self.adam_eps)
    if self.grad_clip_norm > 0:
      return optax.chain(clip_by_global_norm(self.grad_clip_norm), adam), schedule
    return adam, schedule
