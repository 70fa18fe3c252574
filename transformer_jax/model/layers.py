"""Flax Linen layers of the Transformer, each usable on its own in any Flax model (the embedding
and positional encodings: model/embedding.py).

Every parameter carries logical axis names (`embed, heads, kv, mlp, vocab,
length`) and the main activations are constrained to (`batch, length, embed`,
...), so a table of rules (see `transformer_jax.sharding`) shards them without
code changes. Parameters are float32; `dtype` is the computation dtype.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model import attention
from transformer_jax.model.dropout import Dropout

Dtype = Any

# Initial parameters: "xavier", Xavier-uniform weights and zero biases (tensor2tensor's scale);
# "fairseq", fairseq's: W^Q, W^K, W^V at Xavier gain 2^-1/2, W^O Xavier, and the feed-forward
# layers and Q, K, V biases as torch's nn.Linear default, U(+-1/sqrt(fan_in)).
INITS = ("xavier", "fairseq")


def _uniform(bound: float):
  """An initializer drawing U(-bound, bound)."""
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


# The decode cache's entries that are the same for every hypothesis of a source sentence: the
# cross-attention's keys and values, projected once, and the self-attention's write position.
# The others hold one row per hypothesis, `[rows, heads, max_len, d]`.
SHARED_CACHE_ENTRIES = ("static_key", "static_value", "cache_index")

# The feed-forward activations: the paper's ReLU, and those of other pretrained models
# (swish = x * sigmoid(x); gelu is the exact, erf-based one).
ACTIVATIONS = {
  "relu": nn.relu,
  "swish": nn.swish,
  "gelu": functools.partial(nn.gelu, approximate=False),
}


def logical_param(module, name, init, shape, axes, dtype):
  """A float32 parameter annotated with logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class MultiHeadAttention(nn.Module):
  """Multi-head attention: `Concat(head_1..head_h) W^O`, heads of `Attention(Q W^Q, K W^K, V W^V)`.

  Input `[batch, q_len, d_model]` attends over `[batch, kv_len, d_model]`;
  output `[batch, q_len, out_features or d_model]`. W^Q, W^K are
  `[d_model, heads, d_k]`, W^V `[d_model, heads, d_v]`, W^O `[heads, d_v,
  d_model]`, with no biases, as in the paper; `use_bias` adds a bias to each
  projection (`[heads, d]` for Q, K, V, `[d_model]` for the output).
  `init_scheme` is one of INITS.

  Incremental decoding (`decode=True`) keeps a "cache" collection of
  head-major `[batch, heads, length, d]` keys/values: for self-attention
  those of the steps so far (the first call, with the full target shape,
  only sizes the cache); with `static_kv` (cross-attention over a fixed
  encoder output) they are projected on the first call and reused at every
  later step.
  """

  num_heads: int = 8
  d_k: int = 64
  d_v: int = 64
  out_features: int | None = None
  static_kv: bool = False
  use_bias: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_impl: attention.Implementation = "auto"
  init_scheme: str = "xavier"

  @nn.compact
  def __call__(self, inputs_q, inputs_kv, mask=None, *, decode: bool = False):
    d_in = inputs_q.shape[-1]
    d_out = self.out_features or d_in
    h = self.num_heads
    kv_init = nn.initializers.variance_scaling(
      0.5 if self.init_scheme == "fairseq" else 1.0,
      "fan_avg",
      "uniform",
      in_axis=0,
      out_axis=(1, 2),
    )
    w_q = logical_param(
      self, "query", kv_init, (d_in, h, self.d_k), ("embed", "heads", "kv"), self.param_dtype
    )
    w_k = logical_param(
      self,
      "key",
      kv_init,
      (inputs_kv.shape[-1], h, self.d_k),
      ("embed", "heads", "kv"),
      self.param_dtype,
    )
    w_v = logical_param(
      self,
      "value",
      kv_init,
      (inputs_kv.shape[-1], h, self.d_v),
      ("embed", "heads", "kv"),
      self.param_dtype,
    )
    w_o = logical_param(
      self,
      "out",
      nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2),
      (h, self.d_v, d_out),
      ("heads", "kv", "embed"),
      self.param_dtype,
    )
    b_q, b_k, b_v, b_o = self._biases(d_in, inputs_kv.shape[-1], d_out)

    def project(x, w, b, layout="blhk"):
      y = jnp.einsum(f"bld,dhk->{layout}", x.astype(self.dtype), w.astype(self.dtype))
      if b is not None:
        y = y + (b if layout == "blhk" else b[:, None, :]).astype(self.dtype)
      return nn.with_logical_constraint(
        y,
        ("batch", "length", "heads", "kv")
        if layout == "blhk"
        else ("batch", "heads", "length", "kv"),
      )

    query = project(inputs_q, w_q, b_q)
    if decode:
      # The cache is head-major, [batch, heads, length, d], as the attention wants it.
      if self.static_kv:
        key, value = self._static_kv_cache(
          lambda: (project(inputs_kv, w_k, b_k, "bhlk"), project(inputs_kv, w_v, b_v, "bhlk"))
        )
      else:
        key, value, mask = self._self_attention_cache(
          project(inputs_kv, w_k, b_k, "bhlk"), project(inputs_kv, w_v, b_v, "bhlk"), mask
        )
      out = attention.cached_attention(query, key, value, mask)
    else:
      key, value = project(inputs_kv, w_k, b_k), project(inputs_kv, w_v, b_v)
      out = attention.dot_product_attention(
        query, key, value, mask, implementation=self.attention_impl
      )
    out = jnp.einsum("blhk,hkd->bld", out, w_o.astype(self.dtype))
    if b_o is not None:
      out = out + b_o.astype(self.dtype)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))

  def _biases(self, d_in, d_kv, d_out):
    """The biases of Q, K, V and the output projection, or four Nones without `use_bias`."""
    if not self.use_bias:
      return None, None, None, None
    zeros, h = nn.initializers.zeros, self.num_heads
    fairseq = self.init_scheme == "fairseq"
    q_init, kv_init = (_uniform(d_in**-0.5), _uniform(d_kv**-0.5)) if fairseq else (zeros, zeros)
    return (
      logical_param(self, "query_bias", q_init, (h, self.d_k), ("heads", "kv"), self.param_dtype),
      logical_param(self, "key_bias", kv_init, (h, self.d_k), ("heads", "kv"), self.param_dtype),
      logical_param(self, "value_bias", kv_init, (h, self.d_v), ("heads", "kv"), self.param_dtype),
      logical_param(self, "out_bias", zeros, (d_out,), ("embed",), self.param_dtype),
    )

  def _static_kv_cache(self, compute):
    """Keys/values projected once from a fixed source, then read from the cache."""
    if self.has_variable("cache", "static_key"):
      return self.get_variable("cache", "static_key"), self.get_variable("cache", "static_value")
    key, value = compute()
    self.put_variable("cache", "static_key", key)
    self.put_variable("cache", "static_value", value)
    return key, value

  def _self_attention_cache(self, key, value, mask):
    """Write this step's key/value `[b, heads, 1, d]` into the cache; attend over steps so far."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, mask  # Sizing call: the full-length shape makes the cache.
    if key.shape[2] != 1:
      raise ValueError(
        f"incremental decoding takes one target position per call; got {key.shape[2]}"
      )
    max_len = cached_key.value.shape[2]
    index = cache_index.value
    zero = jnp.zeros_like(index)  # Start indices of one dtype, also with jax_enable_x64.
    key = jax.lax.dynamic_update_slice(cached_key.value, key, (zero, zero, index, zero))
    value = jax.lax.dynamic_update_slice(cached_value.value, value, (zero, zero, index, zero))
    cached_key.value, cached_value.value = key, value
    cache_index.value = index + 1
    seen = (jnp.arange(max_len) <= index)[None, None, None, :]
    return key, value, attention.combine_masks(mask, seen)


class FeedForward(nn.Module):
  """Position-wise feed-forward network `max(0, x W1 + b1) W2 + b2`, `[..., d_model]` to itself.

  `activation` (a name of ACTIVATIONS) replaces the paper's ReLU `max(0, .)`;
  `init_scheme` is one of INITS.
  """

  d_ff: int = 2048
  activation: str = "relu"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  init_scheme: str = "xavier"

  @nn.compact
  def __call__(self, x):
    d_model = x.shape[-1]
    if self.init_scheme == "fairseq":
      inits = (_uniform(d_model**-0.5),) * 2 + (_uniform(self.d_ff**-0.5),) * 2
    else:
      inits = (nn.initializers.xavier_uniform(), nn.initializers.zeros) * 2
    w1 = logical_param(
      self, "wi", inits[0], (d_model, self.d_ff), ("embed", "mlp"), self.param_dtype
    )
    b1 = logical_param(self, "bi", inits[1], (self.d_ff,), ("mlp",), self.param_dtype)
    w2 = logical_param(
      self, "wo", inits[2], (self.d_ff, d_model), ("mlp", "embed"), self.param_dtype
    )
    b2 = logical_param(self, "bo", inits[3], (d_model,), ("embed",), self.param_dtype)
    x = x.astype(self.dtype)
    hidden = ACTIVATIONS[self.activation](x @ w1.astype(self.dtype) + b1.astype(self.dtype))
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return hidden @ w2.astype(self.dtype) + b2.astype(self.dtype)


def residual(x, sublayer, *, norm, dropout, pre_norm: bool, deterministic: bool):
  """One residual sub-layer with dropout on its output before the add.

  Post-LN (the paper): `LayerNorm(x + Dropout(sublayer(x)))`.
  Pre-LN: `x + Dropout(sublayer(LayerNorm(x)))`.
  """
  if pre_norm:
    return x + dropout(sublayer(norm(x)), deterministic=deterministic)
  return norm(x + dropout(sublayer(x), deterministic=deterministic))


def layer_norm(dtype, name=None, epsilon=1e-6):
  """LayerNorm with logically partitioned scale and bias."""
  return nn.LayerNorm(
    epsilon=epsilon,
    dtype=dtype,
    name=name,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
  )


class _LayerFields(nn.Module):
  """Settings shared by EncoderLayer and DecoderLayer; the defaults are the paper's base model."""

  num_heads: int = 8
  d_k: int = 64
  d_v: int = 64
  d_ff: int = 2048
  dropout_rate: float = 0.1
  pre_norm: bool = False
  dtype: Dtype = jnp.float32
  attention_impl: attention.Implementation = "auto"
  attention_bias: bool = False
  activation: str = "relu"
  norm_epsilon: float = 1e-6
  init_scheme: str = "xavier"

  # Named apart from the submodules they make: `nnx.bridge.ToNNX` finds variables by attribute.
  def _norm(self, name):
    return layer_norm(self.dtype, name, self.norm_epsilon)

  def _feed_forward(self):
    return FeedForward(
      self.d_ff,
      self.activation,
      dtype=self.dtype,
      init_scheme=self.init_scheme,
      name="feed_forward",
    )

  def _attention(self, name, **kwargs):
    return MultiHeadAttention(
      self.num_heads,
      self.d_k,
      self.d_v,
      use_bias=self.attention_bias,
      dtype=self.dtype,
      attention_impl=self.attention_impl,
      init_scheme=self.init_scheme,
      name=name,
      **kwargs,
    )

  def _residual_block(self, deterministic: bool):
    """`block(x, sublayer, norm=...)`: `residual` with this layer's dropout and norm placement."""
    return functools.partial(
      residual,
      dropout=Dropout(self.dropout_rate),
      pre_norm=self.pre_norm,
      deterministic=deterministic,
    )


