"""Scaled dot-product attention and attention masks, as pure functions.

Nothing here has parameters. Arrays follow the layout
`[batch, length, heads, head_dim]`; masks are boolean, broadcastable to
`[batch, heads, query_length, key_length]`, and True where a query may attend
to a key.
"""

from typing import Literal

import jax
import jax.numpy as jnp

from transformer_jax.conventions import PAD_ID

Implementation = Literal["auto", "fused", "reference", "xla", "cudnn"]
IMPLEMENTATIONS = ("auto", "fused", "reference", "xla", "cudnn")


def padding_mask(query_tokens, key_tokens, pad_id: int = PAD_ID):
  """Mask of real (non-pad) query/key pairs: `[batch, 1, q_len, k_len]`."""
  query_real = jnp.asarray(query_tokens) != pad_id
  key_real = jnp.asarray(key_tokens) != pad_id
  return query_real[:, None, :, None] & key_real[:, None, None, :]


def causal_mask(length: int):
  """Mask letting position i attend to positions <= i: `[1, 1, length, length]`."""
  return jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))[None, None]


def segment_mask(query_segment_ids, key_segment_ids):
  """Mask keeping packed examples apart: `[batch, 1, q_len, k_len]`.

  Segment ids number the examples packed into a row 1, 2, ...; 0 marks
  padding, which attends to nothing and is attended by nothing.
  """
  q = jnp.asarray(query_segment_ids)[:, None, :, None]
  k = jnp.asarray(key_segment_ids)[:, None, None, :]
  return (q == k) & (q != 0) & (k != 0)


