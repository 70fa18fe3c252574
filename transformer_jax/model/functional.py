"""The layers' math as pure functions of their parameters, and how each parameter starts.

The Linen modules (layers.py, embedding.py) and the NNX modules (nnx_layers.py) hold
the parameters and call these functions, so the two front doors compute the
same thing; parameters are named, shaped and initialised as `AXES` and the
initialisers here say, and the scaled dot-product attention itself is
model/attention.py's.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from transformer_jax.model import attention

# Every parameter's logical axis names, by its name in its module; the sharding rules
# (transformer_jax.sharding) map them to mesh axes.
AXES = {
  "query": ("embed", "heads", "kv"),
  "key": ("embed", "heads", "kv"),
  "value": ("embed", "heads", "kv"),
  "out": ("heads", "kv", "embed"),
  "query_bias": ("heads", "kv"),
  "key_bias": ("heads", "kv"),
  "value_bias": ("heads", "kv"),
  "out_bias": ("embed",),
  "wi": ("embed", "mlp"),
  "bi": ("mlp",),
  "wo": ("mlp", "embed"),
  "bo": ("embed",),
  "scale": ("embed",),
  "bias": ("embed",),
  "embedding": ("vocab", "embed"),
  "logits_bias": ("vocab",),
  "table": ("length", "embed"),
}

# Initial parameters: "xavier", Xavier-uniform weights and zero biases (tensor2tensor's scale);
# "fairseq", fairseq's: W^Q, W^K, W^V at Xavier gain 2^-1/2, W^O Xavier, and the feed-forward
# layers and Q, K, V biases as torch's nn.Linear default, U(+-1/sqrt(fan_in)).
INITS = ("xavier", "fairseq")

POSITIONALS = ("sinusoidal", "learned")

# The feed-forward activations: the paper's ReLU, and those of other pretrained models
# (swish = x * sigmoid(x); gelu is the exact, erf-based one).
ACTIVATIONS = {
  "relu": nn.relu,
  "swish": nn.swish,
  "gelu": functools.partial(nn.gelu, approximate=False),
}


def uniform(bound: float):
  """An initializer drawing U(-bound, bound)."""
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


class ParamSpec(NamedTuple):
  """One parameter: its shape and initializer (its logical axes: `AXES[name]`)."""

  shape: tuple[int, ...]
  init: Callable


def attention_params(
  scheme: str,
  d_in: int,
  d_kv: int,
  num_heads: int,
  d_k: int,
  d_v: int,
  *,
  d_out: int | None = None,
  use_bias: bool = False,
) -> dict[str, ParamSpec]:
  """`MultiHeadAttention`'s parameters, by name, in the order they are made, for queries of width
  `d_in`, keys and values of width `d_kv` and an output `d_out` (default `d_in`) wide; the biases
  with `use_bias`. Initializers by `scheme` (one of INITS)."""
  d_out = d_out or d_in
  qkv = nn.initializers.variance_scaling(
    0.5 if scheme == "fairseq" else 1.0, "fan_avg", "uniform", in_axis=0, out_axis=(1, 2)
  )
  params = {
    "query": ParamSpec((d_in, num_heads, d_k), qkv),
    "key": ParamSpec((d_kv, num_heads, d_k), qkv),
    "value": ParamSpec((d_kv, num_heads, d_v), qkv),
    "out": ParamSpec(
      (num_heads, d_v, d_out), nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)
    ),
  }
  if use_bias:
    fairseq, zeros = scheme == "fairseq", nn.initializers.zeros
    params |= {
      "query_bias": ParamSpec((num_heads, d_k), uniform(d_in**-0.5) if fairseq else zeros),
      "key_bias": ParamSpec((num_heads, d_k), uniform(d_kv**-0.5) if fairseq else zeros),
      "value_bias": ParamSpec((num_heads, d_v), uniform(d_kv**-0.5) if fairseq else zeros),
      "out_bias": ParamSpec((d_out,), zeros),
    }
  return params


def feed_forward_params(scheme: str, d_model: int, d_ff: int) -> dict[str, ParamSpec]:
  """`FeedForward`'s parameters, by name, in the order they are made."""
  if scheme == "fairseq":
    inits = [
      uniform(d_model**-0.5),
      uniform(d_model**-0.5),
      uniform(d_ff**-0.5),
      uniform(d_ff**-0.5),
    ]
  else:
    xavier, zeros = nn.initializers.xavier_uniform(), nn.initializers.zeros
    inits = [xavier, zeros, xavier, zeros]
  shapes = [(d_model, d_ff), (d_ff,), (d_ff, d_model), (d_model,)]
  return {name: ParamSpec(*spec) for name, *spec in zip(("wi", "bi", "wo", "bo"), shapes, inits)}


