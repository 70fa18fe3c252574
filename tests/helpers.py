"""What several test modules share: a tiny model and trainer, tiny command-line runs, readers of
what a run writes (TensorBoard scalars, checkpoints), and small tree utilities.

Tiny runs are the default experiment shrunk to a 2+2-layer d_model-32 model on
the tiny embedded corpus, one CPU device per process. The corpus, the
vocabulary and a JAX compilation cache are shared by all runs of a test
session (`shared_dir`), so a run starts in seconds.
"""

import contextlib
import dataclasses
import functools
import io
import logging
import os
import pathlib
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

import numpy_reference
from transformer_jax import config as config_lib
from transformer_jax import data, sharding
from transformer_jax.checkpoints import store
from transformer_jax.conventions import BATCH_KEYS, EOS_ID
from transformer_jax.model import dropout
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.transformer import Transformer, TransformerConfig
from transformer_jax.placement import Placement
from transformer_jax.train import loop, objective
from transformer_jax.train.reporting import TrainLogger
from transformer_jax.train.step import Trainer

REPO = pathlib.Path(__file__).resolve().parents[1]

# The model and batches.


def tiny_model_config(**overrides) -> TransformerConfig:
  fields = dict(vocab_size=40, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=16)
  return TransformerConfig(**{**fields, **overrides})


