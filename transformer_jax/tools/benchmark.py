"""Benchmark: training step, decoding and the device's matmul rate, optionally against PyTorch.

  python -m transformer_jax.tools.benchmark --config=small [--vs=torch] [--json=results.json]
  python -m transformer_jax.tools.benchmark --experiment=experiments/default.py
  python -m transformer_jax.tools.benchmark --config=small --sweep_tokens=1024,2048 \
      --sweep_lengths=32,64,128 --steps=5 --warmup=1 --plot=scaling_small.png

Measures in one process: the train step (forward, label-smoothed loss,
backward, Adam update; median/min/max over --steps after --warmup), the
first step (compile included), non-padding tokens/s, peak memory, a square
matmul's FLOP/s and the model FLOPs utilization against it
(`train.objective.train_flops`), and beam-search and greedy decoding of a fixed
shape. With --vs=torch the same model in torch.nn.Transformer runs on the
same batch, in blocks of --block steps alternating with ours.

With --experiment, the model and the batches are an experiment's own: its
train step on batches from its data pipeline in each batch mode
(length-bucketed 'tokens', 'packed' and fixed-length 'padded'), in real
tokens per second.

With --sweep (or --sweep_tokens, --sweep_lengths) it times the train step
alone at every batch shape of a grid (`tools.sweep`) and prints a markdown
table and draws a figure of how the step time grows.
"""

import dataclasses
import json
import resource
import statistics
import sys
import time

from ml_collections import config_flags

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import config as config_lib
from transformer_jax import data, sharding
from transformer_jax.conventions import PAD_ID, UNK_ID
from transformer_jax.data.config import BATCH_MODES
from transformer_jax.decode import search
from transformer_jax.errors import UserError
from transformer_jax.experiment import Experiment, make_trainer
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.train import objective
from transformer_jax.train.reporting import measure_matmul_flops
from transformer_jax.train.step import Trainer
from transformer_jax.tools import sweep
from transformer_jax.workdir import Workdir


@dataclasses.dataclass(frozen=True)
class Workload:
  """A model and the shape of its benchmark batch (`batch` pairs, 75% of tokens real)."""

  model: dict
  batch: int
  source_length: int
  target_length: int


