"""The embedded synthetic corpus: deterministic, disjoint splits, real grammar, no word-for-word."""

import re

import numpy as np
import pytest
import sacrebleu
import scipy.sparse

from transformer_jax.data import embedded
from transformer_jax.data.embedded import LEXICON, Clause, NounPhrase, PrepPhrase

FULL = {"train": 100_000, "validation": 2_000, "test": 2_000}
SMALL = {"train": 3_000, "validation": 300, "test": 300}

# The target language's agreement endings, written out by hand (the spec).
NOM = {0: "o", 1: "a", 2: "e", "pl": "i"}
ACC = {0: "on", 1: "an", 2: "e", "pl": "is"}
DAT = {0: "om", 1: "ar", 2: "em", "pl": "im"}
NOUN_PLURAL = {0: "en", 1: "es", 2: "a"}
PRESENT_SG, PRESENT_PL, PAST_SG, PAST_PL = "at", "ant", "it", "int"

SEES, SLEEPS = ("sees", "see", "saw"), ("sleeps", "sleep", "slept")


@pytest.fixture(scope="module")
def full():
  return embedded.generate_corpus(0, FULL)


def noun(word):
  return LEXICON.nouns[word]


def the(case, word):
  return LEXICON.determiners["the"] + case[noun(word)[1]]


def test_same_seed_same_corpus_other_seed_other_corpus():
  a = embedded.generate_corpus(3, SMALL)
  assert a == embedded.generate_corpus(3, SMALL)
  b = embedded.generate_corpus(4, SMALL)
  assert a["train"][:100] != b["train"][:100]
  assert {k: len(v) for k, v in a.items()} == SMALL


@pytest.mark.slow
def test_full_corpus_sizes_disjoint_splits_and_varied_lengths(full):
  assert {k: len(v) for k, v in full.items()} == FULL
  sources = [{s for s, _ in full[k]} for k in FULL]
  assert sum(map(len, sources)) == sum(FULL.values()), "unique, so disjoint"
  words = np.array([len(s.split()) for s, _ in full["train"]])
  assert words.max() <= 40 and words.min() <= 4 and words.max() >= 38
  assert 10 < words.mean() < 20 and words.std() > 6
  vocab = lambda side: {w.strip(".,").lower() for pair in full["train"] for w in pair[side].split()}
  assert 300 < len(vocab(0)) < 1000, "a few hundred source words"
  assert not vocab(0) & vocab(1), "the target vocabulary is different"


def test_simple_clause_agreement_and_adjective_order():
  c = Clause(
    subject=NounPhrase("the", [], "dog", "sg"),
    verb=SEES,
    tense="present",
    negated=False,
    obj=NounPhrase("the", ["big", "red"], "cat", "sg"),
  )
  src, tgt = embedded.render([(None, c)])
  assert src == "The dog sees the big red cat."
  g = noun("cat")[1]
  expected = [
    the(NOM, "dog"),
    noun("dog")[0],
    LEXICON.verbs["sees"] + PRESENT_SG,
    the(ACC, "cat"),
    noun("cat")[0],
    LEXICON.adjectives["red"] + ACC[g],
    LEXICON.adjectives["big"] + ACC[g],
  ]
  assert tgt == (" ".join(expected) + ".").capitalize()


def test_fronted_subordinate_clause_is_verb_final_and_inverts_the_main_clause():
  sub = Clause(subject=NounPhrase("the", [], "man", "pl"), verb=SLEEPS, tense="past", negated=True)
  main = Clause(
    subject=NounPhrase("a", [], "dog", "sg"),
    verb=SEES,
    tense="past",
    negated=False,
    obj=NounPhrase("two", [], "cat", "pl"),
    pp=PrepPhrase("in", NounPhrase("my", ["old"], "house", "sg")),
    sub=("because", sub, True),
  )
  src, tgt = embedded.render([(None, main)])
  assert src == "Because the men did not sleep, a dog saw two cats in my old house."
  man_stem, man_g = noun("man")
  house_stem, house_g = noun("house")
  expected = [
    LEXICON.words["because"],
    LEXICON.determiners["the"] + NOM["pl"],
    man_stem + NOUN_PLURAL[man_g],
    LEXICON.words["not"],
    LEXICON.verbs["sleeps"] + PAST_PL + ",",  # verb last, plural past
    LEXICON.verbs["sees"] + PAST_SG,  # then the main verb before its subject
    LEXICON.determiners["a"] + NOM[noun("dog")[1]],
    noun("dog")[0],
    LEXICON.words["two"],
    noun("cat")[0] + NOUN_PLURAL[noun("cat")[1]],
    LEXICON.words["in"],
    LEXICON.determiners["my"] + DAT[house_g],
    house_stem,
    LEXICON.adjectives["old"] + DAT[house_g],
  ]
  assert tgt == (" ".join(expected) + ".").capitalize()


