"""The Transformer's layers as Flax NNX modules, over the same math as the Linen ones.

Each module holds its parameters under the Linen module's names
(model/nnx_transformer.py maps them both ways) and calls model/functional.py, so the
two front doors compute the same thing. Every parameter carries its logical axis
names (`functional.AXES`) as `out_sharding` metadata, without eager sharding:
`transformer_jax.sharding.nnx_shardings(model, mesh, rules)` gives its shardings.
Dropout keys come from the `dropout` stream of the `rngs` given at construction
(`Dropout` also takes a key at the call); a `deterministic` argument switches it off
for a call, `model.eval()` / `model.train()` (or `nnx.view(model, deterministic=...)`)
for every call after.
"""

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

from transformer_jax.model import attention, dropout, functional
from transformer_jax.model.decode_cache import SentenceCache
from transformer_jax.model.settings import (
  AttentionSettings,
  FeedForwardSettings,
  LayerSettings,
  NormSettings,
)

Dtype = Any


def _annotated(name: str, value) -> nnx.Param:
  """The parameter `name` holding `value`, annotated with its logical axes, not sharded eagerly."""
  return nnx.Param(value, out_sharding=functional.AXES[name], eager_sharding=False)


def _make(module, specs: dict[str, functional.ParamSpec], rngs, param_dtype, names=()):
  """Set the parameters `specs` (a table of model/functional.py) on `module`, each drawn with the
  next `rngs.params()` key (`rngs` None: made without a key), and the `names` not in `specs` to
  None."""
  for name, spec in specs.items():
    key = None if rngs is None else rngs.params()
    setattr(module, name, _annotated(name, spec.init(key, spec.shape, param_dtype)))
  for name in set(names) - set(specs):
    setattr(module, name, nnx.data(None))


