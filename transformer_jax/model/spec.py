"""What the trainer needs of a model (`ModelSpec`), and a loss over its outputs (`LossFn`); a
spec of a Flax Linen module (`linen_spec`) or of a Flax NNX module (`nnx_spec`).

The train step, the Trainer, `fit`, `Placement`, the evaluation loss and the
compile mode take a `ModelSpec` and a `LossFn`, so any Flax model trains with
the sharded loop, Orbax checkpoints, preemption handling, exact resume and
the compile mode. The Transformer's are `transformer.transformer_spec` and
`loss.transformer_loss`.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

Batch = Mapping[str, jax.Array]
# `(model outputs, batch) -> sums`: float32 scalars summed over the batch, at least `loss` (what
# the gradient is taken of) and `tokens` (what the summed gradient is divided by; the loss and
# every other sum are logged per token). `nll` adds a perplexity to the logs; `source_tokens` a
# second tokens/s; any other sum is carried to the metrics and logged per token.
LossFn = Callable[[Any, Batch], dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A model as the trainer takes it.

  - `init(key) -> params`: fresh parameters, a pytree whose leaves may be boxed
    with logical axis names (`nn.LogicallyPartitioned`, what Linen's
    `nn.with_logical_partitioning` makes); the placement's rules shard those,
    and replicate unboxed leaves. Called under `jax.eval_shape` and `jax.jit`.
  - `apply(params, batch, dropout_key) -> outputs`: the forward pass on a batch,
    a dict of `[rows, length]` int32 arrays that holds at least `batch_keys`
    (the model takes them by name). `dropout_key` is a PRNG key in training
    (dropout on) and None in evaluation (deterministic). The outputs go to
    the loss function as they are.
  - `batch_keys`: the batch arrays the model reads; the trainer checks that a
    batch has them and sends only them to the devices.
  - `flops(batch) -> float`: the model FLOPs of one training step (forward and
    backward) on `batch`, traced inside the step or on numpy arrays (the compile
    mode passes arrays of ones: every position a token); None: no MFU.
  - `module`: what else reads the model (the Transformer's searches read
    `placement.model`): the Linen module of `linen_spec`, the graph definition
    of `nnx_spec`.
  """

  init: Callable[[jax.Array], Any]
  apply: Callable[[Any, Batch, jax.Array | None], Any]
  batch_keys: tuple[str, ...]
  flops: Callable[[Batch], Any] | None = None
  module: Any = None

  def __post_init__(self):
    if not self.batch_keys or isinstance(self.batch_keys, str):
      raise ValueError(f"batch_keys={self.batch_keys!r}: name the batch arrays the model reads")
    object.__setattr__(self, "batch_keys", tuple(self.batch_keys))


def _dummy_batch(batch_keys: Sequence[str]) -> dict:
  return {k: jnp.ones((1, 1), jnp.int32) for k in batch_keys}


def linen_spec(
  module: nn.Module,
  *,
  batch_keys: Sequence[str],
  flops: Callable[[Batch], Any] | None = None,
  train_arg: str | None = "train",
) -> ModelSpec:
  """A Linen module called as `module(**{key: batch[key] for key in batch_keys}, train=...)`.

  Its parameters are `module.init`'s `params` (initialized on a `[1, 1]`
  batch of ones), dropout draws from the `dropout` RNG stream, and
  `train_arg` names the keyword argument that is True in training (None: the
  module takes none; a module that takes `deterministic` gets it through a
  small wrapper module or its own `apply`).
  """

  def call(variables, batch, train: bool, rngs=None):
    flag = {} if train_arg is None else {train_arg: train}
    return module.apply(variables, **{k: batch[k] for k in batch_keys}, **flag, rngs=rngs)

  def init(key):
    flag = {} if train_arg is None else {train_arg: False}
    return module.init({"params": key}, **_dummy_batch(batch_keys), **flag)["params"]

  def apply(params, batch, dropout_key=None):
    rngs = None if dropout_key is None else {"dropout": dropout_key}
    return call({"params": params}, batch, dropout_key is not None, rngs)

  return ModelSpec(init, apply, tuple(batch_keys), flops, module)


def _boxed(variable: nnx.Variable):
  """A parameter's value, boxed with its logical axis names (`out_sharding`, as
  `nnx.with_partitioning` and model/nnx_layers.py set it) where it has them."""
  names = variable.get_metadata().get("out_sharding")
  return nn.LogicallyPartitioned(variable[...], tuple(names)) if names else variable[...]


def nnx_spec(
  make: Callable[[nnx.Rngs], nnx.Module],
  *,
  batch_keys: Sequence[str],
  flops: Callable[[Batch], Any] | None = None,
) -> ModelSpec:
  """An NNX module, made by `make(rngs)` and called as `model(**{key: batch[key] ...})`.

  The parameters are its `nnx.Param` variables as a nested dict (the
  `nnx.to_pure_dict` layout), boxed with their logical axis names. Each call
  merges them into the module (`nnx.merge`) with its RNG streams reseeded
  from the dropout key (stream i from `fold_in(dropout_key, i)`), viewed with
  `deterministic` = not training (`nnx.view`, which the dropout modules
  follow). Its variables may be parameters and RNG streams only: the trainer
  keeps no other state (batch statistics). The module is made under
  `nnx.use_eager_sharding(False)`: placing the parameters is the trainer's.
  """
  with nnx.use_eager_sharding(False):
    abstract = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
  graphdef, _, rest = nnx.split(abstract, nnx.Param, ...)
  variables = jax.tree.leaves(rest, is_leaf=lambda x: isinstance(x, nnx.Variable))
  others = sorted({type(v).__name__ for v in variables if not isinstance(v, nnx.RngState)})
  if others:
    raise ValueError(
      f"nnx_spec: the model holds {', '.join(others)} variables; the trainer keeps parameters "
      "(nnx.Param) and RNG streams only"
    )

  def init(key):
    with nnx.use_eager_sharding(False):
      params = nnx.state(make(nnx.Rngs(key)), nnx.Param)
    return nnx.to_pure_dict(params, extract_fn=_boxed)

  def streams(dropout_key) -> dict:
    key = jax.random.key(0) if dropout_key is None else dropout_key
    index = iter(range(len(variables)))

    def fresh(variable):
      value = variable.get_value()
      if isinstance(variable, nnx.RngKey):
        return jax.random.fold_in(key, next(index))
      return jnp.zeros(value.shape, value.dtype)  # A stream's count.

    return nnx.to_pure_dict(rest, extract_fn=fresh)

  def apply(params, batch, dropout_key=None):
    model = nnx.merge(graphdef, params, streams(dropout_key))
    model = nnx.view(model, deterministic=dropout_key is None, raise_if_not_found=False)
    return model(**{k: batch[k] for k in batch_keys})

  return ModelSpec(init, apply, tuple(batch_keys), flops, graphdef)
