"""Decoding: cache vs teacher forcing, greedy and beam search vs brute force, output limits.

References are independent of the code under test: the teacher-forced forward
pass, numpy float64 formulas, and exhaustive enumeration of every hypothesis.
Random tiny Transformers tend to end at once or never, so the searches are
also checked on a model that is not a Transformer (`markov_search_model`):
next-token tables that make EOS likelier with position and give optima of
every length, run through the searches' encoder and step functions.
"""

import dataclasses
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import numpy_reference as ref
from helpers import SOURCES_16, VOCAB, code_block, stack_layers
from helpers import eos_biased_model as tiny_model
from transformer_jax.conventions import EOS_ID as EOS
from transformer_jax.decode import cache as cache_lib
from transformer_jax.decode import search as search_lib
from transformer_jax.decode import transformer_search
from transformer_jax.model import nnx_transformer
from transformer_jax.model.transformer import Transformer

pytestmark = pytest.mark.device

WORDS = range(2, VOCAB)


# --- models and references -------------------------------------------------


def markov_search_model(table, second) -> search_lib.SearchModel:
  """A model that is not a Transformer: logits `table[position, previous] + second[position,
  the token before it]`, with the tables `[max_len, vocab, vocab]` in the shared part of the
  cache and each hypothesis' tokens so far in its rows (`[rows, max_len]`, position axis 1),
  which beam search must reorder with the beams for the second-order term to be right."""

  def encode(inputs, rows, max_len):
    return cache_lib.SearchCache(
      shared={"table": table, "second": second},
      rows={"history": jnp.zeros((rows, max_len), jnp.int32)},
      position_axis=1,
    )

  def step(tokens, position, cache):
    last = jnp.maximum(position - 1, 0)
    history = cache.rows["history"].at[:, last].set(jnp.where(position > 0, tokens, 0))
    before = jnp.where(position > 1, history[:, jnp.maximum(position - 2, 0)], 0)
    logits = cache.shared["table"][position, tokens] + cache.shared["second"][position, before]
    return jax.nn.log_softmax(logits), cache.replace(rows={"history": history})

  return search_lib.SearchModel(encode, step, max_len=table.shape[0])


@functools.partial(jax.jit, static_argnames=("search",) + transformer_search.STATIC_OPTIONS)
def markov_search(tables, inputs, *, search="beam_search", **options):
  """`search_lib.<search>` over `markov_search_model(*tables)`, jitted."""
  return getattr(search_lib, search)(markov_search_model(*tables), inputs, **options)


def markov_model(seed, slope, second_order=0.0):
  """Random tables whose EOS logit grows by `slope` per position, the second-order term scaled
  by `second_order`: (tables for `markov_search`, the same tables in numpy)."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(16, VOCAB, VOCAB)).astype(np.float32)
  table[:, :, EOS] += slope * (np.arange(16)[:, None] - 2.5)
  second = (second_order * rng.normal(size=(16, VOCAB, VOCAB))).astype(np.float32)
  return (jnp.asarray(table), jnp.asarray(second)), (table, second)


def markov_logits(tables, prefix):
  """float64 logits of the token after `prefix` (a list of ids) under the numpy tables."""
  table, second = (t.astype(np.float64) for t in tables)
  position = len(prefix)
  previous = prefix[-1] if prefix else 0
  before = prefix[-2] if len(prefix) > 1 else 0
  return table[position, previous] + second[position, before]


def markov_log_prob(tables, tokens):
  """Summed log-probability of a token list under the tables, in float64."""
  total = 0.0
  for position, token in enumerate(tokens):
    logits = markov_logits(tables, tokens[:position])
    total += logits[token] - np.log(np.exp(logits).sum())
  return total


@functools.partial(jax.jit, static_argnums=0)
def _forward_log_probs(model, variables, inputs, targets):
  return jax.nn.log_softmax(model.apply(variables, inputs, targets))


def teacher_forced_log_probs(model, variables, inputs, targets):
  """float64 log-softmax of the full forward pass: `[b, t, vocab]`."""
  return np.asarray(_forward_log_probs(model, variables, inputs, targets), np.float64)


def transformer_log_probs(model, variables, source, hypotheses):
  """Summed log-probability of each hypothesis (lists of ids) given one source row."""
  targets = np.zeros((len(hypotheses), max(len(h) for h in hypotheses)), np.int32)
  for i, h in enumerate(hypotheses):
    targets[i, : len(h)] = h
  inputs = np.repeat(np.asarray(source)[None], len(hypotheses), axis=0)
  log_probs = teacher_forced_log_probs(model, variables, inputs, targets)
  picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return np.sum(np.where(targets != 0, picked, 0.0), axis=1)


def gnmt_penalty(length, alpha):
  return ((5.0 + np.asarray(length, np.float64)) / 6.0) ** alpha


def length_power(length, alpha):
  """Hugging Face's normalization: length ** alpha."""
  return np.asarray(length, np.float64) ** alpha


