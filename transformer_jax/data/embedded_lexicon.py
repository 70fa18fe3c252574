"""The words of the embedded corpus's language pair: the English lemmas the grammar draws, the
target's agreement endings, and the invented target word of every lemma (`LEXICON`, fixed: part
of the language, independent of the corpus seed)."""

import dataclasses
import random

# (singular, plural) English nouns; plural forms never equal a singular form.
# fmt: off
NOUNS = (
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
PLURALS = dict(NOUNS)
ANIMATE = frozenset(sg for sg, _ in NOUNS[:28])  # 'who' vs 'which'
ADJECTIVES = (
    "big", "small", "old", "young", "red", "green", "blue", "happy", "sad",
    "quick", "slow", "tall", "short", "dark", "bright", "quiet", "loud", "rich",
    "poor", "clever", "strong", "weak", "kind", "cold", "warm", "new", "strange",
    "brave", "lazy", "hungry", "famous", "gentle", "proud", "wild", "tired",
    "lucky",
)
# (3rd person singular present, plural present, past)
TRANSITIVE = (
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
INTRANSITIVE = (
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
COMPLEMENT = (
    ("says", "say", "said"), ("thinks", "think", "thought"),
    ("hopes", "hope", "hoped"), ("believes", "believe", "believed"),
    ("hears", "hear", "heard"), ("forgets", "forget", "forgot"),
)
ADVERBS = (
    "often", "rarely", "always", "sometimes", "usually", "seldom", "again",
    "already", "still", "also",
)
PREPOSITIONS = (
    "in", "on", "near", "under", "behind", "with", "without", "from",
    "beside", "above",
)
SUBORDINATORS = ("because", "when", "although", "if", "while", "before", "after")
CONJUNCTIONS = ("and", "but", "or")
# Determiners: (word, number it requires: 'sg', 'pl' or 'any', inflects?)
DETERMINERS = (
    ("the", "any", True), ("a", "sg", True), ("this", "sg", True),
    ("these", "pl", True), ("every", "sg", True), ("some", "pl", True),
    ("my", "any", True), ("our", "any", True), ("two", "pl", False),
    ("three", "pl", False), ("many", "pl", False),
)

# Agreement endings [case][number][gender]; cases nom, acc, dat; genders m, f, n.
ENDINGS = {
    "nom": {"sg": ("o", "a", "e"), "pl": ("i", "i", "i")},
    "acc": {"sg": ("on", "an", "e"), "pl": ("is", "is", "is")},
    "dat": {"sg": ("om", "ar", "em"), "pl": ("im", "im", "im")},
}
NOUN_PLURAL = ("en", "es", "a")  # by gender
VERB_ENDINGS = {("present", "sg"): "at", ("present", "pl"): "ant",
                 ("past", "sg"): "it", ("past", "pl"): "int"}
# fmt: on


def _invent_words(count, rng, taken):
  """`count` new pronounceable stems (consonant-vowel syllables), unique in `taken`."""
  consonants, vowels = "bdfgklmnprstvz", "aeiou"
  words = []
  while len(words) < count:
    syllables = rng.choice((2, 2, 3))
    word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables))
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
  noun_stems = _invent_words(len(NOUNS), rng, taken)
  nouns = {sg: (stem, rng.randrange(3)) for (sg, _), stem in zip(NOUNS, noun_stems)}
  adjectives = dict(zip(ADJECTIVES, _invent_words(len(ADJECTIVES), rng, taken)))
  all_verbs = sorted({v[0] for v in TRANSITIVE + INTRANSITIVE + COMPLEMENT})
  verbs = dict(zip(all_verbs, _invent_words(len(all_verbs), rng, taken)))
  invariant = (
    ADVERBS + PREPOSITIONS + SUBORDINATORS + CONJUNCTIONS + ("two", "three", "many", "not", "that")
  )
  words = dict(zip(invariant, _invent_words(len(invariant), rng, taken)))
  inflecting = [d for d, _, inflects in DETERMINERS if inflects] + ["who/which"]
  determiners = dict(zip(inflecting, _invent_words(len(inflecting), rng, taken)))
  return Lexicon(nouns, adjectives, verbs, words, determiners)


LEXICON = make_lexicon()
