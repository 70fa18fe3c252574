"""Flax Linen layers of the Transformer, each usable on its own in any Flax model (the embedding
and positional encodings: model/embedding.py; the same layers in NNX: model/nnx_layers.py).

The modules hold the parameters; the math is model/functional.py's. Every
parameter carries logical axis names (`embed, heads, kv, mlp, vocab,
length`) and the main activations are constrained to (`batch, length, embed`,
...), so a table of rules (see `transformer_jax.sharding`) shards them without
code changes. `param_dtype` holds the parameters (float32 by default); `dtype` computes.
"""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.model import attention, functional
from transformer_jax.model.decode_cache import CACHE_COLLECTIONS, ROW_CACHE, SENTENCE_CACHE
from transformer_jax.model.dropout import Dropout
from transformer_jax.model.functional import ACTIVATIONS, INITS
from transformer_jax.model.settings import (
  AttentionSettings,
  FeedForwardSettings,
  LayerSettings,
  NormSettings,
)

Dtype = Any

__all__ = [
  "ACTIVATIONS",
  "CACHE_COLLECTIONS",
  "INITS",
  "DecoderLayer",
  "EncoderLayer",
  "FeedForward",
  "LayerNorm",
  "LayerSettings",
  "MultiHeadAttention",
  "logical_param",
]


def _dropout_or_none(rate: float, deterministic: bool):
  """A `Dropout(rate)` submodule of the module being called, as a function of one array, where it
  drops anything; None where it does not."""
  if rate == 0 or deterministic:
    return None
  return functools.partial(Dropout(rate), deterministic=False)


def logical_param(module, name, init, shape, dtype):
  """The parameter `name` of `module`, annotated with its logical axis names (`functional.AXES`)."""
  axes = functional.AXES[name]
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def make_params(module, specs: dict[str, functional.ParamSpec], dtype) -> dict:
  """The parameters `specs` (a table of model/functional.py) of `module`, by name."""
  return {
    name: logical_param(module, name, spec.init, spec.shape, dtype) for name, spec in specs.items()
  }


