"""End to end through the command line, on a test-sized override of experiments/default.py.

Every run is a fresh `python -m transformer_jax.main` process on one CPU
device; losses are read back from the TensorBoard event files it writes.
"""

import glob
import os
import pathlib
import signal
import struct
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
from tensorboardX.proto import event_pb2

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
           PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


@pytest.fixture(scope="module")
def flags(tmp_path_factory):
  """Flags for a tiny run of the default experiment: the tiny embedded corpus, packed rows,
  a 2+2-layer d_model-32 model, no evaluation; corpus and vocabulary are shared by all runs."""
  shared = tmp_path_factory.mktemp("shared")
  return [
      "--config=experiments/default.py",
      "--config.data.name=embedded_tiny", f"--config.data.data_dir={shared / 'tfds'}",
      f"--config.data.vocab_path={shared / 'vocab.model'}", "--config.data.vocab_size=200",
      "--config.data.batch_mode=packed", "--config.data.batch_size=8",
      "--config.data.max_length=64", "--config.data.max_source_length=64",
      "--config.data.max_target_length=64",
      "--config.model.num_layers=2", "--config.model.d_model=32", "--config.model.d_ff=64",
      "--config.warmup_steps=10", "--config.log_every_steps=1",
      "--config.peak_flops_per_device=1e9", "--config.eval_every_steps=0",
  ]


def _main(flags, workdir, *extra):
  return subprocess.Popen(
      [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *flags, *extra],
      cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process, timeout=300):
  output, _ = process.communicate(timeout=timeout)
  assert process.returncode == 0, output[-4000:]
  return output


def _scalars(workdir, tag):
  """{step: value} of one TensorBoard scalar, from every event file of the run."""
  values = {}
  for path in sorted(glob.glob(f"{workdir}/tensorboard/events.out.tfevents.*")):
    with open(path, "rb") as f:
      while header := f.read(12):  # uint64 length, uint32 length CRC
        record = f.read(struct.unpack("<Q", header[:8])[0])
        f.read(4)  # data CRC
        event = event_pb2.Event.FromString(record)
        values.update({event.step: v.simple_value for v in event.summary.value if v.tag == tag})
  return values


def _checkpoint(workdir, step):
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.join(workdir, "checkpoints", str(step), "state"))


def test_the_default_experiment_learns(flags, tmp_path):
  output = _finish(_main(flags, tmp_path, "--config.num_train_steps=40",
                         "--config.learning_rate=2.0", "--config.eval_every_steps=40"))
  losses = _scalars(tmp_path, "train/loss")
  assert sorted(losses) == list(range(1, 41))
  # From above log(vocab) at the start to well below it (the unigram level) in 40 steps.
  first, last = losses[1], np.mean([losses[s] for s in range(36, 41)])
  assert first > np.log(200) and last < first - 0.8, (first, last)
  assert set(_scalars(tmp_path, "eval_validation/perplexity")) == {40}
  assert "ETA" in output and "MFU" in output and "done: step 40/40" in output
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["40"]


def test_three_steps_then_a_restart_equal_six_straight(flags, tmp_path):
  straight, split = tmp_path / "straight", tmp_path / "split"
  runs = [_main(flags, straight, "--config.num_train_steps=6"),
          _main(flags, split, "--config.num_train_steps=3")]
  for run in runs:
    _finish(run)
  output = _finish(_main(flags, split, "--config.num_train_steps=6"))
  assert "resumed from" in output and "at step 3" in output
  straight_losses, split_losses = (_scalars(d, "train/loss") for d in (straight, split))
  assert sorted(straight_losses) == sorted(split_losses) == list(range(1, 7))
  for step in range(1, 7):
    assert split_losses[step] == straight_losses[step], step
  a, b = _checkpoint(straight, 6), _checkpoint(split, 6)
  assert int(a["step"]) == int(b["step"]) == 6
  for x, y in zip(_leaves(a), _leaves(b)):
    np.testing.assert_array_equal(x, y)


def _leaves(tree):
  if isinstance(tree, dict):
    return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
  if isinstance(tree, (list, tuple)):
    return [leaf for item in tree for leaf in _leaves(item)]
  return [np.asarray(tree)]


def test_sigterm_saves_a_checkpoint_and_stops(flags, tmp_path):
  run = _main(flags, tmp_path, "--config.num_train_steps=100000",
              "--config.checkpoint_every_steps=100000")
  lines = []
  for line in run.stdout:
    lines.append(line)
    if "step 3/100000" in line:
      run.send_signal(signal.SIGTERM)
      break
  output = "".join(lines) + _finish(run)
  assert "stopped at step" in output
  steps = [int(s) for s in os.listdir(tmp_path / "checkpoints")]
  assert len(steps) == 1 and 3 <= steps[0] < 100000


def test_bad_flags_fail_before_compiling(flags, tmp_path):
  cases = {
      "--config.num_train_steps=0": "config.num_train_steps must be a positive integer; got 0",
      "--config.mesh.data=3": "needs 3 devices but 1 are present",
      "--config.data.batch_mode=rows": "config.data.batch_mode='rows' is invalid",
      "--config.num_train_step=5": "num_train_step",
  }
  runs = {flag: _main(flags, tmp_path / str(i), flag) for i, flag in enumerate(cases)}
  for flag, run in runs.items():
    output, _ = run.communicate(timeout=120)
    assert run.returncode != 0, flag
    assert cases[flag] in output, (flag, output[-2000:])
    assert "compiling" not in output