WORKLOADS = {
    "small": Workload(dict(vocab_size=8192, num_layers=3, d_model=256, d_ff=1024, num_heads=4),
                      batch=16, source_length=64, target_length=64),
    "base": Workload(dict(preset="base", vocab_size=32768), batch=8, source_length=128,
                     target_length=128),
    "big": Workload(dict(preset="big", vocab_size=32768), batch=8, source_length=128,
                    target_length=128),
}
REAL_FRACTION = 0.75
DECODE_SENTENCES, DECODE_SOURCE_LENGTH, DECODE_OUTPUT_LENGTH = 16, 32, 48
# The sweep's model keeps TransformerConfig's default positional table, the same at every point.
SWEEP_MAX_LEN = TransformerConfig.max_len

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags; defined only when run as a program, so importing defines none."""
  flags.DEFINE_enum("config", "small", list(WORKLOADS), "Model and batch shape to measure.")
  flags.DEFINE_integer("steps", 20, "Timed training steps (after warm-up).", lower_bound=1)
  flags.DEFINE_integer("warmup", 3, "Untimed training steps after the first (compile) step.",
                       lower_bound=0)
  flags.DEFINE_integer("block", 5, "Timed steps in a row, after one untimed step; with --vs the "
                       "frameworks alternate by block.", lower_bound=1)
  flags.DEFINE_integer("decode_runs", 5, "Timed runs of each search (after its compile run).",
                       lower_bound=1)
  flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                    "Computation dtype; default float32 on CPU, bfloat16 on accelerators.")
  flags.DEFINE_bool("scan_layers", False, "Run the layers through nn.scan.")
  flags.DEFINE_enum("remat", "none", ["none", "dots", "full"], "Rematerialization policy.")
  flags.DEFINE_enum("vs", None, ["torch"], "Also measure the same model in this framework.")
  flags.DEFINE_string("json", None, "Also write the results to this JSON file.")
  config_flags.DEFINE_config_file(
      "experiment", None, "Measure this experiment's model on its own data in every batch mode "
      "(experiments/default.py): the model, dtype and batches are the experiment's, so "
      "--config, --dtype, --scan_layers, --remat, --vs, --warmup and --block do not apply.")
  flags.DEFINE_string("workdir", "/tmp/transformer_jax_benchmark",
                      "--experiment: where its vocabulary is made and kept.")
  flags.DEFINE_bool("sweep", False, "Time only the train step of --config's model, at every batch "
                    "shape of --sweep_tokens x --sweep_lengths (--steps after --warmup each); "
                    "print a markdown table and draw --plot. Not with --vs or --experiment.")
  flags.DEFINE_list("sweep_tokens", list(map(str, sweep.DEFAULT_TOKENS)),
                    "Sweep: tokens per batch on each side (source tokens = target tokens, padding "
                    "included, as data.tokens_per_batch counts them). Giving it implies --sweep.")
  flags.DEFINE_list("sweep_lengths", list(map(str, sweep.DEFAULT_LENGTHS)),
                    "Sweep: the source and target length of every row, at most "
                    f"{SWEEP_MAX_LEN} (the model's max_len); a batch has tokens / length rows, "
                    "rounded down to a multiple of the devices. Giving it implies --sweep.")
  flags.DEFINE_string("plot", None, "Sweep: the figure (PNG) to write, median step time against "
                      "length and against tokens per batch; default scaling_<config>.png in the "
                      "current directory, empty for none. Needs matplotlib.")


def model_config(workload: Workload, *, dtype: str, scan_layers: bool, remat: str,
                 max_len: int | None = None):
  """The TransformerConfig measured, with dropout as in training (0.1); positions up to `max_len`,
  by default the workload's longest row or decoding's output, whichever is longer."""
  fields = dict(workload.model)
  preset = fields.pop("preset", None)
  fields.update(dtype=dtype, scan_layers=scan_layers, remat=remat,
                max_len=max_len or max(workload.source_length, workload.target_length,
                                       DECODE_OUTPUT_LENGTH))
  if preset:
    return TransformerConfig.preset(preset, **fields)
  return TransformerConfig(**fields)


def paper_trainer(cfg: TransformerConfig) -> Trainer:
  """A Trainer of `cfg`, data parallel over every device, with the paper's Adam and label
  smoothing 0.1."""
  placement = sharding.Placement(cfg, sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1}),
                                 sharding.logical_rules("dp"))
  optimizer, _ = objective.OptimizerSettings().make(cfg.d_model)
  return Trainer(placement, optimizer, label_smoothing=0.1)


def synthetic_batch(workload: Workload, vocab_size: int, seed: int = 0) -> dict:
  """A fixed batch with REAL_FRACTION of each row real tokens, the rest padding."""
  rng = np.random.default_rng(seed)
  batch = {}
  for side, length in (("inputs", workload.source_length), ("targets", workload.target_length)):
    real = int(round(REAL_FRACTION * length))
    ids = rng.integers(UNK_ID + 1, vocab_size, (workload.batch, length)).astype(np.int32)
    ids[:, real:] = PAD_ID
    batch[side] = ids
    batch[f"{side}_segmentation"] = (ids != PAD_ID).astype(np.int32)
    batch[f"{side}_position"] = np.where(ids != PAD_ID, np.arange(length, dtype=np.int32), 0)
  return batch


def _timed(fn):
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def _summary(times):
  return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def peak_memory_bytes() -> tuple[int, str]:
  """Peak device memory where the backend reports it, else the process's peak RSS."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def measure_decoding(model, params, runs: int) -> dict:
  """Seconds per batch for beam 4 (alpha 0.6) and greedy, forced to DECODE_OUTPUT_LENGTH tokens."""
  vocab = model.config.vocab_size
  inputs = jnp.asarray(np.random.default_rng(1).integers(
      UNK_ID + 1, vocab, (DECODE_SENTENCES, DECODE_SOURCE_LENGTH)), jnp.int32)
  variables = {"params": params}
  common = dict(max_len=DECODE_OUTPUT_LENGTH, max_extra=DECODE_OUTPUT_LENGTH, eos_id=-1)
  searches = {
      "beam4": lambda: search.beam_search(model, variables, inputs, beam_size=4, alpha=0.6,
                                          **common).tokens,
      "greedy": lambda: search.greedy_decode(model, variables, inputs, **common).tokens,
  }
  results = {}
  for name, fn in searches.items():
    first = _timed(fn)
    results[name] = {"first": first, **_summary([_timed(fn) for _ in range(runs)])}
  return results