def test_relative_clause_pronoun_agrees_and_negation_ends_the_main_clause():
  cat = NounPhrase("the", [], "cat", "pl")
  cat.relative = Clause(
    subject=NounPhrase("the", [], "dog", "sg"), verb=SEES, tense="present", negated=False
  )  # object gap
  main = Clause(subject=cat, verb=SLEEPS, tense="present", negated=True, adverb="often")
  src, tgt = embedded.render([(None, main)])
  assert src == "The cats who the dog sees do not often sleep."  # animate: who
  expected = [
    LEXICON.determiners["the"] + NOM["pl"],
    noun("cat")[0] + NOUN_PLURAL[noun("cat")[1]],
    LEXICON.determiners["who/which"] + ACC["pl"],  # object of the relative clause
    the(NOM, "dog"),
    noun("dog")[0],
    LEXICON.verbs["sees"] + PRESENT_SG,
    LEXICON.verbs["sleeps"] + PRESENT_PL,
    LEXICON.words["often"],
    LEXICON.words["not"],
  ]
  assert tgt == (" ".join(expected) + ".").capitalize()


def _words(text):
  return re.findall(r"[a-z]+", text.lower())


def word_by_word_bleu(train, test):
  """BLEU of translating each source word by the target word most associated with it.

  The dictionary is the best a word-for-word substitution can learn from the
  training pairs: for each source word, the target word with the highest Dice
  coefficient of co-occurrence.
  """

  def incidence(texts, vocab):
    rows, cols = [], []
    for i, text in enumerate(texts):
      for w in set(_words(text)):
        rows.append(i)
        cols.append(vocab.setdefault(w, len(vocab)))
    return rows, cols

  src_vocab, tgt_vocab = {}, {}
  s = incidence([p[0] for p in train], src_vocab)
  t = incidence([p[1] for p in train], tgt_vocab)
  shape = lambda v: (len(train), len(v))
  S = scipy.sparse.csr_matrix((np.ones(len(s[0])), s), shape=shape(src_vocab))
  T = scipy.sparse.csr_matrix((np.ones(len(t[0])), t), shape=shape(tgt_vocab))
  dice = 2 * (S.T @ T).toarray() / (np.asarray(S.sum(0)).T + np.asarray(T.sum(0)))
  tgt_words = {i: w for w, i in tgt_vocab.items()}
  best = {w: tgt_words[int(dice[i].argmax())] for w, i in src_vocab.items()}
  hyps = []
  for src, _ in test:
    text = " ".join(best[w] for w in _words(src) if w in best) + "."
    hyps.append(text.capitalize())
  return sacrebleu.corpus_bleu(hyps, [[p[1] for p in test]]).score


@pytest.mark.slow
def test_word_by_word_substitution_scores_badly(full):
  bleu = word_by_word_bleu(full["train"], full["test"])
  print(f"word-by-word baseline BLEU on the embedded test split: {bleu:.1f}")
  assert 5 < bleu < 30
  copy = sacrebleu.corpus_bleu([p[0] for p in full["test"]], [[p[1] for p in full["test"]]]).score
  assert copy < 1


def test_the_baseline_would_notice_a_substitution_cipher(full):
  # Sanity check of the measurement: on a pure word-for-word cipher of the
  # source, the same baseline is nearly perfect.
  cipher = lambda text: " ".join(w[::-1] + "q" for w in _words(text)) + "."
  pairs = lambda split: [(s, cipher(s).capitalize()) for s, _ in full[split][:20_000]]
  assert word_by_word_bleu(pairs("train"), pairs("test")) > 95
