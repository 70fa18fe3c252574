"""Property-based tests (hypothesis) of packing and of the tokenizer round trip.

The mask builders have theirs in test_mask_properties.py.
"""

import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_jax.conventions import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data import pipeline
from transformer_jax.data import tokenizer as tokenizer_lib

# Packing ------------------------------------------------------------------


@st.composite
def packing_problems(draw):
  """(max_length, batch_size, shard_count, [(source length, target length)]) that fit a row each."""
  max_length = draw(st.integers(2, 24))
  shard_count = draw(st.sampled_from([1, 2]))
  batch_size = shard_count * draw(st.integers(1, 4))
  side = st.integers(1, max_length)
  lengths = draw(st.lists(st.tuples(side, side), min_size=1, max_size=40))
  return max_length, batch_size, shard_count, lengths


def _tokens(pair: int, side: int, length: int) -> list[int]:
  """Distinct, recognisable token ids: pair, side and position are readable from each."""
  return [100_000 * (pair + 1) + 10_000 * side + j for j in range(length)]


@settings(max_examples=150, deadline=None)
@given(packing_problems(), st.integers(0, 2**16), st.integers(0, 5))
def test_packing_places_every_token_once_in_order_in_rows_that_fit(problem, seed, window):
  max_length, batch_size, shard_count, lengths = problem
  lengths = np.asarray(lengths, np.int64)
  ids = np.arange(len(lengths))
  seen = {}
  for shard in range(shard_count):
    planner = pipeline._PackPlanner(
      max_length,
      batch_size,
      lengths=lengths,
      ids=ids,
      seed=seed,
      shard_index=shard,
      shard_count=shard_count,
    )
    for batch_number, plan in enumerate(planner(window, np.arange(len(ids)))):
      assert plan.num_rows == batch_size // shard_count and plan.length == max_length
      examples = [(_tokens(i, 0, lengths[i, 0]), _tokens(i, 1, lengths[i, 1])) for i in plan.ids]
      batch = pipeline.layout(examples, plan.rows, plan.num_rows, plan.length)  # Raises if over.
      for row in range(plan.num_rows):
        for side, key in enumerate(("inputs", "targets")):
          tokens = batch[key][row]
          segments = batch[f"{key}_segmentation"][row]
          positions = batch[f"{key}_position"][row]
          used = int(np.count_nonzero(segments))
          # Real tokens first, then padding: zeros everywhere.
          assert np.all(segments[:used] > 0) and not np.any(tokens[used:])
          assert not np.any(segments[used:]) and not np.any(positions[used:])
          members = [i for i, r in zip(plan.ids, plan.rows) if r == row]
          # Segments 1, 2, ... in the plan's order, each a whole pair with positions 0, 1, ...
          expected = [t for i in members for t in _tokens(i, side, lengths[i, side])]
          assert tokens[:used].tolist() == expected
          assert segments[:used].tolist() == [
            s + 1 for s, i in enumerate(members) for _ in range(lengths[i, side])
          ]
          assert positions[:used].tolist() == [p for i in members for p in range(lengths[i, side])]
          assert used <= max_length
      for i in plan.ids:
        assert int(i) not in seen, f"pair {i} placed twice"
        seen[int(i)] = (batch_number, shard)
  assert sorted(seen) == ids.tolist()  # Every pair exactly once, over all hosts.


# Tokenizer ----------------------------------------------------------------

ALPHABET = string.ascii_lowercase + "äöüß"


@pytest.fixture(scope="module")
def tokenizer():
  rng = np.random.default_rng(0)
  words = ["".join(rng.choice(list(ALPHABET), size=rng.integers(1, 9))) for _ in range(400)]
  sentences = [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(3000)]
  sentences.append(" ".join(ALPHABET))  # Every character seen.
  return tokenizer_lib.Tokenizer(tokenizer_lib.train_model(sentences, 300))


words = st.text(alphabet=ALPHABET, min_size=1, max_size=12)
sentences = st.lists(words, min_size=0, max_size=15).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(text=sentences)
def test_text_of_known_characters_survives_encode_then_decode(tokenizer, text):
  ids = tokenizer.encode(text)
  assert all(3 <= i < tokenizer.vocab_size for i in ids)  # No pad, EOS or unknown.
  assert tokenizer.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(
  parts=st.lists(st.tuples(st.text(alphabet=" \t\n\r", max_size=3), words), max_size=10),
  end=st.text(alphabet=" \t\n", max_size=3),
)
def test_whitespace_comes_back_normalized_to_single_spaces(tokenizer, parts, end):
  text = "".join(space + word for space, word in parts) + end
  assert tokenizer.decode(tokenizer.encode(text)) == " ".join(text.split())


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_any_text_encodes_to_valid_ids_with_unknown_characters_as_unk(tokenizer, text):
  ids = tokenizer.encode(text)
  assert all(0 < i < tokenizer.vocab_size and i != EOS_ID for i in ids)
  assert isinstance(tokenizer.decode(ids), str)
  if set(text) <= set(ALPHABET + " \t\n"):
    assert UNK_ID not in ids


@settings(max_examples=100, deadline=None)
@given(text=sentences, tail=st.lists(st.integers(0, 299), max_size=10), padding=st.integers(0, 5))
def test_decode_stops_at_eos_and_ignores_padding(tokenizer, text, tail, padding):
  ids = tokenizer.encode(text)
  padded = [PAD_ID] * padding + ids + [EOS_ID] + tail
  assert tokenizer.decode(np.asarray(padded)) == text
