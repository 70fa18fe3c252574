"""The train-step benchmark runs end to end on a tiny workload and reports consistent figures (no
timing asserted)."""

import numpy as np
import pytest

import helpers
from tools import step_benchmark

TINY = step_benchmark.Workload(
  dict(vocab_size=64, num_layers=1, d_model=32, d_ff=64, num_heads=2),
  batch=8,
  source_length=8,
  target_length=12,
)


def test_synthetic_batch_is_three_quarters_real_tokens():
  batch = step_benchmark.synthetic_batch(TINY, vocab_size=64)
  assert batch["inputs"].shape == (8, 8) and batch["targets"].shape == (8, 12)
  assert np.all((batch["inputs"] != 0).sum(1) == 6) and np.all((batch["targets"] != 0).sum(1) == 9)
  np.testing.assert_array_equal(batch["targets_segmentation"], batch["targets"] != 0)
  np.testing.assert_array_equal(batch["inputs_position"][0], [0, 1, 2, 3, 4, 5, 0, 0])


@pytest.mark.slow
@pytest.mark.parametrize("vs", [None, "torch"])
def test_run_reports_every_figure(vs):
  if vs:
    pytest.importorskip("torch")
  results = step_benchmark.run(
    TINY, steps=3, warmup=0, decode_runs=1, dtype="float32", vs=vs, block=2
  )
  assert results["real_tokens_per_step"] == 8 * (6 + 9)
  assert results["train_flops_per_step"] > 0 and results["matmul_flops_per_s"] > 0
  for name in ("ours", "torch") if vs else ("ours",):
    figures = results[name]
    assert 0 < figures["step_s"]["min"] <= figures["step_s"]["median"] <= figures["step_s"]["max"]
    assert figures["tokens_per_s"] == pytest.approx(120 / figures["step_s"]["median"])
    assert figures["mfu"] > 0
  for search in ("beam4", "greedy"):
    assert results["ours"]["decode_s"][search]["median"] > 0
  table = step_benchmark.format_table(results)
  assert "train step, median (s)" in table and ("ours/torch" in table) == bool(vs)


def test_the_torch_model_drops_where_ours_does_at_our_rates():
  torch = pytest.importorskip("torch")
  from tools import torch_reference  # pylint: disable=g-import-not-at-top

  config = helpers.tiny_model_config(
    dropout_rate=0.3,
    attention_dropout_rate=0.1,
    activation_dropout_rate=0.2,
    num_layers=3,
    num_decoder_layers=1,
  )
  model = torch_reference._TorchTransformer(torch, config)  # pylint: disable=protected-access
  encoder, decoder = model.core.encoder.layers, model.core.decoder.layers
  assert (len(encoder), len(decoder)) == (3, 1)
  for layer in (*encoder, *decoder):
    assert (layer.self_attn.dropout, layer.dropout.p, layer.dropout1.p) == (0.1, 0.2, 0.3)
  assert all(layer.multihead_attn.dropout == 0.1 for layer in decoder)