class EncoderLayer(_LayerFields):
  """Self-attention then feed-forward, each in a residual block: `[batch, length, d_model]` -> same.

  `mask` is broadcastable to `[batch, heads, length, length]`.
  """

  @nn.compact
  def __call__(self, x, mask=None, deterministic: bool = True):
    block = self._residual_block(deterministic)
    attend = self._attention("self_attention")
    x = block(x, lambda y: attend(y, y, mask), norm=self._norm("self_attention_norm"))
    x = block(x, self._feed_forward(), norm=self._norm("feed_forward_norm"))
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(_LayerFields):
  """Masked self-attention, attention over the encoder output, then feed-forward.

  `x`: `[batch, t_len, d_model]`; `encoded`: `[batch, s_len, d_model]`;
  `self_mask` broadcastable to `[batch, heads, t_len, t_len]` (causal and
  padding), `cross_mask` to `[batch, heads, t_len, s_len]`. With
  `decode=True` it runs one position at a time over a "cache" collection
  (see `MultiHeadAttention`); the cache supplies the causal mask then.
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
    x = block(
      x,
      lambda y: self_attend(y, y, self_mask, decode=decode),
      norm=self._norm("self_attention_norm"),
    )
    x = block(
      x,
      lambda y: cross_attend(y, encoded, cross_mask, decode=decode),
      norm=self._norm("cross_attention_norm"),
    )
    x = block(x, self._feed_forward(), norm=self._norm("feed_forward_norm"))
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))
