"""The Transformer: encoder, decoder and the model (its settings: model/config.py), and the model as
the trainer takes it (`transformer_spec`)."""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.conventions import BATCH_KEYS, PAD_ID
from transformer_jax.model import attention
from transformer_jax.model.config import (
  PRESETS,
  REMAT_POLICIES,
  TransformerConfig,
  batch_train_flops,
  count_params,
  preset_fields,
)
from transformer_jax.model.decode_cache import CACHE_COLLECTIONS
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.embedding import Embed, PositionalEncoding
from transformer_jax.model.layers import DecoderLayer, EncoderLayer, LayerNorm
from transformer_jax.model.loss import transformer_outputs
from transformer_jax.model.settings import LayerSettings
from transformer_jax.model.spec import ModelSpec

# The settings stay importable from here, where config files have imported them from.
__all__ = [
  "PRESETS",
  "Decoder",
  "Encoder",
  "LayerSettings",
  "Transformer",
  "TransformerConfig",
  "count_params",
  "preset_fields",
  "shift_right",
  "transformer_spec",
]


def shift_right(targets, segmentation=None):
  """Decoder inputs: targets moved one step right, PAD_ID (the start token) first.

  With packed `segmentation`, every example's first position gets the start
  token instead of the previous example's last token. `[batch, length]`.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  if segmentation is None:
    return shifted
  previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(segmentation == previous, shifted, PAD_ID)


def encoder_mask(inputs, segmentation=None):
  """The encoder's self-attention mask: padding, or packed segments."""
  if segmentation is None:
    return attention.padding_mask(inputs, inputs)
  return attention.segment_mask(segmentation, segmentation)


def decoder_masks(
  inputs, targets, inputs_segmentation, targets_segmentation, positions, *, decode: bool
):
  """The decoder's (self-attention, cross-attention) masks: padding (or packed segments), the
  causal mask left to the self-attention's `is_causal` (the decoder layer's); with `decode` (one
  step, the cache masks unseen positions) no self-attention mask, and `positions` are required."""
  if decode:
    if positions is None:
      raise ValueError("decode=True needs the position of the step being decoded, [b, 1]")
    key_real = (inputs != PAD_ID) if inputs_segmentation is None else (inputs_segmentation != 0)
    return None, key_real[:, None, None, :]
  if targets_segmentation is None:
    return attention.padding_mask(targets, targets), attention.padding_mask(targets, inputs)
  return (
    attention.segment_mask(targets_segmentation, targets_segmentation),
    attention.segment_mask(targets_segmentation, inputs_segmentation),
  )


def layer_settings(config: TransformerConfig) -> LayerSettings:
  """The settings of an encoder or decoder layer (Linen or NNX) of `config`: a `LayerSettings`,
  which unpacks as keyword arguments too (`EncoderLayer(**layer_settings(config))`)."""
  return config.layer_settings()


class _ScanStep(nn.Module):
  """One layer in the (carry, _) -> (carry, None) form that nn.scan expects."""

  layer: Any
  kwargs: Any
  static: tuple

  @nn.compact
  def __call__(self, x, *args):
    return self.layer(**self.kwargs, name="layer")(x, *args, *self.static), None


def _stack_layers(cfg: TransformerConfig, depth: int, layer_cls, x, args: tuple, static: tuple):
  """Applies `depth` layers to x: a Python loop, or nn.scan; with remat if asked.

  `args` are arrays shared by every layer; `static` are Python values (flags).
  """
  if cfg.remat != "none":
    first = 2 + len(args)  # Flax counts self as argument 0.
    layer_cls = nn.remat(
      layer_cls,
      policy=REMAT_POLICIES[cfg.remat],
      static_argnums=tuple(range(first, first + len(static))),
    )
  kwargs = layer_settings(cfg)
  if not cfg.scan_layers:
    for i in range(depth):
      x = layer_cls(**kwargs, name=f"layer_{i}")(x, *args, *static)
    return x
  scanned = nn.scan(
    _ScanStep,
    variable_axes={"params": 0, **dict.fromkeys(CACHE_COLLECTIONS, 0)},
    split_rngs={"params": True, "dropout": True},
    in_axes=nn.broadcast,
    length=depth,
    metadata_params={nn.PARTITION_NAME: "layers"},
  )
  x, _ = scanned(layer_cls, kwargs, static, name="layers")(x, *args)
  return x


def check_tokens(name, tokens, max_len):
  """Raise ValueError unless `tokens` is `[batch, length]` integer ids with length <= max_len."""
  if tokens.ndim != 2:
    raise ValueError(f"{name} must be [batch, length] token ids; got shape {tokens.shape}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{name} must hold integer token ids; got dtype {tokens.dtype}")
  if tokens.shape[1] > max_len:
    raise ValueError(f"{name} has length {tokens.shape[1]} > TransformerConfig.max_len={max_len}")


def _embed_positions(cfg: TransformerConfig, embed: Embed, ids, positions, deterministic):
  """The stacks' input: embedded ids plus positional encodings, then dropout (inside a compact
  method: the submodules belong to the caller)."""
  x = embed(ids)
  x = PositionalEncoding(cfg.max_len, cfg.positional, name="positions")(x, positions)
  return Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


def _final_norm(cfg: TransformerConfig, x):
  """Pre-LN stacks end in a LayerNorm (the sublayers normalise only their inputs)."""
  return (
    LayerNorm(cfg.norm_epsilon, cfg.compute_dtype, name="final_norm")(x) if cfg.norm == "pre" else x
  )


