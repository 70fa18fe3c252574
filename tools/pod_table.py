"""The paper's models on TPU slices and H100s, on paper: `--mode=compile` for each row of a plan,
as one markdown table (docs/compile.md).

    JAX_PLATFORMS=cpu python -m tools.pod_table --output=docs/pod_table.md

Each row compiles every program of `experiments/wmt14.py:<variant>` for a
target with a mesh preset and options (scanned layers, remat), and reports
per-device memory, whether it fits, the compiler's estimated step time,
tokens/s and the hours the paper's steps take at that rate, and the compile
time on this machine. Rows marked `largest` also search the largest batch.
"""

import datetime
import json
import os
import subprocess
import time

import jax
from absl import app, flags, logging

from transformer_jax import config as config_lib
from transformer_jax.compile import programs, targets

_OUTPUT = flags.DEFINE_string("output", "docs/pod_table.md", "The markdown file to write.")
_ROWS = flags.DEFINE_list("rows", [], "Only these rows of PLAN (their numbers, from 1).")
_EXPERIMENTS = os.path.join(os.path.dirname(__file__), "..", "experiments", "wmt14.py")

# (variant, target, rules, config overrides, search the largest batch)
PLAN = (
  ("base", "v5e-8", "dp", {}, True),
  ("base", "v5e-8", "fsdp", {}, False),
  ("base", "v5e-8", "dp", {"model.scan_layers": True}, False),
  ("base", "v5e-8", "dp", {"model.remat": "full"}, False),
  ("big", "v5e-8", "fsdp", {}, True),
  ("big", "v5e-8", "fsdp", {"model.remat": "full"}, False),
  ("base", "v5p-8", "dp", {}, False),
  ("big", "v5p-8", "fsdp", {}, False),
  ("base", "v5p-128", "dp", {"data.batch.size": 128, "data.batch.multiple": 64}, False),
  ("big", "v5p-128", "fsdp", {"data.batch.size": 128, "data.batch.multiple": 64}, False),
  ("base", "8xh100", "dp", {}, False),
  ("big", "8xh100", "fsdp", {}, False),
)


def _config(variant: str, rules: str, overrides: dict):
  config = config_lib.load_file(f"{_EXPERIMENTS}:{variant}")
  config.sharding_rules = rules
  config.mesh = (
    {"data": -1, "fsdp": 1, "tensor": 1} if rules == "dp" else {"data": 1, "fsdp": -1, "tensor": 1}
  )
  for path, value in overrides.items():
    section, field = path.split(".")
    config[section][field] = value
  return config_lib.parse(config)


def _gib(value: float) -> str:
  return f"{value / targets.GIB:.1f}"


def row(
  number: int, variant: str, target_name: str, rules: str, overrides: dict, search: bool
) -> str:
  """One markdown row: the report of one compile."""
  target = targets.parse_target(target_name)
  start = time.perf_counter()
  settings = _config(variant, rules, overrides)
  report = programs.compile_experiment(settings, target, find_largest_batch=search).record()
  seconds = time.perf_counter() - start
  train = [p for p in report["programs"] if p["kind"] == "train"]
  worst = max(report["programs"], key=lambda p: p["total_bytes"])
  estimate = train[0]["compiler_estimate"]
  if estimate:
    hours = settings.fit.num_train_steps * estimate["step_seconds"] / 3600
    timing = (
      f"{estimate['step_seconds'] * 1e3:.1f} | {estimate['tokens_per_second']:,.0f} | "
      f"{estimate['mfu']:.0%} | {hours:.1f}"
    )
  else:
    timing = "- | - | - | -"
  largest = report["largest_batch"]
  biggest = f"{largest['field']}={largest['value']}" if largest else ""
  options = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "-"
  return (
    f"| {number} | {variant} | {target_name} | {rules} | {options} | "
    f"{_gib(train[0]['total_bytes'])} | {worst['name']}: {_gib(worst['total_bytes'])} | "
    f"{_gib(report['target']['usable_bytes'])} | {'yes' if report['fits'] else 'no'} | "
    f"{biggest} | {timing} | {report['compile_seconds']:.0f} | {seconds:.0f} |"
  )


def main(argv):
  del argv
  if jax.default_backend() != "cpu":
    raise app.UsageError("run with JAX_PLATFORMS=cpu")
  selected = {int(n) for n in _ROWS.value} or set(range(1, len(PLAN) + 1))
  commit = (
    subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    or "unknown"
  )
  lines = [
    f"Made {datetime.date.today()} at commit {commit} on this machine ({os.cpu_count()} CPU "
    f"cores, load average {os.getloadavg()[0]:.1f} at the start), jax {jax.__version__}, by "
    "`JAX_PLATFORMS=cpu python -m tools.pod_table`.",
    "",
    "| # | model | target | rules | options | train GiB/device | largest program GiB | "
    "usable GiB | fits | largest batch | est. step ms | est. tokens/s | est. MFU | "
    "est. hours for the paper's steps | compile s | wall s |",
    "|" + "---|" * 16,
  ]
  for number, plan in enumerate(PLAN, 1):
    if number in selected:
      logging.info("row %d of %d: %s", number, len(PLAN), json.dumps(plan))
      lines.append(row(number, *plan))
      with open(_OUTPUT.value, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
