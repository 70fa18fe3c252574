"""The train step: gradient accumulation equals the whole batch, micro-batches keep each device's
rows, bfloat16 computation keeps float32 parameters and Adam state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import synthetic_batch, tiny_model_config
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.transformer import transformer_spec
from transformer_jax.train import objective
from transformer_jax.train import step as step_lib

pytestmark = pytest.mark.device


@pytest.mark.slow
def test_gradient_accumulation_over_4_micro_batches_equals_the_whole_batch():
  config = tiny_model_config(dropout_rate=0.0)
  spec = transformer_spec(config)
  model = spec.module
  batch = synthetic_batch(1, rows=16)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  optimizer = optax.sgd(1.0)  # The parameter change is minus the gradient itself.
  state = step_lib.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
  )
  results = []
  for accum in (1, 4):
    step = step_lib.make_train_step(spec, transformer_loss(0.1), optimizer, grad_accum_steps=accum)
    new_state, metrics = jax.jit(step)(state, batch)
    results.append((jax.device_get(metrics), jax.device_get(new_state.params)))
  (whole, whole_params), (accumulated, accumulated_params) = results
  for key in ("loss", "nll", "tokens", "source_tokens", "grad_norm", "flops"):
    np.testing.assert_allclose(accumulated[key], whole[key], rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), accumulated_params, whole_params
  )


def test_split_micro_batches_keeps_each_devices_rows_together():
  rows = np.arange(8)[:, None]
  micro = np.asarray(step_lib.split_micro_batches(jnp.asarray(rows), 2))
  # Two devices holding rows 0-3 and 4-7: each micro-batch takes 2 rows from each.
  np.testing.assert_array_equal(micro[:, :, 0], [[0, 2, 4, 6], [1, 3, 5, 7]])


@pytest.mark.slow
def test_bfloat16_computation_keeps_float32_parameters_and_adam_state():
  config = tiny_model_config(dtype="bfloat16")
  spec = transformer_spec(config)
  model = spec.module
  batch = synthetic_batch(2)
  params = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])["params"]
  optimizer, _ = objective.OptimizerSettings(warmup_steps=10, grad_clip_norm=1.0).make(
    config.d_model
  )
  state = step_lib.TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
  )
  step = jax.jit(step_lib.make_train_step(spec, transformer_loss(0.1), optimizer))
  state, metrics = step(state, batch)
  floats = [x for x in jax.tree.leaves((state.params, state.opt_state)) if x.ndim]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  per_token = float(metrics["loss"]) / float(metrics["tokens"])
  assert np.isfinite(per_token) and abs(per_token - np.log(config.vocab_size)) < 1.5
  assert int(state.step) == 1


def test_the_global_norm_is_optaxs_over_one_sum_of_row_sums():
  tree = {
    "w": jnp.arange(3 * 70, dtype=jnp.float32).reshape(3, 70) / 7.0,  # 3 rows < 64: 210 at once
    "q": jnp.linspace(-1.0, 1.0, 8 * 16 * 5).reshape(8, 16, 5),  # 8 x 16 = 128 row sums
    "b": jnp.full((5,), 0.5),
    "s": jnp.float32(3.0),
  }
  expected = float(optax.tree.norm(tree))
  np.testing.assert_allclose(float(objective.global_norm(tree)), expected, rtol=1e-6)
  np.testing.assert_allclose(float(jax.jit(objective.global_norm)(tree)), expected, rtol=1e-6)
  nan = {**tree, "b": tree["b"].at[2].set(jnp.nan)}
  assert not np.isfinite(float(objective.global_norm(nan)))


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # Clipped, and left as it is.
def test_clipping_by_the_global_norm_is_optaxs(max_norm):
  rng = np.random.default_rng(0)
  tree = {"w": rng.normal(size=(80, 3)), "b": rng.normal(size=(7,)), "s": np.float64(0.3)}
  tree = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
  ours = objective.clip_by_global_norm(max_norm)
  theirs = optax.clip_by_global_norm(max_norm)
  clipped, _ = jax.jit(ours.update)(tree, ours.init(tree))
  expected, _ = theirs.update(tree, theirs.init(tree))
  for a, b in zip(jax.tree.leaves(clipped), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
  norm = float(objective.global_norm(clipped))
  assert norm == pytest.approx(min(max_norm, float(optax.tree.norm(tree))), rel=1e-6)


def test_clipping_leaves_zero_gradients_and_passes_a_nan_on():
  clip = objective.clip_by_global_norm(1.0)
  zeros = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
  clipped, _ = clip.update(zeros, clip.init(zeros))
  assert all(not np.asarray(x).any() for x in jax.tree.leaves(clipped))
  nan = {"w": jnp.full((3, 2), 2.0), "b": jnp.array([jnp.nan, 1.0])}
  clipped, _ = clip.update(nan, clip.init(nan))
  # A non-finite norm makes a non-finite update, which the train step skips (skip_nonfinite).
  assert np.isnan(np.asarray(clipped["w"])).all()
