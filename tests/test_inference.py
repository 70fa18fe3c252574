"""train -> average -> eval -> translate on a tiny run trained once, in this process through the
functions each `--mode` runs (`transformer_jax.experiment`); test_main runs them through the
command line.

References: sacrebleu on the written hypotheses against the split read
straight from the dataset, and the same lines translated in reverse order.
"""

import dataclasses
import json
import logging
import os
import shutil

import pytest

import helpers
from transformer_jax import data
from transformer_jax import experiment as experiment_lib
from transformer_jax.data import sources
from transformer_jax.decode import metrics
from transformer_jax.errors import UserError
from transformer_jax.experiment import Checkpoint
from transformer_jax.workdir import Workdir

pytestmark = pytest.mark.slow

STEPS = 20
# A 1+1-layer model that learns fast, decoded 32 sentences at a time.
OVERRIDES = {
  "model__num_layers": 1,
  "learning_rate": 2.0,
  "decode__batch_size": 32,
  "log_every_steps": 10,
}


@pytest.fixture(scope="module")
def run(shared, tmp_path_factory):
  """A 20-step tiny run of the default experiment evaluated (BLEU) at steps 10 and 20."""
  workdir = tmp_path_factory.mktemp("run")
  experiment = helpers.tiny_experiment(
    shared,
    num_train_steps=STEPS,
    checkpoint_every_steps=10,
    eval_every_steps=10,
    eval_bleu_sentences=16,
    average_last=2,
    **OVERRIDES,
  )
  experiment_lib.train(experiment, Workdir(str(workdir)))
  return {"workdir": workdir, "shared": shared, "experiment": experiment}


def _workdir(run, workdir=None) -> Workdir:
  return Workdir(str(workdir or run["workdir"]))


def test_training_logs_validation_bleu_and_keeps_the_best_parameters(run):
  bleu = helpers.scalars(run["workdir"], "eval_validation/bleu")
  assert sorted(bleu) == [10, STEPS]
  best = json.loads((run["workdir"] / "best.json").read_text())
  assert best["step"] in bleu and best["split"] == "validation" and best["sentences"] == 16
  assert best["bleu"] == pytest.approx(max(bleu.values()), abs=1e-4)
  assert best["search"] == "greedy"
  assert os.listdir(run["workdir"] / "best") == [str(best["step"])]


def test_average_then_eval_write_hypotheses_and_their_bleu(run, caplog):
  workdir, experiment = run["workdir"], run["experiment"]
  averaged = experiment_lib.average(experiment, _workdir(run))
  assert averaged["steps"] == [10, STEPS]
  assert averaged["directory"] == str(workdir / "averaged" / str(STEPS))
  scored = dataclasses.replace(
    experiment, decode=dataclasses.replace(experiment.decode, tokenized_bleu=True, as_is_bleu=True)
  )
  returned = experiment_lib.evaluate_split(scored, _workdir(run), Checkpoint.parse("averaged"))
  assert "could not be restored" not in caplog.text  # Orbax's noise about unread items.
  record = json.loads((workdir / "eval" / "test-averaged-beam4.json").read_text())
  assert record == json.loads(json.dumps(returned))
  hypotheses = (workdir / "eval" / "test-averaged-beam4.txt").read_text().split("\n")
  assert hypotheses.pop() == ""  # Every line ends with a newline.
  split = sources.open_split(helpers.tiny_data_config(run["shared"]), "test")
  references = [target for _, target in split.pairs(range(len(split)))]
  assert len(hypotheses) == len(references) == record["sentences"] == 200
  assert record["bleu"] == pytest.approx(metrics.bleu(hypotheses, references), abs=1e-9)
  assert record["bleu_as_is"] == pytest.approx(metrics.bleu_as_is(hypotheses, references))
  assert record["bleu_tokenized"] == pytest.approx(
    metrics.bleu(hypotheses, references, tokenized=True)
  )
  assert set(record["bleu_methods"]) == {"bleu", "bleu_tokenized", "bleu_as_is"}
  assert record["checkpoint"] == f"averaged 10-{STEPS} (2 checkpoints)"
  assert record["beam_size"] == 4 and record["alpha"] == 0.6 and record["max_extra"] == 50
  assert 1.0 < record["perplexity"] < 200.0