def synthetic_batch(seed: int, rows: int = 8, length: int = 12, vocab: int = 40) -> dict:
  """Packed rows as the data pipeline makes them: one or two examples per row, then padding."""
  rng = np.random.default_rng(seed)
  batch = {k: np.zeros((rows, length), np.int32) for k in BATCH_KEYS}
  for row in range(rows):
    for side in ("inputs", "targets"):
      start = 0
      for segment in (1, 2)[: 1 + row % 2]:
        size = int(rng.integers(2, length // 2))
        span = slice(start, start + size)
        batch[side][row, span] = rng.integers(3, vocab, size)
        batch[side][row, start + size - 1] = 1  # EOS
        batch[f"{side}_segmentation"][row, span] = segment
        batch[f"{side}_position"][row, span] = np.arange(size)
        start += size
  return batch


# A tiny search vocabulary (pad 0, EOS 1, words 2..4), and source sentences of a 16-token one.
VOCAB = 5
SOURCES_16 = np.array(
  [
    [2, 3, 4, 5, 6, 7, 0, 0],
    [3, 3, 9, 0, 0, 0, 0, 0],
    [4, 2, 2, 2, 12, 13, 14, 15],
    [5, 6, 7, 8, 9, 10, 11, 0],
  ],
  np.int32,
)


def eos_biased_model(eos_bias=0.0, seed=0, vocab=VOCAB):
  """2+2 layers, d_model 32, with `eos_bias` added to the EOS logit at every position.

  The bias goes into the last decoder LayerNorm's offset along a direction `u`
  with `embedding @ u = one_hot(EOS)`, so only the EOS logit moves.
  """
  cfg = TransformerConfig(
    vocab_size=vocab, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=32, dropout_rate=0.0
  )
  model = Transformer(cfg)
  variables = nn.unbox(
    model.init(jax.random.key(seed), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))
  )
  params = variables["params"]
  embedding = np.asarray(params["embed"]["embedding"], np.float64)
  direction = np.linalg.pinv(embedding) @ np.eye(vocab)[EOS_ID]
  norm = params["decoder"]["layer_1"]["feed_forward_norm"]
  norm["bias"] = norm["bias"] + jnp.asarray(eos_bias * direction, jnp.float32)
  return model, variables


def make_trainer(
  mesh_shape=None, rules: str = "dp", devices=None, *, seed: int = 0, **model_overrides
) -> Trainer:
  """A Trainer of `tiny_model_config(**model_overrides)` with the paper's Adam (warmup 10), label
  smoothing 0.1; on one device unless a mesh shape is given."""
  if mesh_shape is None:
    mesh_shape, devices = {"data": 1}, jax.devices()[:1]
  config = tiny_model_config(**model_overrides)
  optimizer, _ = objective.OptimizerSettings(warmup_steps=10).make(config.d_model)
  placement = Placement(
    config, sharding.make_mesh(mesh_shape, devices), sharding.logical_rules(rules)
  )
  return Trainer(placement, optimizer, transformer_loss(0.1), seed=seed)


def _late(batch, seconds: float):
  time.sleep(seconds)
  return batch


def fit_batches(
  trainer: Trainer,
  batches: list,
  directory,
  *,
  may_save=lambda: True,
  times=None,
  stop_requested=lambda step: False,
  batch_shapes=(),
  data_delay: float = 0.0,
  **settings,
):
  """`loop.fit` from a fresh state over `batches`, checkpoints in `directory`/checkpoints; keeps
  every checkpoint, never evaluates and stops on a failed save unless `settings` say otherwise;
  `times` (a `run_times.RunTimes`) gets where the time went; `stop_requested` and `batch_shapes` as
  `fit` takes them; each batch is handed over `data_delay` seconds late, as by a slow input
  pipeline."""
  logger = TrainLogger(
    str(directory / "tensorboard"),
    total_steps=len(batches),
    start_step=0,
    learning_rate_fn=lambda step: 1e-3,
    peak_flops=1e9,
  )
  manager = store.make_manager(str(directory / "checkpoints"))
  dataset = grain.MapDataset.source(batches).to_iter_dataset()
  if data_delay:  # Slept in the loop's own `next`, as it waits for a slow pipeline.
    dataset = dataset.map(functools.partial(_late, seconds=data_delay))
  iterator = iter(dataset)
  try:
    fit_settings = loop.FitSettings(
      **{
        "num_train_steps": len(batches),
        "keep_checkpoints": 0,
        "eval_every_steps": 0,
        "on_checkpoint_save_error": "stop",
        **settings,
      }
    )
    return loop.fit(
      trainer,
      trainer.init(),
      iterator,
      fit_settings,
      logger=logger,
      manager=manager,
      may_save=may_save,
      times=times,
      stop_requested=stop_requested,
      batch_shapes=batch_shapes,
    )
  finally:
    manager.close()


def random_state(trainer: Trainer, seed: int):
  """A state with distinct random values in every float leaf and `seed` in the integer ones,
  placed as the trainer shards it."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
    lambda a: jax.device_put(
      rng.normal(size=a.shape).astype(a.dtype) if a.dtype != np.int32 else np.array(seed, np.int32),
      a.sharding,
    ),
    trainer.abstract_state,
  )


def stack_layers(params):
  """The looped model's params in the scanned layout: each stack's layer_i subtrees stacked on
  axis 0."""
  out = {}
  for name, sub in params.items():
    if isinstance(sub, dict) and "layer_0" in sub:
      layers = numpy_reference.layers(sub)
      rest = {k: v for k, v in sub.items() if not k.startswith("layer_")}
      out[name] = {
        **rest,
        "layers": {"layer": jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)},
      }
    else:
      out[name] = sub
  return out


def record_dropout_calls(fn):
  """Run fn() and return `(rate, input, output)` of every call of a Linen `Dropout` module, in
  order."""
  seen = []

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, dropout.Dropout) and context.method_name == "__call__":
      given, out64 = np.asarray(args[0], np.float64), np.asarray(out, np.float64)
      seen.append((context.module.rate, given, out64))
    return out

  with nn.intercept_methods(interceptor):
    fn()
  return seen


def record_dropout_inputs(fn):
  """Run fn() and return the arrays every `Dropout` module was applied to, in order."""
  return [given for _, given, _ in record_dropout_calls(fn)]


def leaves(tree) -> list:
  """The leaves of nested dicts/lists in a fixed order (sorted keys), as numpy arrays."""
  if isinstance(tree, dict):
    return [leaf for key in sorted(tree) for leaf in leaves(tree[key])]
  if isinstance(tree, (list, tuple)):
    return [leaf for item in tree for leaf in leaves(item)]
  return [np.asarray(tree)]


def data_config(base: data.DataConfig | None = None, **fields) -> data.DataConfig:
  """`base` (default: every default) with `fields` replaced, each named `<section>__<field>`
  (`vocab__size=200` for `data.vocab.size`); a section's fields are checked together."""
  base = base or data.DataConfig()
  sections = {}
  for key, value in fields.items():
    section, field = key.split("__")
    sections.setdefault(section, {})[field] = value
  return dataclasses.replace(
    base,
    **{name: dataclasses.replace(getattr(base, name), **new) for name, new in sections.items()},
  )


# Tiny runs of `python -m transformer_jax.main`.


def shared_dir(tmp_path_factory) -> pathlib.Path:
  """The session's shared corpus, vocabulary and compilation cache, prepared on first use."""
  shared = tmp_path_factory.getbasetemp() / "runs_shared"
  if not (shared / "vocab.model").exists():
    data.get_tokenizer(
      data_config(
        source__name="embedded_tiny",
        source__data_dir=str(shared / "tfds"),
        vocab__size=200,
        vocab__path=str(shared / "vocab.model"),
      ),
      str(shared),
    )
  return shared


def tiny_data_config(shared: pathlib.Path):
  """The `config.data` of tiny runs (without their vocabulary path)."""
  return data_config(source__name="embedded_tiny", source__data_dir=str(shared / "tfds"))


def tiny_config(shared: pathlib.Path, **overrides) -> dict:
  """`{field path: value}` of a tiny run's config overrides; `overrides` add to them (`__` for
  `.`)."""
  config = {
    "data.source.name": "embedded_tiny",
    "data.source.data_dir": shared / "tfds",
    "data.vocab.path": shared / "vocab.model",
    "data.vocab.size": 200,
    "data.batch.mode": "packed",
    "data.batch.size": 8,
    "data.batch.max_length": 64,
    "data.batch.max_source_length": 64,
    "data.batch.max_target_length": 64,
    "model.num_layers": 2,
    "model.d_model": 32,
    "model.d_ff": 64,
    "warmup_steps": 10,
    "log_every_steps": 1,
    "peak_flops_per_device": 1e9,
    "eval_every_steps": 0,
    "checkpoint_every_steps": 2,
    "keep_checkpoints": 3,
    "compilation_cache_dir": shared / "jax_cache",
  }
  config.update({k.replace("__", "."): v for k, v in overrides.items()})
  return config


def tiny_experiment(shared: pathlib.Path, **overrides):
  """The `Experiment` of a tiny run (`tiny_config`) as the command line parses it, without the
  compilation cache (this process's settings stay as they are)."""
  values = tiny_config(shared, **{"compilation_cache_dir": "", **overrides})
  config = config_lib.load_file(str(REPO / "experiments" / "default.py"))
  config.update_from_flattened_dict(
    {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in values.items()}
  )
  return config_lib.parse(config)


def flags(shared: pathlib.Path, **overrides) -> list[str]:
  """Command-line flags of a tiny run (`tiny_config`): `--config.<path>=<value>`."""
  return [
    "--config=experiments/default.py",
    *(f"--config.{k}={v}" for k, v in tiny_config(shared, **overrides).items()),
  ]


def free_port() -> int:
  """A TCP port nobody listens on, for a coordinator."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def environment(shared: pathlib.Path | None = None, devices: int = 1) -> dict:
  """The environment of a subprocess: the session's platform (on the CPU: with `devices`
  devices, and the session's other XLA flags), this repository importable, and (with `shared`)
  $JAX_COMPILATION_CACHE_DIR, the session's cache for programs that do not go through the
  command line's `config.compilation_cache_dir`."""
  env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  if env.setdefault("JAX_PLATFORMS", "cpu") == "cpu":
    count = "--xla_force_host_platform_device_count"
    env["XLA_FLAGS"] = " ".join(
      [
        f"{count}={devices}",
        *(flag for flag in env.get("XLA_FLAGS", "").split() if not flag.startswith(count)),
      ]
    )
  if shared is not None:
    env.update(
      JAX_COMPILATION_CACHE_DIR=str(shared / "jax_cache"),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
  return env


def python(
  *args,
  shared: pathlib.Path | None = None,
  devices: int = 1,
  cwd=REPO,
  timeout: float = 300,
  **kwargs,
) -> subprocess.CompletedProcess:
  """`python args...` run to its end in `environment(shared, devices)`, from the repository
  (or `cwd`); its stdout and stderr as text. `kwargs` go to `subprocess.run` (`input`)."""
  return subprocess.run(
    [sys.executable, *map(str, args)],
    cwd=cwd,
    env=environment(shared, devices),
    capture_output=True,
    text=True,
    timeout=timeout,
    **kwargs,
  )


class Run:
  """One `python -m transformer_jax.main` process with a tiny run's flags (`flags`).

  `extra_flags` come after those flags (`--mode=eval`, `--checkpoint=best`);
  `overrides` are `flags`' config overrides; `stdin` is fed to the process,
  which sees `devices` CPU devices.
  Threads collect its output: `stdout` (bytes, what the program prints) and
  `lines` (stdout and stderr lines as text, as they come).
  """

  def __init__(
    self,
    shared,
    workdir,
    *extra_flags,
    stdin: bytes | None = None,
    preexec_fn=None,
    devices: int = 1,
    **overrides,
  ):
    self.process = subprocess.Popen(
      [
        sys.executable,
        "-m",
        "transformer_jax.main",
        f"--workdir={workdir}",
        *flags(shared, **overrides),
        *extra_flags,
      ],
      cwd=REPO,
      env=environment(shared, devices),
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      preexec_fn=preexec_fn,
    )
    self.lines, self.stdout = [], b""
    self._changed = threading.Condition()
    self._readers = [
      threading.Thread(target=self._read, args=(stream, keep), daemon=True)
      for stream, keep in ((self.process.stdout, True), (self.process.stderr, False))
    ]
    for reader in self._readers:
      reader.start()
    if stdin:
      self.process.stdin.write(stdin)
    self.process.stdin.close()

  def _read(self, stream, keep: bool):
    for raw in stream:
      with self._changed:
        if keep:
          self.stdout += raw
        self.lines.append(raw.decode(errors="replace"))
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
        if not any(r.is_alive() for r in self._readers) or time.monotonic() > deadline:
          raise AssertionError(f"no line matches {pattern!r}; output:\n{self.output[-4000:]}")
        self._changed.wait(timeout=1)

  def finish(self, timeout: float = 300) -> int:
    """Wait for the process to end; returns its exit status."""
    self.process.wait(timeout=timeout)
    for reader in self._readers:
      reader.join(timeout=30)
    return self.process.returncode

  def succeed(self, timeout: float = 300) -> str:
    assert self.finish(timeout) == 0, self.output[-4000:]
    return self.output

  def fail(self, timeout: float = 300) -> str:
    """The output of a run that must end with status 1 and one `error:` line, no traceback."""
    assert self.finish(timeout) == 1, self.output[-4000:]
    errors = [line for line in self.lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in self.output, self.output[-4000:]
    return errors[0]


def logged_steps(output: str) -> list[int]:
  """The steps a run's output reports as done (its log lines `step k/N | loss ...`)."""
  return [int(m) for m in re.findall(r"\] step (\d+)/\d+ \| loss", output)]


# What a run leaves in its work directory.


def scalars_per_run(workdir, tag: str = "train/loss") -> list[dict]:
  """[{step: value}] of one TensorBoard scalar, one dict per event file (per run), oldest first.

  A record cut short by a killed process ends its file's reading.
  """
  # tensorboardX imports PyTorch where it is installed: not in the processes that import
  # helpers without reading events (those the tests start).
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel

  runs = []
  files = epath.Path(str(workdir), "tensorboard").glob("events.out.tfevents.*")
  for path in sorted(files, key=str):  # A local directory or a bucket's.
    values = {}
    for record in tfrecords_of(path.read_bytes(), name=str(path)):
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = value.simple_value
    runs.append(values)
  return runs


def tfrecords(path, masked_crc32c=None) -> list[bytes]:
  """The data of each record of a TFRecord file (`tfrecords_of` its bytes)."""
  with open(path, "rb") as f:
    return tfrecords_of(f.read(), masked_crc32c, name=str(path))


def tfrecords_of(content: bytes, masked_crc32c=None, name: str = "the file") -> list[bytes]:
  """The data of each record of TFRecord bytes; a record cut short (by a killed process) ends
  the reading. With `masked_crc32c` (a reference implementation), every record must be whole and
  both its checksums must match it."""
  out, f = [], io.BytesIO(content)
  while header := f.read(12):  # uint64 length, uint32 masked CRC of the length
    whole = len(header) == 12
    if whole:
      (length,) = struct.unpack("<Q", header[:8])
      data, crc = f.read(length), f.read(4)
      whole = len(data) == length and len(crc) == 4
    if not whole:
      assert masked_crc32c is None, f"{name}: a record cut short"
      break
    if masked_crc32c is not None:
      assert struct.unpack("<I", header[8:])[0] == masked_crc32c(header[:8])
      assert struct.unpack("<I", crc)[0] == masked_crc32c(data)
    out.append(data)
  return out


def scalars(workdir, tag: str = "train/loss") -> dict:
  """{step: value} of one TensorBoard scalar over all runs (a later run's value wins)."""
  merged = {}
  for run in scalars_per_run(workdir, tag):
    merged.update(run)
  return merged


def committed_steps(workdir) -> list[int]:
  """The committed checkpoints of `workdir/checkpoints`, sorted: step directories (in a bucket,
  those with Orbax's commit marker: a step being written has its directory already)."""
  return store.committed_steps(os.path.join(str(workdir), "checkpoints"))


def partial_writes(workdir) -> list[str]:
  """The interrupted (uncommitted) checkpoint writes in `workdir/checkpoints`."""
  return sorted(name for name in _names(workdir) if ".orbax-checkpoint-tmp" in name)


def _names(workdir) -> list[str]:
  directory = epath.Path(str(workdir)) / "checkpoints"  # A local directory or a bucket's.
  try:
    return [path.name for path in directory.iterdir()]
  except FileNotFoundError:
    return []


def restore_state(workdir, step: int) -> dict:
  """The train state saved at `step`, as numpy arrays in nested dicts."""
  manager = store.make_manager(os.path.join(workdir, "checkpoints"), read_only=True)
  return store.read_state_on_host(manager, step)


def init_module(module, *args, **kwargs):
  """(variables, unboxed params) of a Flax module initialised from key 0 on `args`."""
  variables = module.init(jax.random.key(0), *args, **kwargs)
  return variables, nn.meta.unbox(variables.get("params", {}))


def randn(seed, *shape):
  """float32 standard normal numbers of `shape`, from numpy's generator seeded `seed`."""
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def code_block(path: str, after: str) -> str:
  """The first python code block of the repository's file `path` after the text `after`."""
  text = (pathlib.Path(__file__).resolve().parents[1] / path).read_text()
  return re.search(r"```python\n(.*?)```", text.split(after, 1)[1], re.DOTALL)[1]


def assert_loader_resumes(make, tmp_path, before: int, after: int) -> None:
  """A Grain iterator of `make()` saved through Orbax after `before` batches, restored into a fresh
  one, yields the `after` batches the saved one would have."""
  it = iter(make())
  for _ in range(before):
    next(it)
  manager = ocp.CheckpointManager(tmp_path / "ckpt")
  manager.save(before, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  manager.wait_until_finished()
  expected = [next(it) for _ in range(after)]
  it.close()
  fresh = iter(make())
  manager.restore(before, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  got = [next(fresh) for _ in range(after)]
  fresh.close()
  for a, b in zip(expected, got, strict=True):
    for key in BATCH_KEYS:
      np.testing.assert_array_equal(a[key], b[key])


def text_data_config(root, **fields) -> data.DataConfig:
  """The 'text' dataset of files <root>/train.{xx,yy} and <root>/dev.{xx,yy}: batch rows in pairs,
  512 tokens a batch, and `fields`."""
  return data_config(
    source__name="text",
    source__source_lang="xx",
    source__target_lang="yy",
    source__text_train=str(root / "train"),
    source__text_validation=str(root / "dev"),
    source__data_dir=str(root / "tfds"),
    batch__multiple=2,
    batch__tokens=512,
    **fields,
  )


@contextlib.contextmanager
def compilations(name: str):
  """Within the block, the list of jax's lines saying it compiled a program of the jitted function
  `name` (XLA's compiler ran), in any thread (its log of compilations switched on for all of them,
  as it was after)."""
  compiled = []

  class Counter(logging.Handler):
    def emit(self, record):
      if record.getMessage().startswith(f"Finished XLA compilation of jit({name})"):
        compiled.append(record.getMessage())

  counter, root, logged = Counter(), logging.getLogger(), jax.config.jax_log_compiles
  root.addHandler(counter)
  jax.config.update("jax_log_compiles", True)  # In every thread (a context is the caller's).
  try:
    yield compiled
  finally:
    jax.config.update("jax_log_compiles", logged)
    root.removeHandler(counter)
