"""The options of the layers, each declared once: `LayerSettings` (an encoder or decoder layer)
and what it gives each sub-layer, `AttentionSettings`, `FeedForwardSettings` and `NormSettings`.
The Linen modules (model/layers.py) take their fields as their own; the NNX modules
(model/nnx_layers.py) take a settings object or its fields as keywords; both read them.

`TransformerConfig.layer_settings()` (model/config.py) makes one from a model's config; the
parameters the settings imply are `functional.layer_params`'s.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from transformer_jax.model.attention import Implementation

Dtype = Any


class _Options:
  """What every settings type here does: a frozen dataclass that is also a mapping of its fields
  (`Module(**settings)`), whose fields a Linen module takes as its own (`module_fields`)."""

  @classmethod
  def names(cls) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))

  @classmethod
  def module_fields(cls, **extra: tuple[Any, Any]) -> dict[str, Any]:
    """The namespace of a Linen module whose fields are these (annotations and defaults), then
    `extra` ones (`name=(type, default)`): `locals().update(Settings.module_fields())` in its
    class body, which annotates nothing else (its one `__annotations__` is this one's)."""
    fields = {f.name: (f.type, f.default) for f in dataclasses.fields(cls)} | extra
    return {"__annotations__": {name: kind for name, (kind, _) in fields.items()}} | {
      name: default for name, (_, default) in fields.items()
    }

  @classmethod
  def of(cls, module):
    """The settings held as attributes of `module` (a Linen module's fields)."""
    return cls(**{name: getattr(module, name) for name in cls.names()})

  @classmethod
  def build(cls, settings=None, args=(), kwargs=None):
    """`settings`, or the settings of positional `args`, with the fields `kwargs` changed: what an
    NNX module of either calling style holds."""
    if settings is not None and args:
      raise TypeError(f"give a {cls.__name__} or its fields as positional arguments, not both")
    base = cls(*args) if settings is None else settings
    return dataclasses.replace(base, **(kwargs or {}))

  def keys(self):
    return self.names()

  def __getitem__(self, name: str):
    return getattr(self, name)

  def __iter__(self):
    return iter(self.names())

  def __len__(self):
    return len(self.names())

  def items(self):
    return [(name, getattr(self, name)) for name in self.names()]

  def replace(self, **changes):
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class AttentionSettings(_Options):
  """`MultiHeadAttention`'s options (either front door): `num_heads` heads of queries/keys `d_k`
  and values `d_v` wide, an output `out_features` wide (None: the queries' width), `use_bias` on
  each projection, `attention_impl` (the kernel), `init_scheme` (one of `functional.INITS`),
  `dropout_rate` on the attention weights; `dtype` computes, `param_dtype` holds parameters."""

  num_heads: int = 8
  d_k: int = 64
  d_v: int = 64
  out_features: int | None = None
  use_bias: bool = False
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  attention_impl: Implementation = "auto"
  init_scheme: str = "xavier"
  dropout_rate: float = 0.0


@dataclasses.dataclass(frozen=True)
class FeedForwardSettings(_Options):
  """`FeedForward`'s options: `d_ff` hidden units, `activation` (a name of
  `functional.ACTIVATIONS`), `init_scheme`, `dropout_rate` on the hidden activations."""

  d_ff: int = 2048
  activation: str = "relu"
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  init_scheme: str = "xavier"
  dropout_rate: float = 0.0


@dataclasses.dataclass(frozen=True)
class NormSettings(_Options):
  """`LayerNorm`'s options."""

  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32


@dataclasses.dataclass(frozen=True)
class LayerSettings(_Options):
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
  attention_impl: Implementation = "auto"
  attention_bias: bool = False
  activation: str = "relu"
  norm_epsilon: float = 1e-6
  init_scheme: str = "xavier"
  attention_dropout_rate: float = 0.0
  activation_dropout_rate: float = 0.0
  param_dtype: Dtype = jnp.float32

  # What each sub-layer of either front door is given.
  def attention(self) -> AttentionSettings:
    return AttentionSettings(
      num_heads=self.num_heads,
      d_k=self.d_k,
      d_v=self.d_v,
      use_bias=self.attention_bias,
      attention_impl=self.attention_impl,
      init_scheme=self.init_scheme,
      dropout_rate=self.attention_dropout_rate,
      **self._dtypes(),
    )

  def feed_forward(self) -> FeedForwardSettings:
    return FeedForwardSettings(
      d_ff=self.d_ff,
      activation=self.activation,
      init_scheme=self.init_scheme,
      dropout_rate=self.activation_dropout_rate,
      **self._dtypes(),
    )

  def norm(self) -> NormSettings:
    return NormSettings(epsilon=self.norm_epsilon, **self._dtypes())

  def _dtypes(self) -> dict[str, Any]:
    return {"dtype": self.dtype, "param_dtype": self.param_dtype}