def time_alternating(runs: dict, *, steps: int, warmup: int, block: int) -> tuple[dict, dict]:
  """`(first, times)`: each of `runs` (name -> step function) timed on its first call (compile
  included), then `steps` times after `warmup` untimed calls.

  The runs alternate in blocks of `block` timed steps, so all see the same
  machine conditions; each block starts with an untimed step, since a step
  right after another framework's (or any pause) runs slower (up to 1.8x here).
  """
  first = {name: _timed(fn) for name, fn in runs.items()}
  for _ in range(warmup):
    for fn in runs.values():
      fn()
  times = {name: [] for name in runs}
  while any(len(t) < steps for t in times.values()):
    for name, fn in runs.items():
      fn()
      times[name] += [_timed(fn) for _ in range(min(block, steps - len(times[name])))]
  return first, times


def run(workload: Workload, *, steps: int, warmup: int, decode_runs: int, dtype: str,
        scan_layers: bool = False, remat: str = "none", vs: str | None = None,
        block: int = 5) -> dict:
  """Measure everything for one workload; returns the results as a JSON-ready dict."""
  cfg = model_config(workload, dtype=dtype, scan_layers=scan_layers, remat=remat)
  matmul_rate = measure_matmul_flops(cfg.compute_dtype)
  trainer = paper_trainer(cfg)
  batch = synthetic_batch(workload, cfg.vocab_size)
  state = trainer.init()

  def ours():
    nonlocal state
    state, metrics = trainer.train_step(state, batch)
    return metrics["loss"]

  runs = {"ours": ours}
  if vs == "torch":
    from transformer_jax.tools import torch_reference  # pylint: disable=g-import-not-at-top
    torch_step = torch_reference.build(cfg, label_smoothing=0.1)
    runs["torch"] = lambda: torch_step(batch)
  first, times = time_alternating(runs, steps=steps, warmup=warmup, block=block)

  real_tokens, flops = _real_tokens(batch), _batch_flops(cfg, batch)
  results = {"config": dataclasses.asdict(cfg), "workload": dataclasses.asdict(workload),
             "device": str(jax.local_devices()[0].device_kind), "devices": jax.device_count(),
             "matmul_flops_per_s": matmul_rate, "train_flops_per_step": flops,
             "real_tokens_per_step": real_tokens}
  devices = {"ours": jax.device_count(), "torch": 1}  # torch runs on the host's CPU
  for name in runs:
    step = _summary(times[name])
    results[name] = {"first_step_s": first[name], "step_s": step,
                     "tokens_per_s": real_tokens / step["median"],
                     "mfu": flops / step["median"] / (matmul_rate * devices[name])}
  memory, memory_kind = peak_memory_bytes()
  results["ours"]["peak_memory_bytes"], results["peak_memory_kind"] = memory, memory_kind
  results["ours"]["decode_s"] = measure_decoding(trainer.placement.model, state.params, decode_runs)
  return results


def run_sweep(workload: Workload, points: list[sweep.Point], *, steps: int, warmup: int,
              dtype: str, scan_layers: bool = False, remat: str = "none", block: int = 5) -> dict:
  """The train step of `workload`'s model timed as `run` times it, on a synthetic batch of each
  of `points` (`sweep.grid`) in turn; one state trains throughout, each point's first step
  compiles. Returns the results as a JSON-ready dict, one record per point in "points"."""
  cfg = model_config(workload, dtype=dtype, scan_layers=scan_layers, remat=remat,
                     max_len=SWEEP_MAX_LEN)
  trainer = paper_trainer(cfg)
  state = trainer.init()
  records = []
  for index, point in enumerate(points):
    logging.info("sweep point %d of %d: %s", index + 1, len(points), point)
    shape = dataclasses.replace(workload, batch=point.rows, source_length=point.length,
                                target_length=point.length)
    batch = synthetic_batch(shape, cfg.vocab_size)

    def step(batch=batch):
      nonlocal state
      state, metrics = trainer.train_step(state, batch)
      return metrics["loss"]

    first, times = time_alternating({"step": step}, steps=steps, warmup=warmup, block=block)
    summary, real_tokens = _summary(times["step"]), _real_tokens(batch)
    records.append({**dataclasses.asdict(point), "real_tokens_per_step": real_tokens,
                    "first_step_s": first["step"], "step_s": summary,
                    "tokens_per_s": real_tokens / summary["median"]})
  return {"config": dataclasses.asdict(cfg), "device": str(jax.local_devices()[0].device_kind),
          "devices": jax.device_count(), "steps": steps, "warmup": warmup, "points": records}


