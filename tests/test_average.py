"""Checkpoint averaging and params-only checkpoints, on 8 simulated devices.

The reference is numpy's float64 mean of hand-made parameter trees.
"""

import json

import jax
import numpy as np
import pytest

from helpers import fit_batches, synthetic_batch
from helpers import make_trainer as _trainer
from helpers import random_state as _random_state
from transformer_jax.checkpoints import store
from transformer_jax.checkpoints.average import average_params
from transformer_jax.decode import transformer_search as search_lib
from transformer_jax.errors import FieldError
from transformer_jax.train.loop import FitSettings


def _leaves(tree):
  return [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_the_average_of_two_checkpoints_is_their_mean_parameter_by_parameter(tmp_path):
  trainer = _trainer({"fsdp": 8}, "fsdp")
  states = [_random_state(trainer, seed) for seed in (10, 11)]
  manager = store.make_manager(str(tmp_path / "checkpoints"))
  for step, state in zip((100, 200), states):
    store.save(manager, step, state)
  manager.wait_until_finished()

  abstract = trainer.placement.abstract_params
  averaged, used = average_params(manager, [100, 200], abstract)
  assert used == [100, 200]
  for got, a, b in zip(_leaves(averaged), _leaves(states[0].params), _leaves(states[1].params)):
    np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6, atol=1e-7)
  for leaf, target in zip(jax.tree.leaves(averaged), jax.tree.leaves(abstract)):
    assert leaf.dtype == np.float32 and leaf.sharding.is_equivalent_to(target.sharding, leaf.ndim)

  # Saved alone, it restores as it was (without any optimizer state) and decodes.
  out = store.make_params_manager(str(tmp_path / "averaged"))
  store.save_params(out, 200, averaged, steps=[100, 200])
  assert store.saved_info(out, 200) == {"steps": [100, 200]}
  restored = store.restore_params(out, abstract)
  for got, want in zip(_leaves(restored), _leaves(averaged)):
    np.testing.assert_array_equal(got, want)
  inputs = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)
  model = trainer.placement.model
  decoded = [
    search_lib.greedy_search(model, {"params": p}, inputs, max_len=8).tokens
    for p in (restored, averaged)
  ]
  np.testing.assert_array_equal(decoded[0], decoded[1])
  assert decoded[0].shape == (2, 8)


@pytest.mark.slow
def test_the_newest_checkpoints_that_read_back_intact_are_averaged(tmp_path, caplog):
  trainer = _trainer({"data": 1}, "dp", jax.devices()[:1])
  states = {step: _random_state(trainer, step) for step in (1, 2, 3)}
  manager = store.make_manager(str(tmp_path), async_save=False)
  for step, state in states.items():
    store.save(manager, step, state)
  saved = store.saved_fingerprints(manager, 3)
  (tmp_path / "3" / "integrity" / "metadata").write_text(
    json.dumps({**saved, "params": saved["params"] ^ 1})
  )
  abstract = trainer.placement.abstract_params
  averaged, used = average_params(manager, [1, 2, 3], abstract, count=2)
  assert used == [1, 2]
  assert f"not averaging checkpoint {tmp_path / '3'}: " in caplog.text
  for got, a, b in zip(_leaves(averaged), _leaves(states[1].params), _leaves(states[2].params)):
    np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6, atol=1e-7)
  with pytest.raises(store.CorruptCheckpointError, match="none of the checkpoints 3 in"):
    average_params(manager, [3], abstract)


@pytest.mark.slow
def test_restore_params_reads_a_train_checkpoint_without_its_optimizer_state(tmp_path):
  trainer = _trainer({"data": 8}, "dp")
  state = _random_state(trainer, 12)
  manager = store.make_manager(str(tmp_path))
  store.save(manager, 7, state)
  manager.wait_until_finished()
  params = store.restore_params(manager, trainer.placement.abstract_params)
  assert jax.tree.structure(params) == jax.tree.structure(state.params)
  for got, want in zip(_leaves(params), _leaves(state.params)):
    np.testing.assert_array_equal(got, want)
  arrays = store.saved_arrays(manager, 7)
  assert arrays["params/embed/embedding"].shape == state.params["embed"]["embedding"].shape


