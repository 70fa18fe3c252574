"""train -> average -> eval -> translate through the command line, on a tiny run made once.

Every command is a fresh `python -m transformer_jax.main` process on one CPU
device. References: sacrebleu on the written hypotheses against the split
read straight from the dataset, and the same lines translated in reverse order.
"""

import json
import os
import subprocess
import sys

import pytest

from transformer_jax import data, evaluation
from transformer_jax.data import sources
from test_main import ENV, REPO, _scalars

STEPS = 20


def _start(flags, workdir, *extra, stdin=None):
  return subprocess.Popen(
      [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *flags, *extra],
      cwd=REPO, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(process, stdin: bytes = b"", ok=True):
  """(stdout bytes, stderr text) of a process; asserts its exit status is 0 (or not, `ok=False`)."""
  out, err = process.communicate(stdin, timeout=300)
  err = err.decode()
  assert (process.returncode == 0) == ok, err[-4000:]
  return out, err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A 20-step tiny run of the default experiment evaluated (BLEU) at steps 10 and 20."""
  shared = tmp_path_factory.mktemp("shared")
  flags = [
      "--config=experiments/default.py",
      "--config.data.name=embedded_tiny", f"--config.data.data_dir={shared / 'tfds'}",
      f"--config.data.vocab_path={shared / 'vocab.model'}", "--config.data.vocab_size=200",
      "--config.data.batch_mode=packed", "--config.data.batch_size=8",
      "--config.data.max_length=64", "--config.data.max_source_length=64",
      "--config.data.max_target_length=64", "--config.data.eval_batch_size=64",
      "--config.model.num_layers=1", "--config.model.d_model=32", "--config.model.d_ff=64",
      "--config.warmup_steps=10", "--config.learning_rate=2.0",
      "--config.peak_flops_per_device=1e9", "--config.decode.batch_size=32",
  ]
  workdir = tmp_path_factory.mktemp("run")
  _, log = _finish(_start(flags, workdir, "--mode=train", f"--config.num_train_steps={STEPS}",
                          "--config.checkpoint_every_steps=10", "--config.eval_every_steps=10",
                          "--config.eval_bleu_sentences=16", "--config.average_last=2"))
  return {"flags": flags, "workdir": workdir, "shared": shared, "log": log}


def _data_config(shared):
  c = data.default_config()
  c.name, c.data_dir = "embedded_tiny", str(shared / "tfds")
  return c


def test_training_logs_validation_bleu_and_keeps_the_best_parameters(run):
  bleu = _scalars(run["workdir"], "eval_validation/bleu")
  assert sorted(bleu) == [10, STEPS]
  assert "| BLEU " in run["log"]
  best = json.loads((run["workdir"] / "best.json").read_text())
  assert best["step"] in bleu and best["split"] == "validation" and best["sentences"] == 16
  assert best["bleu"] == pytest.approx(max(bleu.values()), abs=1e-4)
  assert best["search"] == "greedy"
  assert os.listdir(run["workdir"] / "best") == [str(best["step"])]


def test_average_then_eval_write_hypotheses_and_their_bleu(run):
  workdir, flags = run["workdir"], run["flags"]
  out, _ = _finish(_start(flags, workdir, "--mode=average", "--config.average_last=2"))
  assert out.decode().startswith(f"averaged steps 10, {STEPS} into ")
  out, _ = _finish(_start(flags, workdir, "--mode=eval", "--checkpoint=averaged"))
  assert out.decode().startswith("test BLEU ")
  record = json.loads((workdir / "eval" / "test-averaged-beam4.json").read_text())
  hypotheses = (workdir / "eval" / "test-averaged-beam4.txt").read_text().split("\n")
  assert hypotheses.pop() == ""  # Every line ends with a newline.
  split = sources.open_split(_data_config(run["shared"]), "test")
  references = [target for _, target in split.pairs(range(len(split)))]
  assert len(hypotheses) == len(references) == record["sentences"] == 200
  assert record["bleu"] == pytest.approx(evaluation.bleu(hypotheses, references), abs=1e-9)
  assert record["checkpoint"] == f"averaged 10-{STEPS} (2 checkpoints)"
  assert record["beam_size"] == 4 and record["alpha"] == 0.6 and record["max_extra"] == 50
  assert 1.0 < record["perplexity"] < 200.0


def test_translate_keeps_line_count_and_order_with_empty_and_overlong_lines(run, tmp_path):
  tokenizer = data.Tokenizer((run["shared"] / "vocab.model").read_bytes())
  split = sources.open_split(_data_config(run["shared"]), "validation")
  by_length = {}
  for source, _ in split.pairs(range(len(split))):
    by_length.setdefault(len(tokenizer.encode(source)), source)
  sentences = [by_length[n] for n in sorted(by_length)[:6]]  # Distinct lengths: one order.
  overlong = " ".join(s for s, _ in split.pairs(range(20)))
  assert len(tokenizer.encode(overlong)) > 128  # The model's max_len.
  lines = [sentences[0], "", sentences[1], overlong, sentences[2], "  ", *sentences[3:]]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  reverse = _start(run["flags"], run["workdir"], "--mode=translate", "--checkpoint=best",
                   f"--output={tmp_path / 'out.txt'}")
  forward = _start(run["flags"], run["workdir"], "--mode=translate", "--checkpoint=best",
                   f"--input={tmp_path / 'in.txt'}")
  _, reverse_log = _finish(reverse, ("\n".join(reversed(lines)) + "\n").encode())
  out, forward_log = _finish(forward)
  forward_lines = out.decode().split("\n")
  assert forward_lines.pop() == ""
  reverse_lines = (tmp_path / "out.txt").read_text().split("\n")
  assert reverse_lines.pop() == ""
  assert len(forward_lines) == len(lines)
  assert forward_lines == reverse_lines[::-1]
  assert [i for i, line in enumerate(forward_lines) if not line] == [1, 5]
  assert "line 4 has" in forward_log and f"line {len(lines) - 3} has" in reverse_log


def test_user_mistakes_give_one_clear_message(run, tmp_path):
  flags, workdir = run["flags"], run["workdir"]
  (tmp_path / "bad.txt").write_bytes(b"a fine line\nnot \xc3\x28 fine\n")
  other_vocab = tmp_path / "vocab150.model"
  c = _data_config(run["shared"])
  c.vocab_path, c.vocab_size = str(other_vocab), 150
  data.get_tokenizer(c, str(tmp_path))
  cases = {
      "line 2: not valid UTF-8 (byte 0xc3": (workdir, f"--input={tmp_path / 'bad.txt'}"),
      "no checkpoint in": (tmp_path / "empty", "--input=-"),
      "--checkpoint='step9' is not understood": (workdir, "--checkpoint=step9"),
      "should have shape (150, 32)": (workdir, f"--config.data.vocab_path={other_vocab}",
                                      "--config.data.vocab_size=150"),
  }
  runs = {message: _start(flags, dir_, "--mode=translate", *extra)
          for message, (dir_, *extra) in cases.items()}
  for message, process in runs.items():
    _, err = _finish(process, b"a line\n", ok=False)
    assert message in err, (message, err[-2000:])
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1].startswith("error: "), err[-2000:]
