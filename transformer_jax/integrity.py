"""Content fingerprints, saved with every checkpoint and checked when it is restored.

Orbax reads a checkpoint whose array bytes were altered on disk without
complaint (compressed chunks decode to other values); these fingerprints turn
that into an error. `tree_fingerprint` is computed on the devices and does not
depend on the sharding, so a checkpoint verifies on any mesh.
"""

import hashlib
import json

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

_UINTS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _leaf_sum(leaf, salt: int):
  """Sum over the elements of `bits * odd weight`, mod 2**32: any single changed bit changes it."""
  leaf = jnp.asarray(leaf)
  if leaf.dtype == jnp.bool_:
    bits = leaf.astype(jnp.uint32)
  else:
    bits = jax.lax.bitcast_convert_type(leaf, _UINTS[leaf.dtype.itemsize]).astype(jnp.uint32)
  index = jax.lax.iota(jnp.uint32, bits.size).reshape(bits.shape)
  weight = (index + jnp.uint32(salt)) * jnp.uint32(2654435761) * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(bits * weight, dtype=jnp.uint32)


@jax.jit
def _tree_fingerprint(tree):
  total = jnp.uint32(0)
  for salt, leaf in enumerate(jax.tree.leaves(tree)):
    total = total * jnp.uint32(1_000_003) + _leaf_sum(leaf, salt)
  return total


def tree_fingerprint(tree) -> int:
  """A 32-bit checksum of every bit of every array leaf of `tree` (jax or numpy arrays), in leaf order.

  Integer arithmetic mod 2**32, so the result is exact whatever the sharding
  or reduction order. Leaves of 1, 2 or 4 bytes per element.
  """
  return int(jax.device_get(_tree_fingerprint(tree)))


def iterator_fingerprints(iterator) -> list[str]:
  """The sha256 of each process's data-iterator position (`iterator.get_state()`), in process order.

  Every process calls this at the same time (it gathers across processes).
  """
  text = json.dumps(iterator.get_state(), sort_keys=True, default=repr)
  digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1, digest.size)
  return [bytes(row).hex() for row in gathered]
