"""A synthetic parallel corpus that needs real translation: English-like source, invented target
(its words: embedded_lexicon.py).

The target language ('sy') differs from the English-like source ('en') in the
ways a translator has to learn, so that copying or word-by-word substitution
scores badly:
  * its own vocabulary (invented, fixed words);
  * three noun genders, with gender/number/case agreement on articles,
    adjectives, possessives and relative pronouns (case from the syntax:
    subject, object, after a preposition);
  * verb endings for tense and number (English 'does not' / 'did not' fold into
    the verb; English past tense has no number, the target's has);
  * adjectives after the noun, in mirrored order;
  * the verb at the end of subordinate and relative clauses;
  * subject-verb inversion after a fronted subordinate clause;
  * negation at the end of a main clause, before the verb in a subordinate one.
Every source sentence has exactly one translation, so a model can reach BLEU
near 100. Generation is deterministic from a seed (`generate_corpus`).
"""

import dataclasses
import random

from transformer_jax.data.embedded_lexicon import (
  ADJECTIVES,
  ADVERBS,
  ANIMATE,
  COMPLEMENT,
  CONJUNCTIONS,
  DETERMINERS,
  ENDINGS,
  INTRANSITIVE,
  LEXICON,
  NOUN_PLURAL,
  NOUNS,
  PLURALS,
  PREPOSITIONS,
  SUBORDINATORS,
  TRANSITIVE,
  VERB_ENDINGS,
)

SOURCE_LANG = "en"
TARGET_LANG = "sy"
MAX_WORDS = 40


@dataclasses.dataclass
class NounPhrase:
  """Determiner, adjectives, noun and an optional relative clause."""

  det: str
  adjectives: list
  noun: str  # English singular
  number: str  # 'sg' | 'pl'
  relative: "Clause | None" = None  # its subject or object is the head noun (None)


@dataclasses.dataclass
class PrepPhrase:
  """A preposition and its noun phrase (dative in the target)."""

  prep: str
  np: NounPhrase


@dataclasses.dataclass
class Clause:
  """One clause. `subject` or `obj` is None inside a relative clause (the gap)."""

  subject: NounPhrase | None
  verb: tuple  # one of the (3sg, pl, past) tuples
  tense: str  # 'present' | 'past'
  negated: bool
  obj: NounPhrase | None = None
  complement: "Clause | None" = None  # the 'that' clause of a complement verb
  adverb: str | None = None
  pp: PrepPhrase | None = None
  sub: tuple | None = None  # (subordinator, Clause, fronted)


class _Generator:
  """Random parse trees from the grammar (only `random()` draws: they are fast)."""

  def __init__(self, rng):
    self.random = rng.random

  def chance(self, p):
    return self.random() < p

  def pick(self, seq):
    return seq[int(self.random() * len(seq))]

  def weighted(self, values, cumulative):
    r = self.random() * cumulative[-1]
    return next(v for v, c in zip(values, cumulative) if r < c)

  def noun_phrase(self, depth):
    det, number_rule, _ = self.pick(DETERMINERS)
    number = number_rule if number_rule != "any" else self.pick(("sg", "pl"))
    adjectives = []
    for _ in range(self.weighted((0, 1, 2), (5, 9, 10))):
      adjective = self.pick(ADJECTIVES)
      if adjective not in adjectives:
        adjectives.append(adjective)
    np = NounPhrase(det, adjectives, self.pick(NOUNS)[0], number)
    if depth < 2 and self.chance(0.12):
      np.relative = self.clause(depth + 1, gap=self.pick(("subject", "obj")))
    return np

  def clause(self, depth, gap=None):
    if gap == "obj":
      kind = "trans"
    else:
      kind = self.weighted(("trans", "intrans", "comp"), (5, 8, 10) if depth < 2 else (5, 8, 8))
    verbs = {"trans": TRANSITIVE, "intrans": INTRANSITIVE, "comp": COMPLEMENT}
    c = Clause(
      subject=None if gap == "subject" else self.noun_phrase(depth + 1),
      verb=self.pick(verbs[kind]),
      tense=self.pick(("present", "past")),
      negated=self.chance(0.2),
    )
    if kind == "trans" and gap != "obj":
      c.obj = self.noun_phrase(depth + 1)
    if kind == "comp":
      c.complement = self.clause(depth + 1)
    if self.chance(0.25):
      c.adverb = self.pick(ADVERBS)
    # No prepositional phrase in relative clauses: after an object's relative
    # clause it would be ambiguous which clause it belongs to.
    if gap is None and self.chance(0.25):
      c.pp = PrepPhrase(self.pick(PREPOSITIONS), self.noun_phrase(depth + 1))
    if gap is None and depth == 0 and self.chance(0.25):
      c.sub = (self.pick(SUBORDINATORS), self.clause(depth + 1), self.chance(0.5))
    return c

  def sentence(self):
    """A list of (conjunction or None, main Clause)."""
    n = self.weighted((1, 2, 3), (14, 19, 20))
    return [(None if i == 0 else self.pick(CONJUNCTIONS), self.clause(0)) for i in range(n)]


def _subject_number(clause, head_number):
  return clause.subject.number if clause.subject is not None else head_number


