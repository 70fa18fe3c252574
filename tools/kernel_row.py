"""The kernels, bytes and roofline floor of an experiment's train step on a GPU target, compiled
on this CPU: one row of the table in docs/performance.md ("Predicted kernels, bytes and roofline
floor"), and the kernels that move the most bytes and do the most FLOPs, with their source.

  ./launch.sh kernels --config=experiments/wmt14.py:base --target=1xh100 \
      --change="what changed" [--config.<field>=<value> ...] [--json=PATH]

It compiles only the train step, at each batch shape the config's batching
produces (one for packed rows), as the compile mode does (`compile/programs.py`),
and reads its optimized HLO (`compile/kernels.py`). Every figure is an estimate
read off the compiler's output, not a measurement; `measured step ms` is left
for a run on the device to fill in.
"""

import json
import subprocess
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from transformer_jax import config as config_lib
from transformer_jax import data
from transformer_jax.cli import flag_errors
from transformer_jax.compile import programs, targets, thunks
from transformer_jax.errors import UserError

FLAGS = flags.FLAGS
HEADER = (
  "| model | commit | change | kernels | 1x1x1-grid kernels | host launches (graphs) | GEMMs "
  "| cuDNN calls | HBM GB | TFLOP | floor ms (est.) | measured step ms |\n"
  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def define_flags():
  """The command line's flags; defined only when run as a program, so importing defines none."""
  config_flags.DEFINE_config_file(
    "config", None, "Experiment config file with its variant: experiments/wmt14.py:base."
  )
  flags.DEFINE_string("target", "1xh100", "The GPU target (1xh100, 8xh100, 1xh200, ...).")
  flags.DEFINE_string("change", "as committed", "What the row's tree changes, for its table row.")
  flags.DEFINE_string("json", None, "Also write every program's record (Program.record) here.")


def commit() -> str:
  """The short commit of this checkout, `+changes` where the package or the experiments differ
  from it; `?` outside a git checkout."""
  try:
    head = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "?"
  clean = subprocess.run(
    ["git", "diff", "--quiet", "HEAD", "--", "transformer_jax", "experiments"], check=False
  )
  return head if clean.returncode == 0 else f"{head}+changes"


def train_records(experiment, target_name: str) -> list[dict]:
  """The record (`Program.record`, with its `kernels`) of the experiment's train step at every
  batch shape it trains on, compiled for the GPU target named."""
  target = targets.parse_target(target_name)
  if target.platform != "gpu":
    raise targets.TargetError(f"--target={target.name}: the kernel reader reads GPU programs")
  compiler = programs.Compiler(experiment, target)
  shapes = data.train_batch_shapes(experiment.data, compiler.placement.data_shard[1])
  return [compiler.train(rows, length).record(target) for rows, length in shapes]


def row(model: str, commit_name: str, change: str, record: dict, shape: bool = False) -> str:
  """The markdown row of one train step's record (`shape`: name its batch shape too)."""
  k = record["kernels"]
  cells = (
    f"{model} {record['name']}" if shape else model,
    commit_name,
    change,
    f"{k['kernels']:,}",
    f"{k['one_block_kernels']:,}",
    thunks.launches_cell(k["host_launches"]),
    f"{k['gemms']:,}",
    f"{k['cudnn_calls']:,}",
    f"{k['bytes'] / 1e9:.1f}",
    f"{k['flops'] / 1e12:.2f}",
    f"{k['floor_seconds'] * 1e3:.1f}",
    "-",
  )
  return "| " + " | ".join(cells) + " |"


def largest(record: dict) -> str:
  """The kernels that move the most bytes and do the most FLOPs, one line each."""
  lines = []
  for key, unit, scale in (("largest_by_bytes", "GB", 1e9), ("largest_by_flops", "TFLOP", 1e12)):
    lines.append(f"{record['name']}: {key.replace('_', ' ')}")
    field = "bytes" if unit == "GB" else "flops"
    for kernel in record["kernels"][key]:
      launches = f" x{kernel['launches']}" if kernel["launches"] > 1 else ""
      lines.append(
        f"  {kernel[field] / scale:8.3f} {unit}  {kernel['floor_seconds'] * 1e3:6.2f} ms  "
        f"{kernel['name']}{launches} ({kernel['category']})  {kernel['source']}"
      )
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  jax.config.update("jax_platforms", "cpu")  # The target's compiler runs beside the CPU backend.
  spec = config_flags.get_config_filename(FLAGS["config"])
  model = spec.rpartition(":")[2] if ":" in spec else spec.rsplit("/", 1)[-1].removesuffix(".py")
  try:
    records = train_records(config_lib.parse(FLAGS.config), FLAGS.target)
  except UserError as error:
    sys.exit(f"error: {config_lib.user_message(error)}")
  name = commit()
  print(HEADER)
  for record in records:
    print(row(model, name, FLAGS.change, record, shape=len(records) > 1))
  print(f"\n{FLAGS.target}: figures read off the optimized HLO (estimates, not measurements)")
  for record in records:
    print(largest(record))
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as file:
      json.dump(records, file, indent=1)


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=flag_errors.parse_flags)
