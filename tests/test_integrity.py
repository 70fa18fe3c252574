"""Checkpoint fingerprints (`checkpoints.integrity.tree_fingerprint`): the same numbers as a numpy
formula of their definition, as the checkpoints already on disk hold, and on any sharding."""

import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformer_jax import sharding
from transformer_jax.checkpoints import integrity


def _tree():
  rng = np.random.default_rng(7)
  return {
    "params": {
      "w": rng.normal(size=(5, 3)).astype(np.float32),
      "b": jnp.asarray(rng.normal(size=(3,)), jnp.bfloat16),
    },
    "opt_state": [
      {"count": np.int32(42)},
      {"mu": {"w": rng.normal(size=(5, 3)).astype(np.float32)}},
    ],
    "flags": np.array([True, False, True]),
    "bytes": np.arange(7, dtype=np.uint8),
    "step": np.array(900, np.int32),
  }


def _numpy_fingerprint(tree) -> int:
  """The definition, in Python integers: per leaf (named by its path), the sum over elements of
  their bits times an odd weight made from the element's index and the name's CRC-32, mod 2**32;
  then the leaves' sums added, mod 2**32."""
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    leaf = np.asarray(leaf)
    if leaf.dtype == np.bool_:
      bits = leaf.astype(np.uint64).ravel()
    else:
      unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[leaf.dtype.itemsize]
      bits = leaf.view(unsigned).astype(np.uint64).ravel()
    salt = zlib.crc32(integrity.leaf_name(path).encode())
    for index, value in enumerate(bits.tolist()):
      weight = ((index * 2654435761) % 2**32 ^ salt) | 1
      total += value * weight
  return total % 2**32


def test_the_fingerprint_is_its_definition():
  tree = _tree()
  assert integrity.tree_fingerprint(tree) == _numpy_fingerprint(tree)
  params = {"params": tree["params"]}
  assert integrity.tree_fingerprint(params) == _numpy_fingerprint(params)
  assert tree["params"]["b"].dtype == ml_dtypes.bfloat16  # A 2-byte leaf among the 4- and 1-byte.


def test_the_fingerprints_are_those_saved_checkpoints_hold():
  """Computed by the whole-tree program of the checkpoints written before 2026-11-28; a change
  here makes every checkpoint on disk fail its check."""
  tree = _tree()
  assert integrity.tree_fingerprint(tree) == 4280608346
  assert integrity.tree_fingerprint({"params": tree["params"]}) == 2886122916


def test_one_changed_bit_changes_it_and_the_sharding_does_not():
  tree = {"a": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones((8, 16), np.float32)}
  base = integrity.tree_fingerprint(tree)
  flipped = tree["a"].copy()
  flipped.view(np.uint32)[3, 5] ^= 1 << 17
  assert integrity.tree_fingerprint({**tree, "a": flipped}) != base
  assert integrity.tree_fingerprint({"a": tree["b"], "b": tree["a"]}) != base  # Names count.
  mesh = sharding.make_mesh({"data": len(jax.devices())}, jax.devices())
  rows = NamedSharding(mesh, PartitionSpec("data"))
  columns = NamedSharding(mesh, PartitionSpec(None, "data"))
  sharded = {"a": jax.device_put(tree["a"], rows), "b": jax.device_put(tree["b"], columns)}
  assert integrity.tree_fingerprint(sharded) == base
