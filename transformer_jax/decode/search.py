"""Greedy search and beam search over any model given as two functions (`SearchModel`).

The model's `encode(inputs, rows, max_len)` makes its cache (`SearchCache`) for
`rows` hypotheses of the batch's sentences once; its `step(tokens, position,
cache)` takes one token per hypothesis and gives the next token's
log-probabilities and the new cache. Both searches are one `lax.while_loop`,
batched over sentences, to be run inside `jax.jit` (the functions may close
over traced parameters); decode/transformer_search.py runs them over the
Transformer, jitted.

Token conventions are `transformer_jax.conventions`': PAD_ID (0) is padding
and the decoder's start token, `eos_id` (EOS_ID, 1, by default) ends a
sentence. Decoders never emit PAD_ID.

Output length: sentence `i` gets at most `max_lengths(inputs, max_extra,
max_len)[i]` tokens, EOS included, i.e. its number of non-pad input tokens
plus `max_extra` (the paper's input length + 50), capped by the buffer size
`max_len` (so a buffer of exactly N positions is an absolute cap of N tokens,
Hugging Face's `max_length` N + 1, which counts the decoder's start). A
hypothesis that reaches its limit without EOS ends there; with `force_eos` its
last token is EOS, scored log-probability 0 (Hugging Face's
`forced_eos_token_id`). A row whose input is all padding decodes to nothing
(all zeros, score 0).

Log-probabilities are the model's log-softmax with the pad id set to -inf
afterwards; `renormalize` takes the log-softmax over the other tokens instead
(Hugging Face's `renormalize_logits` after `bad_words_ids=[[pad]]`).

Sharding: pass `inputs` sharded along the batch (e.g. `NamedSharding(mesh,
P('data'))`); beams of a sentence stay next to each other (`[batch * beam]`
rows, sentence-major), so every gather here is local to a sentence's shard.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.conventions import EOS_ID, PAD_ID
from transformer_jax.decode.cache import SearchCache, gather_beams, reorder_cache

NEG_INF = -jnp.inf


class SearchModel(NamedTuple):
  """A model as the searches see it.

  encode: `(inputs [batch, src_len] int32, rows, max_len) -> SearchCache`, the
    cache for `rows` hypotheses (a multiple of `batch`, the hypotheses of a
    sentence next to each other) of at most `max_len` tokens.
  step: `(tokens [rows] int32, position int32 scalar, cache) -> (log_probs
    [rows, vocab] float32, cache)`: the previous tokens (PAD_ID, the start
    token, at position 0), fed at `position`; the next token's
    log-probabilities.
  max_len: the most output positions the model can take; None: no limit.
  """

  encode: Callable[[jax.Array, int, int], SearchCache]
  step: Callable[[jax.Array, jax.Array, SearchCache], tuple[jax.Array, SearchCache]]
  max_len: int | None = None


class Decoded(NamedTuple):
  """Output of a search.

  tokens: `[batch, max_len]` int32, each row the hypothesis followed by zeros;
    it ends with EOS unless it was cut at the row's maximum length.
  scores: `[batch]` float32; greedy: the hypothesis' summed log-probability;
    beam search: that sum divided by `length_penalty(length, alpha, normalization)`.
  steps: int32 scalar, the number of decoder steps run (the loop stops as soon
    as every sentence is done, usually before `max_len`).
  """

  tokens: jax.Array
  scores: jax.Array
  steps: jax.Array


# What a finished hypothesis' summed log-probability is divided by: the GNMT length penalty
# (the paper's), or the length itself as Hugging Face's beam search does (its `length_penalty`
# is the exponent, alpha here).
LENGTH_NORMALIZATIONS = ("gnmt", "length")


def length_penalty(length, alpha, normalization: str = "gnmt"):
  """`((5 + length) / 6) ** alpha` ("gnmt") or `length ** alpha` ("length"); float32, same shape
  as `length`. Both grow with the length for alpha >= 0."""
  length = jnp.asarray(length, jnp.float32)
  if normalization not in LENGTH_NORMALIZATIONS:
    raise ValueError(
      f"length normalization {normalization!r}; allowed: {', '.join(LENGTH_NORMALIZATIONS)}"
    )
  return ((5.0 + length) / 6.0 if normalization == "gnmt" else length) ** alpha


def max_lengths(inputs, max_extra: int, max_len: int):
  """Per-sentence output limit: non-pad input tokens + `max_extra`, capped at `max_len`.

  `inputs` `[batch, src_len]` -> `[batch]` int32; 0 for rows with no real token.
  """
  source_lengths = jnp.sum(inputs != PAD_ID, axis=1, dtype=jnp.int32)
  return jnp.where(source_lengths > 0, jnp.minimum(source_lengths + max_extra, max_len), 0)


def restrict_to_eos(log_probs, last, eos_id: int):
  """Rows where `last` `[n]` is true may only emit EOS, at log-probability 0: `[n, vocab]`."""
  only_eos = jnp.where(jnp.arange(log_probs.shape[-1]) == eos_id, 0.0, NEG_INF)
  return jnp.where(last[:, None], only_eos, log_probs)


def top_extensions(alive_log_probs, log_probs, k: int):
  """The `k` best one-token extensions of each sentence's beams, by summed log-probability.

  `alive_log_probs` `[b, beams]` and next-token `log_probs` `[b, beams, vocab]`
  -> (summed log-probs, source beam, token), each `[b, k]`, best first.
  `approx_max_k` with recall target 1 is exact on every backend; unlike
  `lax.top_k`, XLA keeps it sharded along a sharded batch instead of
  gathering every sentence's candidates onto every device.
  """
  b, beams, vocab = log_probs.shape
  candidates = (alive_log_probs[:, :, None] + log_probs).reshape(b, beams * vocab)
  top_log_probs, top = lax.approx_max_k(candidates, k, recall_target=1.0)
  return top_log_probs, top // vocab, (top % vocab).astype(jnp.int32)


def _check_args(model: SearchModel, max_len, beam_size=1):
  """Raise ValueError for a buffer the model cannot position or an empty beam."""
  if max_len < 1 or (model.max_len is not None and max_len > model.max_len):
    raise ValueError(
      f"max_len={max_len} must be in [1, {model.max_len or 'inf'}] (the model's "
      "max_len, the positions it can encode)"
    )
  if beam_size < 1:
    raise ValueError(f"beam_size must be at least 1; got {beam_size}")


def next_log_probs(model: SearchModel, tokens, position, cache, renormalize: bool):
  """The model's step with the pad id at -inf (never emitted): after its log-softmax, or before
  a new one with `renormalize`: (log-probs `[rows, vocab]` float32, cache)."""
  log_probs, cache = model.step(tokens, position, cache)
  log_probs = log_probs.astype(jnp.float32).at[:, PAD_ID].set(NEG_INF)
  return (jax.nn.log_softmax(log_probs) if renormalize else log_probs), cache


def greedy_search(
  model: SearchModel,
  inputs,
  *,
  max_len: int,
  max_extra: int = 50,
  eos_id: int = EOS_ID,
  force_eos: bool = False,
  renormalize: bool = False,
) -> Decoded:
  """Greedy decoding of source ids `[batch, src_len]` -> `Decoded` (tokens `[batch, max_len]`).

  At each step every unfinished sentence takes its most probable token;
  `force_eos` and `renormalize` as in the module doc.
  """
  _check_args(model, max_len)
  batch = inputs.shape[0]
  limits = max_lengths(inputs, max_extra, max_len)

  def cond(state):
    step, _, _, done, _ = state
    return (step < max_len) & ~jnp.all(done)

  def body(state):
    step, tokens, scores, done, cache = state
    previous = jnp.where(step > 0, tokens[:, jnp.maximum(step - 1, 0)], PAD_ID)
    log_probs, cache = next_log_probs(model, previous, step, cache, renormalize)
    if force_eos:
      log_probs = restrict_to_eos(log_probs, step + 1 >= limits, eos_id)
    token = jnp.where(done, PAD_ID, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
    token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0]
    scores = scores + jnp.where(done, 0.0, token_log_prob)
    tokens = tokens.at[:, step].set(token)
    done = done | (token == eos_id) | (step + 1 >= limits)
    return step + 1, tokens, scores, done, cache

  state = (
    jnp.int32(0),
    jnp.zeros((batch, max_len), jnp.int32),
    jnp.zeros((batch,), jnp.float32),
    limits == 0,
    model.encode(inputs, batch, max_len),
  )
  steps, tokens, scores, _, _ = lax.while_loop(cond, body, state)
  return Decoded(tokens, scores, steps)


# When a sentence's beam search stops: "exact" once no alive beam can beat the best finished
# hypothesis (Hugging Face's early_stopping="never"); "heuristic" once `k` hypotheses have
# finished and the best alive beam, scored at its present length, does not beat the worst of
# them (its default, early_stopping=False); "first_k" once `k` have finished (early_stopping=True).
EARLY_STOPPING = ("exact", "heuristic", "first_k")


def _sentence_done(state, limits, penalty, early_stopping: str):
  """True for sentences whose search is over (see `EARLY_STOPPING`), or that have no alive beam:
  `[b]`.

  "exact": log-probabilities only fall as a hypothesis grows, so an alive
  beam's best possible score is its log-probability now over the largest
  penalty of any length it may still end at (between `step + 1` and its
  sentence's limit).
  """
  best_alive = jnp.max(state.alive_log_probs, axis=1)
  if early_stopping == "exact":
    largest_penalty = jnp.maximum(penalty(state.step + 1), penalty(limits))
    return state.finished_scores[:, 0] >= best_alive / largest_penalty
  full = jnp.all(state.finished_scores > NEG_INF, axis=1)
  if early_stopping == "heuristic":
    # Scored at its present length (at least 1: the rule is only consulted once k have finished).
    full &= best_alive / penalty(jnp.maximum(state.step, 1)) <= jnp.min(
      state.finished_scores, axis=1
    )
  return full | (best_alive == NEG_INF)


class BeamState(NamedTuple):
  """The loop state of `beam_search`, for `batch` sentences of `k` beams, the `n` best finished
  hypotheses (1, or `k` where the stopping rule needs them) and a `max_len` buffer."""

  step: jax.Array  # int32 scalar: positions decoded so far.
  alive: jax.Array  # [batch, k, max_len] int32: the alive hypotheses.
  alive_log_probs: jax.Array  # [batch, k] float32: their summed log-probabilities (-inf: none).
  finished_scores: jax.Array  # [batch, n] float32: finished hypotheses' scores, best first.
  finished: jax.Array  # [batch, n, max_len] int32: those hypotheses.
  cache: SearchCache  # The model's: `[batch * k, ...]` rows.


def _beam_step(
  model: SearchModel,
  limits,
  penalty,
  eos_id,
  force_eos,
  renormalize,
  early_stopping,
  state: BeamState,
) -> BeamState:
  """Extend every alive beam by one token: the best `2k` extensions; those of the first `k` that
  end (EOS, or the sentence's limit) join the finished hypotheses, and the best `k` that do not
  end are the alive beams of the next step."""
  batch, k = state.alive.shape[:2]
  step = state.step
  done = _sentence_done(state, limits, penalty, early_stopping)
  alive_log_probs = jnp.where(done[:, None], NEG_INF, state.alive_log_probs)
  previous = jnp.where(step > 0, state.alive[:, :, jnp.maximum(step - 1, 0)], PAD_ID)
  log_probs, cache = next_log_probs(model, previous.reshape(-1), step, state.cache, renormalize)
  last = step + 1 >= limits
  if force_eos:
    log_probs = restrict_to_eos(log_probs, jnp.repeat(last, k), eos_id)
  top_log_probs, beams, tokens = top_extensions(
    alive_log_probs, log_probs.reshape(batch, k, -1), 2 * k
  )
  ends = (tokens == eos_id) | last[:, None]
  extended = gather_beams(state.alive, beams).at[:, :, step].set(tokens)

  # Masks rather than slices of the ranked candidates: a slice of their first k beside their
  # whole would keep XLA's CPU compiler from running the ranking as a top-k (it sorts every
  # candidate instead; docs/performance.md#decoding).
  finishing = ends & (jnp.arange(2 * k) < k)
  finished_scores, kept = lax.approx_max_k(
    jnp.concatenate(
      [state.finished_scores, jnp.where(finishing, top_log_probs / penalty(step + 1), NEG_INF)],
      axis=1,
    ),
    state.finished_scores.shape[1],
    recall_target=1.0,
  )
  finished = gather_beams(jnp.concatenate([state.finished, extended], axis=1), kept)

  alive_log_probs, kept = lax.approx_max_k(
    jnp.where(ends, NEG_INF, top_log_probs), k, recall_target=1.0
  )
  kept_beams = jnp.take_along_axis(beams, kept, axis=1)
  alive = gather_beams(extended, kept)
  cache = reorder_cache(cache, kept_beams, length=step + 1)
  return BeamState(
    step=step + 1,
    alive=alive,
    alive_log_probs=alive_log_probs,
    finished_scores=finished_scores,
    finished=finished,
    cache=cache,
  )


def beam_search(
  model: SearchModel,
  inputs,
  *,
  beam_size: int = 4,
  alpha=0.6,
  max_len: int,
  max_extra: int = 50,
  eos_id: int = EOS_ID,
  length_normalization: str = "gnmt",
  force_eos: bool = False,
  renormalize: bool = False,
  early_stopping: str = "exact",
) -> Decoded:
  """Beam search over source ids `[batch, src_len]` -> `Decoded`, the best hypothesis per sentence.

  Each step ranks every one-token extension of the `k = beam_size` alive
  beams by summed log-probability. Those among the best `k` that end in EOS
  (or reach the sentence's limit) are finished and scored with the length
  penalty (length counts EOS); the best `k` that do not end are the next
  alive beams (fairseq's and Hugging Face's rule). A sentence stops by the
  `early_stopping` rule (`EARLY_STOPPING`; "exact": once no alive beam can
  beat its best finished hypothesis); the loop stops when every sentence
  has. With `beam_size=1`, `alpha=0` and "exact" this is greedy decoding
  (with `alpha > 0` a beam that ends may give way to a longer one that
  scores better). `alpha` is traced: changing it does not recompile.
  `length_normalization="length"` divides by `length ** alpha` instead
  (Hugging Face's normalization). `force_eos` and `renormalize` as in the
  module doc.
  """
  _check_args(model, max_len, beam_size)
  if early_stopping not in EARLY_STOPPING:
    raise ValueError(f"early_stopping={early_stopping!r}; allowed: {', '.join(EARLY_STOPPING)}")
  penalty = functools.partial(length_penalty, alpha=alpha, normalization=length_normalization)
  batch, k = inputs.shape[0], beam_size
  kept = 1 if early_stopping == "exact" else k
  limits = max_lengths(inputs, max_extra, max_len)

  def cond(state: BeamState):
    done = _sentence_done(state, limits, penalty, early_stopping)
    return (state.step < max_len) & ~jnp.all(done)

  body = functools.partial(
    _beam_step, model, limits, penalty, eos_id, force_eos, renormalize, early_stopping
  )
  # Every beam starts from the start token; only the first is live, so the
  # first step expands one hypothesis per sentence.
  first_beam = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF).astype(jnp.float32)
  state = BeamState(
    step=jnp.int32(0),
    alive=jnp.zeros((batch, k, max_len), jnp.int32),
    alive_log_probs=jnp.where(limits[:, None] > 0, first_beam[None, :], NEG_INF),
    # An empty source's output is empty, score 0.
    finished_scores=jnp.full((batch, kept), NEG_INF)
    .at[:, 0]
    .set(jnp.where(limits > 0, NEG_INF, 0.0)),
    finished=jnp.zeros((batch, kept, max_len), jnp.int32),
    cache=model.encode(inputs, batch * k, max_len),
  )
  final = lax.while_loop(cond, body, state)
  return Decoded(final.finished[:, 0], final.finished_scores[:, 0], final.step)


def trim(tokens, eos_id: int = EOS_ID) -> list[list[int]]:
  """Host-side: token rows `[batch, max_len]` -> lists of ids, cut before the first EOS or pad."""
  rows = []
  for row in jax.device_get(tokens).tolist():
    end = next((j for j, t in enumerate(row) if t in (eos_id, PAD_ID)), len(row))
    rows.append(row[:end])
  return rows
