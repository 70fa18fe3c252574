"""A decoder-only language model built from the Transformer's Linen layers, as the trainer takes
it (`language_model_spec`), with its loss (`language_model_loss`) and FLOPs (`train_flops`).

The model is what a user lifting our layers into their own model writes: the shared embedding
(`Embed`, also the output layer), the positional encodings, the paper's encoder layer made
causal (the decoder layer without cross-attention: the padding or packed-segment mask, the causal
one left to the self-attention's `is_causal`, cuDNN's CAUSAL mask type on a GPU, as in the
decoder), and a final LayerNorm for pre-LN. Its settings are the Transformer's
(`TransformerConfig`): `num_layers` layers of `d_model`, `d_ff` and `num_heads`, its dropout,
norm placement, attention implementation, `scan_layers`, `remat` and `max_len`. It reads the
target side of a translation batch (`targets`, packed `targets_segmentation` and
`targets_position`), so it trains on any data source; every parameter carries the Transformer's
logical axis names, so the sharding rules apply as they are.
"""

import functools
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.config import TransformerConfig, weight_counts
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.embedding import Embed, PositionalEncoding
from transformer_jax.model.encoder_decoder import check_tokens, encoder_mask, shift_right
from transformer_jax.model.layers import EncoderLayer, LayerNorm
from transformer_jax.model.loss import cross_entropy
from transformer_jax.model.spec import ModelSpec, linen_spec

# The Transformer's stacking of layers: a loop, or `nn.scan` (`scan_layers`), with `remat`.
from transformer_jax.model.transformer import stack_layers

# The batch arrays the model reads: the target side of the pipeline's batches.
LM_BATCH_KEYS = ("targets", "targets_segmentation", "targets_position")


class LanguageModel(nn.Module):
  """Next-token prediction: ids `[batch, length]` -> logits `[batch, length, vocab]`, position t
  predicting token t from tokens before it (the ids are shifted right inside, PAD_ID first,
  as the Transformer's decoder does)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, targets, targets_segmentation=None, targets_position=None, *, train=False):
    cfg = self.config
    check_tokens("targets", targets, cfg.max_len)
    embed = Embed(
      cfg.known_vocab_size(),
      cfg.d_model,
      cfg.logits_bias,
      dtype=cfg.compute_dtype,
      vocab_multiple=cfg.vocab_multiple,
      name="embed",
    )
    x = embed(shift_right(targets, targets_segmentation))
    x = PositionalEncoding(cfg.max_len, cfg.positional, name="positions")(x, targets_position)
    x = Dropout(cfg.dropout_rate)(x, deterministic=not train)
    # Position i sees positions <= i of its own example: the mask keeps the examples apart (packed
    # segments, else the non-padding tokens), the layers' `is_causal` adds the causal mask.
    mask = encoder_mask(targets, targets_segmentation)
    x = stack_layers(cfg, cfg.num_layers, EncoderLayer, x, (mask,), (not train, True))
    if cfg.norm == "pre":  # Pre-LN sublayers normalise only their inputs.
      x = LayerNorm(cfg.norm_epsilon, cfg.compute_dtype, name="final_norm")(x)
    logits = embed.attend(x)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


def train_flops(cfg: TransformerConfig, batch: Mapping[str, jax.Array]) -> jax.Array:
  """Model FLOPs of one training step on `batch`: 3 x the forward pass, 2 FLOPs per multiply-add.

  Each non-padding token (`targets_segmentation > 0`) meets every layer's attention
  projections and feed-forward and the output projection (vocab x d_model), and is charged
  `heads * (d_k + d_v)` multiply-adds per key of the padded row (the full square, as
  computed). Embedding lookups, norms, softmaxes and the loss are left out.
  """
  tokens = (batch["targets_segmentation"] > 0).sum(dtype=jnp.float32)
  length = batch["targets"].shape[1]
  w = weight_counts(cfg)
  attention_products = cfg.num_heads * (cfg.key_size + cfg.value_size) * length
  layer = w["query"] + w["key"] + w["value"] + w["out"] + w["feed_forward"] + attention_products
  per_token = cfg.num_layers * layer + cfg.known_vocab_size() * cfg.d_model
  return 3.0 * 2.0 * tokens * per_token


def language_model_spec(config: TransformerConfig) -> ModelSpec:
  """`LanguageModel(config)` as the trainer takes it: a Linen module on `LM_BATCH_KEYS`, its
  FLOPs `train_flops`; its loss function is `language_model_loss`."""
  return linen_spec(
    LanguageModel(config), batch_keys=LM_BATCH_KEYS, flops=functools.partial(train_flops, config)
  )


def language_model_loss(label_smoothing: float):
  """The loss function `(logits, batch) -> sums` (`model.spec.LossFn`) of next-token prediction:
  float32 sums over the non-padding target tokens of `loss` (label-smoothed cross entropy,
  `loss.cross_entropy`), `nll` (what perplexity is of) and `tokens`."""

  def sums(logits, batch: Mapping[str, jax.Array]) -> dict:
    weights = (batch["targets_segmentation"] > 0).astype(jnp.float32)
    smoothed, nll = cross_entropy(logits, batch["targets"], label_smoothing)
    return {
      "loss": jnp.sum(smoothed * weights).astype(jnp.float32),
      "nll": jnp.sum(nll * weights).astype(jnp.float32),
      "tokens": jnp.sum(weights),
    }

  return sums