def combine_masks(*masks):
  """Logical AND of the given masks (None entries are skipped; all None -> None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  combined = masks[0]
  for m in masks[1:]:
    combined = combined & m
  return combined


def _accumulation_dtype(x):
  """float32 for half- and single-precision inputs, float64 for float64 ones."""
  return jnp.promote_types(x.dtype, jnp.float32)


def masked_softmax(logits, mask=None):
  """Softmax over the last axis in float32 (float64 for float64 logits); masked entries get
  exactly 0, rows with none allowed are 0."""
  logits = logits.astype(_accumulation_dtype(logits))
  if mask is None:
    return jax.nn.softmax(logits, axis=-1)
  mask = jnp.broadcast_to(mask, logits.shape)
  weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(logits.dtype).min), axis=-1)
  return jnp.where(mask, weights, 0.0)


def attention_weights(query, key, mask=None):
  """softmax(Q K^T / sqrt(d_k)), `[batch, heads, q_len, k_len]`, in float32 (float64 for float64).

  Masked keys get exactly zero weight; a query row with no allowed key gets
  all zeros (never NaN).
  """
  logits = jnp.einsum(
    "bqhd,bkhd->bhqk", query, key, preferred_element_type=_accumulation_dtype(query)
  )
  return masked_softmax(logits / jnp.sqrt(jnp.asarray(query.shape[-1], logits.dtype)), mask)


def cached_attention(query, key_cache, value_cache, mask=None):
  """Attention of a few new queries over head-major cached keys/values (incremental decoding).

  query `[batch, q_len, heads, d_k]`; key_cache `[kv_batch, heads, k_len,
  d_k]`; value_cache `[kv_batch, heads, k_len, d_v]`, where `batch` is a
  multiple `g` of `kv_batch` and query rows `i * g ... i * g + g - 1` all
  attend over cache row `i` (the beams of a sentence over its encoder
  output: each cached row is read once for all of them); mask broadcastable
  to `[kv_batch, heads, g * q_len, k_len]` (for `g == 1`: `[batch, heads,
  q_len, k_len]`). Returns `[batch, q_len, heads, d_v]`. Keeping the cache
  head-major spares a transpose of the whole cache at every step.
  """
  batch, q_len, heads, _ = query.shape
  kv_batch = key_cache.shape[0]
  if batch % kv_batch:
    raise ValueError(
      f"cached attention of {batch} query rows over {kv_batch} cached rows: the "
      "query rows must be a multiple of the cached ones"
    )
  # A group's query rows become query positions of its cached row.
  query = query.reshape(kv_batch, batch // kv_batch * q_len, heads, query.shape[-1])
  logits = jnp.einsum(
    "bqhd,bhkd->bhqk", query, key_cache, preferred_element_type=_accumulation_dtype(query)
  )
  weights = masked_softmax(logits / jnp.sqrt(jnp.asarray(query.shape[-1], logits.dtype)), mask)
  out = jnp.einsum("bhqk,bhkd->bqhd", weights.astype(value_cache.dtype), value_cache)
  return out.reshape(batch, q_len, heads, value_cache.shape[-1]).astype(query.dtype)


def dot_product_attention(
  query,
  key,
  value,
  mask=None,
  *,
  is_causal: bool = False,
  implementation: Implementation = "auto",
  dropout=None,
):
  """Scaled dot-product attention, `softmax(Q K^T / sqrt(d_k)) V`.

  Args:
    query: `[batch, q_len, heads, d_k]`.
    key: `[batch, k_len, heads, d_k]`.
    value: `[batch, k_len, heads, d_v]`.
    mask: optional boolean, broadcastable to `[batch, heads, q_len, k_len]`;
      True where attention is allowed.
    is_causal: query i attends only to keys 0..i as well (q_len == k_len):
      the kernel's own causal path (cuDNN's skips the blocks above the
      diagonal) instead of a causal mask folded into `mask`.
    implementation: "fused" uses `jax.nn.dot_product_attention` (cuDNN flash
      attention on GPU for half-precision inputs, XLA elsewhere) and needs
      d_k == d_v; "xla" and "cudnn" pick its backend whatever the platform;
      "reference" is plain jnp; "auto" picks fused when it applies, and the
      reference for float64 inputs (the fused softmax is float32). The
      platform is JAX's default backend (`resolve_implementation`); a model
      placed on a mesh resolves it against the mesh's devices instead.
    dropout: optional function of the attention weights `[batch, heads,
      q_len, k_len]` (attention dropout). The fused kernels have none, so with
      it the reference path runs, whatever `implementation` says.

  Returns:
    `[batch, q_len, heads, d_v]` in the query's dtype. Rows whose keys are all
    masked are zero.
  """
  _check_shapes(query, key, value, mask)
  if is_causal and query.shape[1] != key.shape[1]:
    raise ValueError(
      f"is_causal needs as many queries as keys; got {query.shape[1]} and {key.shape[1]}"
    )
  backend = (
    "reference"
    if dropout is not None
    else resolve_implementation(
      implementation,
      jax.default_backend(),
      dtype=query.dtype,
      d_k=key.shape[-1],
      d_v=value.shape[-1],
    )
  )
  if backend == "reference":
    if is_causal:
      mask = combine_masks(causal_mask(query.shape[1]), mask)
    weights = attention_weights(query, key, mask)
    if dropout is not None:
      weights = dropout(weights)
    return jnp.einsum("bhqk,bkhd->bqhd", weights.astype(value.dtype), value).astype(query.dtype)

  if mask is not None:
    mask = jnp.asarray(mask, jnp.bool_)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  out = jax.nn.dot_product_attention(
    query, key, value, mask=mask, is_causal=is_causal, implementation=backend
  )
  if mask is None:
    return out  # Every query has a key (causal: itself).
  # The fused kernel spreads a fully masked row uniformly; the paper's -inf
  # masking leaves nothing to attend to, so such rows are zero here.
  if is_causal:
    mask = combine_masks(causal_mask(query.shape[1]), mask)
  has_key = jnp.any(mask, axis=-1)  # [batch|1, heads|1, q_len]
  has_key = jnp.moveaxis(has_key, 1, 2)[..., None]  # [batch|1, q_len, heads|1, 1]
  return jnp.where(has_key, out, jnp.zeros((), out.dtype))


def resolve_implementation(implementation: str, platform: str, *, dtype, d_k: int, d_v: int) -> str:
  """The attention path that `implementation` takes on `platform` ("cpu", "gpu", "tpu") for inputs
  of `dtype` and head sizes `d_k`, `d_v`: "reference", "xla" or "cudnn".

  "fused" is cuDNN on a GPU for half-precision inputs with a head size it
  takes (a multiple of 8, at most 128), XLA's fused attention otherwise;
  "auto" is "fused" where it applies and the reference for float64 inputs or
  d_k != d_v. "reference", "xla" and "cudnn" are taken as they are.
  ValueError for an unknown implementation, or a fused one with d_k != d_v.
  """
  if implementation == "auto":
    if d_k != d_v or jnp.dtype(dtype) == jnp.float64:
      return "reference"
    implementation = "fused"
  problem = implementation_problem(implementation, d_k=d_k, d_v=d_v)
  if problem:
    raise ValueError(f"implementation={implementation!r}{problem}")
  if implementation == "fused":
    return "cudnn" if cudnn_supports(platform, dtype=dtype, d_k=d_k) else "xla"
  return implementation


def implementation_problem(
  implementation: str, *, d_k: int, d_v: int, platform: str | None = None, dtype=None
) -> str | None:
  """Why attention `implementation` cannot take heads of sizes `d_k` and `d_v` (and, given a
  `platform` and `dtype`, run there), as the words that follow its name in a message; or None.
  The one rule the model's settings, the traced attention and the compile mode's targets share."""
  if implementation not in IMPLEMENTATIONS:
    return f"; allowed: {', '.join(IMPLEMENTATIONS)}"
  if implementation in ("fused", "xla", "cudnn") and d_k != d_v:
    return f" needs d_k == d_v; got d_k={d_k}, d_v={d_v} (use 'auto' or 'reference')"
  if implementation == "cudnn" and platform and not cudnn_supports(platform, dtype=dtype, d_k=d_k):
    return (
      " needs a GPU, bfloat16 or float16 and a head size that is a multiple of 8 up to 128; got "
      f"{platform}, {jnp.dtype(dtype).name}, d_k={d_k} (use 'auto')"
    )
  return None


def cudnn_supports(platform: str, *, dtype, d_k: int) -> bool:
  """Whether cuDNN's fused attention runs heads of size `d_k` in `dtype` on `platform`: a GPU,
  bfloat16 or float16, and a head size that is a multiple of 8 up to 128."""
  return (
    platform == "gpu"
    and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    and d_k % 8 == 0
    and d_k <= 128
  )


def _check_shapes(query, key, value, mask):
  """Raise ValueError for inconsistent attention operands."""
  for name, array in (("query", query), ("key", key), ("value", value)):
    if array.ndim != 4:
      raise ValueError(f"{name} must be [batch, length, heads, head_dim]; got shape {array.shape}")
  if query.shape[-1] != key.shape[-1]:
    raise ValueError(f"query and key head_dim differ: {query.shape[-1]} vs {key.shape[-1]}")
  if key.shape[:3] != value.shape[:3]:
    raise ValueError(
      f"key and value must agree on [batch, length, heads]: {key.shape} vs {value.shape}"
    )
  if query.shape[0] != key.shape[0] or query.shape[2] != key.shape[2]:
    raise ValueError(f"query and key must agree on batch and heads: {query.shape} vs {key.shape}")
  if mask is not None:
    target = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    try:
      fits = jnp.broadcast_shapes(jnp.shape(mask), target) == target
    except ValueError:
      fits = False
    if not fits:
      raise ValueError(
        f"mask of shape {jnp.shape(mask)} does not broadcast to [batch, heads, "
        f"q_len, k_len] = {target}"
      )
