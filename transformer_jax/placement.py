"""A model placed on a mesh (`Placement`); the Transformer's attention resolved for the mesh's
platform."""

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from transformer_jax.errors import FieldError, first_line
from transformer_jax.model.attention import implementation_problem, resolve_implementation
from transformer_jax.model.spec import ModelSpec
from transformer_jax.model.transformer import TransformerConfig, transformer_spec
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

log = logging.getLogger(__name__)

COMPILE_AHEAD = ("accelerators", "always", "never")  # When programs are compiled ahead.


def host_cores() -> int:
  """The CPU cores this process may run on (its affinity, where the system says)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def compiled_ahead_line(what: str, compiled: Sequence[tuple], wall: float, threads: int) -> str:
  """The log line of programs compiled ahead: `what` (e.g. "the beam4") and, of `compiled`'s
  `(name, seconds)`, how long they took, each and in all (`wall` seconds on `threads` threads)."""
  seconds = [t for _, t in compiled]
  return (
    f"{what} for each of {len(compiled)} batch shapes took {min(seconds):.1f}-"
    f"{max(seconds):.1f} s to compile after lowering (or to load, from a cache of compiled "
    f"programs), {wall:.1f} s in all on {threads} threads: {', '.join(str(n) for n, _ in compiled)}"
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
  """A model placed on a mesh: the model, its shardings and the context to run it in.

  `model` is a `ModelSpec` (`model.spec`), or a `TransformerConfig`, which
  stands for the Transformer (`transformer_spec`) with its attention
  implementation resolved for the platform of the mesh's devices
  (`for_platform`), not the process's default backend. `spec` is the
  `ModelSpec` and `model` its Flax module (the Linen `Transformer`, which the
  searches and the translator run). `param_shardings` and `abstract_params`
  (ShapeDtypeStructs with their shardings) follow the parameters' logical
  axis names through `rules`; batches are dicts of `[batch, length]` arrays
  (the spec's `batch_keys`) along the mesh axes of `batch` (`batch_sharding`,
  split into `batch_shards` pieces, of which this process reads block
  `data_shard`). Raises FieldError naming a parameter whose dimension does
  not split evenly. The trainer, the translator and the evaluation modes all
  hold one.
  """

  def __init__(self, model: ModelSpec | TransformerConfig, mesh: Mesh, rules: Rules):
    if isinstance(model, TransformerConfig):
      model = transformer_spec(for_platform(model, mesh.devices.flat[0].platform))
    self.spec, self.model = model, model.module
    self.mesh, self.rules = mesh, rules
    boxed = jax.eval_shape(self.boxed_params, jax.random.key(0))
    self.param_shardings = tree_shardings(boxed, mesh, rules)
    check_divisible(boxed, self.param_shardings)
    self.abstract_params = abstract_tree(nn.unbox(boxed), self.param_shardings)
    self.batch_sharding = batch_sharding(mesh, rules)
    self.batch_shards = num_batch_shards(dict(mesh.shape), rules)
    self.data_shard = data_shard(self.batch_sharding)

  @classmethod
  def data_parallel(cls, model: ModelSpec | TransformerConfig, devices=None) -> "Placement":
    """The model replicated on every one of `devices` (default: all), the batch split over them
    (rules `dp`)."""
    return cls(model, make_mesh({"data": -1}, devices), logical_rules("dp"))

  def boxed_params(self, key):
    """Freshly initialized parameters from `key`, boxed with their logical axis names."""
    return self.spec.init(key)

  def run(self, fn, *args):
    """`fn(*args)` inside the mesh and the logical-axis rules, so the model's constraints apply."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      return fn(*args)

  def should_compile_ahead(self, when: str) -> bool:
    """Whether `when`, a `COMPILE_AHEAD` choice, compiles programs ahead on this mesh: always,
    never, or on GPUs and TPUs only ('accelerators'), whose hosts' cores are idle meanwhile."""
    platform = self.mesh.devices.flat[0].platform
    return when == "always" or (when == "accelerators" and platform != "cpu")

  def compile_ahead(self, lowerings: Sequence[Callable], threads: int) -> list[tuple[Any, float]]:
    """Lower the programs of `lowerings` (functions returning a `jax.stages.Lowered`) one by one
    in this thread, inside the mesh and rules (so that every context of the caller applies, such
    as a matmul precision), each compiled as soon as it is lowered on a pool of up to `threads`
    threads (XLA compiles without Python's lock): `(jax.stages.Compiled, seconds its compile
    took)` of each, None for a program whose compile failed. A lowering that raises ends the
    lowering: that program and those after it get None. Failures are logged, never raised: only
    time is at stake, as a program left out compiles at its first call. Call the compiled
    programs themselves (without the static arguments): a call of the jitted function may
    compile again."""

    def compile_one(lowered):
      start = time.perf_counter()
      try:
        return lowered.compile(), time.perf_counter() - start
      except Exception as error:  # Only time is at stake.
        log.warning(
          "compiling a program ahead failed (%s): its first call compiles it", first_line(error)
        )
        return None, time.perf_counter() - start

    pool = ThreadPoolExecutor(max(1, min(threads, len(lowerings))))
    compiling = []
    try:  # Each compile starts as soon as its program is lowered, while the next one lowers.
      for lower in lowerings:
        try:
          lowered = self.run(lower)
        except Exception as error:  # Only time is at stake.
          log.warning(
            "lowering a program to compile ahead failed (%s): it and the %d after it compile at "
            "their first calls",
            first_line(error),
            len(lowerings) - len(compiling) - 1,
          )
          break
        compiling.append(pool.submit(compile_one, lowered))
      done = [future.result() for future in compiling]
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
    return done + [(None, 0.0)] * (len(lowerings) - len(done))

  def abstract_batch(self, rows: int, length: int) -> dict:
    """A global `[rows, length]` batch of abstract int32 arrays (the spec's `batch_keys`) with the
    batch sharding: what `global_batch` makes of such rows, to lower a program for it."""
    return {
      k: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=self.batch_sharding)
      for k in self.spec.batch_keys
    }

  def global_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict:
    """This process's numpy rows (the spec's `batch_keys` of a batch) -> the sharded global
    batch."""
    return global_batch({k: local_batch[k] for k in self.spec.batch_keys}, self.batch_sharding)
