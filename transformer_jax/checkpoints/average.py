"""The float32 mean of several checkpoints' parameters, computed on sharded arrays."""

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from transformer_jax.checkpoints import store

_accumulate = jax.jit(
    lambda total, params: jax.tree.map(lambda t, p: t + p.astype(jnp.float32), total, params),
    donate_argnums=0)
_divide = jax.jit(lambda total, n: jax.tree.map(lambda t: t / n, total), donate_argnums=0)


def average_params(manager: ocp.CheckpointManager, steps, abstract_params):
  """The float32 mean of the parameters of checkpoints `steps`, parameter by parameter.

  Checkpoints are restored one at a time onto the shardings of
  `abstract_params` and added to a running sum that stays on the devices, so
  a process never holds more than its shards of two copies of the model.
  """
  if not steps:
    raise ValueError("average_params needs at least one step")
  as_float32 = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding), abstract_params)
  total = None
  for step in steps:
    params = store.restore_params(manager, as_float32, step=step)
    total = params if total is None else _accumulate(total, params)
  return _divide(total, float(len(steps)))
