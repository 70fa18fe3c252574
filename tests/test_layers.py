"""Each layer against the paper's formula, computed in numpy float64 from its own parameters."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference as ref
from helpers import init_module as init
from helpers import randn, record_dropout_calls, record_dropout_inputs
from transformer_jax.model import attention, layers

pytestmark = pytest.mark.device


def test_multi_head_attention_matches_formula_with_separate_d_k_and_d_v():
  x_q, x_kv = randn(4, 2, 5, 12), randn(5, 2, 7, 12)
  mask = np.random.default_rng(6).random((2, 1, 5, 7)) < 0.7
  mha = layers.MultiHeadAttention(num_heads=3, d_k=4, d_v=6)
  variables, params = init(mha, x_q, x_kv, mask)
  assert params["query"].shape == (12, 3, 4) and params["value"].shape == (12, 3, 6)
  assert params["out"].shape == (3, 6, 12)
  assert set(params) == {"query", "key", "value", "out"}  # No biases, as in the paper.
  got = mha.apply(variables, x_q, x_kv, mask)
  np.testing.assert_allclose(got, ref.multi_head(params, x_q, x_kv, mask), rtol=1e-5, atol=1e-5)


def test_feed_forward_matches_formula():
  x = randn(7, 2, 3, 8)
  ffn = layers.FeedForward(d_ff=32)
  variables, params = init(ffn, x)
  np.testing.assert_allclose(
    ffn.apply(variables, x), ref.feed_forward(params, x), rtol=1e-5, atol=1e-5
  )


@pytest.mark.slow
@pytest.mark.parametrize("pre_norm", [False, True])
def test_encoder_layer_matches_formula(pre_norm):
  x = randn(8, 2, 6, 16)
  mask = attention.padding_mask(
    np.array([[1, 1, 1, 1, 0, 0], [1] * 6]), np.array([[1, 1, 1, 1, 0, 0], [1] * 6])
  )
  layer = layers.EncoderLayer(num_heads=2, d_k=8, d_v=8, d_ff=32, pre_norm=pre_norm)
  variables, params = init(layer, x, mask)
  got = np.asarray(layer.apply(variables, x, mask))
  want = ref.encoder_layer(params, np.float64(x), mask, pre_norm)
  real = np.array([[1, 1, 1, 1, 0, 0], [1] * 6], bool)
  np.testing.assert_allclose(got[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_a_causal_encoder_layer_is_the_formula_under_the_causal_mask_and_its_segments(pre_norm):
  """`is_causal` with a packed-segment mask: the formula's layer under the causal mask ANDed with
  the segments', in float64 to 1e-12 (the reference attention); on XLA's fused path in float32,
  what the layer gives with that dense mask."""
  segments = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [1] * 8])
  segment_mask = attention.segment_mask(segments, segments)
  dense = np.asarray(attention.causal_mask(8)) & np.asarray(segment_mask)
  x = randn(13, 2, 8, 16)
  sizes = dict(num_heads=2, d_k=8, d_v=8, d_ff=32, pre_norm=pre_norm)
  with jax.enable_x64(True):
    layer = layers.EncoderLayer(**sizes, dtype=jnp.float64, param_dtype=jnp.float64)
    variables, params = init(layer, np.float64(x), segment_mask)
    got = np.asarray(layer.apply(variables, np.float64(x), segment_mask, is_causal=True))
  want = ref.encoder_layer(params, np.float64(x), dense, pre_norm)
  real = segments > 0
  np.testing.assert_allclose(got[real], want[real], rtol=1e-12, atol=1e-12)

  fused = layers.EncoderLayer(**sizes, attention_impl="xla")
  variables, _ = init(fused, x, segment_mask)
  np.testing.assert_allclose(
    fused.apply(variables, x, segment_mask, is_causal=True),
    fused.apply(variables, x, dense),
    rtol=1e-6,
    atol=1e-6,
  )


def test_decoder_layer_matches_formula():
  """The layer's self-attention is causal by itself: with no self mask, the formula's is the
  causal mask."""
  x, enc = randn(9, 2, 4, 16), randn(10, 2, 5, 16)
  cross_mask = np.ones((2, 1, 4, 5), bool)
  cross_mask[1, ..., 3:] = False
  layer = layers.DecoderLayer(num_heads=2, d_k=8, d_v=8, d_ff=32)
  variables, params = init(layer, x, enc, None, cross_mask)
  got = layer.apply(variables, x, enc, None, cross_mask)
  causal = np.asarray(attention.causal_mask(4))
  want = ref.decoder_layer(params, np.float64(x), enc, causal, cross_mask)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_residual_dropout_is_on_each_sublayer_output(pre_norm):
  x = randn(11, 1, 4, 16)
  layer = layers.EncoderLayer(num_heads=2, d_k=8, d_v=8, d_ff=32, pre_norm=pre_norm)
  variables, params = init(layer, x)
  dropped = record_dropout_inputs(lambda: layer.apply(variables, x))
  x64 = np.float64(x)
  norm1 = lambda y: ref.layer_norm(params["self_attention_norm"], y)
  norm2 = lambda y: ref.layer_norm(params["feed_forward_norm"], y)
  attn_in = norm1(x64) if pre_norm else x64
  attn_out = ref.multi_head(params["self_attention"], attn_in, attn_in)
  after_attn = x64 + attn_out if pre_norm else norm1(x64 + attn_out)
  ffn_out = ref.feed_forward(params["feed_forward"], norm2(after_attn) if pre_norm else after_attn)
  assert len(dropped) == 2
  np.testing.assert_allclose(dropped[0], attn_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dropped[1], ffn_out, rtol=1e-4, atol=1e-4)


def test_dropout_is_active_only_in_training():
  x = randn(12, 2, 4, 16)
  layer = layers.EncoderLayer(num_heads=2, d_k=8, d_v=8, d_ff=32, dropout_rate=0.5)
  variables, _ = init(layer, x)
  quiet = layer.apply(variables, x)
  np.testing.assert_array_equal(quiet, layer.apply(variables, x))
  noisy = [
    layer.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(s)})
    for s in (1, 2)
  ]
  assert not np.allclose(noisy[0], quiet) and not np.allclose(noisy[0], noisy[1])


def _dropped_fraction(given, kept):
  """The fraction of `given`'s nonzero entries that dropout zeroed in `kept`."""
  nonzero = given != 0
  return np.mean(kept[nonzero] == 0)


