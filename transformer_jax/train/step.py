"""The sharded train step of any model and loss, a pure function of `(state, batch)`, and the
Trainer that compiles it.

The model is a `model.spec.ModelSpec` (its parameters, its forward pass on a
batch by name, its FLOPs), the loss a function `(outputs, batch) -> sums`
(`model.spec.LossFn`). The step is jit-compiled once per mesh with explicit
in/out shardings and the state donated. Its dropout key is
`fold_in(key(seed), step)`, so a resumed run draws the same masks.
"""

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec

from transformer_jax.model.spec import LossFn, ModelSpec
from transformer_jax.placement import Placement
from transformer_jax.sharding import abstract_tree, tree_shardings
from transformer_jax.train.objective import global_norm


class TrainState(struct.PyTreeNode):
  """What a train step changes: `step` (int32 scalar), float32 `params` and `opt_state`."""

  step: jax.Array
  params: Any
  opt_state: Any


def split_micro_batches(array, num_micro: int):
  """`[batch, ...]` -> `[num_micro, batch / num_micro, ...]`; row `i * num_micro + j` to micro j.

  Each device's consecutive block of rows stays on that device in every
  micro-batch.
  """
  rows = array.shape[0]
  return jnp.swapaxes(array.reshape(rows // num_micro, num_micro, *array.shape[1:]), 0, 1)


def make_train_step(
  model: ModelSpec,
  loss: LossFn,
  optimizer: optax.GradientTransformation,
  *,
  grad_accum_steps: int = 1,
  seed: int = 0,
  batch_sharding: NamedSharding | None = None,
):
  """The pure train step `(state, batch) -> (state, metrics)` of `model` under `loss`.

  The gradient is that of the summed `loss` divided by the summed `tokens`
  (for the Transformer: the mean smoothed loss over all non-padding target
  tokens of the batch). With `grad_accum_steps > 1` the batch is split into
  that many micro-batches (`split_micro_batches`) run one after another with
  `lax.scan`; the sums and gradient sums are added and divided once by the
  total token count, so the update equals the one from the whole batch.
  Micro-batch j draws dropout from `fold_in(step_key, j)`. `metrics` holds
  the loss's sums, `grad_norm`, `flops` (`model.flops` of the batch, where
  the model has it), float32 scalars, and `nonfinite`: 1.0 when the loss or
  the gradient norm is NaN or infinite. Such an update is skipped
  (`skip_nonfinite`): params and optimizer state stay as they were, only
  `step` advances, and the step's sums and gradient norm count as 0.
  """
  dropout_base = jax.random.fold_in(jax.random.key(seed), 1)

  def loss_and_sums(params, batch, key):
    sums = loss(model.apply(params, batch, key), batch)
    return sums["loss"], sums

  grad_fn = jax.grad(loss_and_sums, has_aux=True)

  def train_step(state: TrainState, batch):
    key = jax.random.fold_in(dropout_base, state.step)
    if grad_accum_steps == 1:
      grads, sums = grad_fn(state.params, batch, key)
    else:
      micro = jax.tree.map(
        functools.partial(split_micro_batches, num_micro=grad_accum_steps), batch
      )

      def accumulate(carry, xs):
        index, micro_batch = xs
        if batch_sharding is not None:
          micro_batch = jax.lax.with_sharding_constraint(micro_batch, batch_sharding)
        grads, sums = grad_fn(state.params, micro_batch, jax.random.fold_in(key, index))
        return jax.tree.map(jnp.add, carry, (grads, sums)), None

      first = jax.tree.map(lambda x: x[0], micro)
      shapes = jax.eval_shape(lambda b: loss_and_sums(state.params, b, key)[1], first)
      zeros = (
        jax.tree.map(jnp.zeros_like, state.params),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
      )
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(grad_accum_steps), micro))
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
    grad_norm = global_norm(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**sums, "grad_norm": grad_norm}
    if model.flops is not None:
      metrics["flops"] = model.flops(batch)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    return skip_nonfinite(state, new_state, metrics)

  return train_step


def skip_nonfinite(state: TrainState, new_state: TrainState, metrics: dict):
  """`(new_state, metrics)`, or `state` with its step advanced if the loss or gradient norm is not
  finite.

  Decided on the device (`jnp.where`, no host sync). Adds `metrics["nonfinite"]`
  (1.0 for a skipped update, else 0.0); a skipped step's loss sums (`loss`,
  `tokens` and the others) and `grad_norm` become 0, so logged averages and
  token counts cover the applied updates only; its `flops` stay (it ran).
  """
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
  keep = lambda new, old: jnp.where(finite, new, old)
  state = TrainState(
    step=new_state.step,
    params=jax.tree.map(keep, new_state.params, state.params),
    opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state),
  )
  metrics = {
    k: v if k == "flops" else jnp.where(finite, v, jnp.zeros_like(v)) for k, v in metrics.items()
  }
  metrics["nonfinite"] = 1.0 - finite.astype(jnp.float32)
  return state, metrics


