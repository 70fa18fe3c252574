"""Every program a run of an experiment compiles, compiled for a target by that target's compiler.

The programs: the train step at each batch shape the data pipeline can
produce for the experiment (a function of the batch settings: no data is read),
the evaluation step, the `decode.*` search at the decode shape, and the
validation-BLEU search when training evaluates.
The mesh, sharding rules, dtype, scanned layers and remat apply as on the
hardware; the mesh spans the target's compile-only devices, every host's, as
one process of a multi-host run sees them. Each program gets its per-device
bytes against the chip's memory, the compiler's and the model's FLOPs, and,
where the compiler gives a usable one, its estimated step time with the
tokens/s and MFU that it implies (an estimate, never a measurement).
"""

import dataclasses
import logging
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import data
from transformer_jax.compile import analysis, targets
from transformer_jax.decode.metrics import TeacherForcedLoss
from transformer_jax.decode.translator import DecodeSettings, Translator
from transformer_jax.errors import UserError
from transformer_jax.experiment import Experiment, make_trainer
from transformer_jax.model.config import TransformerConfig

log = logging.getLogger(__name__)

_TRITON_TILING = "Couldn't find output tile sizes"
_MOST_TOKENS = 2**24  # The largest batch the fit search tries.


class DoesNotFitError(UserError):
  """A program of the experiment needs more memory per device than the target's chips have."""


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program: what it is, its shape (global rows x length) and its cost."""

  name: str  # "train 816x40", "eval 64x256", "beam4 128x256", "greedy 128x256"
  kind: str  # "train", "eval", "beam" or "greedy"
  rows: int
  length: int
  cost: analysis.ProgramCost
  model_flops: float | None  # the model's FLOPs of one call, all devices together
  loop: str  # what runs as a loop ("" = nothing), see ProgramCost.estimated_seconds
  note: str = ""

  def record(self, target: targets.Target) -> dict:
    """A JSON-ready dict: the cost, the fit and the estimate on `target`."""
    seconds, why = self.cost.estimated_seconds(target.chip.peak_flops, self.loop)
    estimate = None
    if seconds is not None and self.kind in ("train", "eval"):
      estimate = {
        "step_seconds": seconds,
        "tokens_per_second": self.rows * self.length / seconds,
        "mfu": (
          self.model_flops / (seconds * target.chips * target.chip.peak_flops)
          if self.model_flops
          else None
        ),
      }
    return {
      "name": self.name,
      "kind": self.kind,
      "rows": self.rows,
      "length": self.length,
      **self.cost.record(),
      "fits": self.cost.fits(target.chip.usable_bytes),
      "model_flops_per_device": (self.model_flops / target.chips if self.model_flops else None),
      "compiler_estimate": estimate,
      "estimate_basis": why,
      "note": self.note,
    }


@dataclasses.dataclass
class Report:
  """The programs of an experiment on a target, with the parameters and mesh behind them."""

  target: targets.Target
  hosts: int
  mesh: dict
  rules: str
  attention: str
  parameters: int
  state_bytes_per_device: int
  data_shards: int
  programs: list[Program]
  largest_batch: dict | None = None

  def too_big(self) -> list[Program]:
    return [p for p in self.programs if not p.cost.fits(self.target.chip.usable_bytes)]

  def record(self) -> dict:
    """The whole report as a JSON-ready dict (the fields docs/compile.md describes)."""
    chip = self.target.chip
    return {
      "target": {
        "name": self.target.name,
        "topology": self.target.topology,
        "chip": chip.name,
        "platform": chip.platform,
        "chips": self.target.chips,
        "hosts": self.hosts,
        "memory_bytes": chip.memory_bytes,
        "usable_bytes": chip.usable_bytes,
        "peak_flops": chip.peak_flops,
        "memory_bandwidth": chip.memory_bandwidth,
        "source": chip.source,
      },
      "mesh": self.mesh,
      "sharding_rules": self.rules,
      "attention": self.attention,
      "parameters": {
        "count": self.parameters,
        "bytes_per_parameter": 12,  # float32 parameters and two Adam moments
        "state_bytes_total": 12 * self.parameters,
        "state_bytes_per_device": self.state_bytes_per_device,
      },
      "data_shards": self.data_shards,
      "programs": [p.record(self.target) for p in self.programs],
      "compile_seconds": sum(p.cost.compile_seconds for p in self.programs),
      "fits": not self.too_big(),
      "largest_batch": self.largest_batch,
    }


def program_loops(model: TransformerConfig, loops: tuple[str, ...], length: int) -> str:
  """What a train or eval program of `model` at length `length` runs as loops ("" = nothing):
  `loops`, and the output layer's chunks where `model.loss_chunk` splits the length."""
  chunks = "the output layer's chunks (model.loss_chunk)" if 0 < model.loss_chunk < length else ""
  return " and ".join(x for x in (*loops, chunks) if x)


