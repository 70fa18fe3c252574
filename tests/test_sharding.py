"""Meshes, rules, every logical axis name, and the train step sharded over 8 simulated devices
and over 2 processes.

The reference for every sharded run is the same step on one device.
Run as a script, this file is one worker of the two-process test.
"""

import dataclasses
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.experimental import multihost_utils

from helpers import environment, free_port, make_trainer, synthetic_batch, tiny_model_config
from transformer_jax import sharding
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.errors import FieldError
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement, for_platform

STEPS = 2


def test_mesh_shape_fills_in_the_rest_and_rejects_mismatches():
  assert sharding.resolve_mesh_shape({"data": -1}, 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == (2, 2, 2)
  assert sharding.resolve_mesh_shape({"data": 1, "fsdp": 1, "tensor": 1}, 1) == (1, 1, 1)
  with pytest.raises(FieldError, match="at most one axis may be -1"):
    sharding.resolve_mesh_shape({"data": -1, "fsdp": -1}, 8)
  with pytest.raises(FieldError, match="mesh.tensor must be a positive integer or -1"):
    sharding.resolve_mesh_shape({"tensor": 0}, 8)
  with pytest.raises(FieldError, match="unknown axes"):
    sharding.resolve_mesh_shape({"pipeline": 2}, 8)


def test_rules_from_presets_and_explicit_specs():
  assert sharding.logical_rules("fsdp") == sharding.RULE_PRESETS["fsdp"]
  assert sharding.logical_rules("batch=data+fsdp, heads=tensor, kv=") == (
    ("batch", ("data", "fsdp")),
    ("heads", "tensor"),
    ("kv", None),
  )
  with pytest.raises(FieldError, match="unknown logical axis 'head'"):
    sharding.logical_rules("head=tensor")


def _trainer(mesh_shape, rules, devices=None, **model_overrides):
  return make_trainer(mesh_shape, rules, devices, seed=3, **model_overrides)


def _run(trainer, batches):
  """Losses per step (per token) and the final parameters, as numpy."""
  state, losses = trainer.init(), []
  for batch in batches:
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["loss"]) / float(metrics["tokens"]))
  return np.array(losses), jax.tree.map(np.asarray, jax.device_get(state.params))


@pytest.fixture(scope="module")
def batches():
  return [synthetic_batch(seed, rows=8) for seed in range(STEPS)]


@pytest.fixture(scope="module")
def one_device(batches):
  return _run(_trainer({"data": 1}, "dp", jax.devices()[:1]), batches)


@pytest.fixture(scope="module")
def data_parallel_8(batches):
  """The 8-device data-parallel run, shared by two tests."""
  return _run(_trainer({"data": 8}, "dp"), batches)


@pytest.mark.slow
def test_data_parallel_step_matches_one_device(data_parallel_8, one_device):
  _assert_same_run(data_parallel_8, one_device)


@pytest.mark.parametrize(
  "mesh_shape, rules, expected_spec",
  [
    ({"fsdp": 8}, "fsdp", ("fsdp", None, None)),
    ({"data": 4, "tensor": 2}, "tp", ("fsdp", "tensor", None)),
  ],
)
@pytest.mark.slow
def test_sharded_step_matches_one_device(batches, one_device, mesh_shape, rules, expected_spec):
  trainer = _trainer(mesh_shape, rules)
  query = trainer.state_shardings.params["encoder"]["layer_0"]["self_attention"]["query"]
  assert tuple(query.spec) + (None,) * (3 - len(query.spec)) == expected_spec
  _assert_same_run(_run(trainer, batches), one_device)


def _assert_same_run(run, reference):
  """Losses to 1e-5; parameters to 1e-5, but for a few (under 0.5%) within 3% of a step's update.

  Adam divides each gradient by its root mean square, so a gradient near zero,
  whose rounding differs between shardings (reductions in another order), can
  move its parameter by up to the learning rate (about 1e-2 here). A real
  sharding error (a lost all-reduce, another dropout mask) moves most of them.
  """
  losses, params = run
  reference_losses, reference_params = reference
  np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)

  def compare(a, b):
    assert np.mean(np.abs(a - b) <= 1e-5) >= 0.995
    np.testing.assert_allclose(a, b, atol=3e-4)

  jax.tree.map(compare, params, reference_params)


def test_a_dimension_that_does_not_split_is_named():
  with pytest.raises(ValueError, match=r"\['embed'\]\['embedding'\].*dimension 0 \(41\)"):
    _trainer({"data": 4, "tensor": 2}, "tp", vocab_size=41)


def test_a_batch_that_does_not_split_is_named():
  trainer = _trainer({"data": 8}, "dp")
  with pytest.raises(ValueError, match="the global batch has 6 rows, not a multiple of 8"):
    trainer.check_batch(synthetic_batch(0, rows=6))


