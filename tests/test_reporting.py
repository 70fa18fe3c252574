"""Run reporting: the log line's figures, MFU against a peak measured too low, and the sums of a
loss of its own."""

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


def test_a_loss_of_its_own_sums_gets_each_per_token_and_no_figure_it_lacks(tmp_path, caplog):
  caplog.set_level(logging.INFO)
  sums = {"loss": 20.0, "correct": 4.0, "tokens": 10.0, "grad_norm": 2.0, "nonfinite": 0.0}
  logger = _logger(tmp_path, 1e3, False)
  scalars = logger.train(2, sums, 2, 1.0)
  assert scalars["loss"] == 2.0 and scalars["correct"] == 0.4  # Per target token.
  assert not {"nll", "perplexity", "source_tokens_per_s", "mfu"} & set(scalars)
  assert (
    "step 2/10 | loss 2.0000 | lr" in caplog.text and "tok/s | 0.500 s/step | ETA" in caplog.text
  )
  assert logger.evaluation(2, "dev", {"loss": 5.0, "tokens": 10.0}) == {"loss": 0.5}
  logger.close(2, seconds=1.0, steps=2, checkpoints="nowhere")
  assert "last train loss 2.0000; dev loss 0.5000; checkpoints in nowhere" in caplog.text