def _real_tokens(batch) -> int:
  return int(np.sum(batch["inputs_segmentation"] > 0) + np.sum(batch["targets_segmentation"] > 0))


def _batch_flops(cfg: TransformerConfig, batch) -> float:
  return objective.train_flops(
      cfg, source_tokens=float(np.sum(batch["inputs_segmentation"] > 0)),
      target_tokens=float(np.sum(batch["targets_segmentation"] > 0)),
      source_length=batch["inputs"].shape[1], target_length=batch["targets"].shape[1])


def measure_batch_mode(trainer, state, batches) -> tuple[dict, object]:
  """Train on `batches`, timing each step after one untimed step of every new shape.

  Returns (figures, state): real tokens/s over all timed steps, their median
  step time, the fraction of batch positions that are real tokens, MFU.
  """
  compiled, times, real, total, flops = set(), [], 0, 0, 0.0
  for batch in batches:
    shape = batch["inputs"].shape + batch["targets"].shape
    if shape not in compiled:
      state, _ = trainer.train_step(state, batch)
      jax.block_until_ready(state)
      compiled.add(shape)
    start = time.perf_counter()
    state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    real += _real_tokens(batch)
    total += batch["inputs"].size + batch["targets"].size
    flops += _batch_flops(trainer.placement.model.config, batch)
  seconds = sum(times)
  return {"steps": len(times), "shapes": len(compiled), "step_s": _summary(times),
          "tokens_per_s": real / seconds, "real_fraction": real / total,
          "flops_per_s": flops / seconds}, state


def run_experiment(experiment: Experiment, workdir: Workdir, *, steps: int,
                   decode_runs: int) -> dict:
  """Real tokens/s of `experiment`'s model on `steps` batches of each batch mode.

  All modes train one state on batches of the experiment's own data, sized
  by its data config: 'tokens' (`data.tokens_per_batch`, length buckets),
  'packed' (`data.batch_size` rows of `data.max_length`) and 'padded'
  (`data.tokens_per_batch`, every row as long as the longest pair allowed).
  """
  experiment.check_devices(jax.device_count())
  tokenizer = data.get_tokenizer(experiment.data, workdir.vocab)
  trainer, _ = make_trainer(experiment, vocab_size=tokenizer.vocab_size)
  model = trainer.placement.model
  matmul_rate = measure_matmul_flops(model.config.compute_dtype)
  state = trainer.init()
  results = {"config": dataclasses.asdict(model.config),
             "device": str(jax.local_devices()[0].device_kind), "devices": jax.device_count(),
             "matmul_flops_per_s": matmul_rate, "modes": {}}
  shard_index, shard_count = trainer.placement.data_shard
  for mode in BATCH_MODES:
    # Checked as a whole: e.g. rows that fit the model's positions.
    data_config = dataclasses.replace(experiment, data=dataclasses.replace(
        experiment.data, batch_mode=mode)).data
    iterator = iter(data.make_train_loader(data_config, tokenizer, seed=experiment.seed,
                                           shard_index=shard_index, shard_count=shard_count))
    batches = [next(iterator) for _ in range(steps)]
    iterator.close()
    figures, state = measure_batch_mode(trainer, state, batches)
    hosts = jax.process_count()  # Each host counted its own rows.
    figures["tokens_per_s"] *= hosts
    figures["mfu"] = hosts * figures.pop("flops_per_s") / (matmul_rate * jax.device_count())
    results["modes"][mode] = figures
  results["decode_s"] = measure_decoding(model, state.params, decode_runs)
  return results


def format_experiment_table(results: dict) -> str:
  """Per batch mode: real tokens/s, its ratio to 'padded', real fraction, step time, MFU."""
  modes = results["modes"]
  padded = modes["padded"]["tokens_per_s"]
  lines = [f"{'batch mode':<12}{'real tok/s':>12}{'vs padded':>11}{'real %':>9}"
           f"{'s/step':>9}{'shapes':>8}{'MFU %':>8}"]
  for mode, m in modes.items():
    lines.append(f"{mode:<12}{m['tokens_per_s']:>12,.0f}{m['tokens_per_s'] / padded:>11.2f}"
                 f"{100 * m['real_fraction']:>9.1f}{m['step_s']['median']:>9.3f}"
                 f"{m['shapes']:>8}{100 * m['mfu']:>8.1f}")
  decode = results["decode_s"]
  lines.append(f"beam 4: {decode['beam4']['median']:.3f} s/batch, greedy: "
               f"{decode['greedy']['median']:.3f} s/batch ({DECODE_SENTENCES} sentences of "
               f"{DECODE_SOURCE_LENGTH} tokens -> {DECODE_OUTPUT_LENGTH})")
  lines.append(f"matmul rate: {results['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s on "
               f"{results['device']}")
  return "\n".join(lines)