def full_batch_flops(spec, rows: int, length: int) -> float | None:
  """The model's FLOPs of a train step (`spec.flops`) on a `[rows, length]` batch whose every
  position is a token (arrays of ones, none allocated); None for a model without them."""
  if spec.flops is None:
    return None
  ones = np.broadcast_to(np.int32(1), (rows, length))
  return float(spec.flops({k: ones for k in spec.batch_keys}))


def _compile(target: targets.Target, lower: Callable):
  """`(ProgramCost, note)` of the program `lower()` returns, compiled for `target`.

  XLA's GPU compiler without a device picks Triton GEMM tiles without autotuning
  and fails on some matmuls; those programs are compiled again with Triton GEMMs
  off (cuBLAS), and the note says so.
  """
  lowered = lower()
  try:
    return analysis.compile_and_measure(lowered, chip=target.chip), ""
  except jax.errors.JaxRuntimeError as error:
    message = str(error)
    if "cuDNN not found" in message:
      raise targets.TargetError(
        f"--target={target.name}: the cuDNN attention needs cuDNN: pip install -e '.[cuda]'"
      ) from None
    if target.platform != "gpu" or _TRITON_TILING not in message:
      raise
  cost = analysis.compile_and_measure(
    lowered, {"xla_gpu_enable_triton_gemm": False}, chip=target.chip
  )
  return cost, "compiled with Triton GEMMs off (no tiling without autotuning)"


def _state_bytes_per_device(abstract_state) -> int:
  """Bytes of the train state one device holds under its shardings."""
  total = 0
  for leaf in jax.tree.leaves(abstract_state):
    total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
  return total


class Compiler:
  """An experiment placed on a target's compile-only devices; `train`, `evaluate` and `search`
  compile one program each at a given shape."""

  def __init__(self, experiment: Experiment, target: targets.Target):
    self.experiment, self.target = experiment, target
    self.devices = targets.compile_devices(target)
    experiment.check_devices(len(self.devices))
    # The vocabulary size the experiment asks for (a run takes its tokenizer's, the same for a
    # trained vocabulary; a Marian vocabulary file may differ).
    self.vocab_size = experiment.data.vocab.size
    self.trainer, _ = make_trainer(experiment, vocab_size=self.vocab_size, devices=self.devices)
    self.placement = self.trainer.placement
    self.model_config = self.placement.model.config
    layers = "the layers (model.scan_layers)" if self.model_config.scan_layers else ""
    accumulation = "the micro-batches (grad_accum_steps)" if experiment.grad_accum_steps > 1 else ""
    self._train_loops = (layers, accumulation)
    self._eval_loops = (layers,)

  def _train_flops(self, rows: int, length: int) -> float | None:
    """The model's FLOPs of a train step on a `[rows, length]` batch, every slot counted."""
    return full_batch_flops(self.placement.spec, rows, length)

  def train(self, rows: int, length: int) -> Program:
    trainer, placement = self.trainer, self.placement
    batch = placement.abstract_batch(rows, length)
    cost, note = _compile(
      self.target,
      lambda: placement.run(lambda: trainer.jitted_step.lower(trainer.abstract_state, batch)),
    )
    return Program(
      f"train {rows}x{length}",
      "train",
      rows,
      length,
      cost,
      self._train_flops(rows, length),
      program_loops(self.model_config, self._train_loops, length),
      note,
    )

  def evaluate(self, rows: int, length: int) -> Program:
    placement = self.placement
    step = TeacherForcedLoss(placement, self.trainer.loss).jitted_sums
    batch = placement.abstract_batch(rows, length)
    cost, note = _compile(
      self.target, lambda: placement.run(lambda: step.lower(placement.abstract_params, batch))
    )
    return Program(
      f"eval {rows}x{length}",
      "eval",
      rows,
      length,
      cost,
      flops / 3 if (flops := self._train_flops(rows, length)) else None,
      program_loops(self.model_config, self._eval_loops, length),
      note,
    )  # Forward only.

  def search(self, settings: DecodeSettings, rows: int, length: int) -> Program:
    placement, model = self.placement, self.placement.model
    run, kwargs = settings.search_call(length, self.model_config.max_len)
    inputs = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=placement.batch_sharding)
    variables = {"params": placement.abstract_params}
    lower = lambda: run.lower(model, variables, inputs, **kwargs)
    cost, note = _compile(self.target, lambda: placement.run(lower))
    return Program(
      f"{settings.search} {rows}x{length}",
      "beam" if settings.beam_size > 1 else "greedy",
      rows,
      length,
      cost,
      None,
      "the search steps",
      note,
    )


def _log_progress(index: int, total: int, name: str, started: float) -> None:
  done = time.perf_counter() - started
  eta = f", about {done / index * (total - index):.0f} s left" if index else ""
  log.info("compiling %s (%d of %d; %.0f s so far%s)", name, index + 1, total, done, eta)


