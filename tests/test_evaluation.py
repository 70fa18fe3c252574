"""BLEU vs sacrebleu's command line, tokenization vs hand-tokenized text, perplexity vs numpy."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import evaluation

HYPOTHESES = [
    "Die Katze sitzt auf der Matte.",
    "Das ist ein Ende-zu-Ende-Test, oder?",
    'Er sagte: "Hallo Welt!"',
    "Der 3-D-Drucker kostet 1.000,50 Euro.",
    "kurz",
]
REFERENCES = [
    "Die Katze saß auf der Matte.",
    "Dies ist ein Ende-zu-Ende-Test, nicht wahr?",
    'Er sagte: "Hallo, Welt!"',
    "Der 3-D-Drucker kostet 1.000,50 Euro.",
    "ganz kurz",
]
# The same lines tokenized by hand: punctuation split off (not inside numbers,
# a dash after a digit split), then hyphenated compounds split with ##AT##.
HYPOTHESES_TOKENIZED = [
    "Die Katze sitzt auf der Matte .",
    "Das ist ein Ende ##AT##-##AT## zu ##AT##-##AT## Ende ##AT##-##AT## Test , oder ?",
    'Er sagte : " Hallo Welt ! "',
    "Der 3 - D ##AT##-##AT## Drucker kostet 1.000,50 Euro .",
    "kurz",
]
REFERENCES_TOKENIZED = [
    "Die Katze saß auf der Matte .",
    "Dies ist ein Ende ##AT##-##AT## zu ##AT##-##AT## Ende ##AT##-##AT## Test , nicht wahr ?",
    'Er sagte : " Hallo , Welt ! "',
    "Der 3 - D ##AT##-##AT## Drucker kostet 1.000,50 Euro .",
    "ganz kurz",
]


def sacrebleu_cli(tmp_path, hypotheses, references, *options):
  """`sacrebleu REF < HYP` with the installed command line, score to 4 decimals."""
  ref = tmp_path / "ref.txt"
  ref.write_text("\n".join(references) + "\n", encoding="utf-8")
  result = subprocess.run(
      [sys.executable, "-m", "sacrebleu", str(ref), "-b", "-w", "4", *options],
      input="\n".join(hypotheses) + "\n", capture_output=True, text=True, check=True)
  return float(result.stdout)


def test_bleu_matches_sacrebleu_command_line(tmp_path):
  expected = sacrebleu_cli(tmp_path, HYPOTHESES, REFERENCES)
  assert 0 < expected < 100
  assert evaluation.bleu(HYPOTHESES, REFERENCES) == pytest.approx(expected, abs=6e-5)


def test_paper_tokenize_matches_hand_tokenization():
  assert [evaluation.paper_tokenize(h) for h in HYPOTHESES] == HYPOTHESES_TOKENIZED
  assert [evaluation.paper_tokenize(r) for r in REFERENCES] == REFERENCES_TOKENIZED


def test_tokenized_bleu_matches_command_line_on_hand_tokenized_text(tmp_path):
  expected = sacrebleu_cli(tmp_path, HYPOTHESES_TOKENIZED, REFERENCES_TOKENIZED,
                           "--tokenize", "none", "--smooth-method", "none")
  got = evaluation.bleu(HYPOTHESES, REFERENCES, tokenized=True)
  assert got == pytest.approx(expected, abs=6e-5)
  assert got != pytest.approx(evaluation.bleu(HYPOTHESES, REFERENCES), abs=0.1)


def test_split_compounds_follows_the_perl_one_liner():
  assert evaluation.split_compounds("Ende-zu-Ende") == "Ende ##AT##-##AT## zu ##AT##-##AT## Ende"
  assert evaluation.split_compounds("a - b") == "a - b"  # a free-standing dash stays
  # Matches do not overlap, as with perl's s///g: the middle of a-b-c stays joined.
  assert evaluation.split_compounds("a-b-c") == "a ##AT##-##AT## b-c"


def test_bleu_of_identical_text_is_100_and_mismatched_lengths_raise():
  assert evaluation.bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
  assert evaluation.bleu(REFERENCES, REFERENCES, tokenized=True) == pytest.approx(100.0)
  with pytest.raises(ValueError, match="one hypothesis per reference"):
    evaluation.bleu(HYPOTHESES[:2], REFERENCES)


def reference_nll(logits, targets):
  """float64 NLL of the non-zero targets: (sum, count)."""
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  picked = np.take_along_axis(log_probs, np.asarray(targets)[..., None], -1)[..., 0]
  real = np.asarray(targets) != 0
  return -(picked * real).sum(), int(real.sum())


def test_token_nll_and_perplexity_match_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  targets = np.array([[3, 4, 1, 0, 0], [2, 2, 2, 2, 1], [5, 1, 0, 0, 0]])
  nll, count = evaluation.token_nll(jnp.asarray(logits), jnp.asarray(targets))
  expected_nll, expected_count = reference_nll(logits, targets)
  assert int(count) == expected_count == 10
  assert float(nll) == pytest.approx(expected_nll, rel=1e-6)
  assert evaluation.perplexity(float(nll), int(count)) == pytest.approx(
      np.exp(expected_nll / expected_count), rel=1e-6)
  # Uniform predictions over V tokens have perplexity V.
  assert evaluation.perplexity(*evaluation.token_nll(jnp.zeros((2, 3, 7)), targets[:2, :3])) \
      == pytest.approx(7.0, rel=1e-6)
  with pytest.raises(ValueError, match="at least one token"):
    evaluation.perplexity(0.0, 0)


def test_corpus_perplexity_pools_tokens_over_batches():
  rng = np.random.default_rng(1)
  batches = [
      {"logits": rng.normal(size=(2, 4, 6)).astype(np.float32),
       "targets": np.array([[1, 2, 3, 0], [4, 0, 0, 0]])},
      {"logits": rng.normal(size=(1, 6, 6)).astype(np.float32),
       "targets": np.array([[5, 5, 4, 3, 2, 1]])},
  ]
  sums = [reference_nll(b["logits"], b["targets"]) for b in batches]
  expected = np.exp(sum(s for s, _ in sums) / sum(n for _, n in sums))
  got = evaluation.corpus_perplexity(lambda batch: jnp.asarray(batch["logits"]), batches)
  assert got == pytest.approx(expected, rel=1e-6)
