"""Compile targets: TPU slices and NVIDIA GPU machines as named by users, their chips, and the
compile-only devices that XLA's own compiler for each gives on a machine without them.

A TPU target is a Cloud TPU name (`v5e-8`, `v5p-128`, `v4-32`, `v6e-256`) or a
raw topology (`v5e:2x4`); it needs XLA's TPU compiler (`libtpu`, the `tpu`
extra). A GPU target is `<count>x<gpu>` (`1xh100`, `8xh100`, `16xh100` = 2
hosts of 8); it needs the jax CUDA plugin (the `cuda` extra) and a target
description of the GPU, shipped in `gpu_specs/`. Either compiles under the
CPU backend: no accelerator is touched.
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
import re

import jax
from jax.experimental import topologies

from transformer_jax.errors import UserError

GIB = 2**30
MIB = 2**20


class TargetError(UserError, ValueError):
  """A target name that is unknown, or whose compiler is not installed."""


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip: memory, dense bf16 peak and memory bandwidth, with their source.

  `usable_fraction` is the share of the memory a JAX program gets by default
  (GPU: JAX preallocates 75% of it, XLA_PYTHON_CLIENT_MEM_FRACTION).
  """

  name: str
  platform: str  # "tpu" or "gpu"
  memory_bytes: int
  peak_flops: float  # dense bfloat16 FLOP/s
  memory_bandwidth: float  # bytes/s
  source: str
  usable_fraction: float = 1.0

  @property
  def usable_bytes(self) -> int:
    return int(self.memory_bytes * self.usable_fraction)


