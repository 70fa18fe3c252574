"""The record of the best validation BLEU (best.json): absent, read back, or unreadable."""

import pytest

from transformer_jax import fileio
from transformer_jax.errors import UserError
from transformer_jax.train import validation
from transformer_jax.workdir import Workdir


def test_best_json_is_read_back_and_a_broken_one_is_one_clear_error(tmp_path):
  workdir = Workdir(str(tmp_path))
  assert validation.read_best(workdir) is None
  record = {
    "step": 40,
    "bleu": 12.5,
    "split": "validation",
    "sentences": 16,
    "search": "greedy",
    "alpha": 0.6,
    "checkpoint": f"{tmp_path}/best/40",
  }
  fileio.write_json(workdir.best_json, record)
  assert validation.read_best(workdir) == record
  (tmp_path / "best.json").write_text('{"step": 40, "bl')  # Cut short.
  with pytest.raises(UserError, match=r"best.json is not valid JSON: .*; remove it"):
    validation.read_best(workdir)
