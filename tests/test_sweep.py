"""The benchmark's scaling sweep: its grid, table and figure from given records, and one tiny real
sweep in-process and one through the command line (no timing asserted)."""

import json
import struct
import subprocess

import pytest

import helpers
from tools import step_benchmark, sweep
from transformer_jax.errors import UserError

TINY = step_benchmark.Workload(
  dict(vocab_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=2),
  batch=8,
  source_length=8,
  target_length=8,
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def records(step_s=lambda tokens, length: tokens / 1000 * (1 + length / 256)):
  """One record per point of a 2 x 3 grid, shaped as `sweep.run_sweep` makes them."""
  return [
    {
      "tokens": p.tokens,
      "length": p.length,
      "rows": p.rows,
      "step_s": {"median": step_s(p.tokens, p.length)},
      "tokens_per_s": 1.5 * p.tokens / step_s(p.tokens, p.length),
    }
    for p in sweep.grid([1024, 2048], [32, 64, 128], max_len=512)
  ]


def test_batch_rows_are_tokens_over_length_in_ascending_order():
  points = sweep.grid([2048, 1024, 1024], [64, 32], max_len=64)
  assert [(p.tokens, p.length, p.rows) for p in points] == [
    (1024, 32, 32),
    (1024, 64, 16),
    (2048, 32, 64),
    (2048, 64, 32),
  ]


def test_rows_round_down_to_whole_rows_and_a_multiple_of_the_devices():
  assert sweep.grid([100], [16], max_len=64)[0].rows == 6
  assert sweep.grid([100], [16], max_len=64, row_multiple=4)[0].rows == 4


def test_sizes_reads_whole_numbers():
  assert sweep.sizes("sweep_tokens", ["2048", "1024"]) == [2048, 1024]
  with pytest.raises(UserError, match=r"--sweep_tokens: '2k' is not a whole number"):
    sweep.sizes("sweep_tokens", ["1024", "2k"])


@pytest.mark.parametrize(
  "tokens, lengths, row_multiple, message",
  [
    ([0, 1024], [32], 1, "--sweep_tokens: 0 is not positive"),
    ([1024], [-32, 64], 1, "--sweep_lengths: -32 is not positive"),
    ([], [32], 1, "--sweep_tokens is empty"),
    ([1024], [32, 1024], 1, "--sweep_lengths: 1024 is longer than the model's max_len 512"),
    ([1024, 16], [32], 1, "--sweep_tokens: 16 tokens make no batch of 1 row(s) of length 32"),
    ([64], [32], 4, "--sweep_tokens: 64 tokens make no batch of 4 row(s) of length 32"),
  ],
)
def test_grid_rejects_what_makes_no_batch(tokens, lengths, row_multiple, message):
  with pytest.raises(UserError) as error:
    sweep.grid(tokens, lengths, max_len=512, row_multiple=row_multiple)
  assert str(error.value).startswith(message)


def test_table_has_a_row_per_point_with_its_step_time_against_the_smallest():
  lines = sweep.format_table(records(step_s=lambda tokens, length: tokens / 1024 * length / 32))
  assert lines.splitlines()[0].startswith("| tokens per batch (each side) | length | rows |")
  assert len(lines.splitlines()) == 2 + 6
  assert "| 1,024 | 32 | 32 | 1.000 | 1,536 | 1.00 |" in lines
  assert "| 2,048 | 128 | 16 | 8.000 | 384 | 8.00 |" in lines


def test_plot_writes_one_small_png(tmp_path):
  path = tmp_path / "new folder" / "scaling.png"
  sweep.plot(records(), str(path), title="tiny")
  data = path.read_bytes()
  assert data.startswith(PNG_SIGNATURE)
  width, height = struct.unpack(">II", data[16:24])  # The IHDR chunk comes first.
  assert (width, height) == (900, 360)
  assert 10_000 < len(data) < 500_000


@pytest.mark.slow
def test_run_sweep_times_every_point_on_one_state():
  points = sweep.grid([64], [4, 8], max_len=sweep.SWEEP_MAX_LEN, row_multiple=8)
  results = sweep.run_sweep(TINY, points, steps=2, warmup=0, dtype="float32", block=1)
  assert results["config"]["max_len"] == sweep.SWEEP_MAX_LEN
  assert [(r["length"], r["rows"], r["real_tokens_per_step"]) for r in results["points"]] == [
    (4, 16, 16 * 2 * 3),
    (8, 8, 8 * 2 * 6),
  ]
  for r in results["points"]:
    step = r["step_s"]
    assert 0 < step["min"] <= step["median"] <= step["max"] and r["first_step_s"] > 0
    assert r["tokens_per_s"] == pytest.approx(r["real_tokens_per_step"] / step["median"])
  json.dumps(results)


def bench(*flags, cwd) -> subprocess.CompletedProcess:
  return helpers.python("-m", "tools.benchmark", *flags, cwd=cwd)


@pytest.mark.slow
def test_the_command_line_sweeps_and_draws(tmp_path):
  result = bench(
    "--config=small",
    "--sweep_tokens=16",
    "--sweep_lengths=8",
    "--steps=1",
    "--warmup=0",
    "--block=1",
    "--plot=figure/scaling.png",
    "--json=results.json",
    cwd=tmp_path,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "| 16 | 8 | 2 |" in result.stdout
  points = json.loads((tmp_path / "results.json").read_text())["points"]
  assert [(p["tokens"], p["length"], p["rows"]) for p in points] == [(16, 8, 2)]
  assert (tmp_path / "figure" / "scaling.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.slow
@pytest.mark.parametrize(
  "flags, message",
  [
    (["--sweep_lengths=32,1024"], "error: --sweep_lengths: 1024 is longer than the model's"),
    (["--sweep", "--sweep_tokens=1k"], "error: --sweep_tokens: '1k' is not a whole number"),
    (["--plot=scaling.png"], "error: --plot draws the sweep's figure"),
  ],
)
def test_a_bad_sweep_ends_in_one_error_line_before_any_timing(tmp_path, flags, message):
  result = bench("--config=small", *flags, cwd=tmp_path)
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
  assert errors[0].startswith(message), errors
  assert "Traceback" not in result.stderr and "sweep point" not in result.stderr
  assert not list(tmp_path.iterdir())
