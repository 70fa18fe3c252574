"""Orbax checkpoints: restore across meshes (8 devices to a 1-device process and back), data
position, keep-last-K, and what a step is read to hold."""

import json
import os
import textwrap

import grain
import jax
import numpy as np
import pytest

from helpers import REPO, python
from helpers import make_trainer as _trainer
from helpers import random_state as _random_state
from transformer_jax.checkpoints import store


def _dataset():
  return grain.MapDataset.range(1000).batch(4).to_iter_dataset()


def test_restore_on_another_mesh_and_data_position(tmp_path):
  fsdp = _trainer({"fsdp": 8}, "fsdp")
  state = _random_state(fsdp, 0)
  data = iter(_dataset())
  next(data), next(data)
  manager = store.make_manager(str(tmp_path))
  store.save(manager, 7, state, data)
  manager.wait_until_finished()

  one = _trainer({"data": 1}, "dp", jax.devices()[:1])
  data = iter(_dataset())
  restored = store.restore(store.make_manager(str(tmp_path)), one.abstract_state, data)
  np.testing.assert_array_equal(next(data), [8, 9, 10, 11])  # The third batch.
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), restored, state
  )
  leaf = restored.params["decoder"]["layer_0"]["feed_forward"]["wi"]
  assert leaf.sharding.device_set == {jax.devices()[0]}

  # And back: saved on one device, restored sharded over 8.
  manager = store.make_manager(str(tmp_path / "back"))
  store.save(manager, 3, restored)
  manager.wait_until_finished()
  again = store.restore(store.make_manager(str(tmp_path / "back")), fsdp.abstract_state)
  leaf = again.params["decoder"]["layer_0"]["feed_forward"]["wi"]
  assert len(leaf.sharding.device_set) == 8 and leaf.sharding.spec[0] == "fsdp"
  assert leaf.addressable_shards[0].data.shape == (32 // 8, 64)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), again, state
  )


@pytest.mark.slow
def test_a_checkpoint_from_8_devices_loads_in_a_1_device_process(tmp_path):
  fsdp = _trainer({"fsdp": 8}, "fsdp")
  state = _random_state(fsdp, 1)
  manager = store.make_manager(str(tmp_path / "ckpt"))
  store.save(manager, 5, state)
  manager.wait_until_finished()
  np.save(tmp_path / "expected.npy", np.asarray(state.params["embed"]["embedding"]))
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {str(REPO / "tests")!r})
      import jax, numpy as np
      from transformer_jax.checkpoints import store
      from helpers import make_trainer
      assert jax.device_count() == 1
      trainer = make_trainer({{"data": -1}}, "dp")
      state = store.restore(store.make_manager({str(tmp_path / "ckpt")!r}), trainer.abstract_state)
      assert int(state.step) == {int(state.step)}
      np.testing.assert_array_equal(np.asarray(state.params["embed"]["embedding"]),
                                    np.load({str(tmp_path / "expected.npy")!r}))
      print("restored on", jax.devices())
  """)
  result = python("-c", script)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "restored on [CpuDevice(id=0)]" in result.stdout


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
  trainer = _trainer({"data": 1}, "dp", jax.devices()[:1])
  state = _random_state(trainer, 2)
  manager = store.make_manager(str(tmp_path), max_to_keep=2)
  for step in (10, 20, 30, 40):
    assert store.save(manager, step, state)
  assert not store.save(manager, 40, state)  # Already there.
  manager.wait_until_finished()
  assert manager.all_steps() == [30, 40]
  assert sorted(os.listdir(tmp_path)) == ["30", "40"]
  (tmp_path / "50.orbax-checkpoint-tmp").mkdir()  # A write under way.
  assert store.committed_steps(str(tmp_path)) == [30, 40]
  assert store.committed_steps(str(tmp_path / "absent")) == []


def test_the_parameters_of_a_train_checkpoint_are_verified_alone(tmp_path):
  trainer = _trainer({"data": 1}, "dp", jax.devices()[:1])
  state = _random_state(trainer, 3)
  manager = store.make_manager(str(tmp_path), async_save=False)
  store.save(manager, 1, state)
  abstract = trainer.placement.abstract_params
  params = store.restore_params(manager, abstract, step=1)
  assert all(
    np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params))
  )
  saved = store.saved_fingerprints(manager, 1)
  (tmp_path / "1" / "integrity" / "metadata").write_text(
    json.dumps({**saved, "params": saved["params"] ^ 1})
  )
  with pytest.raises(store.CorruptCheckpointError, match="the parameters read back differ"):
    store.restore_params(manager, abstract, step=1)


def test_saved_arrays_and_check_layout_read_names_and_shapes_without_the_data(tmp_path):
  trainer = _trainer()
  manager = store.make_manager(str(tmp_path))
  store.save(manager, 4, _random_state(trainer, 4))
  manager.wait_until_finished()
  arrays = store.saved_arrays(manager, 4)
  assert arrays["params/embed/embedding"].shape == (40, 32)
  assert arrays["opt_state/0/mu/embed/embedding"].shape == (40, 32) and "step" in arrays
  store.check_layout(manager, 4, trainer.abstract_state)
  store.check_layout(manager, 4, trainer.placement.abstract_params, under="params")
  other = _trainer(vocab_size=48)
  with pytest.raises(
    store.CheckpointMismatchError,
    match=(r"params/embed/embedding: \(40, 32\) in the checkpoint, \(48, 32\) expected.*Use this"),
  ):
    store.check_layout(manager, 4, other.placement.abstract_params, under="params", hint="Use this")