def format_table(results: dict) -> str:
  """The results as a plain-text table (ours, torch and ours/torch where measured)."""
  ours, torch = results["ours"], results.get("torch")
  rows = [
      ("train step, median (s)", ours["step_s"]["median"], torch and torch["step_s"]["median"]),
      ("train step, min (s)", ours["step_s"]["min"], torch and torch["step_s"]["min"]),
      ("train step, max (s)", ours["step_s"]["max"], torch and torch["step_s"]["max"]),
      ("first step (s)", ours["first_step_s"], torch and torch["first_step_s"]),
      ("real tokens/s", ours["tokens_per_s"], torch and torch["tokens_per_s"]),
      ("MFU (%)", 100 * ours["mfu"], torch and 100 * torch["mfu"]),
      (f"{results['peak_memory_kind']} (MiB)", ours["peak_memory_bytes"] / 2**20, None),
      ("beam 4, s/batch (median)", ours["decode_s"]["beam4"]["median"], None),
      ("beam 4, first call (s)", ours["decode_s"]["beam4"]["first"], None),
      ("greedy, s/batch (median)", ours["decode_s"]["greedy"]["median"], None),
  ]
  lines = [f"{'figure':<30}{'ours':>12}" + (f"{'torch':>12}{'ours/torch':>12}" if torch else "")]
  for name, value, other in rows:
    line = f"{name:<30}{value:>12.4g}"
    if torch:
      line += f"{other:>12.4g}{value / other:>12.3f}" if other else f"{'':>12}{'':>12}"
    lines.append(line)
  lines.append(f"matmul rate: {results['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s on "
               f"{results['device']}; {results['train_flops_per_step'] / 1e9:.2f} GFLOP/step")
  return "\n".join(lines)


def sweep_main(dtype: str) -> dict:
  """The sweep the flags ask for, checked before anything is timed: its table, figure, results."""
  if FLAGS.experiment or FLAGS.vs:
    raise UserError("--sweep times --config's model alone: drop --experiment and --vs")
  points = sweep.grid(sweep.sizes("sweep_tokens", FLAGS.sweep_tokens),
                      sweep.sizes("sweep_lengths", FLAGS.sweep_lengths),
                      max_len=SWEEP_MAX_LEN, row_multiple=jax.device_count())
  plot = f"scaling_{FLAGS.config}.png" if FLAGS.plot is None else FLAGS.plot
  if plot:
    sweep.require_matplotlib()
  results = run_sweep(WORKLOADS[FLAGS.config], points, steps=FLAGS.steps, warmup=FLAGS.warmup,
                      dtype=dtype, scan_layers=FLAGS.scan_layers, remat=FLAGS.remat,
                      block=FLAGS.block)
  print(sweep.format_table(results["points"]))
  if plot:
    sweep.plot(results["points"], plot,
               title=f"{FLAGS.config}, {dtype}, on {results['devices']} x {results['device']}")
    print(f"figure: {plot}")
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  dtype = FLAGS.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
  sweeping = FLAGS.sweep or FLAGS["sweep_tokens"].present or FLAGS["sweep_lengths"].present
  if sweeping:
    try:
      results = sweep_main(dtype)
    except UserError as error:
      sys.exit(f"error: {error}")
  elif FLAGS["plot"].present:
    sys.exit("error: --plot draws the sweep's figure: add --sweep (or --sweep_tokens, "
             "--sweep_lengths)")
  elif FLAGS.experiment:
    results = run_experiment(config_lib.parse(FLAGS.experiment), Workdir(FLAGS.workdir),
                             steps=FLAGS.steps, decode_runs=FLAGS.decode_runs)
    print(format_experiment_table(results))
  else:
    results = run(WORKLOADS[FLAGS.config], steps=FLAGS.steps, warmup=FLAGS.warmup,
                  decode_runs=FLAGS.decode_runs, dtype=dtype, scan_layers=FLAGS.scan_layers,
                  remat=FLAGS.remat, vs=FLAGS.vs, block=FLAGS.block)
    print(format_table(results))
  print(json.dumps(results))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
