"""The training objective of a batch: label-smoothed cross entropy, summed over its real tokens.

Pure functions of (model, params, batch). The train step differentiates
`loss_sums`; evaluation (validation loss, perplexity) adds it up over a split.
"""

import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.conventions import BATCH_KEYS

LOSS_SUMS = ("loss", "nll", "tokens", "source_tokens")  # What `loss_sums` returns.


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


def loss_sums(
  model: nn.Module,
  params,
  batch: Mapping[str, jax.Array],
  *,
  label_smoothing: float,
  dropout_key=None,
):
  """Sums over the non-padding target tokens of one batch (keys `BATCH_KEYS`).

  Returns a dict of float32 scalars: `loss` (smoothed cross entropy), `nll`,
  `tokens` (target tokens, `targets_segmentation > 0`) and `source_tokens`.
  Dropout is on when `dropout_key` is given.
  """
  logits = model.apply(
    {"params": params},
    *(batch[k] for k in BATCH_KEYS),
    train=dropout_key is not None,
    rngs=None if dropout_key is None else {"dropout": dropout_key},
  )
  smoothed, nll = cross_entropy(logits, batch["targets"], label_smoothing)
  weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
  return {
    "loss": jnp.sum(smoothed * weights),
    "nll": jnp.sum(nll * weights),
    "tokens": jnp.sum(weights),
    "source_tokens": jnp.sum(batch["inputs_segmentation"] > 0).astype(jnp.float32),
  }


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
