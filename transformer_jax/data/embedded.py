"""A synthetic parallel corpus that needs real translation: English-like source, invented target.

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

SOURCE_LANG = "en"
TARGET_LANG = "sy"
MAX_WORDS = 40

# (singular, plural) English nouns; plural forms never equal a singular form.
_NOUNS = (
    ("dog", "dogs"), ("cat", "cats"), ("bird", "birds"), ("horse", "horses"),
    ("cow", "cows"), ("fox", "foxes"), ("wolf", "wolves"), ("bear", "bears"),
    ("mouse", "mice"), ("goat", "goats"), ("child", "children"), ("man", "men"),
    ("woman", "women"), ("teacher", "teachers"), ("doctor", "doctors"),
    ("farmer", "farmers"), ("king", "kings"), ("queen", "queens"),
    ("student", "students"), ("friend", "friends"), ("girl", "girls"),
    ("boy", "boys"), ("baker", "bakers"), ("soldier", "soldiers"),
    ("sailor", "sailors"), ("singer", "singers"), ("painter", "painters"),
    ("neighbor", "neighbors"), ("house", "houses"), ("tree", "trees"),
    ("river", "rivers"), ("garden", "gardens"), ("city", "cities"),
    ("book", "books"), ("letter", "letters"), ("table", "tables"),
    ("car", "cars"), ("boat", "boats"), ("bridge", "bridges"), ("road", "roads"),
    ("forest", "forests"), ("village", "villages"), ("mountain", "mountains"),
    ("school", "schools"), ("window", "windows"), ("door", "doors"),
    ("apple", "apples"), ("cake", "cakes"), ("ship", "ships"), ("hill", "hills"),
    ("lake", "lakes"), ("tower", "towers"), ("castle", "castles"),
    ("picture", "pictures"), ("song", "songs"), ("box", "boxes"),
    ("chair", "chairs"), ("flower", "flowers"), ("stone", "stones"),
    ("market", "markets"),
)
_PLURALS = dict(_NOUNS)
_ANIMATE = frozenset(sg for sg, _ in _NOUNS[:28])  # 'who' vs 'which'
_ADJECTIVES = (
    "big", "small", "old", "young", "red", "green", "blue", "happy", "sad",
    "quick", "slow", "tall", "short", "dark", "bright", "quiet", "loud", "rich",
    "poor", "clever", "strong", "weak", "kind", "cold", "warm", "new", "strange",
    "brave", "lazy", "hungry", "famous", "gentle", "proud", "wild", "tired",
    "lucky",
)
# (3rd person singular present, plural present, past)
_TRANSITIVE = (
    ("sees", "see", "saw"), ("likes", "like", "liked"), ("finds", "find", "found"),
    ("follows", "follow", "followed"), ("helps", "help", "helped"),
    ("knows", "know", "knew"), ("watches", "watch", "watched"),
    ("carries", "carry", "carried"), ("calls", "call", "called"),
    ("meets", "meet", "met"), ("builds", "build", "built"),
    ("paints", "paint", "painted"), ("takes", "take", "took"),
    ("writes", "write", "wrote"), ("eats", "eat", "ate"),
    ("holds", "hold", "held"), ("catches", "catch", "caught"),
    ("brings", "bring", "brought"), ("teaches", "teach", "taught"),
    ("buys", "buy", "bought"), ("draws", "draw", "drew"),
    ("loves", "love", "loved"), ("visits", "visit", "visited"),
    ("pushes", "push", "pushed"), ("pulls", "pull", "pulled"),
    ("washes", "wash", "washed"), ("opens", "open", "opened"),
    ("hides", "hide", "hid"), ("chases", "chase", "chased"),
    ("forgets", "forget", "forgot"),
)
_INTRANSITIVE = (
    ("sleeps", "sleep", "slept"), ("runs", "run", "ran"),
    ("laughs", "laugh", "laughed"), ("sings", "sing", "sang"),
    ("dances", "dance", "danced"), ("swims", "swim", "swam"),
    ("waits", "wait", "waited"), ("works", "work", "worked"),
    ("cries", "cry", "cried"), ("falls", "fall", "fell"),
    ("smiles", "smile", "smiled"), ("jumps", "jump", "jumped"),
    ("walks", "walk", "walked"), ("arrives", "arrive", "arrived"),
    ("plays", "play", "played"), ("sits", "sit", "sat"),
    ("stays", "stay", "stayed"), ("rests", "rest", "rested"),
    ("shouts", "shout", "shouted"), ("grows", "grow", "grew"),
)
# Verbs taking a 'that' clause.
_COMPLEMENT = (
    ("says", "say", "said"), ("thinks", "think", "thought"),
    ("hopes", "hope", "hoped"), ("believes", "believe", "believed"),
    ("hears", "hear", "heard"), ("forgets", "forget", "forgot"),
)
_ADVERBS = (
    "often", "rarely", "always", "sometimes", "usually", "seldom", "again",
    "already", "still", "also",
)
_PREPOSITIONS = (
    "in", "on", "near", "under", "behind", "with", "without", "from",
    "beside", "above",
)
_SUBORDINATORS = ("because", "when", "although", "if", "while", "before", "after")
_CONJUNCTIONS = ("and", "but", "or")
# Determiners: (word, number it requires: 'sg', 'pl' or 'any', inflects?)
_DETERMINERS = (
    ("the", "any", True), ("a", "sg", True), ("this", "sg", True),
    ("these", "pl", True), ("every", "sg", True), ("some", "pl", True),
    ("my", "any", True), ("our", "any", True), ("two", "pl", False),
    ("three", "pl", False), ("many", "pl", False),
)

# Agreement endings [case][number][gender]; cases nom, acc, dat; genders m, f, n.
_ENDINGS = {
    "nom": {"sg": ("o", "a", "e"), "pl": ("i", "i", "i")},
    "acc": {"sg": ("on", "an", "e"), "pl": ("is", "is", "is")},
    "dat": {"sg": ("om", "ar", "em"), "pl": ("im", "im", "im")},
}
_NOUN_PLURAL = ("en", "es", "a")  # by gender
_VERB_ENDINGS = {("present", "sg"): "at", ("present", "pl"): "ant",
                 ("past", "sg"): "it", ("past", "pl"): "int"}


def _invent_words(count, rng, taken):
  """`count` new pronounceable stems (consonant-vowel syllables), unique in `taken`."""
  consonants, vowels = "bdfgklmnprstvz", "aeiou"
  words = []
  while len(words) < count:
    syllables = rng.choice((2, 2, 3))
    word = "".join(rng.choice(consonants) + rng.choice(vowels)
                   for _ in range(syllables))
    word = word[:-1] if rng.random() < 0.5 else word  # some end in a consonant
    if word not in taken:
      taken.add(word)
      words.append(word)
  return words


@dataclasses.dataclass(frozen=True)
class Lexicon:
  """The target words for every source lemma (fixed; part of the language)."""
  nouns: dict  # English singular -> (stem, gender index)
  adjectives: dict  # English -> stem (takes an agreement ending)
  verbs: dict  # English 3sg present -> stem (takes a tense/number ending)
  words: dict  # other English words -> invariant target word
  determiners: dict  # inflecting English determiner -> stem


def make_lexicon():
  """The one fixed lexicon of the language pair (independent of the corpus seed)."""
  rng = random.Random(20170612)
  taken = set()
  noun_stems = _invent_words(len(_NOUNS), rng, taken)
  nouns = {sg: (stem, rng.randrange(3)) for (sg, _), stem in zip(_NOUNS, noun_stems)}
  adjectives = dict(zip(_ADJECTIVES, _invent_words(len(_ADJECTIVES), rng, taken)))
  all_verbs = sorted({v[0] for v in _TRANSITIVE + _INTRANSITIVE + _COMPLEMENT})
  verbs = dict(zip(all_verbs, _invent_words(len(all_verbs), rng, taken)))
  invariant = (_ADVERBS + _PREPOSITIONS + _SUBORDINATORS + _CONJUNCTIONS
               + ("two", "three", "many", "not", "that"))
  words = dict(zip(invariant, _invent_words(len(invariant), rng, taken)))
  inflecting = [d for d, _, inflects in _DETERMINERS if inflects] + ["who/which"]
  determiners = dict(zip(inflecting, _invent_words(len(inflecting), rng, taken)))
  return Lexicon(nouns, adjectives, verbs, words, determiners)


LEXICON = make_lexicon()


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
    det, number_rule, _ = self.pick(_DETERMINERS)
    number = number_rule if number_rule != "any" else self.pick(("sg", "pl"))
    adjectives = []
    for _ in range(self.weighted((0, 1, 2), (5, 9, 10))):
      adjective = self.pick(_ADJECTIVES)
      if adjective not in adjectives:
        adjectives.append(adjective)
    np = NounPhrase(det, adjectives, self.pick(_NOUNS)[0], number)
    if depth < 2 and self.chance(0.12):
      np.relative = self.clause(depth + 1, gap=self.pick(("subject", "obj")))
    return np

  def clause(self, depth, gap=None):
    if gap == "obj":
      kind = "trans"
    else:
      kind = self.weighted(("trans", "intrans", "comp"),
                           (5, 8, 10) if depth < 2 else (5, 8, 8))
    verbs = {"trans": _TRANSITIVE, "intrans": _INTRANSITIVE, "comp": _COMPLEMENT}
    c = Clause(
        subject=None if gap == "subject" else self.noun_phrase(depth + 1),
        verb=self.pick(verbs[kind]),
        tense=self.pick(("present", "past")),
        negated=self.chance(0.2))
    if kind == "trans" and gap != "obj":
      c.obj = self.noun_phrase(depth + 1)
    if kind == "comp":
      c.complement = self.clause(depth + 1)
    if self.chance(0.25):
      c.adverb = self.pick(_ADVERBS)
    # No prepositional phrase in relative clauses: after an object's relative
    # clause it would be ambiguous which clause it belongs to.
    if gap is None and self.chance(0.25):
      c.pp = PrepPhrase(self.pick(_PREPOSITIONS), self.noun_phrase(depth + 1))
    if gap is None and depth == 0 and self.chance(0.25):
      c.sub = (self.pick(_SUBORDINATORS), self.clause(depth + 1), self.chance(0.5))
    return c

  def sentence(self):
    """A list of (conjunction or None, main Clause)."""
    n = self.weighted((1, 2, 3), (14, 19, 20))
    return [(None if i == 0 else self.pick(_CONJUNCTIONS), self.clause(0))
            for i in range(n)]


def _subject_number(clause, head_number):
  return clause.subject.number if clause.subject is not None else head_number


# ---- English ---------------------------------------------------------------

def _en_np(np):
  noun = np.noun if np.number == "sg" else _PLURALS[np.noun]
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
    verb, aux = c.verb[0] if number == "sg" else c.verb[1], (
        "does" if number == "sg" else "do")
  vp = [aux, "not", c.verb[1]] if c.negated else [verb]
  if c.adverb:
    vp = vp[:2] + [c.adverb] + vp[2:] if c.negated else [c.adverb] + vp
  words = []
  if head is not None:
    words.append("who" if head.noun in _ANIMATE else "which")
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
    words = sub_words[:-1] + [sub_words[-1] + ","] + words if fronted else (
        words + sub_words)
  return words


# ---- target ----------------------------------------------------------------

def _ending(case, number, gender):
  return _ENDINGS[case][number][gender]


def _sy_np(np, case):
  stem, gender = LEXICON.nouns[np.noun]
  words = []
  if np.det in LEXICON.determiners:
    words.append(LEXICON.determiners[np.det] + _ending(case, np.number, gender))
  else:
    words.append(LEXICON.words[np.det])
  words.append(stem + (_NOUN_PLURAL[gender] if np.number == "pl" else ""))
  words += [LEXICON.adjectives[a] + _ending(case, np.number, gender)
            for a in reversed(np.adjectives)]
  if np.relative:
    words += _sy_clause(np.relative, main=False, head=np)
  return words


def _sy_pp(pp):
  return [LEXICON.words[pp.prep], *_sy_np(pp.np, "dat")]


def _sy_clause(c, main, head=None):
  """Target words: main clauses verb-second, subordinate/relative verb-final."""
  number = _subject_number(c, head.number if head else None)
  verb = [LEXICON.verbs[c.verb[0]] + _VERB_ENDINGS[(c.tense, number)]]
  neg = [LEXICON.words["not"]] if c.negated else []
  adverb = [LEXICON.words[c.adverb]] if c.adverb else []
  subject = _sy_np(c.subject, "nom") if c.subject is not None else []
  obj = _sy_np(c.obj, "acc") if c.obj is not None else []
  pp = _sy_pp(c.pp) if c.pp else []
  complement = ([LEXICON.words["that"], *_sy_clause(c.complement, main=False)]
                if c.complement is not None else [])
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
  sy = [(LEXICON.words[conj] if conj else None, _sy_clause(c, main=True))
        for conj, c in sentence]
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
    out[split] = pairs[start:start + n]
    start += n
  return out