def all_hypotheses(limit):
  """Every complete output of at most `limit` tokens: words then EOS, or `limit` words cut off."""
  hyps = [list(p) + [EOS] for n in range(limit) for p in itertools.product(WORDS, repeat=n)]
  return hyps + [list(p) for p in itertools.product(WORDS, repeat=limit)]


def brute_force_best(log_prob_of, limit, alpha, penalty=gnmt_penalty):
  """(best hypothesis, its score) over `all_hypotheses(limit)`; asserts there is no near-tie."""
  hyps = all_hypotheses(limit)
  scores = np.array([log_prob_of(hyps)]).ravel() / penalty([len(h) for h in hyps], alpha)
  best, runner_up = np.argsort(-scores)[:2]
  assert scores[best] - scores[runner_up] > 1e-4, "fixture has a near-tie"
  return hyps[best], scores[best]


def source_lengths(inputs):
  return (np.asarray(inputs) != 0).sum(axis=1)


def output_lengths(tokens):
  """Tokens per row, EOS included (decoders never emit the pad id 0)."""
  return (np.asarray(tokens) != 0).sum(axis=1)


def hypothesis(tokens, b):
  return list(np.asarray(tokens)[b, : output_lengths(tokens)[b]])


# --- pure helpers -----------------------------------------------------------


def test_length_penalty_matches_gnmt_formula():
  lengths = np.arange(0, 60)
  for alpha in (0.0, 0.6, 1.0, 2.0):
    np.testing.assert_allclose(
      search_lib.length_penalty(lengths, alpha), gnmt_penalty(lengths, alpha), rtol=1e-6
    )
    np.testing.assert_allclose(
      search_lib.length_penalty(lengths, alpha, "length"), length_power(lengths, alpha), rtol=1e-6
    )
  with pytest.raises(ValueError, match="length normalization 'log'"):
    search_lib.length_penalty(lengths, 0.6, "log")


def test_max_lengths_adds_extra_to_source_length_and_caps():
  inputs = jnp.array([[5, 6, 7, 0], [5, 0, 0, 0], [0, 0, 0, 0], [5, 6, 7, 8]])
  np.testing.assert_array_equal(search_lib.max_lengths(inputs, 50, 53), [53, 51, 0, 53])
  np.testing.assert_array_equal(search_lib.max_lengths(inputs, 2, 64), [5, 3, 0, 6])