class Dropout(nnx.Module):
  """`dropout.dropout` (hashed keep decisions) as an NNX module; `rate` 0 or `deterministic`:
  the identity."""

  def __init__(self, rate: float, *, deterministic: bool = False, rngs: nnx.Rngs | None = None):
    self.rate = rate
    self.deterministic = deterministic
    self.rngs = rngs.dropout.fork() if rngs is not None and rate > 0 else nnx.data(None)

  def set_view(self, deterministic: bool | None = None):
    """What `nnx.view(model, deterministic=...)` calls."""
    if deterministic is not None:
      self.deterministic = deterministic

  def active(self, deterministic: bool | None = None) -> bool:
    """Whether a call with `deterministic` drops anything."""
    return self.rate > 0 and not (self.deterministic if deterministic is None else deterministic)

  def function(self, deterministic: bool | None = None):
    """This dropout as a function of one array where a call with `deterministic` drops anything;
    None where it does not."""
    return functools.partial(self, deterministic=False) if self.active(deterministic) else None

  def __call__(self, x, *, deterministic: bool | None = None, rngs=None):
    """`rngs`: a key, an `nnx.Rngs` or a stream, instead of the one given at construction."""
    if not self.active(deterministic):
      return x
    source = self.rngs if rngs is None else rngs
    if source is None:
      raise ValueError("Dropout with rate > 0 and deterministic=False needs rngs")
    if isinstance(source, nnx.Rngs):
      key = source.dropout()
    elif isinstance(source, nnx.RngStream):
      key = source()
    else:
      key = source
    return dropout.dropout(x, self.rate, key)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis with a `[d]` scale and bias (`functional.layer_norm`); its
  options: `settings` (a `NormSettings`), or its fields as keywords."""

  def __init__(self, d: int, *, settings: NormSettings | None = None, **kwargs):
    s = self.settings = NormSettings.build(settings, kwargs=kwargs)
    _make(self, functional.norm_params(d), None, s.param_dtype)

  def __call__(self, x):
    return functional.layer_norm(x, self.scale[...], self.bias[...], self.settings)


_BIASES = ("query_bias", "key_bias", "value_bias", "out_bias")


class MultiHeadAttention(nnx.Module):
  """Multi-head attention (the Linen `layers.MultiHeadAttention`): queries of width `d_model`
  attend over keys/values of width `d_kv` (default `d_model`); output `out_features` wide
  (default `d_model`).

  `dropout_rate` drops attention weights in training (attention dropout); a call's `is_causal`
  adds the causal mask through the kernel's causal path. Decoding: `init_cache(rows, max_len)`
  makes a self-attention buffer of `rows` hypotheses; `set_static_kv(inputs_kv)` projects
  cross-attention keys/values once; `decode=True` calls then read them (and write the step's
  own key/value into the buffer). Its options: `settings` (an `AttentionSettings`), or its
  fields as arguments after `d_model` (`num_heads, d_k, d_v, ...`).
  """

  def __init__(
    self,
    d_model: int,
    *args,
    d_kv: int | None = None,
    settings: AttentionSettings | None = None,
    rngs: nnx.Rngs,
    **kwargs,
  ):
    s = self.settings = AttentionSettings.build(settings, args, kwargs)
    specs = functional.attention_params(
      s.init_scheme,
      d_model,
      d_kv or d_model,
      s.num_heads,
      s.d_k,
      s.d_v,
      d_out=s.out_features,
      use_bias=s.use_bias,
    )
    _make(self, specs, rngs, s.param_dtype, names=_BIASES)
    self.cached_key = self.cached_value = self.cache_index = nnx.data(None)
    self.static_key = self.static_value = nnx.data(None)
    self.weights_dropout = Dropout(s.dropout_rate, rngs=rngs)

  def _weights(self, name):
    p = getattr(self, name)
    return None if p is None else p[...]

  def _project(self, x, name, head_major=False):
    return functional.project(
      x,
      self._weights(name),
      self._weights(f"{name}_bias"),
      self.settings.dtype,
      head_major=head_major,
    )

  def init_cache(self, rows: int, max_len: int):
    """Empty self-attention buffers `[rows, heads, max_len, d]` (`nnx.Cache`, per row) and a
    write position of 0 (`SentenceCache`: model/decode_cache.py)."""
    heads, d_k = self.query.shape[1:]
    d_v = self.value.shape[2]
    dtype = self.settings.dtype
    self.cached_key = nnx.Cache(jnp.zeros((rows, heads, max_len, d_k), dtype))
    self.cached_value = nnx.Cache(jnp.zeros((rows, heads, max_len, d_v), dtype))
    self.cache_index = SentenceCache(jnp.array(0, jnp.int32))

  def set_static_kv(self, inputs_kv):
    """Project the fixed keys/values (an encoder output `[b, s, d_kv]`) once, head-major, one
    copy per sentence (`SentenceCache`)."""
    self.static_key = SentenceCache(self._project(inputs_kv, "key", head_major=True))
    self.static_value = SentenceCache(self._project(inputs_kv, "value", head_major=True))

  def __call__(
    self, inputs_q, inputs_kv, mask=None, *, is_causal=False, decode=False, deterministic=None
  ):
    query = self._project(inputs_q, "query")
    if not decode:
      key, value = self._project(inputs_kv, "key"), self._project(inputs_kv, "value")
      dropout = self.weights_dropout.function(deterministic)
      out = attention.dot_product_attention(
        query,
        key,
        value,
        mask,
        is_causal=is_causal,
        implementation=self.settings.attention_impl,
        dropout=dropout,
      )
    elif self.static_key is not None:
      out = attention.cached_attention(query, self.static_key[...], self.static_value[...], mask)
    else:
      if self.cached_key is None:
        raise ValueError("decode=True needs init_cache (self-attention) or set_static_kv first")
      key, value, mask = functional.write_step(
        self.cached_key[...],
        self.cached_value[...],
        self.cache_index[...],
        self._project(inputs_kv, "key", head_major=True),
        self._project(inputs_kv, "value", head_major=True),
        mask,
      )
      self.cached_key[...], self.cached_value[...] = key, value
      self.cache_index[...] = self.cache_index[...] + 1
      out = attention.cached_attention(query, key, value, mask)
    return functional.merge_heads(
      out, self.out[...], self._weights("out_bias"), self.settings.dtype
    )


class FeedForward(nnx.Module):
  """Position-wise feed-forward network `activation(x W1 + b1) W2 + b2`, `[..., d_model]`;
  `dropout_rate` drops hidden activations in training (activation dropout). Its options:
  `settings` (a `FeedForwardSettings`), or its fields as arguments after `d_model`."""

  def __init__(
    self, d_model: int, *args, settings: FeedForwardSettings | None = None, rngs: nnx.Rngs, **kwargs
  ):
    s = self.settings = FeedForwardSettings.build(settings, args, kwargs)
    _make(self, functional.feed_forward_params(s.init_scheme, d_model, s.d_ff), rngs, s.param_dtype)
    self.activation_dropout = Dropout(s.dropout_rate, rngs=rngs)

  def __call__(self, x, deterministic: bool | None = None):
    weights = {name: getattr(self, name)[...] for name in ("wi", "bi", "wo", "bo")}
    return functional.feed_forward(
      x, **weights, settings=self.settings, dropout=self.activation_dropout.function(deterministic)
    )


class Embed(nnx.Module):
  """The shared token embedding: `__call__` ids -> `[b, l, d_model]` times sqrt(d_model);
  `attend` `[b, l, d_model]` -> logits `[b, l, vocab]` through the same matrix (+ a bias), its
  matmul over the table padded to a multiple of `vocab_multiple` rows (`functional.logits`)."""

  def __init__(
    self,
    vocab_size: int,
    d_model: int,
    *,
    logits_bias: bool = False,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    vocab_multiple: int = 1,
    rngs: nnx.Rngs,
  ):
    self.dtype, self.vocab_multiple = dtype, vocab_multiple
    specs = functional.embed_params(vocab_size, d_model, logits_bias)
    _make(self, specs, rngs, param_dtype, names=("logits_bias",))

  def __call__(self, ids):
    return functional.embed(self.embedding[...], ids, self.dtype)

  def attend(self, x, wide: bool = False):
    bias = None if self.logits_bias is None else self.logits_bias[...]
    kwargs = dict(vocab_multiple=self.vocab_multiple, wide=wide)
    return functional.logits(self.embedding[...], bias, x, self.dtype, **kwargs)


class PositionalEncoding(nnx.Module):
  """Adds the paper's sinusoid (`kind="sinusoidal"`) or a learned `[max_len, d_model]` table."""

  def __init__(
    self,
    max_len: int,
    d_model: int,
    kind: str = "sinusoidal",
    *,
    param_dtype: Dtype = jnp.float32,
    rngs: nnx.Rngs | None = None,
  ):
    self.max_len = max_len
    specs = functional.positional_params(max_len, d_model, kind)
    _make(self, specs, rngs, param_dtype, names=("table",))

  def __call__(self, x, positions=None):
    table = None if self.table is None else self.table[...]
    return functional.add_positions(x, table, positions, self.max_len)


