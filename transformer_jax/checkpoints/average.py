"""The float32 mean of several checkpoints' parameters, computed on sharded arrays."""

import logging

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from transformer_jax.checkpoints import store

log = logging.getLogger(__name__)

_accumulate = jax.jit(
  lambda total, params: jax.tree.map(lambda t, p: t + p.astype(jnp.float32), total, params),
  donate_argnums=0,
)
_divide = jax.jit(lambda total, n: jax.tree.map(lambda t: t / n, total), donate_argnums=0)


def average_params(
  manager: ocp.CheckpointManager,
  steps,
  abstract_params,
  *,
  count: int | None = None,
  hint: str = "",
):
  """`(mean, used)`: the float32 mean of the parameters of the newest `count` (default: all) of
  checkpoints `steps` that read back intact, parameter by parameter, and the steps used.

  Each checkpoint is checked against its fingerprint (`store.restore_params`);
  one that fails is skipped with a warning naming it, and CorruptCheckpointError
  is raised when none is left; CheckpointMismatchError (ending with `hint`)
  when one holds other parameters than `abstract_params`. Checkpoints are
  restored one at a time onto the shardings of `abstract_params` and added to
  a running sum that stays on the devices, so a process never holds more than
  its shards of two copies of the model.
  """
  as_float32 = jax.tree.map(
    lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=a.sharding), abstract_params
  )
  total, used = None, []
  for step in sorted(steps, reverse=True):
    if len(used) == count:
      break
    try:
      params = store.restore_params(manager, as_float32, step=step, hint=hint)
    except store.CorruptCheckpointError as error:
      log.warning("not averaging checkpoint %s: %s", manager.directory / str(step), error)
      continue
    total = params if total is None else _accumulate(total, params)
    used.append(step)
  if not used:
    raise store.CorruptCheckpointError(
      f"none of the checkpoints {', '.join(map(str, sorted(steps)))} in {manager.directory} "
      "reads back intact (see the warnings above): nothing to average"
    )
  return _divide(total, float(len(used))), sorted(used)
