"""The benchmark's scaling sweep: its grid of batch shapes, and its table and figure of step times.

A point of the grid is `tokens` per batch on each side (source tokens =
target tokens, padding included, as `data.batch.tokens` counts them) in
rows of `length` source and `length` target tokens. `run_sweep` times the
train step at each point and returns one record (a dict) per point; the table
and the figure are drawn from such records alone.
"""

import dataclasses
import importlib
import logging
import pathlib
from collections.abc import Sequence

import jax

from tools import step_benchmark
from tools.timing import real_tokens, summary, time_alternating
from transformer_jax.errors import UserError
from transformer_jax.model.transformer import TransformerConfig

log = logging.getLogger(__name__)

DEFAULT_TOKENS = (1024, 2048, 4096)
DEFAULT_LENGTHS = (32, 64, 128, 256)
MATPLOTLIB_HINT = "pip install -e '.[bench]' (or '.[test]'), or --plot= for no figure"
# The sweep's model keeps TransformerConfig's default positional table, the same at every point.
SWEEP_MAX_LEN = TransformerConfig.max_len


@dataclasses.dataclass(frozen=True)
class Point:
  """A batch of `rows` pairs of `length` + `length` tokens, from `tokens` asked for per side."""

  tokens: int
  length: int
  rows: int


def sizes(flag: str, values: Sequence[str]) -> list[int]:
  """The whole numbers of list flag `--flag` (UserError naming the flag for anything else)."""
  numbers = []
  for value in values:
    try:
      numbers.append(int(value))
    except ValueError:
      raise UserError(f"--{flag}: {value!r} is not a whole number") from None
  return numbers


def grid(
  tokens: Sequence[int], lengths: Sequence[int], *, max_len: int, row_multiple: int = 1
) -> list[Point]:
  """Every (tokens, length) point, ascending, tokens major.

  A point has tokens // length rows, rounded down to a multiple of
  `row_multiple` (the data-parallel devices). UserError for an empty or
  non-positive value, a length over `max_len`, or tokens that fill no rows.
  """
  for flag, values in (("sweep_tokens", tokens), ("sweep_lengths", lengths)):
    if not values:
      raise UserError(f"--{flag} is empty")
    if min(values) <= 0:
      raise UserError(f"--{flag}: {min(values)} is not positive")
  if max(lengths) > max_len:
    raise UserError(f"--sweep_lengths: {max(lengths)} is longer than the model's max_len {max_len}")
  points = []
  for count in sorted(set(tokens)):
    for length in sorted(set(lengths)):
      rows = count // length // row_multiple * row_multiple
      if not rows:
        raise UserError(
          f"--sweep_tokens: {count} tokens make no batch of {row_multiple} row(s) of length "
          f"{length} (tokens per side: rows = tokens / length, a multiple of the "
          f"{row_multiple} device(s))"
        )
      points.append(Point(count, length, rows))
  return points


def run_sweep(
  workload: step_benchmark.Workload,
  points: list[Point],
  *,
  steps: int,
  warmup: int,
  dtype: str,
  scan_layers: bool = False,
  remat: str = "none",
  block: int = 5,
) -> dict:
  """The train step of `workload`'s model timed as `step_benchmark.run` times it, on a synthetic
  batch of each of `points` (`grid`) in turn; one state trains throughout, each point's first
  step compiles. Returns the results as a JSON-ready dict, one record per point in "points"."""
  cfg = step_benchmark.model_config(
    workload, dtype=dtype, scan_layers=scan_layers, remat=remat, max_len=SWEEP_MAX_LEN
  )
  trainer = step_benchmark.paper_trainer(cfg)
  state = trainer.init()
  records = []
  for index, point in enumerate(points):
    log.info("sweep point %d of %d: %s", index + 1, len(points), point)
    shape = dataclasses.replace(
      workload, batch=point.rows, source_length=point.length, target_length=point.length
    )
    batch = step_benchmark.synthetic_batch(shape, cfg.vocab_size)

    def step(batch=batch):
      nonlocal state
      state, metrics = trainer.train_step(state, batch)
      return metrics["loss"]

    first, times = time_alternating({"step": step}, steps=steps, warmup=warmup, block=block)
    step_s, tokens = summary(times["step"]), real_tokens(batch)
    records.append(
      {
        **dataclasses.asdict(point),
        "real_tokens_per_step": tokens,
        "first_step_s": first["step"],
        "step_s": step_s,
        "tokens_per_s": tokens / step_s["median"],
      }
    )
  return {
    "config": cfg.record(),
    "device": str(jax.local_devices()[0].device_kind),
    "devices": jax.device_count(),
    "steps": steps,
    "warmup": warmup,
    "points": records,
  }


def format_table(records: Sequence[dict]) -> str:
  """A markdown table of the records, with each median step time against the smallest point's."""
  smallest = min(records, key=lambda r: (r["tokens"], r["length"]))["step_s"]["median"]
  lines = [
    "| tokens per batch (each side) | length | rows | step, median (s) | real tokens/s "
    "| step vs smallest |",
    "|---:|---:|---:|---:|---:|---:|",
  ]
  for r in records:
    median = r["step_s"]["median"]
    lines.append(
      f"| {r['tokens']:,} | {r['length']} | {r['rows']} | {median:.3f} | "
      f"{r['tokens_per_s']:,.0f} | {median / smallest:.2f} |"
    )
  return "\n".join(lines)


def require_matplotlib() -> None:
  """UserError unless matplotlib can be imported (checked before minutes of measuring)."""
  try:
    importlib.import_module("matplotlib")
  except ImportError:
    raise UserError(f"--plot needs matplotlib: {MATPLOTLIB_HINT}") from None


def _series(records, key: str, x: str) -> dict[int, tuple[list[int], list[float]]]:
  """{value of `key`: (its records' `x` values, their median step times)}, ascending."""
  series = {}
  for r in sorted(records, key=lambda r: (r[key], r[x])):
    xs, ys = series.setdefault(r[key], ([], []))
    xs.append(r[x])
    ys.append(r["step_s"]["median"])
  return series


def plot(records: Sequence[dict], path: str, *, title: str = "") -> None:
  """Write a PNG of median step time against length (a line per tokens per batch) and against
  tokens per batch (a line per length), both on log scales; makes the folder if needed."""
  # The Agg canvas directly: no pyplot, so no display and no global figure state.
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  figure = Figure(figsize=(9, 3.6), dpi=100, layout="constrained")
  FigureCanvasAgg(figure)
  panels = figure.subplots(1, 2)
  for axes, key, x, label, legend in (
    (panels[0], "tokens", "length", "length (tokens per row)", "{:,} tokens"),
    (panels[1], "length", "tokens", "tokens per batch (each side)", "length {}"),
  ):
    for value, (xs, ys) in _series(records, key, x).items():
      axes.plot(xs, ys, marker="o", label=legend.format(value))
    ticks = sorted({r[x] for r in records})
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(ticks, labels=[f"{t:,}" for t in ticks])
    axes.xaxis.set_minor_locator(ticker.NullLocator())
    axes.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 3, 5)))
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xlabel(label)
    axes.set_ylabel("train step, median (s)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
  if title:
    figure.suptitle(title, fontsize="medium")
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  figure.savefig(path, format="png")