def test_translate_keeps_line_count_and_order_with_empty_and_overlong_lines(run, tmp_path, caplog):
  tokenizer = data.Tokenizer((run["shared"] / "vocab.model").read_bytes())
  split = sources.open_split(helpers.tiny_data_config(run["shared"]), "validation")
  by_length = {}
  for source, _ in split.pairs(range(len(split))):
    by_length.setdefault(len(tokenizer.encode(source)), source)
  sentences = [by_length[n] for n in sorted(by_length)[:6]]  # Distinct lengths: one order.
  overlong = " ".join(s for s, _ in split.pairs(range(20)))
  assert len(tokenizer.encode(overlong)) > 128  # The model's max_len.
  lines = [sentences[0], "", sentences[1], overlong, sentences[2], "  ", *sentences[3:]]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  (tmp_path / "reversed.txt").write_text("\n".join(reversed(lines)) + "\n")
  best = Checkpoint.parse("best")
  with caplog.at_level(logging.WARNING):
    experiment_lib.translate_file(
      run["experiment"],
      _workdir(run),
      best,
      str(tmp_path / "reversed.txt"),
      str(tmp_path / "out.txt"),
    )
  reverse_log = caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    result = experiment_lib.translate_file(
      run["experiment"], _workdir(run), best, str(tmp_path / "in.txt"), str(tmp_path / "fwd.txt")
    )
  forward_log = caplog.text
  assert result["lines"] == len(lines)
  forward_lines = (tmp_path / "fwd.txt").read_text().split("\n")
  assert forward_lines.pop() == ""
  reverse_lines = (tmp_path / "out.txt").read_text().split("\n")
  assert reverse_lines.pop() == ""
  assert len(forward_lines) == len(lines)
  assert forward_lines == reverse_lines[::-1]
  assert [i for i, line in enumerate(forward_lines) if not line] == [1, 5]
  assert "line 4 has" in forward_log and f"line {len(lines) - 3} has" in reverse_log


def test_user_mistakes_give_one_clear_message(run, tmp_path):
  workdir = run["workdir"]
  (tmp_path / "bad.txt").write_bytes(b"a fine line\nnot \xc3\x28 fine\n")
  other_vocab = tmp_path / "vocab150.model"
  data.get_tokenizer(
    helpers.data_config(
      helpers.tiny_data_config(run["shared"]), vocab__path=str(other_vocab), vocab__size=150
    ),
    str(tmp_path),
  )
  other = helpers.tiny_experiment(
    run["shared"], data__vocab__path=other_vocab, data__vocab__size=150, **OVERRIDES
  )
  good = tmp_path / "good.txt"
  good.write_text("a line\n")
  cases = {
    "line 2: not valid UTF-8 (byte 0xc3": (
      run["experiment"],
      workdir,
      "latest",
      tmp_path / "bad.txt",
    ),
    "no checkpoint in": (run["experiment"], tmp_path / "empty", "latest", good),
    "params/embed/embedding: (200, 32) in the checkpoint, (150, 32) expected": (
      other,
      workdir,
      "latest",
      good,
    ),
  }
  for message, (experiment, directory, checkpoint, source) in cases.items():
    with pytest.raises(UserError) as caught:
      experiment_lib.translate_file(
        experiment,
        Workdir(str(directory)),
        Checkpoint.parse(checkpoint),
        str(source),
        str(tmp_path / "out.txt"),
      )
    assert message in str(caught.value), message
  with pytest.raises(UserError, match="--checkpoint='step9' is not understood"):
    Checkpoint.parse("step9")


def _damage_arrays(step_dir):
  """Flip a byte in the middle of every array data file of a checkpoint step."""
  for path in (step_dir / "state").rglob("d/*"):
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x5A
    path.write_bytes(bytes(content))


def test_average_skips_a_broken_checkpoint_and_eval_refuses_it(run, tmp_path, caplog):
  workdir = tmp_path / "copy"
  shutil.copytree(run["workdir"] / "checkpoints", workdir / "checkpoints")
  broken = workdir / "checkpoints" / str(STEPS)
  _damage_arrays(broken)
  with caplog.at_level(logging.WARNING):
    averaged = experiment_lib.average(run["experiment"], Workdir(str(workdir)))
  assert f"not averaging checkpoint {broken}: checkpoint {broken}" in caplog.text
  assert "averaged 1 checkpoints, not config.average_last=2" in caplog.text
  assert averaged["steps"] == [10]
  with pytest.raises(UserError) as caught:
    experiment_lib.evaluate_split(
      run["experiment"], Workdir(str(workdir)), Checkpoint.parse(str(STEPS))
    )
  assert str(caught.value).startswith(f"checkpoint {broken}")
  _damage_arrays(workdir / "checkpoints" / "10")
  with pytest.raises(UserError) as caught:
    experiment_lib.average(run["experiment"], Workdir(str(workdir)))
  assert f"none of the checkpoints 10, {STEPS} in {workdir / 'checkpoints'} reads back" in str(
    caught.value
  )
