"""The experiment from Python: docs/library.md's example runs as written, on the tiny corpus; the
checkpoint a trained model is loaded from; the trainer's schedule."""

import pytest

import helpers
from helpers import code_block
from transformer_jax import experiment
from transformer_jax.errors import UserError
from transformer_jax.train import objective
from transformer_jax.workdir import Workdir


def _example() -> str:
  """The code block of the "From Python" section of docs/library.md."""
  return code_block("docs/library.md", "### From Python\n")


@pytest.mark.slow
@pytest.mark.device
def test_the_library_docs_example_trains_translates_and_leaves_its_checkpoints(
  shared, tmp_path, capfd
):
  code = _example()
  tiny = (
    f'source=data.SourceSettings(name="embedded_tiny", data_dir={str(shared / "tfds")!r}), '
    f"vocab=data.VocabSettings(size=200, path={str(shared / 'vocab.model')!r})"
  )
  for old, new in (
    ('source=data.SourceSettings(name="embedded")', tiny),
    ('"/tmp/transformer_jax_from_python"', repr(str(tmp_path))),
  ):
    assert code.count(old) == 1, old
    code = code.replace(old, new)
  assert len(code.strip().splitlines()) < 20
  exec(compile(code, "docs/library.md", "exec"), {})  # pylint: disable=exec-used
  lines = capfd.readouterr().out.splitlines()[-3:]  # After what TFDS prints on first use.
  assert all(" -> " in line for line in lines), lines
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["10", "20"]
  assert (tmp_path / "tensorboard").is_dir() and (tmp_path / "config.txt").exists()


def test_checkpoint_names_parse_and_anything_else_is_refused():
  assert experiment.Checkpoint.parse("800") == experiment.Checkpoint("step", 800)
  assert experiment.Checkpoint.parse("latest") == experiment.Checkpoint()
  workdir = Workdir("/runs/base")
  assert experiment.Checkpoint.parse("averaged").directory(workdir) == "/runs/base/averaged"
  assert experiment.Checkpoint.parse("best").directory(workdir) == "/runs/base/best"
  assert experiment.Checkpoint.parse("12").directory(workdir) == "/runs/base/checkpoints"
  with pytest.raises(UserError, match="--checkpoint='step9' is not understood; allowed: latest"):
    experiment.Checkpoint.parse("step9")
  for name, step in (("step", None), ("latest", 3), ("newest", None)):
    with pytest.raises(ValueError, match="is not a checkpoint"):
      experiment.Checkpoint(name, step)


def test_the_trainer_takes_the_cooldown_to_the_runs_last_step(tmp_path):
  settings = helpers.tiny_experiment(tmp_path, num_train_steps=50, cooldown_steps=10)
  _, schedule = experiment.make_trainer(settings, vocab_size=40)
  paper = objective.learning_rate_schedule(
    d_model=settings.model.d_model,
    warmup_steps=settings.optimizer.warmup_steps,
    scale=settings.optimizer.learning_rate,
  )
  for count, factor in ((39, 1.0), (40, 1.0), (45, 0.5), (49, 0.1)):
    assert float(schedule(count)) == pytest.approx(float(paper(count)) * factor, rel=1e-6)