# ---- English ---------------------------------------------------------------


def _en_np(np):
  noun = np.noun if np.number == "sg" else PLURALS[np.noun]
  words = [*np.adjectives, noun]
  det = "an" if np.det == "a" and words[0][0] in "aeiou" else np.det
  words.insert(0, det)
  if np.relative:
    words += _en_clause(np.relative, head=np)
  return words


def _en_pp(pp):
  return [pp.prep, *_en_np(pp.np)]


def _en_clause(c, head=None):
  """English words; `head` is the noun phrase a relative clause attaches to."""
  number = _subject_number(c, head.number if head else None)
  if c.tense == "past":
    verb, aux = c.verb[2], "did"
  else:
    verb, aux = c.verb[0] if number == "sg" else c.verb[1], ("does" if number == "sg" else "do")
  vp = [aux, "not", c.verb[1]] if c.negated else [verb]
  if c.adverb:
    vp = vp[:2] + [c.adverb] + vp[2:] if c.negated else [c.adverb] + vp
  words = []
  if head is not None:
    words.append("who" if head.noun in ANIMATE else "which")
  if c.subject is not None:
    words += _en_np(c.subject)
  words += vp
  if c.obj is not None:
    words += _en_np(c.obj)
  if c.complement is not None:
    words += ["that", *_en_clause(c.complement)]
  if c.pp:
    words += _en_pp(c.pp)
  if c.sub:
    subordinator, sub_clause, fronted = c.sub
    sub_words = [subordinator, *_en_clause(sub_clause)]
    words = sub_words[:-1] + [sub_words[-1] + ","] + words if fronted else (words + sub_words)
  return words


# ---- target ----------------------------------------------------------------


def _ending(case, number, gender):
  return ENDINGS[case][number][gender]


def _sy_np(np, case):
  stem, gender = LEXICON.nouns[np.noun]
  words = []
  if np.det in LEXICON.determiners:
    words.append(LEXICON.determiners[np.det] + _ending(case, np.number, gender))
  else:
    words.append(LEXICON.words[np.det])
  words.append(stem + (NOUN_PLURAL[gender] if np.number == "pl" else ""))
  words += [
    LEXICON.adjectives[a] + _ending(case, np.number, gender) for a in reversed(np.adjectives)
  ]
  if np.relative:
    words += _sy_clause(np.relative, main=False, head=np)
  return words


def _sy_pp(pp):
  return [LEXICON.words[pp.prep], *_sy_np(pp.np, "dat")]


def _sy_clause(c, main, head=None):
  """Target words: main clauses verb-second, subordinate/relative verb-final."""
  number = _subject_number(c, head.number if head else None)
  verb = [LEXICON.verbs[c.verb[0]] + VERB_ENDINGS[(c.tense, number)]]
  neg = [LEXICON.words["not"]] if c.negated else []
  adverb = [LEXICON.words[c.adverb]] if c.adverb else []
  subject = _sy_np(c.subject, "nom") if c.subject is not None else []
  obj = _sy_np(c.obj, "acc") if c.obj is not None else []
  pp = _sy_pp(c.pp) if c.pp else []
  complement = (
    [LEXICON.words["that"], *_sy_clause(c.complement, main=False)]
    if c.complement is not None
    else []
  )
  sub_words, fronted = [], False
  if c.sub:
    subordinator, sub_clause, fronted = c.sub
    sub_words = [LEXICON.words[subordinator], *_sy_clause(sub_clause, main=False)]
  if head is not None:
    _, gender = LEXICON.nouns[head.noun]
    case = "nom" if c.subject is None else "acc"
    rel = [LEXICON.determiners["who/which"] + _ending(case, head.number, gender)]
    return rel + subject + adverb + obj + pp + neg + verb + complement
  if not main:
    return subject + adverb + obj + pp + neg + verb + complement + sub_words
  if fronted:
    sub_words[-1] += ","
    return sub_words + verb + subject + adverb + obj + pp + neg + complement
  return subject + verb + adverb + obj + pp + neg + complement + sub_words


def _sentence_text(clauses):
  words = []
  for conj, c in clauses:
    words += ([conj] if conj else []) + c
  text = " ".join(words) + "."
  return text[0].upper() + text[1:]


def render(sentence):
  """(English text, target text) of a parse tree from the generator."""
  en = [(conj, _en_clause(c)) for conj, c in sentence]
  sy = [(LEXICON.words[conj] if conj else None, _sy_clause(c, main=True)) for conj, c in sentence]
  return _sentence_text(en), _sentence_text(sy)


def generate_corpus(seed, sizes):
  """{split name: list of unique (English, target) string pairs}, disjoint across splits.

  `sizes` is {split name: number of pairs}, e.g. {'train': 100_000, ...}; the
  same `seed` gives the same corpus.
  """
  gen = _Generator(random.Random(seed))
  seen, pairs, total = set(), [], sum(sizes.values())
  while len(pairs) < total:
    src, tgt = render(gen.sentence())
    if src not in seen and len(src.split()) <= MAX_WORDS:
      seen.add(src)
      pairs.append((src, tgt))
  out, start = {}, 0
  for split, n in sizes.items():
    out[split] = pairs[start : start + n]
    start += n
  return out