def test_saving_params_again_at_the_same_step_replaces_them(tmp_path):
  trainer = _trainer({"data": 8}, "dp")
  manager = store.make_params_manager(str(tmp_path))
  first, second = (_random_state(trainer, seed).params for seed in (13, 14))
  store.save_params(manager, 5, first)
  store.save_params(manager, 5, second)
  restored = store.restore_params(manager, trainer.placement.abstract_params)
  np.testing.assert_array_equal(restored["embed"]["embedding"], second["embed"]["embedding"])
  store.save_params(manager, 6, first)
  assert manager.all_steps() == [6]  # One params-only checkpoint at a time.


def test_a_params_only_checkpoint_that_reads_back_other_values_is_refused(tmp_path):
  trainer = _trainer({"data": 8}, "dp")
  manager = store.make_params_manager(str(tmp_path))
  store.save_params(manager, 5, _random_state(trainer, 15).params, steps=[5])
  fingerprint = tmp_path / "5" / "integrity" / "metadata"
  record = json.loads(fingerprint.read_text())
  record["state"] ^= 1  # As if one bit of the arrays had changed on disk.
  fingerprint.write_text(json.dumps(record))
  with pytest.raises(store.CorruptCheckpointError, match=r"5: the parameters read back differ"):
    store.restore_params(manager, trainer.placement.abstract_params)


def _saves(settings):
  return [s for s in range(1, settings.num_train_steps + 1) if settings.saves_at(s)]


@pytest.mark.parametrize(
  "steps, every, final, keep, saves, often_saves",
  [(8000, 500, 60, 10, 25, 134), (16_000, 500, 60, 20, 50, 267), (14, 3, 2, 3, 5, 7)],
)
def test_a_final_stretch_of_checkpoints_keeps_those_of_saving_often_throughout(
  steps, every, final, keep, saves, often_saves
):
  often = FitSettings(num_train_steps=steps, checkpoint_every_steps=final, keep_checkpoints=keep)
  sparse = FitSettings(
    num_train_steps=steps,
    checkpoint_every_steps=every,
    final_checkpoint_every_steps=final,
    keep_checkpoints=keep,
  )
  assert _saves(sparse)[-keep:] == _saves(often)[-keep:]
  assert (len(_saves(sparse)), len(_saves(often))) == (saves, often_saves)


def test_the_final_stretch_needs_checkpoints_kept():
  with pytest.raises(FieldError, match="final_checkpoint_every_steps.*needs keep_checkpoints > 0"):
    FitSettings(final_checkpoint_every_steps=60, keep_checkpoints=0)


@pytest.mark.slow
def test_the_final_stretch_averages_the_checkpoints_of_saving_often(tmp_path):
  trainer = _trainer()
  batches = [synthetic_batch(seed) for seed in range(14)]
  runs = {
    "often": dict(checkpoint_every_steps=2),
    "sparse": dict(checkpoint_every_steps=3, final_checkpoint_every_steps=2),
  }
  means = {}
  for name, settings in runs.items():
    fit_batches(trainer, batches, tmp_path / name, keep_checkpoints=3, **settings)
    manager = store.make_manager(str(tmp_path / name / "checkpoints"))
    assert sorted(manager.all_steps()) == [10, 12, 14]
    means[name], used = average_params(manager, manager.all_steps(), trainer.abstract_state.params)
    assert sorted(used) == [10, 12, 14]
    manager.close()
  for a, b in zip(_leaves(means["often"]), _leaves(means["sparse"]), strict=True):
    np.testing.assert_array_equal(a, b)
