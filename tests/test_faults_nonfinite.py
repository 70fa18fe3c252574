"""Non-finite losses and gradients: the update is skipped on the device and counted; too many
stop the run.

The fault is a poisoned batch: a token id past the vocabulary, whose
embedding lookup reads NaN (`jnp.take` fills out-of-range rows with NaN).
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import fit_batches, make_trainer, synthetic_batch
from transformer_jax.checkpoints import store
from transformer_jax.train import loop, step


@pytest.fixture(scope="module")
def trainer():
  return make_trainer()


def _poisoned(seed: int) -> dict:
  batch = synthetic_batch(seed)
  batch["inputs"][0, 0] = 10_000  # Far past the vocabulary of 40.
  return batch


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _assert_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_a_poisoned_batch_skips_the_update_and_the_next_batch_trains(trainer):
  state = trainer.init()
  before = _host(state)
  state, metrics = trainer.train_step(state, _poisoned(0))
  after = _host(state)
  metrics = jax.device_get(metrics)
  assert float(metrics["nonfinite"]) == 1.0
  assert float(metrics["loss"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
  assert int(after.step) == 1  # The step counts; nothing else moved, bit for bit.
  _assert_equal(after.params, before.params)
  _assert_equal(after.opt_state, before.opt_state)
  state, metrics = trainer.train_step(state, synthetic_batch(1))
  assert float(jax.device_get(metrics["nonfinite"])) == 0.0
  assert np.isfinite(float(jax.device_get(metrics["loss"]))) and float(metrics["loss"]) > 0
  moved = _host(state)
  assert int(moved.step) == 2
  assert not np.array_equal(moved.params["embed"]["embedding"], before.params["embed"]["embedding"])
  for leaf in jax.tree.leaves(moved):
    assert np.all(np.isfinite(leaf))


@pytest.mark.parametrize("bad", ["loss", "grad_norm"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_skip_nonfinite_keeps_the_old_state_for_a_bad_loss_or_gradient(bad, value):
  old = step.TrainState(step=jnp.int32(4), params={"w": jnp.ones(3)}, opt_state=(jnp.zeros(3),))
  new = step.TrainState(step=jnp.int32(5), params={"w": jnp.full(3, 2.0)}, opt_state=(jnp.ones(3),))
  metrics = {
    "loss": jnp.float32(3.0),
    "nll": jnp.float32(2.0),
    "tokens": jnp.float32(7.0),
    "grad_norm": jnp.float32(0.5),
    "flops": jnp.float32(1.0),
  }
  kept, out = jax.jit(step.skip_nonfinite)(old, new, {**metrics, bad: jnp.float32(value)})
  assert int(kept.step) == 5
  np.testing.assert_array_equal(kept.params["w"], np.ones(3))
  np.testing.assert_array_equal(kept.opt_state[0], np.zeros(3))
  assert float(out["nonfinite"]) == 1.0 and float(out["loss"]) == 0.0
  taken, out = jax.jit(step.skip_nonfinite)(old, new, metrics)
  np.testing.assert_array_equal(taken.params["w"], np.full(3, 2.0))
  assert float(out["nonfinite"]) == 0.0 and float(out["loss"]) == 3.0


def test_skipped_updates_are_counted_in_the_logs(trainer, tmp_path, caplog):
  batches = [
    synthetic_batch(0),
    _poisoned(1),
    synthetic_batch(2),
    _poisoned(3),
    _poisoned(4),
    synthetic_batch(5),
  ]
  with caplog.at_level(logging.INFO):
    state = fit_batches(
      trainer,
      batches,
      tmp_path,
      log_every_steps=3,
      checkpoint_every_steps=100,
      max_consecutive_nonfinite_steps=3,
    )
  assert int(jax.device_get(state.step)) == 6
  assert "step 3/6 | " in caplog.text and "skipped 1 non-finite update (1 this run)" in caplog.text
  assert "skipped 2 non-finite updates (3 this run)" in caplog.text
  assert "3 non-finite updates skipped" in caplog.text  # The summary line.


def test_too_many_in_a_row_stop_the_run_with_a_clear_message(trainer, tmp_path):
  batches = [synthetic_batch(0), synthetic_batch(1)] + [_poisoned(s) for s in range(2, 8)]
  with pytest.raises(
    loop.NonFiniteError,
    match=r"3 updates in a row, the last at step 5, had a non-finite loss or "
    r"gradient.*max_consecutive_nonfinite_steps=3.*latest "
    r"checkpoint in \S+ is step 4",
  ):
    fit_batches(
      trainer,
      batches,
      tmp_path,
      log_every_steps=1,
      checkpoint_every_steps=2,
      max_consecutive_nonfinite_steps=3,
    )
  # Steps 3 and 4 were skipped: the checkpoint of step 4 holds the parameters of step 2.
  manager = store.make_manager(str(tmp_path / "checkpoints"))
  two, four = (_host(store.restore(manager, trainer.abstract_state, step=s)) for s in (2, 4))
  assert int(four.step) == 4
  _assert_equal(four.params, two.params)
  _assert_equal(four.opt_state, two.opt_state)
