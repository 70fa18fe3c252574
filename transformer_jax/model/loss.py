"""The Transformer's training objective: label-smoothed cross entropy, summed over a batch's real
tokens.

`transformer_loss(label_smoothing)` is the loss function the trainer takes
(`(outputs, batch) -> sums`, `model.spec.LossFn`) over the outputs of
`transformer_outputs` (the forward pass of `transformer.transformer_spec`);
the train step differentiates it and evaluation (validation loss,
perplexity) adds it up over a split. `loss_sums` is the two together.
"""

import functools
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.conventions import BATCH_KEYS

LOSS_SUMS = ("loss", "nll", "tokens", "source_tokens")  # What `loss_sums` returns.


def cross_entropy(logits, targets, label_smoothing: float):
  """Per-token losses from logits `[..., vocab]` (any float dtype) and targets `[...]`.

  Returns `(smoothed, nll)`, `[...]` in float32 (float64 for float64 logits),
  whatever the logits' dtype: the arithmetic is float32 or wider. `nll` is
  `-log p(target)`. `smoothed` is the cross entropy against the smoothed
  target distribution: `1 - eps` on the target and `eps / (vocab - 1)` on each
  other token. It is not shifted by that distribution's entropy (its minimum
  is the entropy, not 0); perplexity comes from `nll` instead.

  Two passes over the logits: their maximum, then one reduction of the
  shifted exponentials, the target's logit (picked by comparing an iota with
  it, not a gather) and the logits' sum together; the gradient is one
  elementwise pass, `p - q` for the smoothed target `q`.
  """
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  vocab = logits.shape[-1]
  shift = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  is_target = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[
    ..., None
  ].astype(jnp.int32)
  # One reduction over the vocabulary for every sum: one pass over the logits after the max.
  terms = [jnp.exp(logits - shift), jnp.where(is_target, logits, 0)]
  if label_smoothing:
    terms.append(logits)
  sums = jnp.sum(jnp.stack(terms, axis=-1), axis=-2)
  log_z = shift[..., 0] + jnp.log(sums[..., 0])
  nll = log_z - sums[..., 1]
  if label_smoothing == 0:
    return nll, nll
  # Sum over all tokens of -log p = vocab * log_z - sum(logits).
  others = vocab * log_z - sums[..., 2] - nll
  smoothed = (1 - label_smoothing) * nll + label_smoothing / (vocab - 1) * others
  return smoothed, nll


def _summed(logits, targets, weights, label_smoothing: float):
  """`(loss, nll)`: `cross_entropy` summed over the positions where `weights` is 1."""
  smoothed, nll = cross_entropy(logits, targets, label_smoothing)
  return jnp.sum(smoothed * weights), jnp.sum(nll * weights)


def _chunked_sums(output_layer, features, targets, weights, label_smoothing: float, chunk: int):
  """`_summed` of `output_layer(features)` over chunks of `chunk` target positions of every row,
  one after another (`lax.scan`), each chunk's logits made again in the backward pass: no
  `[rows, length, vocab]` array exists. The positions padded to a whole chunk weigh 0."""
  rows, length = targets.shape
  count = -(-length // chunk)
  pad = count * chunk - length

  def chunks(x):  # [rows, length, ...] -> [count, rows, chunk, ...]
    x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(rows, count, chunk, *x.shape[2:]), 1, 0)

  @jax.checkpoint
  def chunk_sums(h, t, w):
    return _summed(output_layer(h), t, w, label_smoothing)

  def add_chunk(total, xs):
    return jax.tree.map(jnp.add, total, chunk_sums(*xs)), None

  zero = jnp.zeros((), jnp.promote_types(features.dtype, jnp.float32))
  sums, _ = lax.scan(add_chunk, (zero, zero), (chunks(features), chunks(targets), chunks(weights)))
  return sums


class Features(NamedTuple):
  """A Transformer's outputs when its loss makes the logits chunk by chunk (`loss_chunk`): the
  decoder's features `[b, t, d_model]`, the output layer (features `[b, c, d_model]` -> logits
  `[b, c, vocab]`) and the chunk length."""

  features: jax.Array
  output_layer: Callable
  chunk: int


def transformer_outputs(model: nn.Module, params, batch: Mapping[str, jax.Array], dropout_key=None):
  """The Linen Transformer's forward pass on a batch (keys `BATCH_KEYS`, by name): logits
  `[b, t, vocab]`, or `Features` where the model's `loss_chunk` is shorter than the targets.
  Dropout is on when `dropout_key` is given."""
  variables = {"params": params}
  chunk = model.config.loss_chunk
  chunked = 0 < chunk < batch["targets"].shape[1]
  out = model.apply(
    variables,
    **{k: batch[k] for k in BATCH_KEYS},
    train=dropout_key is not None,
    features=chunked,
    rngs=None if dropout_key is None else {"dropout": dropout_key},
  )
  if not chunked:
    return out
  return Features(out, functools.partial(model.apply, variables, method=model.logits), chunk)


def transformer_loss(label_smoothing: float):
  """The Transformer's loss function `(outputs, batch) -> sums` (`model.spec.LossFn`): sums over
  the non-padding target tokens of the batch.

  The sums are float32 scalars: `loss` (smoothed cross entropy), `nll`,
  `tokens` (target tokens, `targets_segmentation > 0`) and `source_tokens`
  (`LOSS_SUMS`). With `Features` as the outputs, the output layer and the
  loss run chunk by chunk (`_chunked_sums`).
  """

  def sums(outputs, batch: Mapping[str, jax.Array]) -> dict:
    weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
    if isinstance(outputs, Features):
      smoothed, nll = _chunked_sums(
        outputs.output_layer,
        outputs.features,
        batch["targets"],
        weights,
        label_smoothing,
        outputs.chunk,
      )
    else:
      smoothed, nll = _summed(outputs, batch["targets"], weights, label_smoothing)
    # float32 sums, also of a float64 model (whose gradients stay float64: a cast's cotangent is
    # cast back).
    return {
      "loss": smoothed.astype(jnp.float32),
      "nll": nll.astype(jnp.float32),
      "tokens": jnp.sum(weights),
      "source_tokens": jnp.sum(batch["inputs_segmentation"] > 0).astype(jnp.float32),
    }

  return sums


def loss_sums(
  model: nn.Module,
  params,
  batch: Mapping[str, jax.Array],
  *,
  label_smoothing: float,
  dropout_key=None,
):
  """`transformer_loss(label_smoothing)` of `transformer_outputs`: the sums (`LOSS_SUMS`) of one
  batch (keys `BATCH_KEYS`); dropout is on when `dropout_key` is given."""
  outputs = transformer_outputs(model, params, batch, dropout_key)
  return transformer_loss(label_smoothing)(outputs, batch)


@jax.jit
def add_sums(a, b):
  """Two trees of summed metrics (`loss_sums`, train-step metrics), added leaf by leaf."""
  return jax.tree.map(jnp.add, a, b)


def perplexity(nll_sum: float, num_tokens: float) -> float:
  """Per-token perplexity `exp(nll_sum / num_tokens)`, capped at exp(50) so that a diverging run
  still reports a number."""
  if num_tokens <= 0:
    raise ValueError(f"perplexity needs at least one token; got num_tokens={num_tokens}")
  return math.exp(min(nll_sum / num_tokens, 50.0))