class MultiHeadAttention(nn.Module):
  """Multi-head attention: `Concat(head_1..head_h) W^O`, heads of `Attention(Q W^Q, K W^K, V W^V)`.

  Input `[batch, q_len, d_model]` attends over `[batch, kv_len, d_model]`;
  output `[batch, q_len, out_features or d_model]`. W^Q, W^K are
  `[d_model, heads, d_k]`, W^V `[d_model, heads, d_v]`, W^O `[heads, d_v,
  d_model]`, with no biases, as in the paper; `use_bias` adds a bias to each
  projection (`[heads, d]` for Q, K, V, `[d_model]` for the output).
  `init_scheme` is one of INITS. `dropout_rate` drops attention weights when
  a call is not `deterministic` (attention dropout; it takes the reference
  attention, the fused kernels have no dropout). A call's `is_causal` adds the
  causal mask through the kernel's causal path (`attention.dot_product_attention`);
  with `decode=True` the cache masks the positions not yet decoded instead.

  Incremental decoding (`decode=True`, with the `CACHE_COLLECTIONS` mutable)
  keeps head-major `[batch, heads, length, d]` keys/values: for
  self-attention those of the steps so far, one row per hypothesis, in the
  "cache" collection (the first call, with the full target shape, only sizes
  the cache; the write position goes to "sentence_cache"); with `static_kv`
  (cross-attention over a fixed encoder output) they are projected on the
  first call, one copy per sentence in "sentence_cache", and reused at every
  later step (model/decode_cache.py).
  """

  # Its options: AttentionSettings' fields, then whether the keys/values are a fixed source's.
  locals().update(AttentionSettings.module_fields(static_kv=(bool, False)))

  @nn.compact
  def __call__(
    self,
    inputs_q,
    inputs_kv,
    mask=None,
    *,
    is_causal: bool = False,
    decode: bool = False,
    deterministic: bool = True,
  ):
    d_in, d_kv = inputs_q.shape[-1], inputs_kv.shape[-1]
    specs = functional.attention_params(
      self.init_scheme,
      d_in,
      d_kv,
      self.num_heads,
      self.d_k,
      self.d_v,
      d_out=self.out_features,
      use_bias=self.use_bias,
    )
    p = make_params(self, specs, self.param_dtype)
    bias = lambda name: p.get(f"{name}_bias")
    project = functools.partial(functional.project, dtype=self.dtype)

    query = project(inputs_q, p["query"], bias("query"))
    if decode:
      # The cache is head-major, [batch, heads, length, d], as the attention wants it.
      keys_values = lambda: (
        project(inputs_kv, p["key"], bias("key"), head_major=True),
        project(inputs_kv, p["value"], bias("value"), head_major=True),
      )
      if self.static_kv:
        key, value = self._static_kv_cache(keys_values)
      else:
        key, value, mask = self._self_attention_cache(*keys_values(), mask)
      out = attention.cached_attention(query, key, value, mask)
    else:
      key = project(inputs_kv, p["key"], bias("key"))
      value = project(inputs_kv, p["value"], bias("value"))
      out = attention.dot_product_attention(
        query,
        key,
        value,
        mask,
        is_causal=is_causal,
        implementation=self.attention_impl,
        dropout=_dropout_or_none(self.dropout_rate, deterministic),
      )
    return functional.merge_heads(out, p["out"], bias("out"), self.dtype)

  def _static_kv_cache(self, compute):
    """Keys/values projected once from a fixed source, then read from the cache."""
    if self.has_variable(SENTENCE_CACHE, "static_key"):
      get = functools.partial(self.get_variable, SENTENCE_CACHE)
      return get("static_key"), get("static_value")
    key, value = compute()
    self.put_variable(SENTENCE_CACHE, "static_key", key)
    self.put_variable(SENTENCE_CACHE, "static_value", value)
    return key, value

  def _self_attention_cache(self, key, value, mask):
    """Write this step's key/value `[b, heads, 1, d]` into the cache; attend over steps so far."""
    initialized = self.has_variable(ROW_CACHE, "cached_key")
    cached_key = self.variable(ROW_CACHE, "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable(ROW_CACHE, "cached_value", jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable(SENTENCE_CACHE, "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, mask  # Sizing call: the full-length shape makes the cache.
    key, value, mask = functional.write_step(
      cached_key.value, cached_value.value, cache_index.value, key, value, mask
    )
    cached_key.value, cached_value.value = key, value
    cache_index.value = cache_index.value + 1
    return key, value, mask


class FeedForward(nn.Module):
  """Position-wise feed-forward network `max(0, x W1 + b1) W2 + b2`, `[..., d_model]` to itself.

  `activation` (a name of ACTIVATIONS) replaces the paper's ReLU `max(0, .)`;
  `init_scheme` is one of INITS; `dropout_rate` drops hidden activations when a
  call is not `deterministic` (activation dropout).
  """

  locals().update(FeedForwardSettings.module_fields())

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    specs = functional.feed_forward_params(self.init_scheme, x.shape[-1], self.d_ff)
    p = make_params(self, specs, self.param_dtype)
    dropout = _dropout_or_none(self.dropout_rate, deterministic)
    return functional.feed_forward(x, **p, settings=FeedForwardSettings.of(self), dropout=dropout)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with a `[d]` scale and bias (`functional.layer_norm`)."""

  locals().update(NormSettings.module_fields())

  @nn.compact
  def __call__(self, x):
    p = make_params(self, functional.norm_params(x.shape[-1]), self.param_dtype)
    return functional.layer_norm(x, **p, settings=NormSettings.of(self))


class _LayerFields(nn.Module):
  """The fields shared by EncoderLayer and DecoderLayer: those of `LayerSettings`, with its
  defaults (the paper's base model); `EncoderLayer(**settings)` makes one of `settings`."""

  locals().update(LayerSettings.module_fields())

  @property
  def settings(self) -> LayerSettings:
    return LayerSettings.of(self)

  # Named apart from the submodules they make: `nnx.bridge.ToNNX` finds variables by attribute.
  def _norm(self, name):
    return LayerNorm(**self.settings.norm(), name=name)

  def _feed_forward(self):
    return FeedForward(**self.settings.feed_forward(), name="feed_forward")

  def _attention(self, name, **kwargs):
    return MultiHeadAttention(**self.settings.attention(), name=name, **kwargs)

  def _residual_block(self, deterministic: bool):
    """`block(x, sublayer, norm=...)`: `functional.residual` with this layer's dropout (one
    module, a new key at each call) and norm placement."""
    return functools.partial(
      functional.residual,
      dropout=functools.partial(Dropout(self.dropout_rate), deterministic=deterministic),
      pre_norm=self.pre_norm,
    )


class EncoderLayer(_LayerFields):
  """Self-attention then feed-forward, each in a residual block: `[batch, length, d_model]` -> same.

  `mask` is broadcastable to `[batch, heads, length, length]`. `is_causal` makes the
  self-attention causal through the attention's own causal path (`attention.dot_product_attention`;
  cuDNN's CAUSAL mask type on a GPU) with `mask` as the padding or packed segments: a decoder-only
  model's layer, as `model/language_model.py` calls it.
  """

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True, is_causal: bool = False):
    block = self._residual_block(deterministic)
    attend, feed_forward = self._attention("self_attention"), self._feed_forward()
    x = block(
      x,
      lambda y: attend(y, y, mask, is_causal=is_causal, deterministic=deterministic),
      norm=self._norm("self_attention_norm"),
    )
    x = block(x, lambda y: feed_forward(y, deterministic), norm=self._norm("feed_forward_norm"))
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(_LayerFields):
  """Masked self-attention, attention over the encoder output, then feed-forward.

  `x`: `[batch, t_len, d_model]`; `encoded`: `[batch, s_len, d_model]`;
  `self_mask` broadcastable to `[batch, heads, t_len, t_len]` (padding or
  packed segments; the layer adds the causal mask, through the attention's
  `is_causal`), `cross_mask` to `[batch, heads, t_len, s_len]`. With
  `decode=True` it runs one position at a time over the cache collections
  (`CACHE_COLLECTIONS` mutable; see `MultiHeadAttention`); the cache supplies
  the causal mask then.
  """

  @nn.compact
  def __call__(
    self,
    x,
    encoded,
    self_mask=None,
    cross_mask=None,
    deterministic: bool = True,
    decode: bool = False,
  ):
    block = self._residual_block(deterministic)
    self_attend = self._attention("self_attention")
    cross_attend = self._attention("cross_attention", static_kv=True)
    feed_forward = self._feed_forward()
    x = block(
      x,
      lambda y: self_attend(
        y, y, self_mask, is_causal=True, decode=decode, deterministic=deterministic
      ),
      norm=self._norm("self_attention_norm"),
    )
    x = block(
      x,
      lambda y: cross_attend(y, encoded, cross_mask, decode=decode, deterministic=deterministic),
      norm=self._norm("cross_attention_norm"),
    )
    x = block(x, lambda y: feed_forward(y, deterministic), norm=self._norm("feed_forward_norm"))
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))
