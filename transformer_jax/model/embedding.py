"""The shared token embedding with its tied output projection, and the positional encodings
(Flax Linen over model/functional.py; logical axis names on every parameter, as in
model/layers.py)."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.model import functional
from transformer_jax.model.layers import make_params

Dtype = Any


class Embed(nn.Module):
  """One token embedding shared by source, target and the pre-softmax projection.

  `__call__`: ids `[batch, length]` -> `[batch, length, d_model]`, scaled by
  sqrt(d_model). `attend`: `[batch, length, d_model]` -> logits `[batch, length,
  vocab_size]` in `dtype` through the same matrix, plus a `[vocab_size]` bias with
  `logits_bias` (the paper has none); its matmul over the table padded to a multiple
  of `vocab_multiple` rows, `wide`: float32 logits (`functional.logits`).
  """

  vocab_size: int
  d_model: int
  logits_bias: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  vocab_multiple: int = 1

  def setup(self):
    specs = functional.embed_params(self.vocab_size, self.d_model, self.logits_bias)
    p = make_params(self, specs, self.param_dtype)
    self.embedding, self.bias = p["embedding"], p.get("logits_bias")

  def __call__(self, ids):
    return functional.embed(self.embedding, ids, self.dtype)

  def attend(self, x, wide: bool = False):
    return functional.logits(
      self.embedding, self.bias, x, self.dtype, vocab_multiple=self.vocab_multiple, wide=wide
    )


class PositionalEncoding(nn.Module):
  """Adds positional information: `[batch, length, d_model]` -> same shape.

  `kind="sinusoidal"` is the paper's fixed encoding; `kind="learned"` is
  Table 3 row (E), a trained `[max_len, d_model]` table. `positions`
  (`[batch, length]`) index the table; by default 0..length-1.
  """

  max_len: int = 512
  kind: str = "sinusoidal"
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, positions=None):
    specs = functional.positional_params(self.max_len, x.shape[-1], self.kind)
    table = make_params(self, specs, self.param_dtype).get("table")
    return functional.add_positions(x, table, positions, self.max_len)