def norm_params(d: int) -> dict[str, ParamSpec]:
  """`LayerNorm`'s parameters: a `[d]` scale of ones and bias of zeros (made without a key)."""
  return {
    "scale": ParamSpec((d,), nn.initializers.ones),
    "bias": ParamSpec((d,), nn.initializers.zeros),
  }


def embed_params(vocab_size: int, d_model: int, logits_bias: bool = False) -> dict[str, ParamSpec]:
  """`Embed`'s parameters: the shared `[vocab, d_model]` table, N(0, d_model^-1/2), and with
  `logits_bias` a `[vocab]` bias of zeros."""
  params = {"embedding": ParamSpec((vocab_size, d_model), embedding_init(d_model))}
  if logits_bias:
    params["logits_bias"] = ParamSpec((vocab_size,), nn.initializers.zeros)
  return params


def positional_params(max_len: int, d_model: int, kind: str) -> dict[str, ParamSpec]:
  """`PositionalEncoding`'s parameters: a learned `[max_len, d_model]` table, or none."""
  if kind not in POSITIONALS:
    raise ValueError(f"positional kind {kind!r}; allowed: {', '.join(POSITIONALS)}")
  if kind != "learned":
    return {}
  return {"table": ParamSpec((max_len, d_model), embedding_init(d_model))}


def layer_params(
  d_model: int, settings, attentions: tuple[str, ...] = ("self_attention",)
) -> dict[str, dict[str, ParamSpec]]:
  """An encoder layer's (`attentions` ("self_attention",)) or a decoder layer's (and
  "cross_attention") parameters, by sub-layer, for `settings` (a `LayerSettings`)."""
  s = settings
  attend = functools.partial(
    attention_params, s.init_scheme, d_model, d_model, s.num_heads, s.d_k, s.d_v
  )
  tree = {}
  for name in attentions:
    tree[name] = attend(use_bias=s.attention_bias)
    tree[f"{name}_norm"] = norm_params(d_model)
  tree["feed_forward"] = feed_forward_params(s.init_scheme, d_model, s.d_ff)
  tree["feed_forward_norm"] = norm_params(d_model)
  return tree


def embedding_init(d_model: int):
  """N(0, d_model^-1/2), the token embedding's (and a learned position table's) initializer."""
  return nn.initializers.normal(stddev=d_model**-0.5)


def project(x, w, b, dtype, *, head_major: bool = False):
  """`x W (+ b)`: `[b, l, d]` x `[d, heads, k]` -> `[b, l, heads, k]`, or `[b, heads, l, k]`
  (the decode cache's layout) with `head_major`."""
  layout = "bhlk" if head_major else "blhk"
  y = jnp.einsum(f"bld,dhk->{layout}", x.astype(dtype), w.astype(dtype))
  if b is not None:
    y = y + (b[:, None, :] if head_major else b).astype(dtype)
  axes = ("batch", "heads", "length", "kv") if head_major else ("batch", "length", "heads", "kv")
  return nn.with_logical_constraint(y, axes)


def merge_heads(out, w, b, dtype):
  """`Concat(heads) W^O (+ b)`: `[b, l, heads, d_v]` -> `[b, l, d_model]`."""
  out = jnp.einsum("blhk,hkd->bld", out, w.astype(dtype))
  if b is not None:
    out = out + b.astype(dtype)
  return nn.with_logical_constraint(out, ("batch", "length", "embed"))


def write_step(cached_key, cached_value, index, key, value, mask):
  """One decoding step's key/value `[b, heads, 1, d]` written at `index` into the head-major
  buffers `[b, heads, max_len, d]`: (keys, values, the mask `mask` narrowed to the positions
  written so far)."""
  if key.shape[2] != 1:
    raise ValueError(f"incremental decoding takes one target position per call; got {key.shape[2]}")
  zero = jnp.zeros_like(index)  # Start indices of one dtype, also with jax_enable_x64.
  key = lax.dynamic_update_slice(cached_key, key, (zero, zero, index, zero))
  value = lax.dynamic_update_slice(cached_value, value, (zero, zero, index, zero))
  seen = (jnp.arange(cached_key.shape[2]) <= index)[None, None, None, :]
  return key, value, attention.combine_masks(mask, seen)


def feed_forward(x, wi, bi, wo, bo, settings, dropout=None):
  """`activation(x W1 + b1) W2 + b2`: `[..., d_model]` to itself, with the options `settings` (a
  `FeedForwardSettings`: `activation`, the compute `dtype`); `dropout`, a function, is applied to
  the hidden activations (activation dropout)."""
  dtype = settings.dtype
  x = x.astype(dtype)
  hidden = ACTIVATIONS[settings.activation](x @ wi.astype(dtype) + bi.astype(dtype))
  hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
  if dropout is not None:
    hidden = dropout(hidden)
  return hidden @ wo.astype(dtype) + bo.astype(dtype)