class Trainer:
  """A placed model, its loss and its optimizer: sharded init and train step, jit-compiled.

  `loss` is the loss function of `make_train_step` (`model.spec.LossFn`;
  the Transformer's is `model.loss.transformer_loss`). Parameters and optimizer state are sharded by
  their logical axis names through the placement's rules (`state_shardings`,
  `abstract_state`); calls run inside its mesh and rules contexts.
  `jitted_step` is the jit-compiled step over global arrays that
  `train_step` runs (to lower or export it); `compile_ahead` compiles it for several batch shapes
  at once, before their batches come, into `compiled_ahead` (keyed by the shapes of the arrays of
  this process's batches), whose programs `train_step` then runs.
  """

  def __init__(
    self,
    placement: Placement,
    optimizer: optax.GradientTransformation,
    loss: LossFn,
    *,
    grad_accum_steps: int = 1,
    seed: int = 0,
  ):
    self.loss = loss
    self.placement, self.optimizer = placement, optimizer
    self.seed = seed
    self.grad_accum_steps = grad_accum_steps
    boxed = jax.eval_shape(self._init_boxed, jax.random.key(0))
    self.state_shardings = tree_shardings(boxed, placement.mesh, placement.rules)
    self.abstract_state = abstract_tree(nn.unbox(boxed), self.state_shardings)
    replicated = NamedSharding(placement.mesh, PartitionSpec())
    self._init = jax.jit(
      lambda key: nn.unbox(self._init_boxed(key)), out_shardings=self.state_shardings
    )
    step = make_train_step(
      placement.spec,
      self.loss,
      optimizer,
      grad_accum_steps=grad_accum_steps,
      seed=seed,
      batch_sharding=placement.batch_sharding,
    )
    self.jitted_step = jax.jit(
      step,
      in_shardings=(self.state_shardings, placement.batch_sharding),
      out_shardings=(self.state_shardings, replicated),
      donate_argnums=0,
    )
    self.compiled_ahead: dict[tuple, Any] = {}

  def _init_boxed(self, key):
    """Initial state, parameters boxed by logical axis names (the optimizer state inherits them)."""
    params = self.placement.boxed_params(key)
    return TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params)
    )

  def init(self) -> TrainState:
    """Freshly initialized, sharded state; parameters from `key(seed)`."""
    return self.placement.run(self._init, jax.random.fold_in(jax.random.key(self.seed), 0))

  def check_batch(self, local_batch: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError if this process's batch lacks an array the model reads (its spec's
    `batch_keys`), or if its `[rows, length]` arrays cannot be split as configured."""
    keys = self.placement.spec.batch_keys
    missing = [k for k in keys if k not in local_batch]
    if missing:
      raise ValueError(
        f"the batch lacks {', '.join(missing)}: the model reads {', '.join(keys)} "
        f"(the batch has {', '.join(local_batch) or 'nothing'})"
      )
    rows = np.shape(local_batch[keys[0]])[0] * self.placement.data_shard[1]
    need = self.placement.batch_shards * self.grad_accum_steps
    if rows % need:
      raise ValueError(
        f"the global batch has {rows} rows, not a multiple of {need} = "
        f"{self.placement.batch_shards} batch shards (the mesh and sharding rules) x "
        f"{self.grad_accum_steps} micro-batches (grad_accum_steps); change the batch size, "
        "the mesh or grad_accum_steps"
      )

  def compile_ahead(self, shapes: Sequence[tuple[int, int]], threads: int) -> list[tuple]:
    """Compile the train step for global batches of each `(rows, length)` of `shapes`, on up to
    `threads` threads at once (`Placement.compile_ahead`); later `train_step`s on such batches
    run these programs. `((rows, length) of this process's batches, seconds)` of each compiled
    (one whose compile failed is left to its first step)."""
    placement = self.placement
    compiled = placement.compile_ahead(
      [
        lambda shape=shape: self.jitted_step.lower(
          self.abstract_state, placement.abstract_batch(*shape)
        )
        for shape in shapes
      ],
      threads,
    )
    keys, processes = placement.spec.batch_keys, placement.data_shard[1]
    local = [(rows // processes, length) for rows, length in shapes]
    done = [(shape, program, t) for shape, (program, t) in zip(local, compiled) if program]
    for shape, program, _ in done:
      self.compiled_ahead[tuple(shape for _ in keys)] = program
    return [(shape, seconds) for shape, _, seconds in done]

  def train_step(self, state: TrainState, local_batch: Mapping[str, np.ndarray]):
    """One update from this process's rows of the batch; `state` is donated. `(state, metrics)`."""
    shapes = tuple(np.shape(local_batch[k]) for k in self.placement.spec.batch_keys)
    step = self.compiled_ahead.get(shapes, self.jitted_step)
    return self.placement.run(step, state, self.placement.global_batch(local_batch))
