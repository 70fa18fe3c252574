"""Helpers of the fault-injection tests: tiny runs of `transformer_jax.main` in subprocesses.

Every run is the default experiment shrunk to a 2+2-layer d_model-32 model on
the tiny embedded corpus, on one CPU device. The corpus, the vocabulary and a
JAX compilation cache are shared by all runs of a test session (`shared_dir`),
so a run starts in seconds. Losses are read back from the TensorBoard event
files a run writes at every log step.
"""

import glob
import os
import pathlib
import re
import struct
import subprocess
import sys
import threading
import time

import orbax.checkpoint as ocp
from tensorboardX.proto import event_pb2

from transformer_jax import data

REPO = pathlib.Path(__file__).resolve().parents[1]


def shared_dir(tmp_path_factory) -> pathlib.Path:
  """The session's shared corpus, vocabulary and compilation cache, prepared on first use."""
  shared = tmp_path_factory.getbasetemp() / "faults_shared"
  if not (shared / "vocab.model").exists():
    c = data.default_config()
    c.name, c.data_dir, c.vocab_size = "embedded_tiny", str(shared / "tfds"), 200
    c.vocab_path = str(shared / "vocab.model")
    data.get_tokenizer(c, str(shared))
  return shared


def flags(shared: pathlib.Path, **overrides) -> list[str]:
  """Command-line flags of a tiny run; `overrides` set `--config.<name>=<value>` (`__` for `.`)."""
  config = {
      "data.name": "embedded_tiny", "data.data_dir": shared / "tfds",
      "data.vocab_path": shared / "vocab.model", "data.vocab_size": 200,
      "data.batch_mode": "packed", "data.batch_size": 8, "data.max_length": 64,
      "data.max_source_length": 64, "data.max_target_length": 64,
      "model.num_layers": 2, "model.d_model": 32, "model.d_ff": 64,
      "warmup_steps": 10, "log_every_steps": 1, "peak_flops_per_device": 1e9,
      "eval_every_steps": 0, "checkpoint_every_steps": 2, "keep_checkpoints": 3,
  }
  config.update({k.replace("__", "."): v for k, v in overrides.items()})
  return ["--config=experiments/default.py", *(f"--config.{k}={v}" for k, v in config.items())]


def environment(shared: pathlib.Path) -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
              PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
              JAX_COMPILATION_CACHE_DIR=str(shared / "jax_cache"),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


class Run:
  """One `python -m transformer_jax.main` process; its output is collected by a thread."""

  def __init__(self, shared, workdir, *extra_flags, preexec_fn=None, **overrides):
    self.process = subprocess.Popen(
        [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}",
         *flags(shared, **overrides), *extra_flags],
        cwd=REPO, env=environment(shared), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=preexec_fn)
    self.lines = []
    self._changed = threading.Condition()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.process.stdout:
      with self._changed:
        self.lines.append(line)
        self._changed.notify_all()
    with self._changed:
      self._changed.notify_all()

  @property
  def output(self) -> str:
    return "".join(self.lines)

  def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
    """The first match of `pattern` in a line of output, waiting for it."""
    deadline = time.monotonic() + timeout
    seen = 0
    with self._changed:
      while True:
        for line in self.lines[seen:]:
          if match := re.search(pattern, line):
            return match
        seen = len(self.lines)
        if not self._reader.is_alive() or time.monotonic() > deadline:
          raise AssertionError(f"no line matches {pattern!r}; output:\n{self.output[-4000:]}")
        self._changed.wait(timeout=1)

  def finish(self, timeout: float = 300) -> int:
    """Wait for the process to end; returns its exit status."""
    self.process.wait(timeout=timeout)
    self._reader.join(timeout=30)
    return self.process.returncode

  def succeed(self, timeout: float = 300) -> str:
    assert self.finish(timeout) == 0, self.output[-4000:]
    return self.output


def logged_steps(output: str) -> list[int]:
  """The steps a run's output reports as done (its log lines `step k/N | loss ...`)."""
  return [int(m) for m in re.findall(r"\] step (\d+)/\d+ \| loss", output)]


def scalars_per_run(workdir, tag: str = "train/loss") -> list[dict]:
  """[{step: value}] of one TensorBoard scalar, one dict per event file (per run), oldest first.

  A record cut short by a killed process ends its file's reading.
  """
  runs = []
  for path in sorted(glob.glob(f"{workdir}/tensorboard/events.out.tfevents.*")):
    values = {}
    with open(path, "rb") as f:
      while len(header := f.read(12)) == 12:  # uint64 length, uint32 length CRC
        length = struct.unpack("<Q", header[:8])[0]
        record = f.read(length)
        if len(record) < length or len(f.read(4)) < 4:  # data CRC
          break
        event = event_pb2.Event.FromString(record)
        values.update({event.step: v.simple_value for v in event.summary.value if v.tag == tag})
    runs.append(values)
  return runs


def committed_steps(workdir) -> list[int]:
  """The step directories of `workdir/checkpoints` (committed checkpoints), sorted."""
  return sorted(int(name) for name in _names(workdir) if name.isdigit())


def partial_writes(workdir) -> list[str]:
  """The interrupted (uncommitted) checkpoint writes in `workdir/checkpoints`."""
  return sorted(name for name in _names(workdir) if ".orbax-checkpoint-tmp" in name)


def _names(workdir) -> list[str]:
  directory = pathlib.Path(workdir) / "checkpoints"
  try:
    return os.listdir(directory)
  except FileNotFoundError:
    return []


def restore_state(workdir, step: int) -> dict:
  """The train state saved at `step`, as numpy arrays in nested dicts."""
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.join(workdir, "checkpoints", str(step), "state"))


def leaves(tree) -> list:
  """The leaves of nested dicts/lists in a fixed order."""
  if isinstance(tree, dict):
    return [leaf for key in sorted(tree) for leaf in leaves(tree[key])]
  if isinstance(tree, (list, tuple)):
    return [leaf for item in tree for leaf in leaves(item)]
  return [tree]
