"""The experiment benchmark measures every batch mode on the experiment's own data (no timing
asserted)."""

import pytest

import helpers
from tools import experiment_benchmark
from transformer_jax import experiment
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.workdir import Workdir

pytestmark = pytest.mark.slow


def test_experiment_measures_every_batch_mode_on_its_own_data(tmp_path):
  settings = experiment.Experiment(
    model=TransformerConfig(num_layers=1, d_model=32, d_ff=64, num_heads=4, max_len=128),
    data=helpers.data_config(
      source__name="embedded_tiny",
      source__data_dir=str(tmp_path / "tfds"),
      vocab__size=200,
      batch__tokens=512,
      batch__size=8,
      batch__max_length=64,
      batch__max_source_length=64,
      batch__max_target_length=64,
    ),
  )
  results = experiment_benchmark.run_experiment(
    settings, Workdir(str(tmp_path)), steps=3, decode_runs=1
  )
  modes = results["modes"]
  assert list(modes) == ["tokens", "packed", "padded"]
  for figures in modes.values():
    assert figures["steps"] == 3 and figures["shapes"] >= 1
    assert 0 < figures["real_fraction"] <= 1 and figures["tokens_per_s"] > 0 and figures["mfu"] > 0
  assert modes["padded"]["shapes"] == 1, "one fixed shape"
  assert modes["padded"]["real_fraction"] < min(
    modes["tokens"]["real_fraction"], modes["packed"]["real_fraction"]
  )
  table = experiment_benchmark.format_experiment_table(results).splitlines()
  ratio = modes["tokens"]["tokens_per_s"] / modes["padded"]["tokens_per_s"]
  assert table[1].startswith("tokens") and f"{ratio:.2f}" in table[1].split()


@pytest.mark.slow
def test_compile_ahead_times_every_batch_shape_of_the_experiment(tmp_path):
  settings = experiment.Experiment(
    model=TransformerConfig(num_layers=1, d_model=32, d_ff=64, num_heads=4, max_len=64),
    data=helpers.data_config(
      vocab__size=200, batch__tokens=512, batch__max_source_length=24, batch__max_target_length=24
    ),
  )
  results = experiment_benchmark.compile_ahead(settings, threads=2)
  assert [(s["rows"], s["length"]) for s in results["shapes"]] == [(64, 8), (32, 16), (16, 24)]
  assert results["threads"] == 2 and all(s["seconds"] > 0 for s in results["shapes"])
  assert results["wall_seconds"] >= max(s["seconds"] for s in results["shapes"])
  text = experiment_benchmark.format_compile_ahead(results)
  wall = results["wall_seconds"]
  assert text.endswith(f"3 train-step programs in {wall:.1f} s on 2 threads (cpu)")
