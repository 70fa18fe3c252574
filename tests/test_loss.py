"""The loss: label-smoothed cross entropy against a hand computation, sums over real tokens only."""

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
