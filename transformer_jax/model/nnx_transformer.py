"""The Transformer as a Flax NNX module (`Transformer(config, rngs=...)`), and its parameters to and
from the Linen model's.

The same model as model/transformer.py's, built from model/nnx_layers.py: the
parameters have the Linen model's names and shapes (`linen_params` and
`load_linen_params` convert, the scanned Linen layout included), so a checkpoint
trained by this project loads here and back. Its layers are a Python loop
(`scan_layers` and `remat` are the Linen model's, for training).
"""

import functools

import flax.core
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from transformer_jax.model.config import TransformerConfig
from transformer_jax.model.encoder_decoder import (
  TransformerAPI,
  decoder_inputs_and_masks,
  encoder_mask,
)
from transformer_jax.model.nnx_layers import (
  DecoderLayer,
  Dropout,
  Embed,
  EncoderLayer,
  LayerNorm,
  PositionalEncoding,
)


class _Stack(nnx.Module):
  """Positions, dropout, `depth` layers (attributes `layer_0`...), and pre-LN's final norm;
  the token embedding is the model's, passed in."""

  def __init__(self, cfg: TransformerConfig, depth: int, layer_cls, rngs: nnx.Rngs):
    self.depth, self.pre_norm = depth, cfg.norm == "pre"
    self.positions = PositionalEncoding(cfg.max_len, cfg.d_model, cfg.positional, rngs=rngs)
    self.dropout = Dropout(cfg.dropout_rate, rngs=rngs)
    settings = cfg.layer_settings()
    for i in range(depth):
      setattr(self, f"layer_{i}", layer_cls(cfg.d_model, settings=settings, rngs=rngs))
    if self.pre_norm:
      self.final_norm = LayerNorm(cfg.d_model, epsilon=cfg.norm_epsilon, dtype=cfg.compute_dtype)

  def layers(self):
    return [getattr(self, f"layer_{i}") for i in range(self.depth)]

  def _inputs(self, embed, ids, positions, deterministic):
    return self.dropout(self.positions(embed(ids), positions), deterministic=deterministic)

  def _output(self, x):
    return self.final_norm(x) if self.pre_norm else x


class Encoder(_Stack):
  def __call__(self, embed, inputs, segmentation=None, positions=None, *, deterministic=None):
    x = self._inputs(embed, inputs, positions, deterministic)
    mask = encoder_mask(inputs, segmentation)
    for layer in self.layers():
      x = layer(x, mask, deterministic)
    return self._output(x)


class Decoder(_Stack):
  def __call__(
    self,
    embed,
    encoded,
    inputs,
    targets,
    *,
    inputs_segmentation=None,
    targets_segmentation=None,
    positions=None,
    deterministic=None,
    decode=False,
  ):
    decoder_inputs, self_mask, cross_mask = decoder_inputs_and_masks(
      inputs, targets, inputs_segmentation, targets_segmentation, positions, decode=decode
    )
    y = self._inputs(embed, decoder_inputs, positions, deterministic)
    for layer in self.layers():
      y = layer(y, encoded, self_mask, cross_mask, deterministic, decode)
    return self._output(y)


class Transformer(TransformerAPI, nnx.Module):
  """Encoder-decoder Transformer with one embedding shared by both stacks and the output, as the
  Linen `model.transformer.Transformer`, with the same methods (`TransformerAPI`'s) and
  `init_cache`. `train` switches dropout on (True) or off (False) for a call; None leaves it to
  the modules, as `model.train()` / `model.eval()` set them (on after construction)."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    cfg = self.config = config
    self.embed = Embed(
      cfg.known_vocab_size(),
      cfg.d_model,
      logits_bias=cfg.logits_bias,
      dtype=cfg.compute_dtype,
      vocab_multiple=cfg.vocab_multiple,
      rngs=rngs,
    )
    self.encoder = Encoder(cfg, cfg.encoder_depth, EncoderLayer, rngs)
    self.decoder = Decoder(cfg, cfg.decoder_depth, DecoderLayer, rngs)

  def _stack(self, name):
    return functools.partial(getattr(self, name), self.embed)

  @staticmethod
  def _deterministic(train):
    return None if train is None else not train

  def init_cache(self, encoded, rows: int, max_len: int):
    """Decoding state for `rows` hypotheses (a multiple of the sentences of `encoded`, each
    sentence's next to each other) of `max_len` positions: empty self-attention buffers, and
    the cross-attention keys/values of each sentence projected once."""
    for layer in self.decoder.layers():
      layer.self_attention.init_cache(rows, max_len)
      layer.cross_attention.set_static_kv(encoded)


def linen_params(model: nnx.Module, scanned: bool | None = None) -> dict:
  """An NNX module's parameters (any module of model/nnx_layers.py, or the Transformer) as the
  Linen module's `params` dict; `scanned`: a Transformer's layers stacked under `layers/layer`,
  the layout of `scan_layers=True` (None: as its config says)."""
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  if scanned is None:
    scanned = isinstance(model, Transformer) and model.config.scan_layers
  if not scanned:
    return params
  for stack in ("encoder", "decoder"):
    depth = getattr(model, stack).depth
    layers = [params[stack].pop(f"layer_{i}") for i in range(depth)]
    params[stack]["layers"] = {"layer": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}
  return params


def load_linen_params(model: nnx.Module, params: dict) -> None:
  """Set an NNX module's parameters to the Linen module's `params` (boxed or not; a Transformer's
  in the looped or the scanned layout)."""
  params = flax.core.unfreeze(nn.unbox(params))  # Linen's `init` boxes them with axis names.
  if isinstance(model, Transformer):
    for stack in ("encoder", "decoder"):
      scanned = params[stack].pop("layers", None)
      for i in range(getattr(model, stack).depth if scanned else 0):
        params[stack][f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], scanned["layer"])
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  nnx.update(model, state)
