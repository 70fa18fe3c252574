"""Attention and masks against a numpy float64 rendering of the paper's formula."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference
from transformer_jax.compile import targets
from transformer_jax.model import attention

pytestmark = pytest.mark.device


def random_qkv(seed, b=2, q_len=5, k_len=7, h=3, d_k=8, d_v=8):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, q_len, h, d_k)).astype(np.float32)
  k = rng.standard_normal((b, k_len, h, d_k)).astype(np.float32)
  v = rng.standard_normal((b, k_len, h, d_v)).astype(np.float32)
  return q, k, v


def random_mask(seed, b=2, q_len=5, k_len=7):
  return np.random.default_rng(seed).random((b, 1, q_len, k_len)) < 0.6


def relative_error(got, want):
  return np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)


@pytest.mark.parametrize("implementation", ["fused", "reference"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_float64_formula(implementation, seed):
  q, k, v = random_qkv(seed)
  mask = random_mask(seed + 100)
  mask[:, :, :, 0] = True  # Every row keeps at least one key here.
  for m in (None, mask):
    want = numpy_reference.softmax_attention(q, k, v, m)
    got = attention.dot_product_attention(q, k, v, m, implementation=implementation)
    assert relative_error(got, want) < 1e-5


def test_fused_and_reference_paths_agree():
  q, k, v = random_qkv(3, q_len=6, k_len=6)
  mask = attention.combine_masks(attention.causal_mask(6), random_mask(4, q_len=6, k_len=6))
  fused = attention.dot_product_attention(q, k, v, mask, implementation="fused")
  plain = attention.dot_product_attention(q, k, v, mask, implementation="reference")
  np.testing.assert_allclose(fused, plain, atol=2e-6, rtol=1e-5)


def test_different_d_k_and_d_v_uses_reference_path():
  q, k, v = random_qkv(5, d_k=4, d_v=10)
  want = numpy_reference.softmax_attention(q, k, v)
  got = attention.dot_product_attention(q, k, v)
  assert got.shape == (2, 5, 3, 10)
  assert relative_error(got, want) < 1e-5
  with pytest.raises(ValueError, match="d_k == d_v"):
    attention.dot_product_attention(q, k, v, implementation="fused")


def test_masked_keys_get_exactly_zero_weight():
  q, k, v = random_qkv(6)
  mask = random_mask(7)
  mask[:, :, :, 2] = True
  weights = np.asarray(attention.attention_weights(q, k, mask))
  assert np.all(weights[~np.broadcast_to(mask, weights.shape)] == 0.0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
  # The output cannot depend on masked values, whatever they are.
  v_changed = v.copy()
  v_changed[:, 3:] += 1000.0
  key_mask = np.zeros((2, 1, 1, 7), bool)
  key_mask[..., :3] = True
  for impl in ("fused", "reference"):
    a = attention.dot_product_attention(q, k, v, key_mask, implementation=impl)
    b = attention.dot_product_attention(q, k, v_changed, key_mask, implementation=impl)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("implementation", ["fused", "reference"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(implementation):
  q, k, v = random_qkv(8)
  mask = np.ones((2, 1, 5, 7), bool)
  mask[0, :, 1] = False  # Query row 1 of example 0 may attend to nothing.
  mask[1] = False  # Example 1 may attend to nothing at all.
  out = attention.dot_product_attention(q, k, v, mask, implementation=implementation)
  assert np.all(np.isfinite(out))
  np.testing.assert_array_equal(out[0, 1], 0.0)
  np.testing.assert_array_equal(out[1], 0.0)
  want = numpy_reference.softmax_attention(q, k, v, mask)
  np.testing.assert_allclose(out, want, atol=1e-6)
  grads = jax.grad(
    lambda q, k, v: jnp.sum(
      attention.dot_product_attention(q, k, v, mask, implementation=implementation) ** 2
    ),
    argnums=(0, 1, 2),
  )(q, k, v)
  for g in grads:
    assert np.all(np.isfinite(g))


def test_bfloat16_inputs_stay_close():
  q, k, v = random_qkv(9)
  want = numpy_reference.softmax_attention(q, k, v)
  for impl in ("fused", "reference"):
    got = attention.dot_product_attention(
      *(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)), implementation=impl
    )
    assert got.dtype == jnp.bfloat16
    assert relative_error(got, want) < 2e-2


def test_padding_mask_hand_built():
  q = np.array([[5, 6, 0]])
  k = np.array([[7, 0]])
  want = np.array([[[[True, False], [True, False], [False, False]]]])
  np.testing.assert_array_equal(attention.padding_mask(q, k), want)


def test_causal_mask_hand_built():
  want = np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], bool)[None, None]
  np.testing.assert_array_equal(attention.causal_mask(3), want)


def test_segment_mask_keeps_packed_examples_apart():
  seg = np.array([[1, 1, 2, 2, 2, 0]])
  got = np.asarray(attention.segment_mask(seg, seg))[0, 0]
  want = np.zeros((6, 6), bool)
  want[:2, :2] = True
  want[2:5, 2:5] = True
  np.testing.assert_array_equal(got, want)


def test_combine_masks():
  a = np.array([[[[True, True, False]]]])
  b = np.array([[[[True, False, True]]]])
  np.testing.assert_array_equal(attention.combine_masks(a, None, b), a & b)
  assert attention.combine_masks(None, None) is None


@pytest.mark.parametrize(
  "shapes, message",
  [
    (((2, 5, 3), (2, 7, 3, 8), (2, 7, 3, 8)), "query must be"),
    (((2, 5, 3, 8), (2, 7, 3, 4), (2, 7, 3, 8)), "head_dim differ"),
    (((2, 5, 3, 8), (2, 7, 3, 8), (2, 6, 3, 8)), "key and value"),
    (((2, 5, 4, 8), (2, 7, 3, 8), (2, 7, 3, 8)), "batch and heads"),
  ],
)
def test_inconsistent_shapes_raise(shapes, message):
  arrays = [np.zeros(s, np.float32) for s in shapes]
  with pytest.raises(ValueError, match=message):
    attention.dot_product_attention(*arrays)


@pytest.mark.parametrize(
  "implementation, platform, dtype, d_k, d_v, path",
  [
    ("auto", "gpu", jnp.bfloat16, 64, 64, "cudnn"),
    ("auto", "gpu", jnp.float16, 128, 128, "cudnn"),
    ("auto", "gpu", jnp.float32, 64, 64, "xla"),  # cuDNN's attention takes half precision.
    ("auto", "gpu", jnp.bfloat16, 60, 60, "xla"),  # Head sizes: multiples of 8,
    ("auto", "gpu", jnp.bfloat16, 256, 256, "xla"),  # at most 128.
    ("auto", "tpu", jnp.bfloat16, 64, 64, "xla"),
    ("auto", "cpu", jnp.float32, 64, 64, "xla"),
    ("auto", "gpu", jnp.float64, 64, 64, "reference"),
    ("auto", "gpu", jnp.bfloat16, 64, 32, "reference"),
    ("fused", "gpu", jnp.bfloat16, 64, 64, "cudnn"),
    ("fused", "tpu", jnp.float64, 64, 64, "xla"),
    ("reference", "gpu", jnp.bfloat16, 64, 64, "reference"),
    ("xla", "gpu", jnp.bfloat16, 64, 64, "xla"),
    ("cudnn", "cpu", jnp.bfloat16, 64, 64, "cudnn"),
  ],
)
def test_the_implementation_resolves_against_the_platform(
  implementation, platform, dtype, d_k, d_v, path
):
  assert (
    attention.resolve_implementation(implementation, platform, dtype=dtype, d_k=d_k, d_v=d_v)
    == path
  )


def test_bad_mask_shape_and_implementation_raise():
  q, k, v = random_qkv(10)
  with pytest.raises(ValueError, match="does not broadcast"):
    attention.dot_product_attention(q, k, v, np.ones((2, 1, 5, 6), bool))
  with pytest.raises(ValueError, match="allowed"):
    attention.dot_product_attention(q, k, v, implementation="flash")


def test_attention_dropout_applies_to_the_weights_on_the_reference_path():
  q, k, v = random_qkv(11)
  mask = random_mask(12)
  mask[:, :, :, 0] = True
  weights = numpy_reference.softmax_weights(q, k, mask)
  kept = (np.random.default_rng(13).random(weights.shape) < 0.5) * 2.0
  dropout = lambda w: w * kept.astype(np.float32)
  want = numpy_reference.softmax_attention(q, k, v, mask, weights=weights * kept)
  for implementation in ("auto", "xla", "reference"):  # The fused kernels have no dropout.
    got = attention.dot_product_attention(
      q, k, v, mask, implementation=implementation, dropout=dropout
    )
    assert relative_error(got, want) < 1e-5


def test_cached_attention_over_head_major_keys_and_values_matches_formula():
  q, k, v = random_qkv(11, q_len=1, d_k=8, d_v=6)
  mask = np.ones((2, 1, 1, 7), bool)
  mask[0, ..., 4:] = False
  got = attention.cached_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask)
  assert got.shape == (2, 1, 3, 6)
  assert relative_error(got, numpy_reference.softmax_attention(q, k, v, mask)) < 1e-5


def test_cached_attention_of_grouped_query_rows_reads_each_cached_row_for_its_group():
  q, k, v = random_qkv(12, b=6, q_len=1)
  mask = np.random.default_rng(3).random((2, 1, 1, 7)) < 0.7
  cache_k, cache_v = k[::3].transpose(0, 2, 1, 3), v[::3].transpose(0, 2, 1, 3)
  got = attention.cached_attention(q, cache_k, cache_v, mask)
  # The formula with every cached row repeated for the 3 query rows of its group.
  want = numpy_reference.softmax_attention(
    q, np.repeat(k[::3], 3, 0), np.repeat(v[::3], 3, 0), np.repeat(mask, 3, 0)
  )
  assert got.shape == (6, 1, 3, 8) and relative_error(got, want) < 1e-5
  with pytest.raises(ValueError, match="multiple"):
    attention.cached_attention(q[:5], cache_k, cache_v, mask)


@pytest.mark.parametrize("implementation", ["fused", "xla", "reference"])
def test_is_causal_is_the_causal_mask_folded_in(implementation):
  """`is_causal` gives what a causal mask ANDed into `mask` gives, against the float64 formula,
  rows left with no key (row 0 of example 0 may attend only to later keys) zero, gradients
  finite."""
  q, k, v = random_qkv(20, q_len=6, k_len=6)
  mask = random_mask(21, q_len=6, k_len=6)
  mask[..., 1:, 0] = True
  mask[0, :, 0] = [False, True, True, False, False, False]
  causal = np.asarray(attention.causal_mask(6))
  for m in (None, mask):
    folded = causal if m is None else causal & m
    want = numpy_reference.softmax_attention(q, k, v, folded)
    got = attention.dot_product_attention(q, k, v, m, is_causal=True, implementation=implementation)
    assert relative_error(got, want) < 1e-5
  np.testing.assert_array_equal(got[0, 0], 0.0)
  grads = jax.grad(
    lambda q, k, v: jnp.sum(
      attention.dot_product_attention(q, k, v, mask, is_causal=True, implementation=implementation)
      ** 2
    ),
    argnums=(0, 1, 2),
  )(q, k, v)
  assert all(np.all(np.isfinite(g)) for g in grads)
  with pytest.raises(ValueError, match="as many queries as keys"):
    attention.dot_product_attention(*random_qkv(22), is_causal=True)


def _cudnn_attention_calls(mask: bool, is_causal: bool) -> list[tuple[str, str, str]]:
  """(target, mask type, outputs) of every cuDNN attention call of the gradient of a bfloat16
  attention compiled for an H100 on this CPU."""
  device = targets.compile_devices(targets.parse_target("1xh100"))[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  qkv = jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16, sharding=sharding)
  boolean = jax.ShapeDtypeStruct((2, 1, 128, 128), jnp.bool_, sharding=sharding)

  def loss(q, k, v, m):
    out = attention.dot_product_attention(
      q, k, v, m if mask else None, is_causal=is_causal, implementation="cudnn"
    )
    return jnp.sum(out.astype(jnp.float32))

  grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  text = grad.lower(qkv, qkv, qkv, boolean).compile().as_text()
  found = []
  for line in text.splitlines():
    if target := re.search(r'custom_call_target="(__cudnn\$fmha[^"]*)"', line):
      outputs = line.split("=", 1)[1].split(" custom-call(")[0]
      found.append((target[1], re.search(r"mask_type[^A-Z]*([A-Z_]+)", line)[1], outputs))
  return found


@pytest.mark.skipif(
  not any(targets.installed(m) for m in targets.CUDA_PLUGINS) or jax.default_backend() != "cpu",
  reason="needs the cuda extra (jax CUDA plugin) and the CPU backend",
)
def test_cudnn_takes_its_causal_path_and_only_a_mask_brings_a_bias_gradient():
  """On an H100 `is_causal` is cuDNN's CAUSAL mask type, forward and backward. A boolean mask
  travels as a bias, whose gradient cuDNN writes in the backward (jax 0.10.2's public API has
  no packed-segment path); with no mask the backward writes only dQ, dK, dV."""
  plain = _cudnn_attention_calls(mask=False, is_causal=True)
  assert [(t, m) for t, m, _ in plain] == [
    ("__cudnn$fmhaSoftmax", "CAUSAL"),
    ("__cudnn$fmhaSoftmaxBackward", "CAUSAL"),
  ]
  assert plain[1][2].count("bf16[2,4,128,64]") == 3 and "bf16[2,1,128,128]" not in plain[1][2]
  masked = _cudnn_attention_calls(mask=True, is_causal=True)
  assert [(t, m) for t, m, _ in masked] == [
    ("__cudnn$fmhaScaleBiasSoftmax", "CAUSAL"),
    ("__cudnn$fmhaScaleBiasSoftmaxBackward", "CAUSAL"),
  ]
  assert "bf16[2,1,128,128]" in masked[1][2]  # The bias gradient.