class _Layer(nnx.Module):
  """The settings and sub-layers shared by EncoderLayer and DecoderLayer: `settings` (a
  `LayerSettings`), or its fields as arguments (the paper's base model by default)."""

  def __init__(
    self,
    d_model: int,
    *args,
    settings: LayerSettings | None = None,
    attentions: tuple = ("self_attention",),
    rngs: nnx.Rngs,
    **kwargs,
  ):
    s = self.settings = LayerSettings.build(settings, args, kwargs)
    self.pre_norm = s.pre_norm
    for name in attentions:
      setattr(self, name, MultiHeadAttention(d_model, settings=s.attention(), rngs=rngs))
      setattr(self, f"{name}_norm", LayerNorm(d_model, settings=s.norm()))
    self.feed_forward = FeedForward(d_model, settings=s.feed_forward(), rngs=rngs)
    self.feed_forward_norm = LayerNorm(d_model, settings=s.norm())
    self.dropout = Dropout(s.dropout_rate, rngs=rngs)

  def _feed_forward(self, deterministic):
    return functools.partial(self.feed_forward, deterministic=deterministic)

  def _block(self, deterministic):
    return functools.partial(
      functional.residual,
      dropout=functools.partial(self.dropout, deterministic=deterministic),
      pre_norm=self.pre_norm,
    )


class EncoderLayer(_Layer):
  """Self-attention then feed-forward, each in a residual block: `[b, l, d_model]` -> same;
  `is_causal` makes the self-attention causal through the attention's own causal path, `mask`
  then the padding or packed segments (as the Linen layer's)."""

  def __call__(self, x, mask=None, deterministic: bool | None = None, is_causal: bool = False):
    block, feed_forward = self._block(deterministic), self._feed_forward(deterministic)
    x = block(
      x,
      lambda y: self.self_attention(y, y, mask, is_causal=is_causal, deterministic=deterministic),
      norm=self.self_attention_norm,
    )
    x = block(x, feed_forward, norm=self.feed_forward_norm)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(_Layer):
  """Causal self-attention (`self_mask`: padding or packed segments), attention over the encoder
  output, then feed-forward."""

  def __init__(self, d_model: int, *args, **kwargs):
    super().__init__(d_model, *args, attentions=("self_attention", "cross_attention"), **kwargs)

  def __call__(
    self,
    x,
    encoded,
    self_mask=None,
    cross_mask=None,
    deterministic: bool | None = None,
    decode: bool = False,
  ):
    block, feed_forward = self._block(deterministic), self._feed_forward(deterministic)
    attend = dict(decode=decode, deterministic=deterministic)
    x = block(
      x,
      lambda y: self.self_attention(y, y, self_mask, is_causal=True, **attend),
      norm=self.self_attention_norm,
    )
    x = block(
      x,
      lambda y: self.cross_attention(y, encoded, cross_mask, **attend),
      norm=self.cross_attention_norm,
    )
    x = block(x, feed_forward, norm=self.feed_forward_norm)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))
