"""Orbax checkpoints: restore across meshes (8 devices to a 1-device process and back), data position, keep-last-K."""

import os
import pathlib
import subprocess
import sys
import textwrap

import grain
import jax
import numpy as np

from transformer_jax import checkpointing, sharding, training
from test_training import tiny_model_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def _trainer(mesh_shape, rules, devices=None):
  config = tiny_model_config()
  schedule = training.learning_rate_schedule(d_model=config.d_model, warmup_steps=10)
  optimizer = training.make_optimizer(schedule, b1=0.9, b2=0.98, eps=1e-9)
  return training.Trainer(config, optimizer, sharding.make_mesh(mesh_shape, devices),
                          sharding.logical_rules(rules), label_smoothing=0.1)


def _random_state(trainer, seed):
  """A state with distinct random values in every leaf, placed as the trainer shards it."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda a: jax.device_put(rng.normal(size=a.shape).astype(a.dtype) if a.dtype != np.int32
                               else np.array(rng.integers(1, 100), np.int32), a.sharding),
      trainer.abstract_state)


def _dataset():
  return grain.MapDataset.range(1000).batch(4).to_iter_dataset()


def test_restore_on_another_mesh_and_data_position(tmp_path):
  fsdp = _trainer({"fsdp": 8}, "fsdp")
  state = _random_state(fsdp, 0)
  data = iter(_dataset())
  next(data), next(data)
  manager = checkpointing.make_manager(str(tmp_path))
  checkpointing.save(manager, 7, state, data)
  manager.wait_until_finished()

  one = _trainer({"data": 1}, "dp", jax.devices()[:1])
  data = iter(_dataset())
  restored = checkpointing.restore(checkpointing.make_manager(str(tmp_path)), one.abstract_state,
                                   data)
  np.testing.assert_array_equal(next(data), [8, 9, 10, 11])  # The third batch.
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               restored, state)
  leaf = restored.params["decoder"]["layer_0"]["feed_forward"]["wi"]
  assert leaf.sharding.device_set == {jax.devices()[0]}

  # And back: saved on one device, restored sharded over 8.
  manager = checkpointing.make_manager(str(tmp_path / "back"))
  checkpointing.save(manager, 3, restored)
  manager.wait_until_finished()
  again = checkpointing.restore(checkpointing.make_manager(str(tmp_path / "back")),
                                fsdp.abstract_state)
  leaf = again.params["decoder"]["layer_0"]["feed_forward"]["wi"]
  assert len(leaf.sharding.device_set) == 8 and leaf.sharding.spec[0] == "fsdp"
  assert leaf.addressable_shards[0].data.shape == (32 // 8, 64)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               again, state)


def test_a_checkpoint_from_8_devices_loads_in_a_1_device_process(tmp_path):
  fsdp = _trainer({"fsdp": 8}, "fsdp")
  state = _random_state(fsdp, 1)
  manager = checkpointing.make_manager(str(tmp_path / "ckpt"))
  checkpointing.save(manager, 5, state)
  manager.wait_until_finished()
  np.save(tmp_path / "expected.npy", np.asarray(state.params["embed"]["embedding"]))
  script = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {str(REPO / 'tests')!r})
      import jax, numpy as np
      from transformer_jax import checkpointing
      from test_checkpointing import _trainer
      assert jax.device_count() == 1
      trainer = _trainer({{"data": -1}}, "dp")
      state = checkpointing.restore(checkpointing.make_manager({str(tmp_path / 'ckpt')!r}),
                                    trainer.abstract_state)
      assert int(state.step) == {int(state.step)}
      np.testing.assert_array_equal(np.asarray(state.params["embed"]["embedding"]),
                                    np.load({str(tmp_path / 'expected.npy')!r}))
      print("restored on", jax.devices())
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "restored on [CpuDevice(id=0)]" in result.stdout


def test_only_the_last_k_checkpoints_are_kept(tmp_path):
  trainer = _trainer({"data": 1}, "dp", jax.devices()[:1])
  state = _random_state(trainer, 2)
  manager = checkpointing.make_manager(str(tmp_path), max_to_keep=2)
  for step in (10, 20, 30, 40):
    assert checkpointing.save(manager, step, state)
  assert not checkpointing.save(manager, 40, state)  # Already there.
  manager.wait_until_finished()
  assert manager.all_steps() == [30, 40]
  assert sorted(os.listdir(tmp_path)) == ["30", "40"]
