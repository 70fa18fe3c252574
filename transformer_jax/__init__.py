"""transformer_jax: the Transformer of "Attention Is All You Need" in JAX/Flax.

`from transformer_jax import Transformer, TransformerConfig` gives the model;
the layers are in `transformer_jax.model.layers` and the attention functions in
`transformer_jax.model.attention`. The model is imported on first use, so
`transformer_jax.data` alone does not load Flax.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["Transformer", "TransformerConfig"]


def __getattr__(name):
  if name in __all__:
    return getattr(importlib.import_module("transformer_jax.model.transformer"), name)
  raise AttributeError(f"module 'transformer_jax' has no attribute {name!r}")
