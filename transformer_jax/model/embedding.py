"""The shared token embedding with its tied output projection, and the positional encodings
(Flax Linen; logical axis names on every parameter, as in model/layers.py)."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.layers import logical_param

Dtype = Any


class Embed(nn.Module):
  """One token embedding shared by source, target and the pre-softmax projection.

  `__call__`: ids `[batch, length]` -> `[batch, length, d_model]`, scaled by
  sqrt(d_model). `attend`: `[batch, length, d_model]` -> float32 logits
  `[batch, length, vocab_size]` through the same matrix, plus a `[vocab_size]`
  bias with `logits_bias` (the paper has none).
  """

  vocab_size: int
  d_model: int
  logits_bias: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  def setup(self):
    self.embedding = logical_param(
      self,
      "embedding",
      nn.initializers.normal(stddev=self.d_model**-0.5),
      (self.vocab_size, self.d_model),
      ("vocab", "embed"),
      self.param_dtype,
    )
    if self.logits_bias:
      self.bias = logical_param(
        self, "logits_bias", nn.initializers.zeros, (self.vocab_size,), ("vocab",), self.param_dtype
      )

  def __call__(self, ids):
    x = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
    return x * jnp.asarray(np.sqrt(self.d_model), self.dtype)

  def attend(self, x):
    logits = jnp.einsum(
      "bld,vd->blv",
      x.astype(self.dtype),
      self.embedding.astype(self.dtype),
      preferred_element_type=jnp.promote_types(self.dtype, jnp.float32),
    )
    return logits + self.bias.astype(logits.dtype) if self.logits_bias else logits


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
    length, d_model = x.shape[-2:]
    if positions is None:
      if length > self.max_len:
        raise ValueError(f"sequence length {length} exceeds max_len={self.max_len}")
      positions = jnp.arange(length)[None, :]
    if self.kind == "sinusoidal":
      # float32 (float64 in a float64 model), then cast to the computation dtype.
      table = jnp.asarray(
        sinusoidal_table(self.max_len, d_model, jnp.promote_types(x.dtype, jnp.float32))
      )
    elif self.kind == "learned":
      table = logical_param(
        self,
        "table",
        nn.initializers.normal(stddev=d_model**-0.5),
        (self.max_len, d_model),
        ("length", "embed"),
        self.param_dtype,
      )
    else:
      raise ValueError(f"positional kind {self.kind!r}; allowed: sinusoidal, learned")
    return x + jnp.take(table, positions, axis=0).astype(x.dtype)