def layer_norm(x, scale, bias, settings):
  """LayerNorm over the last axis, its statistics in float32 or wider, as `flax.linen.LayerNorm`
  computes it (variance as E[x^2] - E[x]^2, clipped at 0): `[..., d]` -> same, with the options
  `settings` (a `NormSettings`: `epsilon`, the output `dtype`)."""
  epsilon, dtype = settings.epsilon, settings.dtype
  # In flax's order of operations, which XLA's CPU compiler fuses best.
  stats = x.astype(jnp.promote_types(dtype, jnp.float32))
  squares = lax.square(stats)
  mean, mean_square = stats.mean(-1), squares.mean(-1)
  var = jnp.maximum(0.0, mean_square - lax.square(mean))
  mean, var = jnp.expand_dims(mean, -1), jnp.expand_dims(var, -1)
  y = x - mean
  features = (1,) * (x.ndim - 1) + scale.shape
  mul = lax.rsqrt(var + epsilon) * scale.reshape(features)
  y = y * mul + bias.reshape(features)
  return jnp.asarray(y, dtype)


def residual(x, sublayer, *, norm, dropout, pre_norm: bool):
  """One residual sub-layer with dropout on its output before the add.

  Post-LN (the paper): `LayerNorm(x + Dropout(sublayer(x)))`.
  Pre-LN: `x + Dropout(sublayer(LayerNorm(x)))`.
  """
  if pre_norm:
    return x + dropout(sublayer(norm(x)))
  return norm(x + dropout(sublayer(x)))


def embed(embedding, ids, dtype):
  """Token ids `[b, l]` -> their rows of `embedding` `[vocab, d]`, times sqrt(d): `[b, l, d]`."""
  x = jnp.take(embedding, ids, axis=0).astype(dtype)
  return x * jnp.asarray(np.sqrt(embedding.shape[1]), dtype)


def logits(embedding, bias, x, dtype, *, vocab_multiple: int = 1, wide: bool = False):
  """`[b, l, d]` -> logits `[b, l, vocab]` through the shared embedding (+ `bias`), in `dtype`
  (`wide`: in float32 or wider).

  The logits of a bfloat16 model are bfloat16 (the matmul accumulates in float32 and rounds
  once): half the bytes of float32 through the output layer and the loss, whose arithmetic
  (`loss.cross_entropy`) is float32 or wider. A search's one step asks for `wide` logits: a
  bfloat16 logit of 16 is off by up to 0.06, enough to reorder close hypotheses. With
  `vocab_multiple`, the matmul runs over the table padded with zero rows to a multiple of it
  (whole GEMM tiles on a GPU) and the padded columns are sliced off at once.
  """
  vocab = embedding.shape[0]
  table = embedding.astype(dtype)
  padded = -(-vocab // vocab_multiple) * vocab_multiple
  if padded != vocab:
    table = jnp.pad(table, ((0, padded - vocab), (0, 0)))
  out = jnp.einsum(
    "bld,vd->blv",
    x.astype(dtype),
    table,
    preferred_element_type=jnp.promote_types(dtype, jnp.float32) if wide else None,
  )[..., :vocab]
  return out if bias is None else out + bias.astype(out.dtype)


def sinusoidal_table(max_len: int, d_model: int, dtype=np.float32) -> np.ndarray:
  """The paper's encoding `[max_len, d_model]`, computed in float64, returned as `dtype`.

  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)); PE(pos, 2i+1) = cos(same).
  """
  pos = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(10000.0, two_i / d_model)
  table = np.zeros((max_len, d_model), dtype=np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle)
  return table.astype(dtype)


def add_positions(x, table, positions, max_len: int):
  """`x` `[b, l, d]` plus the rows `positions` `[b, l]` (default 0..l-1) of `table` `[max_len, d]`;
  `table` None: the paper's sinusoid."""
  length, d_model = x.shape[-2:]
  if positions is None:
    if length > max_len:
      raise ValueError(f"sequence length {length} exceeds max_len={max_len}")
    positions = jnp.arange(length)[None, :]
  if table is None:
    # float32 (float64 in a float64 model), then cast to the computation dtype.
    table = jnp.asarray(sinusoidal_table(max_len, d_model, jnp.promote_types(x.dtype, jnp.float32)))
  return x + jnp.take(table, positions, axis=0).astype(x.dtype)
