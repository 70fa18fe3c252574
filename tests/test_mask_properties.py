"""Property-based checks of the mask builders on random token and segment layouts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from transformer_jax.model import attention

pytestmark = pytest.mark.device


@st.composite
def query_and_key_tokens(draw):
  """Two token-id arrays [batch, q_len] and [batch, k_len] with 0 as padding."""
  batch = draw(st.integers(1, 3))
  ids = lambda length: hnp.arrays(np.int32, (batch, length), elements=st.integers(0, 5))
  return draw(ids(draw(st.integers(1, 9)))), draw(ids(draw(st.integers(1, 9))))


@st.composite
def packed_segments(draw):
  """Rows of packed examples: segment ids 1, 2, ... in runs, then 0 padding."""
  batch, length = draw(st.integers(1, 3)), draw(st.integers(1, 12))
  rows = []
  for _ in range(batch):
    row, segment = [], 0
    while len(row) < length and draw(st.booleans()):
      segment += 1
      row += [segment] * draw(st.integers(1, length))
    rows.append((row + [0] * length)[:length])
  return np.array(rows, np.int32)


@settings(max_examples=60, deadline=None)
@given(query_and_key_tokens())
def test_padding_mask_is_true_exactly_on_real_pairs(tokens):
  q, k = tokens
  mask = np.asarray(attention.padding_mask(q, k))
  assert mask.shape == (q.shape[0], 1, q.shape[1], k.shape[1])
  for b, i, j in np.ndindex(q.shape[0], q.shape[1], k.shape[1]):
    assert mask[b, 0, i, j] == (q[b, i] != 0 and k[b, j] != 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20))
def test_causal_mask_allows_exactly_the_past(length):
  mask = np.asarray(attention.causal_mask(length))[0, 0]
  i, j = np.indices((length, length))
  np.testing.assert_array_equal(mask, j <= i)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(packed_segments())
def test_segment_mask_is_an_equivalence_on_real_tokens(seg):
  mask = np.asarray(attention.segment_mask(seg, seg))[:, 0]
  for b in range(seg.shape[0]):
    same = seg[b][:, None] == seg[b][None, :]
    real = (seg[b][:, None] != 0) & (seg[b][None, :] != 0)
    np.testing.assert_array_equal(mask[b], same & real)
    np.testing.assert_array_equal(mask[b], mask[b].T)  # Symmetric.
    # Every real token sees itself, so no real row is empty.
    assert all(mask[b, i, i] for i in np.flatnonzero(seg[b]))


@settings(max_examples=40, deadline=None)
@given(packed_segments())
def test_causal_and_segment_masks_combine_to_their_intersection(seg):
  length = seg.shape[1]
  combined = np.asarray(
    attention.combine_masks(attention.causal_mask(length), attention.segment_mask(seg, seg))
  )
  assert combined.shape == (seg.shape[0], 1, length, length)
  for b, i, j in np.ndindex(seg.shape[0], length, length):
    # Query i of row b sees key j: not in its future, in its own example, neither padding.
    allowed = j <= i and seg[b, i] == seg[b, j] and seg[b, i] != 0
    assert combined[b, 0, i, j] == allowed, (b, i, j)
  assert attention.combine_masks(None, None) is None
