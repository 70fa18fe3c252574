"""A Transformer placed on a mesh (`Placement`), its attention resolved for the mesh's platform."""

import dataclasses
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.errors import FieldError
from transformer_jax.model.attention import implementation_problem, resolve_implementation
from transformer_jax.model.transformer import Transformer, TransformerConfig
from transformer_jax.sharding import (
  Rules,
  abstract_tree,
  batch_sharding,
  check_divisible,
  data_shard,
  global_batch,
  logical_rules,
  make_mesh,
  num_batch_shards,
  tree_shardings,
)


def for_platform(model_config: TransformerConfig, platform: str) -> TransformerConfig:
  """`model_config` with its attention implementation resolved for devices of `platform` ("cpu",
  "gpu", "tpu"), so that a program compiled for a target takes the path a run there takes.
  FieldError (owner `model`) for `attention_impl='cudnn'` where cuDNN cannot run it."""
  problem = implementation_problem(
    model_config.attention_impl,
    d_k=model_config.key_size,
    d_v=model_config.value_size,
    platform=platform,
    dtype=model_config.compute_dtype,
  )
  if problem:
    raise FieldError("model", "attention_impl", f"={model_config.attention_impl!r}{problem}")
  attention = resolve_implementation(
    model_config.attention_impl,
    platform,
    dtype=model_config.compute_dtype,
    d_k=model_config.key_size,
    d_v=model_config.value_size,
  )
  return dataclasses.replace(model_config, attention_impl=attention)


class Placement:
  """A Transformer placed on a mesh: the model, its shardings and the context to run it in.

  `param_shardings` and `abstract_params` (ShapeDtypeStructs with their
  shardings) follow the parameters' logical axis names through `rules`;
  batches are `[batch, length]` along the mesh axes of `batch`
  (`batch_sharding`, split into `batch_shards` pieces, of which this process
  reads block `data_shard`). Raises FieldError naming a parameter whose
  dimension does not split evenly. The trainer, the translator and the
  evaluation modes all hold one. The model's attention implementation is
  resolved for the platform of the mesh's devices (`for_platform`), not the
  process's default backend.
  """

  def __init__(self, model_config: TransformerConfig, mesh: Mesh, rules: Rules):
    self.model = Transformer(for_platform(model_config, mesh.devices.flat[0].platform))
    self.mesh, self.rules = mesh, rules
    boxed = jax.eval_shape(self.boxed_params, jax.random.key(0))
    self.param_shardings = tree_shardings(boxed, mesh, rules)
    check_divisible(boxed, self.param_shardings)
    self.abstract_params = abstract_tree(nn.unbox(boxed), self.param_shardings)
    self.batch_sharding = batch_sharding(mesh, rules)
    self.batch_shards = num_batch_shards(dict(mesh.shape), rules)
    self.data_shard = data_shard(self.batch_sharding)

  @classmethod
  def data_parallel(cls, model_config: TransformerConfig, devices=None) -> "Placement":
    """The model replicated on every one of `devices` (default: all), the batch split over them
    (rules `dp`)."""
    return cls(model_config, make_mesh({"data": -1}, devices), logical_rules("dp"))

  def boxed_params(self, key):
    """Freshly initialized parameters from `key`, boxed with their logical axis names."""
    dummy = jnp.ones((1, 1), jnp.int32)
    return self.model.init({"params": key}, dummy, dummy)["params"]

  def run(self, fn, *args):
    """`fn(*args)` inside the mesh and the logical-axis rules, so the model's constraints apply."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return fn(*args)

  def global_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict:
    """This process's numpy rows (the `BATCH_KEYS` of a batch) -> the sharded global batch."""
    return global_batch({k: local_batch[k] for k in BATCH_KEYS}, self.batch_sharding)
