"""Float64 numpy renderings of the paper's formulas, independent of the package."""

import math

import numpy as np


def softmax_attention(q, k, v, mask=None):
  """softmax(Q K^T / sqrt(d_k)) V over [b, len, heads, d]; masked logits -inf, empty rows 0."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(np.broadcast_to(np.asarray(mask), logits.shape), logits, -np.inf)
  top = np.max(logits, axis=-1, keepdims=True)
  e = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
  total = e.sum(-1, keepdims=True)
  weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
  return np.einsum("bhqk,bkhd->bqhd", weights, v)


def multi_head(params, x_q, x_kv, mask=None):
  """Concat(head_1..head_h) W^O with head_i = Attention(x_q W^Q_i, x_kv W^K_i, x_kv W^V_i)."""
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  q = np.einsum("bld,dhk->blhk", x_q, p["query"])
  k = np.einsum("bld,dhk->blhk", x_kv, p["key"])
  v = np.einsum("bld,dhk->blhk", x_kv, p["value"])
  heads = softmax_attention(q, k, v, mask)
  b, length = heads.shape[:2]
  concat = heads.reshape(b, length, -1)
  w_o = p["out"].reshape(-1, p["out"].shape[-1])
  return concat @ w_o


def feed_forward(params, x):
  """max(0, x W1 + b1) W2 + b2."""
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  return np.maximum(0.0, x @ p["wi"] + p["bi"]) @ p["wo"] + p["bo"]


def layer_norm(params, x, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(params["scale"], np.float64) + np.asarray(
      params["bias"], np.float64)


def sinusoid(pos, j, d_model):
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
  angle = pos / 10000 ** ((j - j % 2) / d_model)
  return math.sin(angle) if j % 2 == 0 else math.cos(angle)