def test_gather_beams_and_reorder_cache():
  x = jnp.arange(2 * 3 * 2).reshape(2, 3, 2)
  indices = jnp.array([[2, 2, 0], [1, 0, 1]])
  expected = np.stack([np.asarray(x)[b][np.asarray(indices)[b]] for b in range(2)])
  np.testing.assert_array_equal(cache_lib.gather_beams(x, indices), expected)

  rows = jnp.arange(6 * 4).reshape(6, 4)
  # What is shared is told by where it is, whatever its name: rows are reordered, shared not.
  cache = cache_lib.SearchCache(
    shared={"cached_key": rows, "index": jnp.int32(3)}, rows={"layer": {"static_key": rows}}
  )
  out = cache_lib.reorder_cache(cache, indices)
  flat = np.array([2, 2, 0, 4, 3, 4])  # sentence-major rows: sentence * 3 + beam
  np.testing.assert_array_equal(out.rows["layer"]["static_key"], np.asarray(rows)[flat])
  np.testing.assert_array_equal(out.shared["cached_key"], rows)
  assert int(out.shared["index"]) == 3


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("length", [1, 8, 9, 23, 24])
def test_reorder_cache_moves_the_written_positions_only(scan_layers, length):
  """With `length` and a position axis, the first `length` positions (rounded up to whole
  chunks) are reordered and the rest stay; a buffer that chunks do not divide, or a cache
  without a position axis, is reordered whole."""
  indices = jnp.array([[2, 2, 0], [1, 0, 1]])
  flat = np.array([2, 2, 0, 4, 3, 4])
  reorder = jax.jit(cache_lib.reorder_cache)
  for max_len, position_axis in ((24, 2), (20, 2), (24, None)):
    keys = np.random.default_rng(length).standard_normal((6, 2, max_len, 3)).astype(np.float32)
    layered = keys[None] if scan_layers else keys
    axis = position_axis and position_axis + scan_layers
    cache = cache_lib.SearchCache(
      shared=layered, rows=layered, row_axis=int(scan_layers), position_axis=axis
    )
    out = reorder(cache, indices, length=jnp.int32(length))
    got = np.asarray(out.rows[0] if scan_layers else out.rows)
    whole = max_len % cache_lib.REORDER_CHUNK or position_axis is None
    moved = max_len if whole else -(-length // 8) * 8
    np.testing.assert_array_equal(got[:, :, :moved], keys[flat][:, :, :moved])
    np.testing.assert_array_equal(got[:, :, moved:], keys[:, :, moved:])
    np.testing.assert_array_equal(out.shared, layered)


def test_top_extensions_ranks_every_beam_token_pair():
  rng = np.random.default_rng(0)
  alive = np.array([[-1.0, -0.5, -np.inf], [0.0, -2.0, -3.0]], np.float32)
  log_probs = np.log(rng.dirichlet(np.ones(4), size=(2, 3))).astype(np.float32)
  got_scores, got_beams, got_tokens = search_lib.top_extensions(jnp.asarray(alive), log_probs, 4)
  for b in range(2):
    pairs = sorted(
      ((alive[b, i] + log_probs[b, i, t], i, t) for i in range(3) for t in range(4)), reverse=True
    )[:4]
    np.testing.assert_allclose(got_scores[b], [p[0] for p in pairs], rtol=1e-6)
    assert list(zip(got_beams[b].tolist(), got_tokens[b].tolist())) == [p[1:] for p in pairs]


def test_trim_cuts_at_eos():
  tokens = np.array([[4, 2, 1, 0], [3, 3, 3, 3], [1, 0, 0, 0], [0, 0, 0, 0]])
  assert search_lib.trim(tokens) == [[4, 2], [3, 3, 3, 3], [], []]


# --- cached decoding vs the teacher-forced forward pass ---------------------


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("buffer, steps, reorder_at", [(8, 6, 3), (16, 12, 5), (12, 6, 3)])
def test_cached_steps_match_teacher_forcing_including_beam_reorders(
  scan_layers, buffer, steps, reorder_at
):
  """The reorder moves the positions written so far (with a 16-position buffer: the first chunk
  of 8 only, and decoding goes on past it; a 12-position one is moved whole)."""
  model, variables = tiny_model(seed=1)
  if scan_layers:  # The cache then leads with a layers axis.
    model = Transformer(dataclasses.replace(model.config, scan_layers=True))
    variables = {"params": stack_layers(variables["params"])}
  rng = np.random.default_rng(0)
  inputs = jnp.array([[2, 3, 4, 2, 0], [4, 4, 0, 0, 0]])
  k = 3
  # Each of the 2 * 3 rows feeds its own random tokens; before step `reorder_at` the beams
  # of each sentence are reordered, so later steps continue other rows' prefixes.
  fed = rng.integers(1, VOCAB, size=(2, k, steps))
  order = np.array([[2, 0, 0], [1, 2, 1]])
  history = fed.copy()
  history[:, :, :reorder_at] = np.stack([fed[b][order[b], :reorder_at] for b in range(2)])
  beam_inputs = jnp.repeat(inputs, k, axis=0)  # Sentence-major: the rows of a sentence together.
  before, after = fed.reshape(2 * k, steps), history.reshape(2 * k, steps)
  expected_before = teacher_forced_log_probs(model, variables, beam_inputs, before)
  expected_after = teacher_forced_log_probs(model, variables, beam_inputs, after)

  # As the beam search does it: the 3 rows of a sentence share its cross-attention cache.
  searcher = transformer_search.searchable(model, variables)
  cache = jax.jit(searcher.encode, static_argnums=(1, 2))(inputs, 2 * k, buffer)
  row_axis = int(scan_layers)
  assert cache.row_axis == row_axis and cache.position_axis == row_axis + 2
  shared = jax.tree.leaves(cache.shared["cache"])
  assert {x.shape[row_axis] for x in shared if x.ndim > row_axis} == {2}  # One per sentence.
  assert {x.shape[row_axis] for x in jax.tree.leaves(cache.rows)} == {2 * k}
  step_fn = jax.jit(functools.partial(search_lib.next_log_probs, searcher, renormalize=False))
  reorder = jax.jit(cache_lib.reorder_cache)
  for step in range(steps):
    if step == reorder_at:
      cache = reorder(cache, jnp.asarray(order), length=jnp.int32(reorder_at))
    targets, expected = (before, expected_before) if step < reorder_at else (after, expected_after)
    previous = targets[:, step - 1] if step else np.zeros(2 * k, np.int32)
    log_probs, cache = step_fn(jnp.asarray(previous), jnp.int32(step), cache)
    np.testing.assert_allclose(log_probs[:, 1:], expected[:, step, 1:], atol=1e-5)
    assert np.all(np.isneginf(log_probs[:, 0]))  # the pad id is never emitted


@pytest.mark.parametrize("front_door", ["linen", "linen_scanned", "nnx"])
def test_the_cache_keeps_one_copy_per_sentence_of_what_every_beam_reads(front_door):
  """Told by shape alone: every entry of the rows has one row per hypothesis, and every shared
  entry of the decoder's cache one per sentence, or none (a write position): an entry of one
  kind classified as the other (model/decode_cache.py) fails here, whatever its name."""
  model, variables = tiny_model(seed=1)
  if front_door == "linen_scanned":
    model = Transformer(dataclasses.replace(model.config, scan_layers=True))
    variables = {"params": stack_layers(variables["params"])}
  if front_door == "nnx":
    model = nnx_transformer.Transformer(model.config, rngs=nnx.Rngs(0))
  sentences, k, max_len = 2, 3, 8
  searcher = transformer_search.searchable(model, variables)
  inputs = jnp.array([[2, 3, 4, 2, 0], [4, 4, 0, 0, 0]])
  cache = jax.eval_shape(lambda x: searcher.encode(x, sentences * k, max_len), inputs)
  row_axis = cache.row_axis
  assert row_axis == int(front_door == "linen_scanned")
  stacks = 1 if row_axis else model.config.decoder_depth  # A scanned stack is one of each.
  # Per layer: the self-attention's keys and values per row; the cross-attention's keys and
  # values per sentence, and the self-attention's write position (no row axis).
  rows = jax.tree.leaves(cache.rows)
  assert [x.shape[row_axis] for x in rows] == [sentences * k] * 2 * stacks
  assert {x.shape[cache.position_axis] for x in rows} == {max_len}
  shared = jax.tree.leaves(cache.shared["cache"])
  rows_of_shared = sorted(x.shape[row_axis] if x.ndim > row_axis else 0 for x in shared)
  assert rows_of_shared == sorted([0, sentences, sentences] * stacks)


# --- greedy decoding ----------------------------------------------------------


@pytest.mark.slow
def test_greedy_takes_the_teacher_forced_argmax_and_stops_when_all_are_done():
  model, variables = tiny_model(eos_bias=2.0, seed=3, vocab=16)
  inputs = jnp.concatenate([SOURCES_16, jnp.zeros((1, 8), jnp.int32)])
  out = transformer_search.greedy_search(model, variables, inputs, max_len=24, max_extra=12)
  lengths, limits = output_lengths(out.tokens), source_lengths(inputs) + 12
  all_log_probs = teacher_forced_log_probs(model, variables, inputs, out.tokens)
  for b in range(4):
    hyp, log_probs = hypothesis(out.tokens, b), all_log_probs[b, : lengths[b]]
    np.testing.assert_array_equal(np.argmax(log_probs[:, 1:], axis=-1) + 1, hyp)
    np.testing.assert_allclose(out.scores[b], log_probs[np.arange(len(hyp)), hyp].sum(), atol=1e-4)
    assert (hyp[-1] == EOS) != (lengths[b] == limits[b])  # ends at EOS or is cut at its limit
  assert EOS in hypothesis(out.tokens, 1)  # this fixture has one sentence that ends early
  assert lengths[4] == 0 and float(out.scores[4]) == 0.0  # empty source, empty output
  assert int(out.steps) == lengths.max() < 24  # the loop stops with the last sentence


# --- beam search ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["transformer_eos_early", "transformer", "markov"])
def test_beam_of_one_is_greedy(fixture):
  kwargs = dict(max_len=12, max_extra=6)
  if fixture == "markov":
    tables, _ = markov_model(seed=1, slope=1.0, second_order=1.0)
    inputs = jnp.array([[2, 3, 4, 0], [3, 0, 0, 0], [4, 2, 2, 2], [0, 0, 0, 0]])
    greedy = markov_search(tables, inputs, search="greedy_search", **kwargs)
    beam = markov_search(tables, inputs, beam_size=1, alpha=0.0, **kwargs)
  else:
    bias, seed = (2.0, 3) if fixture == "transformer_eos_early" else (0.0, 5)
    model, variables = tiny_model(eos_bias=bias, seed=seed, vocab=16)
    inputs = SOURCES_16
    greedy = transformer_search.greedy_search(model, variables, inputs, **kwargs)
    beam = transformer_search.beam_search(
      model, variables, inputs, beam_size=1, alpha=0.0, **kwargs
    )
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  assert int(beam.steps) == int(greedy.steps)
  # With alpha = 0 the beam score is the plain summed log-probability.
  np.testing.assert_allclose(beam.scores, greedy.scores, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
  "alpha, normalization",
  [(0.0, "gnmt"), (0.6, "gnmt"), (2.0, "gnmt"), (1.0, "length"), (2.0, "length")],
)
@pytest.mark.parametrize("eos_bias, seed", [(0.0, 6), (-0.5, 7), (1.0, 6)])
def test_transformer_large_beam_finds_the_brute_force_best(alpha, normalization, eos_bias, seed):
  """Limits 3 and 4 (source lengths 1 and 2, max_extra 2), every hypothesis enumerated.

  A beam of 4 * 3**3 = 108 keeps every candidate at every step.
  """
  model, variables = tiny_model(eos_bias=eos_bias, seed=seed)
  inputs = jnp.array([[3, 0, 0], [2, 4, 0]])
  out = transformer_search.beam_search(
    model,
    variables,
    inputs,
    beam_size=108,
    alpha=alpha,
    max_len=8,
    max_extra=2,
    length_normalization=normalization,
  )
  penalty = {"gnmt": gnmt_penalty, "length": length_power}[normalization]
  for b, limit in enumerate(source_lengths(inputs) + 2):
    best, score = brute_force_best(
      lambda hyps, b=b: transformer_log_probs(model, variables, inputs[b], hyps),
      limit,
      alpha,
      penalty,
    )
    assert hypothesis(out.tokens, b) == best
    np.testing.assert_allclose(out.scores[b], score, rtol=1e-5)


def earliest_safe_stop(table, limit, alpha):
  """First step after which no unfinished hypothesis can beat the best finished one (enumerated)."""
  for step in range(1, limit):
    finished = [h for h in all_hypotheses(limit) if len(h) <= step and h[-1] == EOS]
    best = max(
      (markov_log_prob(table, h) / gnmt_penalty(len(h), alpha) for h in finished), default=-np.inf
    )
    alive = max(markov_log_prob(table, p) for p in itertools.product(WORDS, repeat=step))
    if best >= alive / max(gnmt_penalty(step + 1, alpha), gnmt_penalty(limit, alpha)):
      return step
  return limit


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize(
  "seed, slope, second_order",
  [(0, 0.5, 0.0), (1, 1.0, 0.0), (3, 1.0, 0.0), (4, 2.0, 0.0), (1, 1.0, 1.0)],
)
def test_markov_large_beam_finds_the_brute_force_best_and_stops_early(
  alpha, seed, slope, second_order
):
  """Limits 5 and 6; a beam of 4 * 3**5 = 972 keeps every candidate at every step.

  The loop must run exactly until both sentences are safe to stop, which the
  fixtures make happen before the limit in most cases.
  """
  tables, table = markov_model(seed, slope, second_order)
  inputs = jnp.array([[3, 2, 0], [2, 4, 4]])
  limits = source_lengths(inputs) + 3
  out = markov_search(tables, inputs, beam_size=972, alpha=alpha, max_len=8, max_extra=3)
  for b, limit in enumerate(limits):
    best, score = brute_force_best(
      lambda hyps: [markov_log_prob(table, h) for h in hyps], limit, alpha
    )
    assert hypothesis(out.tokens, b) == best
    np.testing.assert_allclose(out.scores[b], score, rtol=1e-5)
  assert int(out.steps) == max(earliest_safe_stop(table, limit, alpha) for limit in limits)


def test_markov_fixtures_cover_early_stops_and_optima_of_every_length():
  """Guards the test above against fixtures that no longer exercise anything."""
  lengths, early = set(), 0
  for seed, slope in [(0, 0.5), (1, 1.0), (3, 1.0), (4, 2.0)]:
    _, table = markov_model(seed, slope)
    for alpha in (0.0, 0.6, 2.0):
      best, _ = brute_force_best(
        lambda hyps, t=table: [markov_log_prob(t, h) for h in hyps], 6, alpha
      )
      lengths.add(len(best))
      early += earliest_safe_stop(table, 6, alpha) < 6
  assert {2, 3, 5} <= lengths and early >= 6


MARKOV_SOURCES = np.array([[3, 2, 0], [2, 4, 4]], np.int32)  # Limits 5 and 6 with max_extra 3.


def markov_reference(
  table, inputs, beam_size, alpha, normalization, max_len, early_stopping="exact", **options
):
  """`numpy_reference.beam_search` of each sentence of `inputs` (max_extra 3, a `max_len`
  buffer): (hypothesis, score, steps, alive beams from beyond the first ranks) per sentence."""
  penalty = lambda n: {"gnmt": gnmt_penalty, "length": length_power}[normalization](n, alpha)
  results = []
  for limit in np.minimum(source_lengths(inputs) + 3, max_len):
    log_probs_of = lambda prefix, limit=limit: ref.step_log_probs(
      markov_logits(table, prefix), last=len(prefix) + 1 == limit, eos=EOS, **options
    )
    results.append(ref.beam_search(log_probs_of, limit, beam_size, penalty, early_stopping))
  return results


MARKOV_BEAMS = [
  (seed, slope, second_order, k)
  for seed, slope, second_order in [
    (0, 0.5, 0.0),
    (1, 1.0, 0.0),
    (4, 2.0, 0.0),
    (5, 0.0, 0.0),
    (6, 1.0, 1.0),
  ]
  for k in (1, 2, 3)
]
BOTH = {"force_eos": True, "renormalize": True}


@pytest.mark.parametrize(
  "early_stopping, options",
  [
    ("exact", {}),
    ("exact", {"force_eos": True}),
    ("exact", {"renormalize": True}),
    ("exact", BOTH),
    ("heuristic", {}),
    ("heuristic", BOTH),
    ("first_k", {}),
    ("first_k", BOTH),
  ],
)
@pytest.mark.parametrize("alpha, normalization", [(0.6, "gnmt"), (1.0, "length"), (2.0, "length")])
@pytest.mark.parametrize("max_len", [8, 5])
def test_markov_beam_equals_the_reference_beam_search(
  early_stopping, options, alpha, normalization, max_len
):
  """Small beams, where the 2k rule decides which beams live on; a buffer of 5 caps both
  sentences at 5 tokens (an absolute cap), where `force_eos` ends every hypothesis with EOS."""
  for seed, slope, second_order, k in MARKOV_BEAMS:
    tables, table = markov_model(seed, slope, second_order)
    out = markov_search(
      tables,
      MARKOV_SOURCES,
      beam_size=k,
      alpha=alpha,
      max_len=max_len,
      max_extra=3,
      length_normalization=normalization,
      early_stopping=early_stopping,
      **options,
    )
    want = markov_reference(
      table, MARKOV_SOURCES, k, alpha, normalization, max_len, early_stopping, **options
    )
    for b, (best, score, _, _) in enumerate(want):
      assert hypothesis(out.tokens, b) == best, (seed, slope, k, b)
      np.testing.assert_allclose(out.scores[b], score, rtol=1e-5)
      assert not options.get("force_eos") or best[-1] == EOS
    assert int(out.steps) == max(steps for _, _, steps, _ in want)


def test_markov_reference_fixtures_exercise_the_2k_rule_the_cap_and_the_stopping_rules():
  """Guards the test above: alive beams come from beyond the first k ranks, the forced EOS
  changes some best hypotheses at the cap, and the stopping rules give different outputs."""
  beyond = forced_changed = heuristic_changed = first_k_changed = 0
  for seed, slope, second_order, k in MARKOV_BEAMS:
    _, table = markov_model(seed, slope, second_order)
    plain = markov_reference(table, MARKOV_SOURCES, k, 2.0, "length", 5)
    forced = markov_reference(table, MARKOV_SOURCES, k, 2.0, "length", 5, force_eos=True)
    heuristic = markov_reference(table, MARKOV_SOURCES, k, 2.0, "length", 8, "heuristic")
    first_k = markov_reference(table, MARKOV_SOURCES, k, 2.0, "length", 8, "first_k")
    exact = markov_reference(table, MARKOV_SOURCES, k, 2.0, "length", 8)
    beyond += sum(r[3] for r in plain)
    forced_changed += sum(p[0] != f[0] for p, f in zip(plain, forced))
    heuristic_changed += sum(e[0] != h[0] for e, h in zip(exact, heuristic))
    first_k_changed += sum(e[0] != f[0] for e, f in zip(exact, first_k))
  assert beyond >= 5 and forced_changed >= 3, (beyond, forced_changed)
  assert heuristic_changed >= 2 and first_k_changed >= 2, (heuristic_changed, first_k_changed)


def forced_eos_hypotheses(limit):
  """Every complete output when the last allowed token is EOS: words then EOS, at most `limit`."""
  return [list(p) + [EOS] for n in range(limit) for p in itertools.product(WORDS, repeat=n)]


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed, slope", [(0, 0.5), (1, 1.0), (5, 0.0)])
def test_markov_large_beam_with_a_cap_and_forced_eos_finds_the_brute_force_best(
  renormalize, alpha, seed, slope
):
  """A buffer of 5 caps both sentences at 5 tokens, the last one EOS; a beam of 4 * 3**5 keeps
  every candidate, so the search must find the best of every hypothesis enumerated."""
  tables, table = markov_model(seed, slope)
  out = markov_search(
    tables,
    MARKOV_SOURCES,
    beam_size=972,
    alpha=alpha,
    max_len=5,
    max_extra=3,
    length_normalization="length",
    force_eos=True,
    renormalize=renormalize,
  )
  hyps = forced_eos_hypotheses(5)
  scores = []
  for h in hyps:
    log_probs = [
      ref.step_log_probs(
        markov_logits(table, h[:i]),
        last=i + 1 == 5,
        eos=EOS,
        force_eos=True,
        renormalize=renormalize,
      )[t]
      for i, t in enumerate(h)
    ]
    scores.append(sum(log_probs) / length_power(len(h), alpha))
  best = int(np.argmax(scores))
  assert sorted(scores)[-1] - sorted(scores)[-2] > 1e-4, "fixture has a near-tie"
  for b in range(2):  # Both sentences have limit 5 (the cap), so the same best.
    assert hypothesis(out.tokens, b) == hyps[best]
    np.testing.assert_allclose(out.scores[b], scores[best], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("renormalize", [False, True])
def test_greedy_with_forced_eos_ends_every_sentence_at_its_limit_with_eos(renormalize):
  model, variables = tiny_model(eos_bias=-30.0, seed=10)  # EOS is never chosen
  inputs = jnp.array([[2, 3, 4, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0], [4, 2, 2, 2, 3]])
  plain = transformer_search.greedy_search(model, variables, inputs, max_len=7, max_extra=3)
  out = transformer_search.greedy_search(
    model, variables, inputs, max_len=7, max_extra=3, force_eos=True, renormalize=renormalize
  )
  lengths = output_lengths(plain.tokens)
  np.testing.assert_array_equal(output_lengths(out.tokens), lengths)
  for b in range(4):
    if lengths[b]:  # The same words, the last one replaced by EOS at log-probability 0.
      assert hypothesis(out.tokens, b) == hypothesis(plain.tokens, b)[:-1] + [EOS]
  if not renormalize:
    last_word = teacher_forced_log_probs(model, variables, inputs, plain.tokens)[
      np.arange(4),
      np.maximum(lengths - 1, 0),
      np.asarray(plain.tokens)[np.arange(4), np.maximum(lengths - 1, 0)],
    ]
    np.testing.assert_allclose(
      out.scores, plain.scores - np.where(lengths > 0, last_word, 0.0), atol=1e-4
    )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="reads the CPU compiler's program")
@pytest.mark.parametrize("early_stopping", search_lib.EARLY_STOPPING)
def test_beam_search_ranks_the_candidates_with_a_top_k_not_a_sort_of_all(early_stopping):
  """On a CPU, XLA runs `approx_max_k` as a top-k only when the ranking is used as a whole; a
  sort of every candidate (4 sentences x 4 beams x 16 tokens here) made a beam search 13x
  slower at vocabulary 8k."""
  model, variables = tiny_model(vocab=16)
  hlo = (
    transformer_search.beam_search.lower(
      model,
      variables,
      SOURCES_16,
      beam_size=4,
      max_len=16,
      max_extra=6,
      early_stopping=early_stopping,
    )
    .compile()
    .as_text()
  )
  sorts = [line for line in hlo.splitlines() if " sort(" in line]
  assert not [line for line in sorts if "[4,64]" in line], sorts
  assert re.search(
    r"f32\[4,8\]\{[0-9,]*\}, s32\[4,8\]\{[0-9,]*\}\) custom-call\([^)]*\), "
    r"custom_call_target=\"TopK\"",
    hlo,
  )  # The best 2k of the 64 candidates.


def test_beam_of_four_stops_before_the_limit():
  model, variables = tiny_model(eos_bias=2.0, seed=3, vocab=16)
  out = transformer_search.beam_search(
    model, variables, SOURCES_16, beam_size=4, max_len=24, max_extra=12
  )
  lengths = output_lengths(out.tokens)
  assert np.all(np.asarray(out.tokens)[np.arange(4), lengths - 1] == EOS)
  assert int(out.steps) < (source_lengths(SOURCES_16) + 12).max()


@pytest.mark.parametrize("name", ["greedy", "beam"])
def test_outputs_never_exceed_source_length_plus_max_extra(name):
  model, variables = tiny_model(eos_bias=-30.0, seed=10)  # EOS is never chosen
  inputs = jnp.array([[2, 3, 4, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0], [4, 2, 2, 2, 3]])
  kwargs = dict(max_len=7, max_extra=3)
  if name == "greedy":
    out = transformer_search.greedy_search(model, variables, inputs, **kwargs)
  else:
    out = transformer_search.beam_search(model, variables, inputs, beam_size=4, **kwargs)
  expected = np.minimum(source_lengths(inputs) + 3, 7) * (source_lengths(inputs) > 0)
  np.testing.assert_array_equal(output_lengths(out.tokens), expected)  # cut at the limit
  assert not np.any(np.asarray(out.tokens) == EOS)
  assert int(out.steps) == expected.max()


def test_rejects_max_len_beyond_the_model_positions_and_empty_beams():
  model, variables = tiny_model()
  inputs = jnp.ones((1, 3), jnp.int32)
  with pytest.raises(ValueError, match=r"max_len=40 must be in \[1, 32\]"):
    transformer_search.greedy_search(model, variables, inputs, max_len=40)
  with pytest.raises(ValueError, match="beam_size must be at least 1"):
    transformer_search.beam_search(model, variables, inputs, beam_size=0, max_len=8)


def test_the_library_docs_search_over_a_bigram_model_runs_and_scores_its_output(capsys):
  """docs/library.md's "search over your own model" block, run as written: each printed
  hypothesis scores as the bigram table says, over the paper's length penalty."""
  code = code_block("docs/library.md", "### The search over your own model\n")
  assert len(code.strip().splitlines()) <= 20
  scope = {}
  exec(compile(code, "docs/library.md", "exec"), scope)  # pylint: disable=exec-used
  printed = capsys.readouterr().out.strip().splitlines()[-1]
  out = scope["beam"](scope["inputs"])
  assert printed == str(search_lib.trim(out.tokens))
  table = np.asarray(scope["bigram"], np.float64)
  log_probs = table - np.log(np.exp(table).sum(axis=1, keepdims=True))
  for b, limit in enumerate(source_lengths(scope["inputs"]) + 50):
    tokens = hypothesis(out.tokens, b)
    assert 0 < len(tokens) <= min(limit, 16) and 0 not in tokens
    total = sum(log_probs[previous, t] for previous, t in zip([0] + tokens[:-1], tokens))
    np.testing.assert_allclose(out.scores[b], total / gnmt_penalty(len(tokens), 0.6), rtol=1e-5)
