"""The options of an encoder or decoder layer, declared once: `LayerSettings`, which the Linen
layers (model/layers.py, whose fields are its fields) and the NNX layers (model/nnx_layers.py,
which take it or its fields as keywords) both read, and which says what each sub-layer is given.

`TransformerConfig.layer_settings()` (model/config.py) makes one from a model's config; the
parameters the settings imply are `functional.layer_params`'s.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from transformer_jax.model import attention

Dtype = Any


@dataclasses.dataclass(frozen=True)
class LayerSettings:
  """An encoder or decoder layer's options; the defaults are the paper's base model.

  `num_heads` heads of queries/keys `d_k` and values `d_v` wide; a feed-forward network `d_ff`
  wide with `activation` (a name of `functional.ACTIVATIONS`); `dropout_rate` on each sub-layer's
  output, `attention_dropout_rate` on the attention weights, `activation_dropout_rate` on the
  feed-forward's hidden activations; `pre_norm`: LayerNorm (`norm_epsilon`) before each sub-layer
  instead of after the residual add; `attention_bias`: biases on the attention projections;
  `init_scheme`: one of `functional.INITS`; `dtype` computes, `param_dtype` holds the parameters;
  `attention_impl`: the kernel (`attention.dot_product_attention`).

  A mapping of its fields too, so `EncoderLayer(**settings)` builds a layer of either front door.
  """

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
  attention_dropout_rate: float = 0.0
  activation_dropout_rate: float = 0.0
  param_dtype: Dtype = jnp.float32

  @classmethod
  def names(cls) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def module_fields(cls) -> dict[str, Any]:
    """The namespace of a Linen module whose fields are these (annotations and defaults)."""
    fields = dataclasses.fields(cls)
    return {"__annotations__": {f.name: f.type for f in fields}} | {
      f.name: f.default for f in fields
    }

  @classmethod
  def of(cls, module) -> "LayerSettings":
    """The settings held as attributes of `module` (a Linen layer's fields)."""
    return cls(**{name: getattr(module, name) for name in cls.names()})

  def keys(self):
    return self.names()

  def __getitem__(self, name: str):
    return getattr(self, name)

  def replace(self, **changes) -> "LayerSettings":
    return dataclasses.replace(self, **changes)

  # What each sub-layer of either front door is given (their keyword arguments).
  def dtypes(self) -> dict[str, Any]:
    return {"dtype": self.dtype, "param_dtype": self.param_dtype}

  def attention(self) -> dict[str, Any]:
    """`MultiHeadAttention`'s keywords."""
    return dict(
      num_heads=self.num_heads,
      d_k=self.d_k,
      d_v=self.d_v,
      use_bias=self.attention_bias,
      attention_impl=self.attention_impl,
      init_scheme=self.init_scheme,
      dropout_rate=self.attention_dropout_rate,
      **self.dtypes(),
    )

  def feed_forward(self) -> dict[str, Any]:
    """`FeedForward`'s keywords."""
    return dict(
      d_ff=self.d_ff,
      activation=self.activation,
      init_scheme=self.init_scheme,
      dropout_rate=self.activation_dropout_rate,
      **self.dtypes(),
    )

  def norm(self) -> dict[str, Any]:
    """`LayerNorm`'s keywords."""
    return dict(epsilon=self.norm_epsilon, **self.dtypes())
