"""Each layer option declared once: `LayerSettings` read by both front doors, the parameter table
of model/functional.py against the real initialisation of every preset, and `count_params` its
sum."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from transformer_jax.model import layers, nnx_layers
from transformer_jax.model import nnx_transformer as nt
from transformer_jax.model.config import PRESETS, TransformerConfig, count_params, param_shapes
from transformer_jax.model.settings import LayerSettings
from transformer_jax.model.transformer import Transformer

# Every option away from its default.
ODD = LayerSettings(
  num_heads=2,
  d_k=3,
  d_v=5,
  d_ff=7,
  dropout_rate=0.2,
  pre_norm=True,
  dtype=jnp.bfloat16,
  attention_impl="reference",
  attention_bias=True,
  activation="gelu",
  norm_epsilon=1e-5,
  init_scheme="fairseq",
  attention_dropout_rate=0.3,
  activation_dropout_rate=0.4,
  param_dtype=jnp.bfloat16,
)


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), nn.unbox(tree))


def _linen_shapes(cfg):
  ids = jnp.ones((1, 3), jnp.int32)
  return jax.eval_shape(Transformer(cfg).init, jax.random.key(0), ids, ids)["params"]


def test_every_option_differs_from_its_default_in_odd():
  default = LayerSettings()
  assert all(ODD[name] != default[name] for name in LayerSettings.names())
  assert dict(ODD) == dataclasses.asdict(ODD) == {**ODD}


@pytest.mark.parametrize("layer", ["EncoderLayer", "DecoderLayer"])
def test_both_front_doors_read_one_settings_object(layer):
  linen = getattr(layers, layer)(**ODD)
  assert linen.settings == ODD
  twin = getattr(nnx_layers, layer)(8, settings=ODD, rngs=nnx.Rngs(0))
  assert twin.settings == ODD
  by_keywords = getattr(nnx_layers, layer)(8, **ODD, rngs=nnx.Rngs(0))
  assert by_keywords.settings == ODD
  # The sub-layers hold what the settings give them.
  assert twin.self_attention.settings == ODD.attention()
  assert twin.feed_forward.settings == ODD.feed_forward()
  assert twin.feed_forward_norm.settings == ODD.norm()


@pytest.mark.parametrize(
  "name, settings, width",
  [
    ("MultiHeadAttention", ODD.attention().replace(out_features=9), (8,)),
    ("FeedForward", ODD.feed_forward(), (8,)),
    ("LayerNorm", ODD.norm(), (8,)),
  ],
)
def test_each_sub_layer_of_both_front_doors_takes_one_settings_object(name, settings, width):
  kind = type(settings)
  linen = getattr(layers, name)(**settings)
  assert kind.of(linen) == settings
  rngs = {} if name == "LayerNorm" else {"rngs": nnx.Rngs(0)}
  assert getattr(nnx_layers, name)(*width, settings=settings, **rngs).settings == settings
  assert getattr(nnx_layers, name)(*width, **settings, **rngs).settings == settings


@pytest.mark.parametrize("layer", ["EncoderLayer", "DecoderLayer"])
def test_linen_layers_hold_their_parameters_in_param_dtype_as_the_nnx_ones(layer):
  x = jnp.ones((1, 4, 8))
  args = (x,) if layer == "EncoderLayer" else (x, x)
  linen = getattr(layers, layer)(**ODD).init(jax.random.key(0), *args)["params"]
  twin = nt.linen_params(getattr(nnx_layers, layer)(8, settings=ODD, rngs=nnx.Rngs(0)))
  dtypes = lambda tree: jax.tree.map(lambda x: x.dtype, nn.unbox(tree))
  assert dtypes(linen) == dtypes(twin)
  assert set(jax.tree.leaves(dtypes(linen))) == {jnp.dtype(jnp.bfloat16)}
  assert _shapes(linen) == _shapes(twin)


def test_a_config_s_layer_settings_take_every_field_of_the_same_name():
  cfg = TransformerConfig(
    vocab_size=11, activation="swish", attention_bias=True, norm_epsilon=1e-3, d_k=5
  )
  settings = cfg.layer_settings()
  shared = set(LayerSettings.names()) & {f.name for f in dataclasses.fields(cfg)}
  assert shared - {"d_k", "d_v", "dtype"}, "no field passes through"
  for name in shared - {"d_k", "d_v", "dtype"}:
    assert settings[name] == getattr(cfg, name), name
  assert (settings.d_k, settings.d_v, settings.pre_norm) == (5, cfg.value_size, False)


@pytest.mark.parametrize("row", sorted(PRESETS))
def test_the_parameter_table_is_the_real_init_of_every_preset(row):
  cfg = TransformerConfig.preset(row)
  real = _linen_shapes(cfg)
  assert _shapes(real) == param_shapes(cfg)
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(real)) == count_params(cfg)


@pytest.mark.parametrize(
  "overrides",
  [
    {},
    dict(norm="pre", positional="learned", logits_bias=True),
    dict(attention_bias=True, init="fairseq", d_k=5, d_v=3, num_decoder_layers=1),
  ],
)
def test_the_parameter_table_is_the_real_init_of_both_front_doors_with_options(overrides):
  cfg = TransformerConfig(
    vocab_size=23, num_layers=2, d_model=16, d_ff=24, num_heads=2, max_len=20, **overrides
  )
  twin = nnx.eval_shape(lambda: nt.Transformer(cfg, rngs=nnx.Rngs(0)))
  assert _shapes(nt.linen_params(twin, scanned=False)) == param_shapes(cfg)
  assert _shapes(_linen_shapes(cfg)) == param_shapes(cfg)
