"""The device report's own checks: the fused attention against the reference (failing on a wrong
kernel), the packed batches its train steps run on, and the count of the device tests' outcomes."""

import jax
import numpy as np
import pytest

from tools.device_report import correctness, speed
from transformer_jax.conventions import EOS_ID

SHAPE = (2, 32, 2, 16)


@pytest.mark.device
def test_the_fused_attention_matches_the_reference_on_this_platform():
  record = correctness.check_attention(SHAPE, jax.default_backend())
  assert record["ok"], record
  for case in record["cases"].values():
    assert case["output_error"] < correctness.OUTPUT_TOLERANCE and case["finite"]
    assert case["empty_rows"] > 0 and case["empty_rows_zero"] and case["empty_rows_zero_dq"]
  if jax.default_backend() == "gpu":
    assert record["implementation"] == "cudnn" and record["cudnn_calls_in_hlo"] >= 2


@pytest.mark.device
def test_the_check_fails_on_a_fused_kernel_that_is_slightly_wrong(monkeypatch):
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(
    jax.nn, "dot_product_attention", lambda q, k, v, **kw: fused(q, k, v, **kw) * 1.05
  )
  record = correctness.check_attention(SHAPE, jax.default_backend())
  assert not record["ok"]
  assert all(
    case["output_error"] > correctness.OUTPUT_TOLERANCE for case in record["cases"].values()
  )


def test_packed_batches_keep_each_pair_whole_and_fill_most_of_a_row():
  batch = speed.packed_batch(104, 256, 37000, seed=3)
  for side in ("inputs", "targets"):
    tokens, segments = batch[side], batch[f"{side}_segmentation"]
    positions = batch[f"{side}_position"]
    for row in range(104):
      ids = segments[row][segments[row] > 0]
      assert np.all(np.diff(ids) >= 0) and ids[0] == 1  # Pairs in order, then padding.
      assert not np.any(segments[row][len(ids) :])
      for segment in np.unique(ids):
        where = np.flatnonzero(segments[row] == segment)
        assert 8 <= len(where) <= 64 and np.all(positions[row, where] == np.arange(len(where)))
        assert tokens[row, where[-1]] == EOS_ID and np.all(tokens[row, where[:-1]] > EOS_ID)
      assert np.all(tokens[row][segments[row] == 0] == 0)
    assert np.mean(segments > 0) > 0.85
  assert np.array_equal(batch["inputs_segmentation"].max(1), batch["targets_segmentation"].max(1))


def test_the_device_tests_outcomes_are_counted_as_they_end(tmp_path):
  tests = tmp_path / "test_sample.py"
  tests.write_text(
    "import pytest\n\n"
    "def test_passes():\n  pass\n\n"
    "def test_fails():\n  assert 1 == 2, 'one is not two'\n\n"
    "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n  pass\n\n"
    "@pytest.fixture\ndef broken():\n  raise RuntimeError('set-up')\n\n"
    "def test_errors(broken):\n  pass\n"
  )
  record = correctness.run_device_tests(
    [str(tests), "-p", "no:randomly"], 120, tmp_path / "log.jsonl", 60, "cpu"
  )
  assert record["status"] == "finished" and record["exit_status"] == 1
  assert record["collected"] == 4
  assert record["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 1}
  assert [f["test"].split("::")[1] for f in record["failures"]] == ["test_fails", "test_errors"]
  assert "one is not two" in record["failures"][0]["message"]


def test_a_stopped_test_run_still_counts_what_ended(tmp_path):
  tests = tmp_path / "test_slow.py"
  tests.write_text(
    "import time\n\ndef test_quick():\n  pass\n\ndef test_slow():\n  time.sleep(60)\n"
  )
  record = correctness.run_device_tests([str(tests)], 8, tmp_path / "log.jsonl", 60, "cpu")
  assert record["status"] == "stopped after 8 s" and record["exit_status"] is None
  assert record["collected"] == 2 and record["counts"] == {"passed": 1}