class Encoder(nn.Module):
  """Embedding, positions, dropout, the encoder layers: ids `[b, s]` -> `[b, s, d_model]`."""

  config: TransformerConfig
  embed: Embed

  @nn.compact
  def __call__(self, inputs, segmentation=None, positions=None, *, deterministic=True):
    cfg = self.config
    x = _embed_positions(cfg, self.embed, inputs, positions, deterministic)
    mask = encoder_mask(inputs, segmentation)
    x = _stack_layers(cfg, cfg.encoder_depth, EncoderLayer, x, (mask,), (deterministic,))
    return _final_norm(cfg, x)


class Decoder(nn.Module):
  """Shifted targets through the decoder layers: features `[b, t, d_model]`, which the shared
  embedding turns into logits (`Transformer.logits`).

  In `decode=True` mode `targets` is the previous output token `[b, 1]` and
  `positions` its position `[b, 1]`; no shift is applied.
  """

  config: TransformerConfig
  embed: Embed

  @nn.compact
  def __call__(
    self,
    encoded,
    inputs,
    targets,
    *,
    inputs_segmentation=None,
    targets_segmentation=None,
    positions=None,
    deterministic=True,
    decode=False,
  ):
    cfg = self.config
    self_mask, cross_mask = decoder_masks(
      inputs, targets, inputs_segmentation, targets_segmentation, positions, decode=decode
    )
    decoder_inputs = targets if decode else shift_right(targets, targets_segmentation)
    y = _embed_positions(cfg, self.embed, decoder_inputs, positions, deterministic)
    y = _stack_layers(
      cfg,
      cfg.decoder_depth,
      DecoderLayer,
      y,
      (encoded, self_mask, cross_mask),
      (deterministic, decode),
    )
    return _final_norm(cfg, y)


class Transformer(nn.Module):
  """Encoder-decoder Transformer with one embedding shared by both stacks and the output.

  Token id PAD_ID (0) is padding and the decoder's start token. Packed batches pass
  segment ids (1, 2, ... per example, 0 on padding) and per-example positions.
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.embed = Embed(
      cfg.known_vocab_size(),
      cfg.d_model,
      cfg.logits_bias,
      dtype=cfg.compute_dtype,
      vocab_multiple=cfg.vocab_multiple,
    )
    self.encoder = Encoder(cfg, self.embed)
    self.decoder = Decoder(cfg, self.embed)

  def encode(self, inputs, inputs_segmentation=None, inputs_position=None, *, train=False):
    """Source ids `[b, s]` -> encoder output `[b, s, d_model]`."""
    check_tokens("inputs", inputs, self.config.max_len)
    return self.encoder(inputs, inputs_segmentation, inputs_position, deterministic=not train)

  def decode(
    self,
    encoded,
    inputs,
    targets,
    targets_segmentation=None,
    targets_position=None,
    inputs_segmentation=None,
    *,
    train=False,
    decode=False,
    features=False,
  ):
    """Encoder output and targets `[b, t]` -> logits `[b, t, vocab]` (targets shifted inside;
    with `decode`, one step of previous tokens at `targets_position`, applied with the
    `CACHE_COLLECTIONS` mutable, after a call with the full target shape has sized them); with
    `features`, the decoder's output before the output layer, `[b, t, d_model]`."""
    check_tokens("targets", targets, self.config.max_len)
    out = self.decoder(
      encoded,
      inputs,
      targets,
      inputs_segmentation=inputs_segmentation,
      targets_segmentation=targets_segmentation,
      positions=targets_position,
      deterministic=not train,
      decode=decode,
    )
    return out if features else self.logits(out, wide=decode)

  def logits(self, features, wide: bool = False):
    """The output layer: the decoder's features `[b, t, d_model]` -> logits `[b, t, vocab]` in
    the compute dtype (`wide`, as in `decode=True`: float32 or wider), through the shared
    embedding."""
    logits = self.embed.attend(features, wide)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

  def __call__(
    self,
    inputs,
    targets,
    inputs_segmentation=None,
    targets_segmentation=None,
    inputs_position=None,
    targets_position=None,
    *,
    train=False,
    features=False,
  ):
    """Teacher-forced forward pass: logits `[b, t, vocab]` for predicting `targets` (with
    `features`, the decoder's output before the output layer)."""
    encoded = self.encode(inputs, inputs_segmentation, inputs_position, train=train)
    return self.decode(
      encoded,
      inputs,
      targets,
      targets_segmentation,
      targets_position,
      inputs_segmentation,
      train=train,
      features=features,
    )


def transformer_spec(config: TransformerConfig) -> ModelSpec:
  """The Linen `Transformer(config)` as the trainer takes it: parameters boxed with their logical
  axis names, the forward pass of `loss.transformer_outputs` on a batch of `BATCH_KEYS` (its
  loss function: `loss.transformer_loss`), and `config.batch_train_flops`; `module` is the
  Transformer (what the searches run)."""
  model = Transformer(config)

  def init(key):
    dummy = jnp.ones((1, 1), jnp.int32)
    return model.init({"params": key}, dummy, dummy)["params"]

  return ModelSpec(
    init=init,
    apply=functools.partial(transformer_outputs, model),
    batch_keys=BATCH_KEYS,
    flops=functools.partial(batch_train_flops, config),
    module=model,
  )
