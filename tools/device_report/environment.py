"""Stage a, environment: the devices as JAX sees them, the driver, CUDA and cuDNN, the versions of
what the project runs on and the XLA flags."""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import jax
from jax.extend import backend as jax_backend

DISTRIBUTIONS = (
  "jax",
  "jaxlib",
  "jax-cuda13-plugin",
  "jax-cuda13-pjrt",
  "jax-cuda12-plugin",
  "jax-cuda12-pjrt",
  "libtpu",
  "nvidia-cudnn-cu13",
  "nvidia-cudnn-cu12",
  "nvidia-cublas",
  "nvidia-cublas-cu12",
  "flax",
  "optax",
  "orbax-checkpoint",
  "grain",
  "tensorflow-datasets",
  "array-record",
  "ml-collections",
  "numpy",
  "sentencepiece",
  "sacrebleu",
  "pytest",
  "torch",
)


def versions() -> dict:
  """Installed version of each of DISTRIBUTIONS (None: not installed)."""
  found = {}
  for name in DISTRIBUTIONS:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def nvidia_smi() -> dict | None:
  """Name, driver and memory of each GPU as nvidia-smi reports them (None: no nvidia-smi)."""
  if shutil.which("nvidia-smi") is None:
    return None
  fields = "name,driver_version,memory.total,clocks.max.sm,power.limit"
  try:
    result = subprocess.run(
      ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
      capture_output=True,
      text=True,
      check=False,
      timeout=30,
    )
  except subprocess.TimeoutExpired:
    return {"gpus": [], "error": "nvidia-smi did not answer in 30 s"}
  rows = [
    dict(zip(fields.split(","), (v.strip() for v in line.split(","))))
    for line in result.stdout.strip().splitlines()
  ]
  return {"gpus": rows, "error": result.stderr.strip()[-500:] or None}


def run(plan, step, result, context) -> None:
  del plan, step, context
  devices = jax.local_devices()
  first = devices[0]
  stats = first.memory_stats() or {}
  backend = jax_backend.get_backend()
  result.put(
    backend=jax.default_backend(),
    device_kind=first.device_kind,
    device_count=len(devices),
    global_device_count=jax.device_count(),
    process_count=jax.process_count(),
    memory_bytes_limit=stats.get("bytes_limit"),
    platform_version=getattr(backend, "platform_version", None),
    python=sys.version.split()[0],
    versions=versions(),
    xla_flags=os.environ.get("XLA_FLAGS", ""),
    jax_environment={
      k: v
      for k, v in os.environ.items()
      if k.startswith(("JAX_", "XLA_", "TF_CPP", "CUDA_", "NVIDIA_"))
    },
    nvidia_smi=nvidia_smi(),
  )
  result.put(environment_info=jax.print_environment_info(return_string=True))
