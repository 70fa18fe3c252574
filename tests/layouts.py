"""Moving parameters between the looped and the scanned model layouts."""

import jax
import jax.numpy as jnp


def stack_layers(params, num_layers):
  """The looped model's params in the scanned layout: layer_i subtrees stacked on axis 0."""
  out = {}
  for name, sub in params.items():
    if isinstance(sub, dict) and "layer_0" in sub:
      layers = [sub[f"layer_{i}"] for i in range(num_layers)]
      rest = {k: v for k, v in sub.items() if not k.startswith("layer_")}
      out[name] = {**rest, "layers": {"layer": jax.tree_util.tree_map(
          lambda *xs: jnp.stack(xs), *layers)}}
    else:
      out[name] = sub
  return out
