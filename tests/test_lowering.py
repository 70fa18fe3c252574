"""The train step and beam search, lowered on the CPU for CUDA and TPU with `jax.export`.

The step is the one training jit-compiles (`experiment.make_trainer`), in
bfloat16 on meshes of the 8 simulated devices; a change that an accelerator
trace rejects (a host callback, a CPU-only custom call, a sharding that does
not split) or that loses the bfloat16 matmuls, the shardings or the donation
fails here without a GPU or TPU.

What this cannot cover: the attention implementation is resolved for the
platform of the mesh's devices (CPU here), so the modules use XLA's
attention, never the cuDNN fused kernel that a GPU run in bfloat16 takes.
Nothing is compiled here: `tests/test_compile.py` compiles for TPU and GPU
targets with their own compilers.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import helpers
from transformer_jax import experiment, sharding
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.decode import transformer_search
from transformer_jax.model.transformer import TransformerConfig

PLATFORMS = ("cuda", "tpu")
ROWS, LENGTH = 16, 16
BF16_MATMUL = re.compile(
  r"stablehlo\.dot_general .*: \(tensor<[0-9x]*xbf16>, tensor<[0-9x]*xbf16>\)"
)


def _trainer(mesh: dict, rules: str, grad_accum_steps: int = 1):
  """The experiment's trainer for a 2+2-layer d_model-64 bfloat16 model on all 8 devices."""
  settings = experiment.Experiment(
    model=TransformerConfig(
      num_layers=2, d_model=64, d_ff=128, num_heads=4, max_len=32, dtype="bfloat16"
    ),
    data=helpers.data_config(batch__max_source_length=32, batch__max_target_length=32),
    mesh=sharding.MeshConfig(**{"data": 1, **mesh}),
    sharding_rules=rules,
    grad_accum_steps=grad_accum_steps,
  )
  trainer, _ = experiment.make_trainer(settings, vocab_size=64)
  return trainer


def _export(placement, fn, *args, **kwargs) -> jax.export.Exported:
  """`fn(*args, **kwargs)` lowered for PLATFORMS inside the placement's mesh and rules."""
  return placement.run(lambda: jax.export.export(fn, platforms=PLATFORMS)(*args, **kwargs))


def _axes(shardings) -> set[str]:
  """The mesh axes (of more than one device) that any of `shardings` splits an array over."""
  found = set()
  for array_sharding in shardings:
    for entry in array_sharding.spec:
      axes = (entry,) if isinstance(entry, str) else entry or ()
      found |= {axis for axis in axes if array_sharding.mesh.shape[axis] > 1}
  return found


@pytest.mark.parametrize(
  "mesh, rules, accum, param_axes",
  [
    ({"data": 8}, "dp", 1, set()),
    ({"data": 2, "tensor": 4}, "tp", 1, {"tensor"}),
    ({"data": 2, "fsdp": 2, "tensor": 2}, "tp", 2, {"fsdp", "tensor"}),
  ],
)
def test_train_step_lowers_for_cuda_and_tpu(mesh, rules, accum, param_axes):
  trainer = _trainer(mesh, rules, accum)
  placement = trainer.placement
  batch = {
    k: jax.ShapeDtypeStruct((ROWS, LENGTH), jnp.int32, sharding=placement.batch_sharding)
    for k in BATCH_KEYS
  }
  # The jit-compiled step that `Trainer.train_step` runs, with its shardings and donation.
  exported = _export(placement, trainer.jitted_step, trainer.abstract_state, batch)
  assert exported.platforms == PLATFORMS
  assert exported.nr_devices == 8

  expected = jax.tree.leaves((trainer.abstract_state, batch))
  assert [(a.shape, a.dtype) for a in exported.in_avals] == [(a.shape, a.dtype) for a in expected]
  params = jax.tree.leaves(trainer.abstract_state.params)
  assert {p.dtype for p in params} == {jnp.dtype(jnp.float32)}
  shardings = exported.in_shardings_jax(placement.mesh)
  for got, want in zip(shardings, expected):
    assert got.is_equivalent_to(want.sharding, len(want.shape))
  state_leaves = len(jax.tree.leaves(trainer.abstract_state))
  assert _axes(shardings[1 : 1 + len(params)]) == param_axes
  assert _axes(shardings[state_leaves:]) == _axes([placement.batch_sharding])
  out_state = exported.out_shardings_jax(placement.mesh)[:state_leaves]
  assert all(
    got.is_equivalent_to(want.sharding, len(want.shape))
    for got, want in zip(out_state, jax.tree.leaves(trainer.abstract_state))
  )

  module = exported.mlir_module()
  sizes = ", ".join(f'"{axis}"={size}' for axis, size in placement.mesh.shape.items())
  assert f"sdy.mesh @mesh = <[{sizes}]>" in module
  assert BF16_MATMUL.search(module), "no bfloat16 matmul in the lowered step"
  main = next(line for line in module.splitlines() if "func.func public @main" in line)
  assert main.count("tf.aliasing_output") == state_leaves  # The state is donated.


def test_beam_search_lowers_for_cuda_and_tpu_with_tensor_parallel_rules():
  placement = _trainer({"data": 2, "tensor": 4}, "tp").placement
  inputs = jax.ShapeDtypeStruct((8, 12), jnp.int32, sharding=placement.batch_sharding)
  exported = _export(
    placement,
    transformer_search.beam_search,
    placement.model,
    {"params": placement.abstract_params},
    inputs,
    beam_size=4,
    max_len=24,
    max_extra=8,
  )
  assert exported.platforms == PLATFORMS
  assert exported.nr_devices == 8
  tokens, scores, steps = exported.out_avals
  assert (tokens.shape, tokens.dtype) == ((8, 24), jnp.int32)
  assert (scores.shape, scores.dtype) == ((8,), jnp.float32)
  assert (steps.shape, steps.dtype) == ((), jnp.int32)
  assert _axes(exported.in_shardings_jax(placement.mesh)) == {"data", "tensor"}
  module = exported.mlir_module()
  assert BF16_MATMUL.search(module), "no bfloat16 matmul in the lowered search"
  assert "stablehlo.while" in module  # The whole search is one loop on the device.
