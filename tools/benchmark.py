"""The benchmarks' command line: the train step, decoding and the device's matmul rate, optionally
against PyTorch (`step_benchmark`, `decode_benchmark`); an experiment's own batches
(`experiment_benchmark`); the scaling sweep (`sweep`).

  python -m tools.benchmark --config=small [--vs=torch] [--json=results.json]
  python -m tools.benchmark --experiment=experiments/default.py
  python -m tools.benchmark --experiment=experiments/multi30k.py:tiny --compile_threads=2
  python -m tools.benchmark --config=small --sweep_tokens=1024,2048 \
      --sweep_lengths=32,64,128 --steps=5 --warmup=1 --plot=scaling_small.png

Measures in one process: the train step (forward, label-smoothed loss,
backward, Adam update; median/min/max over --steps after --warmup), the
first step (compile included), non-padding tokens/s, peak memory, a square
matmul's FLOP/s and the model FLOPs utilization against it
(`model.config.train_flops`), and beam-search and greedy decoding of a fixed
shape. With --vs=torch the same model in torch.nn.Transformer runs on the
same batch, in blocks of --block steps alternating with ours.

With --experiment, the model and the batches are an experiment's own: its
train step on batches from its data pipeline in each batch mode
(length-bucketed 'tokens', 'packed' and fixed-length 'padded'), in real
tokens per second. With --compile_threads it only compiles the experiment's train step for
every batch shape its data can produce, on that many threads, as a run that compiles ahead does.

With --sweep (or --sweep_tokens, --sweep_lengths) it times the train step
alone at every batch shape of a grid (`tools.sweep`) and prints a markdown
table and draws a figure of how the step time grows.
"""

import json
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from tools import experiment_benchmark, step_benchmark, sweep
from transformer_jax import config as config_lib
from transformer_jax.errors import UserError
from transformer_jax.workdir import Workdir

