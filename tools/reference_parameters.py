"""The PyTorch reference's parameters (tools/torch_training.py): our names and shapes, and
fairseq's initial values."""

import math

import flax
import jax
import numpy as np

from transformer_jax.model.transformer import TransformerConfig

ATTENTIONS = ("self_attention", "cross_attention")


def flat_params(params) -> dict[str, np.ndarray]:
  """Our parameter tree (on any device) as `{path: array}`, the paths of `parameter_shapes`."""
  return flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")


def parameter_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
  """Every parameter's name (our flattened path) and shape, for a post-LN or pre-LN model."""
  d, h, dk, dv, ff = (
    config.d_model,
    config.num_heads,
    config.key_size,
    config.value_size,
    config.d_ff,
  )
  shapes = {"embed/embedding": (config.vocab_size, d)}
  if config.logits_bias:
    shapes["embed/logits_bias"] = (config.vocab_size,)

  def attention(prefix):
    shapes.update(
      {
        f"{prefix}/query": (d, h, dk),
        f"{prefix}/key": (d, h, dk),
        f"{prefix}/value": (d, h, dv),
        f"{prefix}/out": (h, dv, d),
      }
    )
    if config.attention_bias:
      shapes.update(
        {
          f"{prefix}/query_bias": (h, dk),
          f"{prefix}/key_bias": (h, dk),
          f"{prefix}/value_bias": (h, dv),
          f"{prefix}/out_bias": (d,),
        }
      )

  def norm(prefix):
    shapes.update({f"{prefix}/scale": (d,), f"{prefix}/bias": (d,)})

  stacks = (
    ("encoder", config.encoder_depth, ATTENTIONS[:1]),
    ("decoder", config.decoder_depth, ATTENTIONS),
  )
  for stack, depth, sublayers in stacks:
    for i in range(depth):
      layer = f"{stack}/layer_{i}"
      for name in sublayers:
        attention(f"{layer}/{name}")
        norm(f"{layer}/{name}_norm")
      shapes.update(
        {
          f"{layer}/feed_forward/wi": (d, ff),
          f"{layer}/feed_forward/bi": (ff,),
          f"{layer}/feed_forward/wo": (ff, d),
          f"{layer}/feed_forward/bo": (d,),
        }
      )
      norm(f"{layer}/feed_forward_norm")
    if config.norm == "pre":
      norm(f"{stack}/final_norm")
  return shapes


def fairseq_init(torch, config: TransformerConfig, name: str, shape, generator):
  """fairseq's initial value of parameter `name` (float64).

  Embeddings N(0, d^-1/2); attention weights Xavier-uniform, gain 2^-1/2 for
  W^Q, W^K, W^V and 1 for W^O; the feed-forward layers and the Q, K, V biases
  keep torch's `nn.Linear` default, U(+-1/sqrt(fan_in)); the attention
  output bias, LayerNorm offsets and (ours only) a logits bias start at 0,
  LayerNorm scales at 1. fairseq also zeroes the padding row of the
  embedding; here PAD is the decoder's start token, so it is drawn like the
  others.
  """
  d, h, leaf = config.d_model, config.num_heads, name.rsplit("/", 1)[-1]
  if leaf == "embedding":
    return torch.randn(shape, generator=generator, dtype=torch.float64) * d**-0.5
  if leaf == "scale":
    return torch.ones(shape, dtype=torch.float64)
  xavier = lambda fan_in, fan_out: math.sqrt(6.0 / (fan_in + fan_out))
  qk, v = 2**-0.5 * xavier(d, h * config.key_size), 2**-0.5 * xavier(d, h * config.value_size)
  bounds = {
    "query": qk,
    "key": qk,
    "value": v,
    "out": xavier(h * config.value_size, d),
    "wi": d**-0.5,
    "bi": d**-0.5,
    "wo": config.d_ff**-0.5,
    "bo": config.d_ff**-0.5,
    "query_bias": d**-0.5,
    "key_bias": d**-0.5,
    "value_bias": d**-0.5,
  }
  if leaf not in bounds:  # out_bias, LayerNorm offsets, logits_bias.
    return torch.zeros(shape, dtype=torch.float64)
  return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bounds[leaf]
