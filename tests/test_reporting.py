"""Run reporting: the log line's figures, and MFU against a peak measured too low."""

import logging

from transformer_jax.train.reporting import TrainLogger

SUMS = {"loss": 20.0, "nll": 18.0, "tokens": 10.0, "source_tokens": 12.0, "grad_norm": 2.0}


def _logger(tmp_path, peak_flops, peak_measured):
  return TrainLogger(
    str(tmp_path / "tensorboard"),
    total_steps=10,
    start_step=0,
    learning_rate_fn=lambda step: 1e-3,
    peak_flops=peak_flops,
    peak_measured=peak_measured,
  )


def test_the_line_gives_speed_mfu_and_eta(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  scalars = _logger(tmp_path, 1e3, False).train(2, {**SUMS, "flops": 500.0}, 2, 1.0)
  assert scalars["mfu"] == 0.5 and scalars["tokens_per_s"] == 10.0
  assert "10 tok/s | 0.500 s/step | MFU 50.0% | ETA 0:00:04" in caplog.text


def test_outrunning_a_measured_peak_warns_once_and_a_given_peak_never(tmp_path, caplog):
  fast = {**SUMS, "flops": 3000.0}
  measured = _logger(tmp_path, 1e3, True)
  for step in (1, 2, 3):
    measured.train(step, fast, 1, 1.0)
  warnings = [r for r in caplog.records if "measured at start-up" in r.getMessage()]
  assert len(warnings) == 1 and "MFU 300%" in warnings[0].getMessage()
  assert "--config.peak_flops_per_device" in warnings[0].getMessage()
  caplog.clear()
  _logger(tmp_path / "given", 1e3, False).train(1, fast, 1, 1.0)
  assert "measured at start-up" not in caplog.text