def test_every_logical_axis_name_of_the_model_is_known_to_the_rules():
  """A misspelled name would leave its axis unsharded without a word; so would an unknown one."""
  names = set()

  def collect(boxed):
    if isinstance(boxed, nn.LogicallyPartitioned):
      names.update(n for n in boxed.names if n is not None)
    return boxed

  constraints = []
  original = nn.with_logical_constraint

  def recording(x, logical_axis_resources, *args, **kwargs):
    constraints.append(tuple(logical_axis_resources))
    return original(x, logical_axis_resources, *args, **kwargs)

  for config in (tiny_model_config(), tiny_model_config(positional="learned", scan_layers=True)):
    placement = Placement(config, sharding.make_mesh({"data": -1}), sharding.logical_rules("dp"))
    boxed = jax.eval_shape(placement.boxed_params, jax.random.key(0))
    jax.tree.map(collect, boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(nn, "with_logical_constraint", recording)
      batch = synthetic_batch(0)
      jax.eval_shape(
        lambda p: placement.model.apply({"params": p}, *(batch[k] for k in BATCH_KEYS)),  # noqa: B023
        nn.unbox(boxed),
      )
  names |= {n for axes in constraints for n in axes if n is not None}
  assert constraints and {"layers", "vocab", "mlp", "heads", "kv", "embed", "batch"} <= names
  assert names <= set(sharding.LOGICAL_AXES), names - set(sharding.LOGICAL_AXES)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_match_one_process(data_parallel_8, tmp_path):
  """2 processes x 4 CPU devices (gloo collectives) against 1 process x 8 devices.

  Data parallel: each process reads half of every batch, also when its devices
  hold every other shard of the batch (interleaved, as the hosts of a TPU slice
  are along its torus; each process passes the rows its devices hold). Tensor parallel across
  the processes (devices interleaved so that each data-parallel row pairs a device of each process):
  both read the whole batch.
  """
  port = free_port()
  env = environment(devices=4)
  workers = [
    subprocess.Popen(
      [sys.executable, __file__, str(i), str(port), str(tmp_path)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  for worker in workers:
    output, _ = worker.communicate(timeout=600)
    assert worker.returncode == 0, output[-3000:]
  losses, params = data_parallel_8
  for layout, shards in (
    ("dp", [(0, 2), (1, 2)]),
    ("dp_interleaved", [(0, 2), (1, 2)]),
    ("tp_across", [(0, 1), (0, 1)]),
  ):
    for i in range(2):
      result = np.load(tmp_path / f"{layout}_{i}.npz")
      assert tuple(result["data_shard"]) == shards[i]
      np.testing.assert_allclose(result["losses"], losses, rtol=1e-5)
      np.testing.assert_allclose(result["embedding"], params["embed"]["embedding"], atol=1e-5)


def _worker(process_id: int, port: int, out_dir: str):
  """One of two processes: train each layout on its block of every batch; save losses, embedding."""
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  interleaved = [d for pair in zip(jax.devices()[:4], jax.devices()[4:]) for d in pair]
  layouts = {
    "dp": ({"data": -1}, "dp", None),
    "dp_interleaved": ({"data": -1}, "dp", interleaved),
    "tp_across": ({"data": 4, "tensor": 2}, "tp", interleaved),
  }
  for name, (mesh_shape, rules, devices) in layouts.items():
    trainer = _trainer(mesh_shape, rules, devices)
    index, count = trainer.placement.data_shard
    # The rows this process's devices hold, in order: block `index` of the loader lands there
    # (`global_batch`), here the batch's own rows, so that every layout sees the same batch.
    held = sorted(
      {
        row
        for where in trainer.placement.batch_sharding.addressable_devices_indices_map(
          (8, 12)
        ).values()
        for row in range(*where[0].indices(8))
      }
    )
    assert len(held) == 8 // count
    state, losses = trainer.init(), []
    for seed in range(STEPS):
      batch = synthetic_batch(seed, rows=8)
      state, metrics = trainer.train_step(state, {k: v[held] for k, v in batch.items()})
      losses.append(
        float(metrics["loss"].addressable_data(0)) / float(metrics["tokens"].addressable_data(0))
      )
    embedding = multihost_utils.process_allgather(state.params["embed"]["embedding"], tiled=True)
    np.savez(
      pathlib.Path(out_dir) / f"{name}_{process_id}.npz",
      losses=np.array(losses),
      embedding=embedding,
      data_shard=np.array([index, count]),
    )
  jax.distributed.shutdown()


def test_a_placed_model_takes_the_attention_of_its_mesh_platform():
  config = TransformerConfig(
    vocab_size=16, num_layers=1, d_model=32, d_ff=32, num_heads=4, dtype="bfloat16"
  )
  assert for_platform(config, "gpu").attention_impl == "cudnn"
  assert for_platform(config, "tpu").attention_impl == "xla"
  assert (
    for_platform(dataclasses.replace(config, attention_impl="reference"), "gpu").attention_impl
    == "reference"
  )
  with pytest.raises(FieldError, match="'cudnn' needs a GPU, bfloat16 or float16"):
    for_platform(dataclasses.replace(config, attention_impl="cudnn"), "tpu")
  with pytest.raises(FieldError, match="got gpu, float32"):
    for_platform(dataclasses.replace(config, attention_impl="cudnn", dtype="float32"), "gpu")
  with pytest.raises(FieldError, match="needs d_k == d_v"):
    TransformerConfig(vocab_size=16, d_model=32, num_heads=4, d_k=8, d_v=16, attention_impl="cudnn")


if __name__ == "__main__":
  _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
