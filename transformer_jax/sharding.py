"""Device mesh, logical-axis rules and shardings (a model placed on a mesh: placement.py).

The mesh has three axes, `('data', 'fsdp', 'tensor')`. Parameters and
activations carry logical axis names (`batch, length, embed, heads, kv, mlp,
vocab`, see `transformer_jax.model.layers` and `.embedding`); a table of rules maps them to mesh
axes, so data parallelism, FSDP and tensor parallelism are a choice of rules
and mesh shape, not code. Rules are tried in order and a mesh axis is used at
most once per array (Flax's priority semantics), which is how `embed` is
sharded along `fsdp` in parameters but stays whole in activations, whose
`batch` dimension already takes `fsdp`.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from transformer_jax import schema
from transformer_jax.errors import FieldError

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXES = ("batch", "length", "embed", "heads", "kv", "mlp", "vocab", "layers")

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Named rule tables. Whatever the mesh shape, each one is correct: a mesh axis
# of size 1 shards nothing.
RULE_PRESETS: dict[str, Rules] = {
  # Data parallel: the batch is split over every device, parameters and
  # optimizer state are replicated.
  "dp": (("batch", MESH_AXES),),
  # Fully sharded data parallel (ZeRO-3): the batch is split over every
  # device and parameters/optimizer state along `embed` over `fsdp`; XLA
  # gathers each weight where it is used.
  "fsdp": (("batch", MESH_AXES), ("embed", "fsdp")),
  # Tensor (Megatron-style) parallel over `tensor`: attention heads, the
  # feed-forward inner dimension and the vocabulary are split; the batch goes
  # over `data` and `fsdp`, and parameters along `embed` over `fsdp`.
  "tp": (
    ("batch", ("data", "fsdp")),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
  ),
}


def _axes(entry) -> tuple[str, ...]:
  """Mesh axes of one PartitionSpec entry."""
  return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def _axis_size(default: int, help_: str):
  return schema.setting(default, help_, ge=1, also=(-1,), means={-1: "the rest of the devices"})


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the mesh axes (`config.mesh`), at most one of them -1: the devices left."""

  data: int = _axis_size(-1, "data-parallel axis: the batch is split over it")
  fsdp: int = _axis_size(1, "the batch and, with rules fsdp or tp, the parameters along embed")
  tensor: int = _axis_size(1, "tensor-parallel axis: heads, feed-forward and vocabulary (tp)")

  def __post_init__(self):
    schema.check(self, "mesh")
    if list(self.shape.values()).count(-1) > 1:
      raise FieldError("mesh", "", ": at most one axis may be -1 (the rest of the devices)")

  @property
  def shape(self) -> dict[str, int]:
    """`{axis: size}`, as `make_mesh` takes it."""
    return dataclasses.asdict(self)


def resolve_mesh_shape(shape: Mapping[str, int], num_devices: int) -> tuple[int, int, int]:
  """Sizes of `('data', 'fsdp', 'tensor')` from a mapping where one size may be -1 (the rest).

  Raises FieldError (owner `mesh`) when the sizes cannot cover exactly
  `num_devices` devices.
  """
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise FieldError(
      "mesh", "", f" has unknown axes {sorted(unknown)}; allowed: {', '.join(MESH_AXES)}"
    )
  sizes = list(MeshConfig(**{axis: shape.get(axis, 1) for axis in MESH_AXES}).shape.values())
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise FieldError(
        "mesh",
        "",
        f"={dict(zip(MESH_AXES, sizes))}: the fixed axes use {known} "
        f"devices, which does not divide the {num_devices} devices present",
      )
    sizes[sizes.index(-1)] = num_devices // known
  elif known != num_devices:
    raise FieldError(
      "mesh",
      "",
      f"={dict(zip(MESH_AXES, sizes))} needs {known} devices but "
      f"{num_devices} are present; set one axis to -1 to take the rest",
    )
  return tuple(sizes)


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `('data', 'fsdp', 'tensor')` mesh over `devices` (default: all, every process).

  Axes are Auto (sharding follows the logical constraints inside the model).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = resolve_mesh_shape(shape, len(devices))
  return jax.make_mesh(
    sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
  )


