"""BLEU vs sacrebleu's command line, tokenization vs hand-tokenized text, the teacher-forced loss
and perplexity vs numpy float64."""

import flax.linen as nn
import jax
import numpy as np
import pytest

import helpers
from transformer_jax import sharding
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.decode import metrics
from transformer_jax.model import loss
from transformer_jax.placement import Placement

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
  result = helpers.python(
    "-m",
    "sacrebleu",
    ref,
    "-b",
    "-w",
    "4",
    *options,
    input="\n".join(hypotheses) + "\n",
    check=True,
  )
  return float(result.stdout)


def test_bleu_matches_sacrebleu_command_line(tmp_path):
  expected = sacrebleu_cli(tmp_path, HYPOTHESES, REFERENCES)
  assert 0 < expected < 100
  assert metrics.bleu(HYPOTHESES, REFERENCES) == pytest.approx(expected, abs=6e-5)


def test_paper_tokenize_matches_hand_tokenization():
  assert [metrics.paper_tokenize(h) for h in HYPOTHESES] == HYPOTHESES_TOKENIZED
  assert [metrics.paper_tokenize(r) for r in REFERENCES] == REFERENCES_TOKENIZED


def test_tokenized_bleu_matches_command_line_on_hand_tokenized_text(tmp_path):
  expected = sacrebleu_cli(
    tmp_path,
    HYPOTHESES_TOKENIZED,
    REFERENCES_TOKENIZED,
    "--tokenize",
    "none",
    "--smooth-method",
    "none",
  )
  got = metrics.bleu(HYPOTHESES, REFERENCES, tokenized=True)
  assert got == pytest.approx(expected, abs=6e-5)
  assert got != pytest.approx(metrics.bleu(HYPOTHESES, REFERENCES), abs=0.1)


def _bleu_float64(hypotheses, references) -> float:
  """Corpus BLEU-4 of whitespace tokens by its definition (Papineni et al. 2002): clipped n-gram
  precisions, their geometric mean, the brevity penalty; no smoothing."""
  matches, totals = np.zeros(4), np.zeros(4)
  hyp_length = ref_length = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_length, ref_length = hyp_length + len(h), ref_length + len(r)
    for n in range(1, 5):
      grams = [tuple(h[i : i + n]) for i in range(len(h) - n + 1)]
      ref_grams = [tuple(r[i : i + n]) for i in range(len(r) - n + 1)]
      matches[n - 1] += sum(min(grams.count(g), ref_grams.count(g)) for g in set(grams))
      totals[n - 1] += len(grams)
  precision = np.exp(np.mean(np.log(matches / totals)))
  return 100 * precision * min(1.0, np.exp(1 - ref_length / hyp_length))


def test_bleu_as_is_scores_tokenized_text_split_at_spaces_alone():
  references = [
    "a man in a red shirt is climbing a rock .",
    "two dogs play in the snow near a fence .",
    "a woman &apos;s bag lies on the bench .",
  ]
  hypotheses = [
    "a man in a red shirt climbs a rock .",
    "two dogs are playing in the snow near a fence .",
    "a woman &apos;s bag is on a bench .",
  ]
  got = metrics.bleu_as_is(hypotheses, references)
  assert got == pytest.approx(_bleu_float64(hypotheses, references), abs=1e-9)
  assert metrics.bleu_as_is(references, references) == pytest.approx(100.0)
  # Punctuation glued to a word is one token as it is; 13a splits it off.
  glued = [h.replace(" .", ".") for h in hypotheses]
  assert metrics.bleu_as_is(glued, references) < got - 1
  assert metrics.bleu(glued, references) == pytest.approx(metrics.bleu(hypotheses, references))
  with pytest.raises(ValueError, match="one hypothesis per reference"):
    metrics.bleu_as_is(hypotheses[:2], references)


def test_split_compounds_follows_the_perl_one_liner():
  assert metrics.split_compounds("Ende-zu-Ende") == "Ende ##AT##-##AT## zu ##AT##-##AT## Ende"
  assert metrics.split_compounds("a - b") == "a - b"  # a free-standing dash stays
  # Matches do not overlap, as with perl's s///g: the middle of a-b-c stays joined.
  assert metrics.split_compounds("a-b-c") == "a ##AT##-##AT## b-c"


def test_bleu_of_identical_text_is_100_and_mismatched_lengths_raise():
  assert metrics.bleu(REFERENCES, REFERENCES) == pytest.approx(100.0)
  assert metrics.bleu(REFERENCES, REFERENCES, tokenized=True) == pytest.approx(100.0)
  with pytest.raises(ValueError, match="one hypothesis per reference"):
    metrics.bleu(HYPOTHESES[:2], REFERENCES)


def _reference_sums(logits, batch, eps):
  """float64 numpy: smoothed loss, NLL and token counts of one batch's real target tokens."""
  logits = np.asarray(logits, np.float64)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = np.full(logits.shape, eps / (logits.shape[-1] - 1))
  np.put_along_axis(q, batch["targets"][..., None], 1 - eps, axis=-1)
  real = batch["targets_segmentation"] > 0
  nll = -np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0]
  return {
    "loss": (-(q * log_p).sum(-1) * real).sum(),
    "nll": (nll * real).sum(),
    "tokens": real.sum(),
    "source_tokens": (batch["inputs_segmentation"] > 0).sum(),
  }


@pytest.mark.slow
def test_teacher_forced_loss_sums_every_batch_of_a_sharded_split_as_numpy_does():
  placement = Placement(
    helpers.tiny_model_config(), sharding.make_mesh({"data": -1}), sharding.logical_rules("dp")
  )
  params = nn.unbox(placement.boxed_params(jax.random.key(0)))
  batches = [helpers.synthetic_batch(seed) for seed in (0, 1, 2)]
  got = metrics.TeacherForcedLoss(placement, loss.transformer_loss(0.1))(params, batches)
  forward = jax.jit(placement.model.apply)
  expected = {key: 0.0 for key in got}
  for batch in batches:
    logits = forward({"params": params}, *(batch[k] for k in BATCH_KEYS))
    for key, value in _reference_sums(logits, batch, 0.1).items():
      expected[key] += value
  for key in ("loss", "nll", "tokens", "source_tokens"):
    assert float(got[key]) == pytest.approx(expected[key], rel=1e-5), key
  assert loss.perplexity(float(got["nll"]), int(got["tokens"])) == pytest.approx(
    np.exp(expected["nll"] / expected["tokens"]), rel=1e-5
  )


def test_perplexity_of_uniform_predictions_is_the_vocabulary_size_and_is_capped():
  assert loss.perplexity(10 * np.log(7.0), 10) == pytest.approx(7.0)
  assert loss.perplexity(1e9, 10) == pytest.approx(np.exp(50.0))  # A diverged run: a number.
  with pytest.raises(ValueError, match="at least one token"):
    loss.perplexity(0.0, 0)
