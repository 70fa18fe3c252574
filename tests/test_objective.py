"""The paper's learning-rate schedule and the FLOP count of a training step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_model_config
from transformer_jax.model.transformer import count_params
from transformer_jax.train import objective


def test_schedule_is_the_papers_formula_and_peaks_at_warmup():
  d_model, warmup, scale = 512, 4000, 2.0
  schedule = objective.learning_rate_schedule(d_model=d_model, warmup_steps=warmup, scale=scale)
  for count in (0, 1, 99, 3998, 3999, 4000, 12345, 99999):
    step = count + 1  # The paper counts from 1.
    expected = scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    np.testing.assert_allclose(float(schedule(count)), expected, rtol=1e-6)
  rates = np.asarray(jax.vmap(schedule)(jnp.arange(10_000)))
  assert int(np.argmax(rates)) == warmup - 1  # Paper step 4000.
  np.testing.assert_allclose(rates.max(), scale * (d_model * warmup) ** -0.5, rtol=1e-6)


def test_train_flops_is_six_times_params_times_tokens_plus_attention():
  # With no attention terms (length 0) and equal token counts the matmul part
  # is 6 * tokens * (weight matrices, the embedding counted once as the output layer).
  config = tiny_model_config()
  tokens = 1000
  flops = objective.train_flops(config, source_tokens=tokens, target_tokens=tokens,
                               source_length=0, target_length=0)
  d, n = config.d_model, config.num_layers
  biases_and_norms = n * (config.d_ff + d + 4 * d) + n * (config.d_ff + d + 6 * d)
  weights = count_params(config) - biases_and_norms  # Embedding/output counted once.
  # Every weight meets one token per side: 6 * tokens * weights.
  assert flops == pytest.approx(6 * tokens * weights)
  with_attention = objective.train_flops(config, source_tokens=tokens, target_tokens=tokens,
                                        source_length=10, target_length=8)
  per_pair = 2 * config.num_heads * (config.d_k + config.d_v)
  assert with_attention - flops == pytest.approx(3 * n * per_pair * tokens * (10 + 8 + 10))
