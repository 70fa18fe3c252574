"""The Transformer: encoder, decoder and the model (its settings: model/config.py), and the model as
the trainer takes it (`transformer_spec`)."""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.conventions import BATCH_KEYS
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
from transformer_jax.model.encoder_decoder import (
  TransformerAPI,
  check_tokens,
  decoder_inputs_and_masks,
  decoder_masks,
  encoder_mask,
  shift_right,
)
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
  "check_tokens",
  "decoder_masks",
  "encoder_mask",
  "count_params",
  "preset_fields",
  "shift_right",
  "transformer_spec",
]


class _ScanStep(nn.Module):
  """One layer in the (carry, _) -> (carry, None) form that nn.scan expects."""

  layer: Any
  kwargs: Any
  static: tuple

  @nn.compact
  def __call__(self, x, *args):
    return self.layer(**self.kwargs, name="layer")(x, *args, *self.static), None


def stack_layers(cfg: TransformerConfig, depth: int, layer_cls, x, args: tuple, static: tuple):
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
  kwargs = cfg.layer_settings()
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
    x = stack_layers(cfg, cfg.encoder_depth, EncoderLayer, x, (mask,), (deterministic,))
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
    decoder_inputs, self_mask, cross_mask = decoder_inputs_and_masks(
      inputs, targets, inputs_segmentation, targets_segmentation, positions, decode=decode
    )
    y = _embed_positions(cfg, self.embed, decoder_inputs, positions, deterministic)
    y = stack_layers(
      cfg,
      cfg.decoder_depth,
      DecoderLayer,
      y,
      (encoded, self_mask, cross_mask),
      (deterministic, decode),
    )
    return _final_norm(cfg, y)


class Transformer(TransformerAPI, nn.Module):
  """Encoder-decoder Transformer with one embedding shared by both stacks and the output; its
  methods (`encode`, `decode`, `logits`, `__call__`) are `TransformerAPI`'s, dropout off unless a
  call says `train=True`.

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

  # Linen wraps only a class's own methods (scopes, setup first): the shared ones, made its own.
  encode, decode = TransformerAPI.encode, TransformerAPI.decode
  logits, __call__ = TransformerAPI.logits, TransformerAPI.__call__

  @nn.nowrap
  def _stack(self, name):
    return getattr(self, name)

  @staticmethod
  def _deterministic(train):
    return not train


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
