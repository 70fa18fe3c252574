"""The loss: label-smoothed cross entropy against a hand computation, sums over real tokens only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import synthetic_batch, tiny_model_config
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.model import loss
from transformer_jax.model.transformer import Transformer

pytestmark = pytest.mark.device


def test_label_smoothed_cross_entropy_against_a_hand_computation():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7))
  targets = rng.integers(0, 7, (2, 3))
  eps = 0.1
  smoothed, nll = loss.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), eps)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = np.full(logits.shape, eps / 6)  # eps spread over the 6 other tokens.
  np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
  np.testing.assert_allclose(smoothed, -(q * log_p).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(
    nll, -np.take_along_axis(log_p, targets[..., None], -1)[..., 0], rtol=1e-5
  )
  plain, _ = loss.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), 0.0)
  np.testing.assert_allclose(plain, nll, rtol=1e-6)


@pytest.mark.slow
def test_loss_counts_only_non_padding_targets():
  config = tiny_model_config()
  model = Transformer(config)
  batch = synthetic_batch(0)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  sums = jax.jit(lambda p, b: loss.loss_sums(model, p, b, label_smoothing=0.1))(params, batch)
  assert float(sums["tokens"]) == np.count_nonzero(batch["targets_segmentation"])
  assert float(sums["source_tokens"]) == np.count_nonzero(batch["inputs_segmentation"])
  logits = np.asarray(
    jax.jit(model.apply)({"params": params}, *(batch[k] for k in BATCH_KEYS)), np.float64
  )
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target_log_p = np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
  expected_nll = -(target_log_p * (batch["targets_segmentation"] > 0)).sum()
  np.testing.assert_allclose(float(sums["nll"]), expected_nll, rtol=1e-5)


def smoothed_target(targets, vocab: int, eps: float) -> np.ndarray:
  """q: 1 - eps on the target, eps / (vocab - 1) on each other token."""
  q = np.full((*targets.shape, vocab), eps / (vocab - 1))
  np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
  return q


def test_float64_loss_and_its_gradient_equal_the_formulas():
  """In float64 the losses equal the textbook formulas, and the gradient of the weighted sum is
  w * (p - q), to 1e-12."""
  rng = np.random.default_rng(1)
  vocab, eps = 37, 0.1
  logits = rng.normal(size=(3, 5, vocab)) * 4
  targets = rng.integers(0, vocab, (3, 5))
  weights = rng.integers(0, 2, (3, 5)).astype(np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = smoothed_target(targets, vocab, eps)
  with jax.enable_x64(True):
    smoothed, nll = loss.cross_entropy(jnp.asarray(logits), jnp.asarray(targets), eps)
    grad = jax.grad(
      lambda x: jnp.sum(loss.cross_entropy(x, jnp.asarray(targets), eps)[0] * weights)
    )(jnp.asarray(logits))
  assert smoothed.dtype == nll.dtype == grad.dtype == jnp.float64
  np.testing.assert_allclose(smoothed, -(q * log_p).sum(-1), rtol=1e-12, atol=0)
  np.testing.assert_allclose(
    nll, -np.take_along_axis(log_p, targets[..., None], -1)[..., 0], rtol=1e-12, atol=0
  )
  np.testing.assert_allclose(grad, weights[..., None] * (np.exp(log_p) - q), rtol=0, atol=1e-12)


def test_bfloat16_logits_give_the_float32_loss_within_bfloat16_rounding():
  """Logits rounded to bfloat16 (8 bits of mantissa) move the loss by at most the rounding of
  the logits themselves, and its arithmetic stays float32."""
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(4, 6, 300)) * 3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, 300, (4, 6)))
  exact = loss.cross_entropy(logits, targets, 0.1)
  rounded = loss.cross_entropy(logits.astype(jnp.bfloat16), targets, 0.1)
  for want, got in zip(exact, rounded):
    assert got.dtype == jnp.float32
    # |logit - bf16(logit)| <= 2^-8 |logit| <= 2^-8 * 15: the loss moves by at most twice that.
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 15 * 2**-8)
    assert float(jnp.max(jnp.abs(got - want))) > 0  # The rounding is there to be seen.


def model_and_batch(**overrides):
  config = tiny_model_config(**overrides)
  model = Transformer(config)
  batch = synthetic_batch(0)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  return model, params, batch


@pytest.mark.parametrize("chunk", [5, 4, 1])  # 12 target positions: padded, whole, one each.
def test_chunked_loss_and_gradients_equal_the_whole_output_layer_in_float64(chunk):
  with jax.enable_x64(True):
    whole, params, batch = model_and_batch(dtype="float64", dropout_rate=0.1)
    params = jax.tree.map(lambda p: p.astype(jnp.float64), params)
    chunked = Transformer(dataclasses.replace(whole.config, loss_chunk=chunk))
    key = jax.random.key(3)  # Dropout on: the chunks see the same masks.

    def sums_and_grads(model):
      def total(p):
        sums = loss.loss_sums(model, p, batch, label_smoothing=0.1, dropout_key=key)
        return sums["loss"].astype(jnp.float64), sums

      return jax.jit(jax.grad(total, has_aux=True))(params)

    (want_grads, want), (got_grads, got) = sums_and_grads(whole), sums_and_grads(chunked)
    for name in loss.LOSS_SUMS:
      np.testing.assert_allclose(got[name], want[name], rtol=1e-6)  # float32 sums
    for w, g in zip(jax.tree.leaves(want_grads), jax.tree.leaves(got_grads)):
      assert g.dtype == jnp.float64
      np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


def dots(jaxpr):
  """Every dot_general of a jaxpr, those of its sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        if hasattr(sub, "jaxpr"):
          yield from dots(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr)
        elif hasattr(sub, "eqns"):
          yield from dots(sub)


@pytest.mark.parametrize("chunk", [0, 5])
def test_a_bfloat16_models_output_layer_runs_in_bfloat16_forward_and_backward(chunk):
  """The logits are bfloat16 and the output layer's matmuls (the logits, made again in the
  backward when chunked, and the gradients of the features and of the embedding) take bfloat16
  operands and give bfloat16 results."""
  model, params, batch = model_and_batch(dtype="bfloat16", loss_chunk=chunk)
  logits = model.apply({"params": params}, *(batch[k] for k in BATCH_KEYS))
  assert logits.dtype == jnp.bfloat16
  grad = jax.grad(lambda p: loss.loss_sums(model, p, batch, label_smoothing=0.1)["loss"])
  vocab_dots = [
    eqn
    for eqn in dots(jax.make_jaxpr(grad)(params).jaxpr)
    if any(v.aval.shape[-1:] == (model.config.vocab_size,) for v in (*eqn.invars, *eqn.outvars))
    or any(v.aval.shape[:1] == (model.config.vocab_size,) for v in (*eqn.invars, *eqn.outvars))
  ]
  assert len(vocab_dots) == (4 if chunk else 3)
  for eqn in vocab_dots:
    assert [v.aval.dtype for v in (*eqn.invars, *eqn.outvars)] == [jnp.bfloat16] * 3, eqn


@pytest.mark.slow
def test_a_bfloat16_models_loss_is_the_float32_models_within_a_percent():
  model32, params, batch = model_and_batch()
  model16 = Transformer(dataclasses.replace(model32.config, dtype="bfloat16"))
  want = loss.loss_sums(model32, params, batch, label_smoothing=0.1)
  got = loss.loss_sums(model16, params, batch, label_smoothing=0.1)
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-2)
  np.testing.assert_allclose(got["nll"], want["nll"], rtol=1e-2)
