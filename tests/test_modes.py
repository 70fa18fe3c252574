"""train -> average -> eval -> translate through the command line, on a tiny run made once.

Every command is a fresh `python -m transformer_jax.main` process on one CPU
device (`helpers.Run`). References: sacrebleu on the written hypotheses
against the split read straight from the dataset, and the same lines
translated in reverse order.
"""

import dataclasses
import json
import os
import shutil

import pytest

import helpers
from transformer_jax import data
from transformer_jax.data import sources
from transformer_jax.decode import metrics

STEPS = 20
# A 1+1-layer model that learns fast, decoded 32 sentences at a time.
OVERRIDES = {"model__num_layers": 1, "learning_rate": 2.0, "decode__batch_size": 32,
             "log_every_steps": 10}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A 20-step tiny run of the default experiment evaluated (BLEU) at steps 10 and 20."""
  shared = helpers.shared_dir(tmp_path_factory)
  workdir = tmp_path_factory.mktemp("run")
  log = helpers.Run(shared, workdir, "--mode=train", num_train_steps=STEPS,
                    checkpoint_every_steps=10, eval_every_steps=10, eval_bleu_sentences=16,
                    average_last=2, **OVERRIDES).succeed()
  return {"workdir": workdir, "shared": shared, "log": log}


def _mode(run, *extra, workdir=None, stdin=None):
  return helpers.Run(run["shared"], workdir or run["workdir"], *extra, stdin=stdin, **OVERRIDES)


def test_training_logs_validation_bleu_and_keeps_the_best_parameters(run):
  bleu = helpers.scalars(run["workdir"], "eval_validation/bleu")
  assert sorted(bleu) == [10, STEPS]
  assert "| BLEU " in run["log"]
  best = json.loads((run["workdir"] / "best.json").read_text())
  assert best["step"] in bleu and best["split"] == "validation" and best["sentences"] == 16
  assert best["bleu"] == pytest.approx(max(bleu.values()), abs=1e-4)
  assert best["search"] == "greedy"
  assert os.listdir(run["workdir"] / "best") == [str(best["step"])]


def test_average_then_eval_write_hypotheses_and_their_bleu(run):
  workdir = run["workdir"]
  average = _mode(run, "--mode=average", "--config.average_last=2")
  average.succeed()
  assert average.stdout.decode().startswith(f"averaged steps 10, {STEPS} into ")
  evaluation = _mode(run, "--mode=eval", "--checkpoint=averaged")
  log = evaluation.succeed()
  assert evaluation.stdout.decode().startswith("test BLEU ")
  assert "could not be restored" not in log  # Orbax's noise about unread items.
  record = json.loads((workdir / "eval" / "test-averaged-beam4.json").read_text())
  hypotheses = (workdir / "eval" / "test-averaged-beam4.txt").read_text().split("\n")
  assert hypotheses.pop() == ""  # Every line ends with a newline.
  split = sources.open_split(helpers.tiny_data_config(run["shared"]), "test")
  references = [target for _, target in split.pairs(range(len(split)))]
  assert len(hypotheses) == len(references) == record["sentences"] == 200
  assert record["bleu"] == pytest.approx(metrics.bleu(hypotheses, references), abs=1e-9)
  assert record["checkpoint"] == f"averaged 10-{STEPS} (2 checkpoints)"
  assert record["beam_size"] == 4 and record["alpha"] == 0.6 and record["max_extra"] == 50
  assert 1.0 < record["perplexity"] < 200.0


def test_translate_keeps_line_count_and_order_with_empty_and_overlong_lines(run, tmp_path):
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
  reverse = _mode(run, "--mode=translate", "--checkpoint=best", f"--output={tmp_path / 'out.txt'}",
                  stdin=("\n".join(reversed(lines)) + "\n").encode())
  forward = _mode(run, "--mode=translate", "--checkpoint=best", f"--input={tmp_path / 'in.txt'}")
  reverse_log, forward_log = reverse.succeed(), forward.succeed()
  forward_lines = forward.stdout.decode().split("\n")
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
  data.get_tokenizer(dataclasses.replace(helpers.tiny_data_config(run["shared"]),
                                         vocab_path=str(other_vocab), vocab_size=150),
                     str(tmp_path))
  cases = {
      "line 2: not valid UTF-8 (byte 0xc3": (workdir, f"--input={tmp_path / 'bad.txt'}"),
      "no checkpoint in": (tmp_path / "empty", "--input=-"),
      "--checkpoint='step9' is not understood": (workdir, "--checkpoint=step9"),
      "params/embed/embedding: (200, 32) in the checkpoint, (150, 32) expected": (
          workdir, f"--config.data.vocab_path={other_vocab}", "--config.data.vocab_size=150"),
  }
  runs = {message: _mode(run, "--mode=translate", *extra, workdir=dir_, stdin=b"a line\n")
          for message, (dir_, *extra) in cases.items()}
  for message, process in runs.items():
    assert message in process.fail(), (message, process.output[-2000:])


def _damage_arrays(step_dir):
  """Flip a byte in the middle of every array data file of a checkpoint step."""
  for path in (step_dir / "state").rglob("d/*"):
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x5A
    path.write_bytes(bytes(content))


def test_average_skips_a_broken_checkpoint_and_eval_refuses_it(run, tmp_path):
  workdir = tmp_path / "copy"
  shutil.copytree(run["workdir"] / "checkpoints", workdir / "checkpoints")
  broken = workdir / "checkpoints" / str(STEPS)
  _damage_arrays(broken)
  average = _mode(run, "--mode=average", "--config.average_last=2", workdir=workdir)
  log = average.succeed()
  assert f"not averaging checkpoint {broken}: checkpoint {broken}" in log
  assert "averaged 1 checkpoints, not config.average_last=2" in log
  assert average.stdout.decode().startswith("averaged steps 10 into ")
  evaluation = _mode(run, "--mode=eval", f"--checkpoint={STEPS}", workdir=workdir)
  assert evaluation.fail().startswith(f"error: checkpoint {broken}")
  _damage_arrays(workdir / "checkpoints" / "10")
  error = _mode(run, "--mode=average", workdir=workdir).fail()
  assert f"none of the checkpoints 10, {STEPS} in {workdir / 'checkpoints'} reads back" in error
