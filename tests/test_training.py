"""Loss, learning-rate schedule, gradient accumulation, FLOP count and config validation.

`tiny_model_config` and `synthetic_batch` are also used by the sharding tests.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_jax import sharding, training
from transformer_jax.model import TransformerConfig, count_params


def tiny_model_config(**overrides) -> TransformerConfig:
  fields = dict(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=16)
  return TransformerConfig(**{**fields, **overrides})


def synthetic_batch(seed: int, rows: int = 8, length: int = 12, vocab: int = 40) -> dict:
  """Packed rows as the data pipeline makes them: one or two examples per row, then padding."""
  rng = np.random.default_rng(seed)
  batch = {k: np.zeros((rows, length), np.int32) for k in training.BATCH_KEYS}
  for row in range(rows):
    for side in ("inputs", "targets"):
      start = 0
      for segment in (1, 2)[: 1 + row % 2]:
        size = int(rng.integers(2, length // 2))
        span = slice(start, start + size)
        batch[side][row, span] = rng.integers(3, vocab, size)
        batch[side][row, start + size - 1] = 1  # EOS
        batch[f"{side}_segmentation"][row, span] = segment
        batch[f"{side}_position"][row, span] = np.arange(size)
        start += size
  return batch


def test_schedule_is_the_papers_formula_and_peaks_at_warmup():
  d_model, warmup, scale = 512, 4000, 2.0
  schedule = training.learning_rate_schedule(d_model=d_model, warmup_steps=warmup, scale=scale)
  for count in (0, 1, 99, 3998, 3999, 4000, 12345, 99999):
    step = count + 1  # The paper counts from 1.
    expected = scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    np.testing.assert_allclose(float(schedule(count)), expected, rtol=1e-6)
  rates = np.asarray(jax.vmap(schedule)(jnp.arange(10_000)))
  assert int(np.argmax(rates)) == warmup - 1  # Paper step 4000.
  np.testing.assert_allclose(rates.max(), scale * (d_model * warmup) ** -0.5, rtol=1e-6)


def test_label_smoothed_cross_entropy_against_a_hand_computation():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7))
  targets = rng.integers(0, 7, (2, 3))
  eps = 0.1
  smoothed, nll = training.cross_entropy(jnp.asarray(logits, jnp.float32),
                                         jnp.asarray(targets), eps)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = np.full(logits.shape, eps / 6)  # eps spread over the 6 other tokens.
  np.put_along_axis(q, targets[..., None], 1 - eps, axis=-1)
  np.testing.assert_allclose(smoothed, -(q * log_p).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(nll, -np.take_along_axis(log_p, targets[..., None], -1)[..., 0],
                             rtol=1e-5)
  plain, _ = training.cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets), 0.0)
  np.testing.assert_allclose(plain, nll, rtol=1e-6)


def test_loss_counts_only_non_padding_targets():
  config = tiny_model_config()
  model = training.Transformer(config)
  batch = synthetic_batch(0)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  sums = jax.jit(lambda p, b: training.loss_sums(model, p, b, label_smoothing=0.1))(params, batch)
  assert float(sums["tokens"]) == np.count_nonzero(batch["targets_segmentation"])
  assert float(sums["source_tokens"]) == np.count_nonzero(batch["inputs_segmentation"])
  logits = np.asarray(jax.jit(model.apply)({"params": params},
                                            *(batch[k] for k in training.BATCH_KEYS)), np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target_log_p = np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
  expected_nll = -(target_log_p * (batch["targets_segmentation"] > 0)).sum()
  np.testing.assert_allclose(float(sums["nll"]), expected_nll, rtol=1e-5)


def test_gradient_accumulation_over_4_micro_batches_equals_the_whole_batch():
  config = tiny_model_config(dropout_rate=0.0)
  model = training.Transformer(config)
  batch = synthetic_batch(1, rows=16)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  optimizer = optax.sgd(1.0)  # The parameter change is minus the gradient itself.
  state = training.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=optimizer.init(params))
  results = []
  for accum in (1, 4):
    step = training.make_train_step(model, optimizer, label_smoothing=0.1,
                                    grad_accum_steps=accum)
    new_state, metrics = jax.jit(step)(state, batch)
    results.append((jax.device_get(metrics), jax.device_get(new_state.params)))
  (whole, whole_params), (accumulated, accumulated_params) = results
  for key in ("loss", "nll", "tokens", "source_tokens", "grad_norm", "flops"):
    np.testing.assert_allclose(accumulated[key], whole[key], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), accumulated_params,
               whole_params)


def test_split_micro_batches_keeps_each_devices_rows_together():
  rows = np.arange(8)[:, None]
  micro = np.asarray(training.split_micro_batches(jnp.asarray(rows), 2))
  # Two devices holding rows 0-3 and 4-7: each micro-batch takes 2 rows from each.
  np.testing.assert_array_equal(micro[:, :, 0], [[0, 2, 4, 6], [1, 3, 5, 7]])


def test_train_flops_is_six_times_params_times_tokens_plus_attention():
  # With no attention terms (length 0) and equal token counts the matmul part
  # is 6 * tokens * (weight matrices, the embedding counted once as the output layer).
  config = tiny_model_config()
  tokens = 1000
  flops = training.train_flops(config, source_tokens=tokens, target_tokens=tokens,
                               source_length=0, target_length=0)
  d, n = config.d_model, config.num_layers
  biases_and_norms = n * (config.d_ff + d + 4 * d) + n * (config.d_ff + d + 6 * d)
  weights = count_params(config) - biases_and_norms  # Embedding/output counted once.
  # Every weight meets one token per side: 6 * tokens * weights.
  assert flops == pytest.approx(6 * tokens * weights)
  with_attention = training.train_flops(config, source_tokens=tokens, target_tokens=tokens,
                                        source_length=10, target_length=8)
  per_pair = 2 * config.num_heads * (config.d_k + config.d_v)
  assert with_attention - flops == pytest.approx(3 * n * per_pair * tokens * (10 + 8 + 10))


def test_model_config_follows_presets_and_builds_the_model_config():
  big = training.model_config("big")
  built = training.build_model_config(big, vocab_size=37000)
  assert built == TransformerConfig.preset("big")
  c2 = training.build_model_config(training.model_config("C2", dtype="bfloat16"), vocab_size=100)
  assert (c2.num_layers, c2.dtype, c2.d_k) == (4, "bfloat16", 64)


def test_bfloat16_computation_keeps_float32_parameters_and_adam_state():
  config = tiny_model_config(dtype="bfloat16")
  model = training.Transformer(config)
  batch = synthetic_batch(2)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  schedule = training.learning_rate_schedule(d_model=config.d_model, warmup_steps=10)
  optimizer = training.make_optimizer(schedule, b1=0.9, b2=0.98, eps=1e-9, grad_clip_norm=1.0)
  state = training.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=optimizer.init(params))
  step = jax.jit(training.make_train_step(model, optimizer, label_smoothing=0.1))
  state, metrics = step(state, batch)
  floats = [x for x in jax.tree.leaves((state.params, state.opt_state)) if x.ndim]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  per_token = float(metrics["loss"]) / float(metrics["tokens"])
  assert np.isfinite(per_token) and abs(per_token - np.log(config.vocab_size)) < 1.5
  assert int(state.step) == 1