def logical_rules(spec: str) -> Rules:
  """A rule table from a preset name (`dp`, `fsdp`, `tp`) or an explicit spec string.

  The explicit form lists `logical=mesh_axes` pairs in priority order,
  separated by commas, with `+` joining several mesh axes and nothing after
  `=` for "not sharded": `batch=data+fsdp,heads=tensor,mlp=tensor,embed=fsdp`.
  Raises FieldError (owner `sharding_rules`) for anything else.
  """
  if spec in RULE_PRESETS:
    return RULE_PRESETS[spec]
  allowed = (
    f"allowed: a preset ({', '.join(RULE_PRESETS)}) or pairs like "
    "'batch=data+fsdp,heads=tensor,embed=fsdp'"
  )
  if not isinstance(spec, str) or "=" not in spec:
    raise FieldError("sharding_rules", "", f"={spec!r} is not understood; {allowed}")
  table = []
  for pair in spec.split(","):
    logical, _, mesh_axes = (part.strip() for part in pair.partition("="))
    if logical not in LOGICAL_AXES:
      raise FieldError(
        "sharding_rules",
        "",
        f": unknown logical axis {logical!r}; logical axes: {', '.join(LOGICAL_AXES)}",
      )
    names = tuple(a.strip() for a in mesh_axes.split("+") if a.strip())
    for name in names:
      if name not in MESH_AXES:
        raise FieldError(
          "sharding_rules",
          "",
          f": unknown mesh axis {name!r} for {logical!r}; mesh axes: {', '.join(MESH_AXES)}",
        )
    table.append((logical, names[0] if len(names) == 1 else (names or None)))
  return tuple(table)


def tree_shardings(abstract_tree, mesh: Mesh, rules: Rules):
  """NamedShardings for a tree whose leaves may be boxed with logical axis names.

  `abstract_tree` is typically `jax.eval_shape` of an init function that
  returns `nn.LogicallyPartitioned` parameters; unboxed leaves are replicated.
  The result has the structure of the unboxed tree.
  """
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def nnx_shardings(model_or_state, mesh: Mesh, rules: Rules):
  """NamedShardings for an NNX module's state (or the state itself) whose variables carry logical
  axis names as `out_sharding` metadata, as model/nnx_layers.py's do; the structure of
  `nnx.state(model)`. Names without a rule are not sharded."""
  state = model_or_state
  if isinstance(state, nnx.Module):
    state = nnx.state(state)
  with nn.logical_axis_rules(()):  # Logical names, not what rules in force would make of them.
    specs = nnx.get_partition_spec(state)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(abstract_tree, shardings) -> None:
  """FieldError (owner `sharding_rules`) if a sharded dimension is not a multiple of its number
  of shards."""
  leaves = jax.tree_util.tree_leaves_with_path(nn.unbox(abstract_tree))
  for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings)):
    for dim, (size, entry) in enumerate(zip(leaf.shape, sharding.spec)):
      axes = _axes(entry)
      shards = math.prod(sharding.mesh.shape[a] for a in axes)
      if size % shards:
        raise FieldError(
          "sharding_rules",
          "",
          f": {jax.tree_util.keystr(path)} has shape {leaf.shape}: "
          f"dimension {dim} ({size}) cannot be split over mesh axes {axes} ({shards} shards); "
          "change the model size, the mesh shape or the sharding rules",
        )


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  """Sharding of a `[batch, length]` array: batch along the mesh axes of `batch`."""
  spec = nn.logical_to_mesh_axes(("batch", "length"), rules)
  return NamedSharding(mesh, PartitionSpec(*spec))


def num_batch_shards(mesh_shape: Mapping[str, int], rules: Rules) -> int:
  """How many pieces the batch dimension is split into on a mesh of sizes `mesh_shape`."""
  return math.prod(mesh_shape[a] for a in _axes(nn.logical_to_mesh_axes(("batch",), rules)[0]))


def data_shard(sharding: NamedSharding) -> tuple[int, int]:
  """`(index, count)`: this process reads block `index` of `count` equal blocks of every batch's
  rows.

  Each process's devices hold some of the batch's shards under `sharding`;
  the processes that hold the same shards (replicas along a mesh axis the
  batch is not split over) form a group, and the groups, ordered by their
  first shard, are the blocks. The shards of a group need not be adjacent (a
  slice's hosts are not, in a mesh laid out along the chips' torus):
  `global_batch` puts the block's rows onto them in order, so a batch's rows
  are permuted, never lost or doubled. One process: `(0, 1)`.
  """
  shards = math.prod(sharding.mesh.shape[a] for a in _axes(sharding.spec[0]))
  held: dict[int, set[int]] = {}
  for device, index in sharding.devices_indices_map((shards, 1)).items():
    held.setdefault(device.process_index, set()).update(range(*index[0].indices(shards)))
  groups = sorted({frozenset(rows) for rows in held.values()}, key=min)
  sizes = {len(group) for group in groups}
  if len(sizes) != 1 or sum(map(len, groups)) != shards:
    raise ValueError(
      f"the processes hold overlapping or unequal parts of the {shards} batch "
      f"shards: {[sorted(group) for group in groups]}"
    )
  return groups.index(frozenset(held[jax.process_index()])), len(groups)


def abstract_tree(tree, shardings):
  """`jax.ShapeDtypeStruct` leaves of `tree` (arrays or abstract leaves) with `shardings`: what
  a checkpoint is restored onto."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def global_batch(local_batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict:
  """Global `jax.Array`s from this process's rows of every `[local_batch, length]` array.

  Each process passes the block of rows that `data_shard` names; with one
  process this is a sharded `device_put`.
  """
  return {
    key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
    for key, value in local_batch.items()
  }