def _dropped_once(call):
  """The one dropout of `call()` at rate 0.5: (its input, its output, what `call` returned)."""
  returned = []
  calls = record_dropout_calls(lambda: returned.append(call()))
  assert len(calls) == 1
  _, given, kept = calls[0]
  assert 0.35 < _dropped_fraction(given, kept) < 0.65
  survived = kept != 0
  np.testing.assert_allclose(kept[survived], 2 * given[survived], rtol=1e-6)
  return given, kept, np.asarray(returned[0], np.float64)


def test_attention_dropout_drops_the_attention_weights_in_training_only():
  x_q, x_kv = randn(13, 2, 5, 12), randn(14, 2, 7, 12)
  mask = np.random.default_rng(15).random((2, 1, 5, 7)) < 0.7
  mha = layers.MultiHeadAttention(num_heads=3, d_k=4, d_v=4, dropout_rate=0.5)
  variables, params = init(mha, x_q, x_kv, mask)
  np.testing.assert_allclose(
    mha.apply(variables, x_q, x_kv, mask), ref.multi_head(params, x_q, x_kv, mask), atol=1e-5
  )
  weights, kept, out = _dropped_once(
    lambda: mha.apply(
      variables, x_q, x_kv, mask, deterministic=False, rngs={"dropout": jax.random.key(1)}
    )
  )
  query = np.einsum("bld,dhk->blhk", x_q, params["query"])
  key = np.einsum("bld,dhk->blhk", x_kv, params["key"])
  np.testing.assert_allclose(weights, ref.softmax_weights(query, key, mask), atol=1e-6)
  want = ref.multi_head(params, x_q, x_kv, mask, weights=kept)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_activation_dropout_drops_the_hidden_activations_in_training_only():
  x = randn(16, 2, 3, 8)
  ffn = layers.FeedForward(d_ff=32, dropout_rate=0.5)
  variables, params = init(ffn, x)
  np.testing.assert_allclose(ffn.apply(variables, x), ref.feed_forward(params, x), atol=1e-5)
  hidden, kept, out = _dropped_once(
    lambda: ffn.apply(variables, x, False, rngs={"dropout": jax.random.key(2)})
  )
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  np.testing.assert_allclose(hidden, np.maximum(0, x @ p["wi"] + p["bi"]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, kept @ p["wo"] + p["bo"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_cls", [layers.EncoderLayer, layers.DecoderLayer])
def test_layers_drop_attention_weights_and_activations_at_their_own_rates(layer_cls):
  x = randn(17, 2, 4, 16)
  args = (x,) if layer_cls is layers.EncoderLayer else (x, randn(18, 2, 5, 16))
  settings = dict(num_heads=2, d_k=8, d_v=8, d_ff=32, dropout_rate=0.0)
  variables, _ = init(layer_cls(**settings), *args)
  layer = layer_cls(**settings, attention_dropout_rate=0.25, activation_dropout_rate=0.5)
  np.testing.assert_array_equal(
    layer.apply(variables, *args), layer_cls(**settings).apply(variables, *args)
  )
  calls = record_dropout_calls(
    lambda: layer.apply(variables, *args, deterministic=False, rngs={"dropout": jax.random.key(3)})
  )
  calls = [(rate, given, kept) for rate, given, kept in calls if rate > 0]  # Not the residual's.
  attentions = 1 if layer_cls is layers.EncoderLayer else 2
  # The attention weights [b, heads, q, k] of each attention, then the hidden activations.
  shapes = [(2, 2, 4, 4), (2, 2, 4, 5)][:attentions] + [(2, 4, 32)]
  assert [given.shape for _, given, _ in calls] == shapes
  assert [rate for rate, _, _ in calls] == [0.25] * attentions + [0.5]
  for rate, given, kept in calls:
    assert abs(_dropped_fraction(given, kept) - rate) < 0.15


def test_parameters_carry_logical_axis_names():
  x = randn(13, 1, 3, 16)
  layer = layers.DecoderLayer(num_heads=2, d_k=8, d_v=8, d_ff=32)
  boxed = layer.init(jax.random.key(0), x, x)["params"]
  names = jax.tree_util.tree_map(
    lambda p: p.names, boxed, is_leaf=lambda p: isinstance(p, nn.Partitioned)
  )
  assert names["self_attention"]["query"] == ("embed", "heads", "kv")
  assert names["cross_attention"]["out"] == ("heads", "kv", "embed")
  assert names["feed_forward"]["wi"] == ("embed", "mlp")
  assert names["feed_forward_norm"]["scale"] == ("embed",)
  leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda p: isinstance(p, nn.Partitioned))
  assert all(isinstance(p, nn.Partitioned) for p in leaves)
  assert all(p.value.dtype == jnp.float32 for p in leaves)


def test_fairseq_init_shrinks_query_key_value_and_draws_feed_forward_as_torch_linear():
  x = jnp.ones((1, 3, 64))

  def attention_params(init):
    module = layers.MultiHeadAttention(num_heads=4, d_k=16, d_v=16, use_bias=True, init_scheme=init)
    return nn.unbox(module.init(jax.random.key(0), x, x))["params"]

  xavier, fairseq = attention_params("xavier"), attention_params("fairseq")
  bound = (6 / 128) ** 0.5  # Xavier-uniform: fan_in = d_model, fan_out = heads * d_k.
  for name in ("query", "key", "value"):
    assert np.abs(xavier[name]).max() <= bound < 1.05 * np.abs(xavier[name]).max()
    np.testing.assert_allclose(fairseq[name], 2**-0.5 * xavier[name], rtol=1e-6)
    assert not xavier[f"{name}_bias"].any()
    assert 0.9 * 64**-0.5 < np.abs(fairseq[f"{name}_bias"]).max() <= 64**-0.5
  np.testing.assert_array_equal(fairseq["out"], xavier["out"])
  assert not fairseq["out_bias"].any()

  feed_forward = layers.FeedForward(d_ff=256, init_scheme="fairseq")
  ff = nn.unbox(feed_forward.init(jax.random.key(1), x))["params"]
  for name, fan_in in (("wi", 64), ("bi", 64), ("wo", 256), ("bo", 256)):
    assert 0.9 * fan_in**-0.5 < np.abs(ff[name]).max() <= fan_in**-0.5, name
