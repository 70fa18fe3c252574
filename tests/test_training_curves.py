"""tools/training_curves.py and its command line (tools/compare_training.py): our training and
the PyTorch reference on an experiment's own batches."""

import json

import numpy as np
import pytest

import helpers
from transformer_jax.workdir import Workdir

pytest.importorskip("torch", reason="the PyTorch reference needs torch (the hf extra)")
from tools import training_curves  # pylint: disable=g-import-not-at-top


def test_copied_start_without_dropout_gives_one_curve(shared, tmp_path):
  experiment = helpers.tiny_experiment(shared, model__dropout_rate=0.0)
  out = tmp_path / "curves.json"
  result = training_curves.compare(
    experiment, Workdir(str(shared)), updates=6, reference_init="copied", log_every=4, out=str(out)
  )
  assert result["updates"] == 6 and len(result["tokens"]) == 6
  np.testing.assert_allclose(result["ours"]["loss"], result["reference"]["loss"], rtol=2e-5)
  np.testing.assert_allclose(result["ours"]["nll"], result["reference"]["nll"], rtol=2e-5)
  assert json.loads(out.read_text()) == result  # Written at the end, as at every log_every.


def test_fairseq_start_is_another_run(shared, tmp_path):
  experiment = helpers.tiny_experiment(shared)
  result = training_curves.compare(experiment, Workdir(str(shared)), updates=2)
  ours, theirs = result["ours"]["loss"], result["reference"]["loss"]
  assert ours[0] != pytest.approx(theirs[0], rel=1e-4)
  # Both start near the loss of a uniform prediction over the 200-piece vocabulary.
  assert np.log(200) - 1 < ours[0] < np.log(200) + 2
  assert np.log(200) - 1 < theirs[0] < np.log(200) + 2
  pytest.importorskip("matplotlib")
  training_curves.plot({"ours": ours, "reference": theirs}, str(tmp_path / "curves.png"), smooth=2)
  assert (tmp_path / "curves.png").stat().st_size > 1000


def test_a_device_torch_cannot_reach_stops_the_comparison_before_any_set_up(shared, tmp_path):
  experiment = helpers.tiny_experiment(shared)
  with pytest.raises(ValueError, match="device='gpu7'"):
    training_curves.compare(
      experiment, Workdir(str(tmp_path / "never made")), updates=2, reference_device="gpu7"
    )
  assert not (tmp_path / "never made").exists()


def test_command_line_writes_both_curves(shared, tmp_path):
  out = tmp_path / "curves.json"
  done = helpers.python(
    "-m",
    "tools.compare_training",
    f"--workdir={shared}",
    "--updates=2",
    "--reference_init=copied",
    f"--out={out}",
    *helpers.flags(shared),
    shared=shared,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["updates"] == 2 and result["reference_init"] == "copied"
  assert result["devices"] == {"ours": "cpu:0", "reference": "cpu"}
  bad = helpers.python(
    "-m",
    "tools.compare_training",
    f"--workdir={shared}",
    *helpers.flags(shared),
    "--config.model.d_model=33",
    shared=shared,
  )
  assert bad.returncode != 0 and "error: config.model.d_model must be an even" in bad.stderr
  assert "Traceback" not in bad.stderr