WORKLOADS = step_benchmark.WORKLOADS
FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags; defined only when run as a program, so importing defines none."""
  flags.DEFINE_enum("config", "small", list(WORKLOADS), "Model and batch shape to measure.")
  flags.DEFINE_integer("steps", 20, "Timed training steps (after warm-up).", lower_bound=1)
  flags.DEFINE_integer(
    "warmup", 3, "Untimed training steps after the first (compile) step.", lower_bound=0
  )
  flags.DEFINE_integer(
    "block",
    5,
    "Timed steps in a row, after one untimed step; with --vs the frameworks alternate by block.",
    lower_bound=1,
  )
  flags.DEFINE_integer(
    "decode_runs", 5, "Timed runs of each search (after its compile run).", lower_bound=1
  )
  flags.DEFINE_enum(
    "dtype",
    None,
    ["float32", "bfloat16"],
    "Computation dtype; default float32 on CPU, bfloat16 on accelerators.",
  )
  flags.DEFINE_bool("scan_layers", False, "Run the layers through nn.scan.")
  flags.DEFINE_enum("remat", "none", ["none", "dots", "full"], "Rematerialization policy.")
  flags.DEFINE_enum("vs", None, ["torch"], "Also measure the same model in this framework.")
  flags.DEFINE_string("json", None, "Also write the results to this JSON file.")
  config_flags.DEFINE_config_file(
    "experiment",
    None,
    "Measure this experiment's model on its own data in every batch mode "
    "(experiments/default.py): the model, dtype and batches are the experiment's, so "
    "--config, --dtype, --scan_layers, --remat, --vs, --warmup and --block do not apply.",
  )
  flags.DEFINE_integer(
    "compile_threads",
    None,
    "--experiment: only compile its train step for every batch shape its data can produce, on "
    "this many threads (config.compile_ahead's work), and print the seconds; one run per "
    "thread count (a process keeps what it compiled; the compilation cache is not used).",
    lower_bound=1,
  )
  flags.DEFINE_string(
    "workdir",
    "/tmp/transformer_jax_benchmark",
    "--experiment: where its vocabulary is made and kept.",
  )
  flags.DEFINE_bool(
    "sweep",
    False,
    "Time only the train step of --config's model, at every batch "
    "shape of --sweep_tokens x --sweep_lengths (--steps after --warmup each); "
    "print a markdown table and draw --plot. Not with --vs or --experiment.",
  )
  flags.DEFINE_list(
    "sweep_tokens",
    list(map(str, sweep.DEFAULT_TOKENS)),
    "Sweep: tokens per batch on each side (source tokens = target tokens, padding "
    "included, as data.batch.tokens counts them). Giving it implies --sweep.",
  )
  flags.DEFINE_list(
    "sweep_lengths",
    list(map(str, sweep.DEFAULT_LENGTHS)),
    "Sweep: the source and target length of every row, at most "
    f"{sweep.SWEEP_MAX_LEN} (the model's max_len); a batch has tokens / length "
    "rows, rounded down to a multiple of the devices. Giving it implies --sweep.",
  )
  flags.DEFINE_string(
    "plot",
    None,
    "Sweep: the figure (PNG) to write, median step time against "
    "length and against tokens per batch; default scaling_<config>.png in the "
    "current directory, empty for none. Needs matplotlib.",
  )


def sweep_main(dtype: str) -> dict:
  """The sweep the flags ask for, checked before anything is timed: its table, figure, results."""
  if FLAGS.experiment or FLAGS.vs:
    raise UserError("--sweep times --config's model alone: drop --experiment and --vs")
  points = sweep.grid(
    sweep.sizes("sweep_tokens", FLAGS.sweep_tokens),
    sweep.sizes("sweep_lengths", FLAGS.sweep_lengths),
    max_len=sweep.SWEEP_MAX_LEN,
    row_multiple=jax.device_count(),
  )
  plot = f"scaling_{FLAGS.config}.png" if FLAGS.plot is None else FLAGS.plot
  if plot:
    sweep.require_matplotlib()
  results = sweep.run_sweep(
    WORKLOADS[FLAGS.config],
    points,
    steps=FLAGS.steps,
    warmup=FLAGS.warmup,
    dtype=dtype,
    scan_layers=FLAGS.scan_layers,
    remat=FLAGS.remat,
    block=FLAGS.block,
  )
  print(sweep.format_table(results["points"]))
  if plot:
    sweep.plot(
      results["points"],
      plot,
      title=f"{FLAGS.config}, {dtype}, on {results['devices']} x {results['device']}",
    )
    print(f"figure: {plot}")
  return results


def measure(dtype: str) -> dict:
  """What the flags ask for, measured and printed as a table; the results."""
  sweeping = FLAGS.sweep or FLAGS["sweep_tokens"].present or FLAGS["sweep_lengths"].present
  if sweeping:
    return sweep_main(dtype)
  if FLAGS["plot"].present:
    raise UserError(
      "--plot draws the sweep's figure: add --sweep (or --sweep_tokens, --sweep_lengths)"
    )
  if FLAGS.compile_threads and not FLAGS.experiment:
    raise UserError("--compile_threads compiles an experiment's train steps: add --experiment")
  if FLAGS.compile_threads:
    results = experiment_benchmark.compile_ahead(
      config_lib.parse(FLAGS.experiment), FLAGS.compile_threads
    )
    print(experiment_benchmark.format_compile_ahead(results))
    return results
  if FLAGS.experiment:
    results = experiment_benchmark.run_experiment(
      config_lib.parse(FLAGS.experiment),
      Workdir(FLAGS.workdir),
      steps=FLAGS.steps,
      decode_runs=FLAGS.decode_runs,
    )
    print(experiment_benchmark.format_experiment_table(results))
    return results
  results = step_benchmark.run(
    WORKLOADS[FLAGS.config],
    steps=FLAGS.steps,
    warmup=FLAGS.warmup,
    decode_runs=FLAGS.decode_runs,
    dtype=dtype,
    scan_layers=FLAGS.scan_layers,
    remat=FLAGS.remat,
    vs=FLAGS.vs,
    block=FLAGS.block,
  )
  print(step_benchmark.format_table(results))
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  dtype = FLAGS.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
  try:
    results = measure(dtype)
  except UserError as error:
    sys.exit(f"error: {config_lib.user_message(error)}")
  print(json.dumps(results))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