CHIPS = {
  # cloud.google.com/tpu/docs/v4: 32 GiB HBM2, 1200 GB/s, 275 TFLOP/s bf16 per chip.
  "v4": Chip("TPU v4", "tpu", 32 * GIB, 275e12, 1200e9, "cloud.google.com/tpu/docs/v4"),
  # cloud.google.com/tpu/docs/v5e: 16 GiB HBM2, 819 GB/s, 197 TFLOP/s bf16 per chip.
  "v5e": Chip("TPU v5e", "tpu", 16 * GIB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e"),
  # cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e, 2765 GB/s, 459 TFLOP/s bf16 per chip.
  "v5p": Chip("TPU v5p", "tpu", 95 * GIB, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p"),
  # cloud.google.com/tpu/docs/v6e: 32 GiB HBM, 1640 GB/s, 918 TFLOP/s bf16 per chip.
  "v6e": Chip("TPU v6e", "tpu", 32 * GIB, 918e12, 1640e9, "cloud.google.com/tpu/docs/v6e"),
  # NVIDIA H100 datasheet (SXM5): 989 TFLOP/s dense bf16, 3.35 TB/s; 81559 MiB as the driver
  # reports an H100 80GB HBM3.
  "h100": Chip(
    "NVIDIA H100 SXM 80GB",
    "gpu",
    81559 * MIB,
    989e12,
    3.35e12,
    "NVIDIA H100 Tensor Core GPU datasheet",
    usable_fraction=0.75,
  ),
  # NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s dense bf16, 2039 GB/s.
  "a100": Chip(
    "NVIDIA A100 SXM 80GB",
    "gpu",
    80 * GIB,
    312e12,
    2.039e12,
    "NVIDIA A100 Tensor Core GPU datasheet",
    usable_fraction=0.75,
  ),
  # NVIDIA H200 datasheet (SXM): 989 TFLOP/s dense bf16, 4.8 TB/s; 143771 MiB as the driver
  # reports it.
  "h200": Chip(
    "NVIDIA H200 SXM 141GB",
    "gpu",
    143771 * MIB,
    989e12,
    4.8e12,
    "NVIDIA H200 Tensor Core GPU datasheet",
    usable_fraction=0.75,
  ),
}
GPU_SPECS = {
  "h100": "h100_sxm_80gb.txtpb",
  "a100": "a100_sxm_80gb.txtpb",
  "h200": "h200_sxm_141gb.txtpb",
}
GPUS_PER_HOST = 8
# Cloud TPU names count TensorCores for v4 and v5p (two per chip) and chips for v5e and v6e.
_CORES_PER_NAME_UNIT = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
# v4 runs as one device per chip (megacore) under JAX; its compile-only topology must be told.
_TOPOLOGY_OPTIONS = {"v4": {"chip_config_name": "megacore"}}
# Hosts have 4 chips (2x2x1, libtpu's default), except the single-host 8-chip v5e and v6e slices.
_SINGLE_HOST_8 = {"v5e", "v6e"}
_DIMENSIONS = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}
TPU_EXAMPLES = "v5e-8, v5e-256, v5p-8, v5p-128, v4-8, v4-32, v6e-8, or a topology such as v5e:2x4"
GPU_EXAMPLES = "1xh100, 8xh100, 16xh100, 8xa100, 8xh200"


@dataclasses.dataclass(frozen=True)
class Target:
  """A named set of chips to compile for: `topology` as XLA's compiler for `chip` takes it."""

  name: str
  chip: Chip
  generation: str  # a key of CHIPS
  topology: str
  chips: int

  @property
  def platform(self) -> str:
    return self.chip.platform

  @property
  def extra(self) -> str:
    """The package extra that installs this target's compiler."""
    return "tpu" if self.platform == "tpu" else "cuda"


# Slice topologies by chip count: 2D for v5e and v6e (at most 256 chips), 3D for v4 and v5p.
_SHAPES_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_SHAPES_3D = {
  4: "2x2x1",
  8: "2x2x2",
  16: "2x2x4",
  32: "2x4x4",
  64: "4x4x4",
  128: "4x4x8",
  256: "4x8x8",
  512: "8x8x8",
  1024: "8x8x16",
  2048: "8x16x16",
  4096: "16x16x16",
}


def parse_target(name: str) -> Target:
  """The target a user names (see the module docstring); TargetError listing the names known."""
  name = name.strip().lower() if isinstance(name, str) else ""
  if match := re.fullmatch(r"(\d+)x(h100|a100|h200)", name):
    count, gpu = int(match[1]), match[2]
    if count < 1 or (count > GPUS_PER_HOST and count % GPUS_PER_HOST):
      raise TargetError(
        f"--target={name}: {count} GPUs; a machine has 1 to {GPUS_PER_HOST}, "
        f"several hosts a multiple of {GPUS_PER_HOST}"
      )
    hosts, per_host = max(1, count // GPUS_PER_HOST), min(count, GPUS_PER_HOST)
    return Target(name, CHIPS[gpu], gpu, f"{hosts}x1x{per_host}", count)
  if match := re.fullmatch(r"(v4|v5e|v5p|v6e):(\d+(?:x\d+)+)", name):
    generation, dims = match[1], [int(d) for d in match[2].split("x")]
    if len(dims) != _DIMENSIONS[generation] or min(dims) < 1:
      raise TargetError(
        f"--target={name}: a {generation} topology has "
        f"{_DIMENSIONS[generation]} dimensions, e.g. "
        f"{generation}:{'2x4' if _DIMENSIONS[generation] == 2 else '2x2x1'}"
      )
    return Target(name, CHIPS[generation], generation, name, math.prod(dims))
  if match := re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)-(\d+)", name):
    generation = "v5e" if match[1] == "v5litepod" else match[1]
    units = int(match[2])
    per_chip = _CORES_PER_NAME_UNIT[generation]
    shapes = _SHAPES_2D if generation in ("v5e", "v6e") else _SHAPES_3D
    chips, odd = divmod(units, per_chip)
    if odd or chips not in shapes:
      unit = "TensorCores, 2 per chip" if per_chip == 2 else "chips"
      sizes = ", ".join(f"{generation}-{n * per_chip}" for n in shapes)
      raise TargetError(
        f"--target={name}: no {generation} slice of {units} {unit} is known; the slices: {sizes}"
      )
    topology = f"{generation}:{shapes[chips]}"
    return Target(name, CHIPS[generation], generation, topology, chips)
  raise TargetError(
    f"--target={name or '(empty)'} is not a target; TPUs: {TPU_EXAMPLES}; GPUs: {GPU_EXAMPLES}"
  )


# Start-up settings of the compilers, read as libtpu or a plugin loads (values already set are
# kept): libtpu asks the cloud for the worker hostnames and accelerator type and logs an error
# when there is no TPU VM, so this machine is named the only worker; the plugins log at INFO as
# they load. libtpu also takes a lock file meant for the chips, which a compile-only process has
# no use for: another process that compiles for a TPU at the same time may load it too.
_QUIET_COMPILERS = {
  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
  "TPU_WORKER_HOSTNAMES": "localhost",
  "TPU_ACCELERATOR_TYPE": "v5litepod-8",
  "TF_CPP_MIN_LOG_LEVEL": "1",
}


@contextlib.contextmanager
def _quiet_compilers():
  """Within this block, the compilers' start-up noise stays off the terminal (_QUIET_COMPILERS);
  after it, the environment is as it was, for the caller's own processes and libraries."""
  saved = {name: os.environ.get(name) for name in _QUIET_COMPILERS}
  for name, value in _QUIET_COMPILERS.items():
    os.environ.setdefault(name, value)
  try:
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


# The jax CUDA plugins, either of which compiles for a GPU target.
CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def installed(module: str) -> bool:
  """Whether `module` can be imported (for `a.b`: False also when `a` is missing)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


def _require(modules: tuple[str, ...], target: Target, what: str) -> None:
  if not any(installed(module) for module in modules):
    raise TargetError(
      f"--target={target.name} needs {what}: pip install -e '.[{target.extra}]' "
      f"(or ./.venv/bin/pip install -e '.[{target.extra}]')"
    )


def gpu_spec(generation: str) -> str:
  """The text GpuTargetConfigProto of a GPU of CHIPS, from this package's `gpu_specs/`."""
  path = os.path.join(os.path.dirname(__file__), "gpu_specs", GPU_SPECS[generation])
  with open(path, encoding="utf-8") as file:
    return file.read()


def compile_devices(target: Target) -> list:
  """The compile-only devices of `target`, one per chip, in the order the slice's processes own
  them. The process must run JAX on the CPU backend (`JAX_PLATFORMS=cpu`): TargetError
  otherwise, and when the target's compiler is missing."""
  if jax.default_backend() != "cpu":
    raise TargetError(
      f"--target={target.name}: compiling for a target runs on the CPU backend; "
      f"set JAX_PLATFORMS=cpu (this process has {jax.default_backend()})"
    )
  if target.platform == "tpu":
    _require(("libtpu",), target, "XLA's TPU compiler (libtpu)")
    options = dict(_TOPOLOGY_OPTIONS.get(target.generation, {}))
    if target.generation in _SINGLE_HOST_8 and target.chips == 8:
      options["chips_per_host_bounds"] = (2, 4, 1)
    describe = lambda: topologies.get_topology_desc(
      topology_name=target.topology, platform="tpu", **options
    )
  else:
    _require(CUDA_PLUGINS, target, "the jax CUDA plugin")
    describe = lambda: topologies.get_topology_desc(
      target.generation, "cuda", target_config=gpu_spec(target.generation), topology=target.topology
    )
  try:
    with _quiet_compilers():  # libtpu or the plugin loads here, and reads them.
      description = describe()
  except jax.errors.JaxRuntimeError as error:
    raise TargetError(
      f"--target={target.name}: the compiler takes no such topology: {str(error).splitlines()[0]}"
    ) from None
  devices = list(description.devices)
  if len(devices) != target.chips:
    raise TargetError(
      f"--target={target.name}: the compiler gave {len(devices)} devices for {target.chips} chips"
    )
  return devices


def hosts(devices) -> int:
  """How many processes (hosts) the devices of a target belong to."""
  return len({device.process_index for device in devices})