def compile_experiment(
  experiment: Experiment, target: targets.Target, *, find_largest_batch: bool = False
) -> Report:
  """The report of every program of `experiment` compiled for `target`.

  With `find_largest_batch`, or when a train step does not fit, also the
  largest batch (`data.batch.size` packed, else `data.batch.tokens`) whose train step fits
  (`largest_batch`).
  Raises FieldError for an experiment the target cannot run (a mesh that does not
  divide its chips, a parameter that does not split), TargetError when its
  compiler is missing. Never raises for a program that does not fit: see
  `Report.too_big`.
  """
  compiler = Compiler(experiment, target)
  placement = compiler.placement
  shapes = data.train_batch_shapes(experiment.data, placement.data_shard[1])
  max_len = compiler.model_config.max_len
  # Evaluation reads whole pairs (none cut) in lengths of the padded series, at most max_len.
  eval_length = min(
    data.padded_length(
      max(experiment.data.batch.max_source_length, experiment.data.batch.max_target_length)
    ),
    max_len,
  )
  decode_length = min(data.padded_length(experiment.data.batch.max_source_length), max_len)
  settings = experiment.decode
  decode_rows = Translator(placement, None, settings).batch_size
  jobs = [(f"train {r}x{n}", lambda r=r, n=n: compiler.train(r, n)) for r, n in shapes]
  jobs.append(
    (
      f"eval {experiment.data.batch.eval_size}x{eval_length}",
      lambda: compiler.evaluate(experiment.data.batch.eval_size, eval_length),
    )
  )
  # --mode=eval and translate (a language model has no search).
  searches = {} if experiment.is_language_model else {settings.beam_size: settings}
  if searches and experiment.fit.eval_every_steps and experiment.eval_bleu_sentences:
    searches.setdefault(
      experiment.eval_bleu_beam_size,
      dataclasses.replace(settings, beam_size=experiment.eval_bleu_beam_size),
    )
  for s in searches.values():
    jobs.append(
      (
        f"{s.search} {decode_rows}x{decode_length}",
        lambda s=s: compiler.search(s, decode_rows, decode_length),
      )
    )
  started = time.perf_counter()
  programs = []
  for index, (name, job) in enumerate(jobs):
    _log_progress(index, len(jobs), name, started)
    programs.append(job())
  report = Report(
    target=target,
    hosts=targets.hosts(compiler.devices),
    mesh=dict(placement.mesh.shape),
    rules=experiment.sharding_rules,
    attention=compiler.model_config.attention_impl,
    parameters=experiment.count_params(placement),
    state_bytes_per_device=_state_bytes_per_device(compiler.trainer.abstract_state),
    data_shards=placement.data_shard[1],
    programs=programs,
  )
  train_too_big = [p for p in report.too_big() if p.kind == "train"]
  if find_largest_batch or train_too_big:
    trains = [p for p in programs if p.kind == "train"]
    most_memory = max(trains, key=lambda p: (bool(p.cost.refused), p.cost.total_bytes))
    report.largest_batch = largest_batch(compiler, most_memory)
  return report


def largest_batch(compiler: Compiler, most_memory: Program) -> dict:
  """The largest batch whose train step fits (`field`: `data.batch.tokens`, or
  `data.batch.size` for packed rows, and its `value`), to within 1/16, found by compiling the
  step at the length of `most_memory` (the train shape that needs the most memory at the
  configured batch) with other row counts: doubling while it fits, then a bisection. `capped`:
  the search stopped at its largest batch, 2**24 tokens, which fits."""
  target, length = compiler.target, most_memory.length
  multiple = data.rows_multiple(compiler.experiment.data, 0, compiler.placement.data_shard[1])
  start = most_memory.rows // multiple
  tried: dict[int, Program] = {start: most_memory}

  def fits(units: int) -> bool:
    if units not in tried:
      log.info("fit search: compiling the train step at %dx%d", units * multiple, length)
      tried[units] = compiler.train(units * multiple, length)
    return tried[units].cost.fits(target.chip.usable_bytes)

  most = max(start, _MOST_TOKENS // (multiple * length))
  low, high = 0, start
  if fits(start):
    low = start
    while low * 2 <= most and fits(low * 2):
      low *= 2
    high = low * 2 if low * 2 <= most else most + 1
  capped = low == most or (high == most + 1 and fits(most))
  if capped:
    low = most
  while high - low > max(1, low // 16):
    middle = (low + high) // 2
    if fits(middle):
      low = middle
    else:
      high = middle
  packed = compiler.experiment.data.batch.mode == "packed"
  record = {
    "field": "data.batch.size" if packed else "data.batch.tokens",
    "value": low * multiple if packed else low * multiple * length,
    "tokens_per_batch": low * multiple * length,
    "rows": low * multiple,
    "length": length,
    "compiles": len(tried) - 1,
    "capped": capped,
  }
  if low:
    record["program"] = tried[low].record(target)
  return record
