"""The paper's learning-rate schedule and the FLOP count of a training step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_model_config
from transformer_jax.model.config import train_flops
from transformer_jax.train import objective

pytestmark = pytest.mark.device


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


def test_a_cooldown_takes_the_last_updates_linearly_down_to_zero():
  d_model, warmup, total, cooldown = 64, 100, 1000, 200
  paper = objective.learning_rate_schedule(d_model=d_model, warmup_steps=warmup)
  schedule = objective.learning_rate_schedule(
    d_model=d_model, warmup_steps=warmup, cooldown_steps=cooldown, num_train_steps=total
  )
  for count in (0, 99, 500, 799, 800, 900, 999):
    factor = min(1.0, (total - count) / cooldown)
    np.testing.assert_allclose(float(schedule(count)), float(paper(count)) * factor, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(999)), float(paper(999)) / cooldown, rtol=1e-6)
  assert float(schedule(1000)) == 0.0
  with pytest.raises(ValueError, match="cooldown needs the run's num_train_steps"):
    objective.learning_rate_schedule(d_model=d_model, warmup_steps=warmup, cooldown_steps=10)
  with pytest.raises(
    ValueError, match=r"cooldown_steps=20 is longer than the run \(num_train_steps=10\)"
  ):
    objective.OptimizerSettings(cooldown_steps=20).make(d_model, 10)


def test_train_flops_counts_each_weight_a_token_meets_and_each_attention_pair():
  # d_model 32, 4 heads of d_k 8 and d_v 12, d_ff 64, 2 + 2 layers, 40 words. By hand:
  # attention: W^Q, W^K 32x32 = 1024 each, W^V 32x48 = 1536, W^O 48x32 = 1536: 5120;
  # feed-forward 2 x 32x64 = 4096; cross-attention keys/values 2560, queries/output 2560.
  config = tiny_model_config(d_k=8, d_v=12)
  per_source_token = 2 * (5120 + 4096 + 2560)  # Encoder layers; decoder keys/values.
  per_target_token = 2 * (5120 + 2560 + 4096) + 40 * 32  # Decoder layers; output projection.
  flops = train_flops(
    config, source_tokens=1000, target_tokens=600, source_length=0, target_length=0
  )
  # Forward: 2 FLOPs per multiply-add; training: 3 x forward.
  assert flops == 3 * 2 * (per_source_token * 1000 + per_target_token * 600)
  with_attention = train_flops(
    config, source_tokens=1000, target_tokens=600, source_length=10, target_length=8
  )
  per_pair = 2 * 4 * (8 + 12)  # FLOPs of Q K^T and weights V for 4 heads, in one layer.
  pairs = 1000 * 10 + 600 * (8 + 10)  # Encoder self, decoder self and cross attention.
  assert with_attention - flops == 3 * 2 * per_pair * pairs  # Training, 2 layers.


def test_train_flops_counts_each_stack_at_its_own_depth():
  # The model above with 3 encoder layers and 1 decoder layer.
  config = tiny_model_config(d_k=8, d_v=12, num_layers=3, num_decoder_layers=1)
  per_source_token = 3 * (5120 + 4096) + 2560  # Encoder layers; one decoder's keys/values.
  per_target_token = (5120 + 2560 + 4096) + 40 * 32
  flops = train_flops(
    config, source_tokens=1000, target_tokens=600, source_length=10, target_length=8
  )
  per_pair = 2 * 4 * (8 + 12)  # FLOPs of one (query, key) pair in one layer.
  pairs = 3 * 1000 * 10 + 600 * (8 + 10)  # Three encoder layers' pairs; one decoder layer's.
  assert flops == 3 * (2 * (per_source_token * 1000 + per_target_token * 600) + per_pair * pairs)
