"""The Transformer as a model the searches run (`search.SearchModel`), and the searches over it.

`searchable(model, variables)` gives its two functions, for the Linen model
with its variables or the NNX one (model/nnx_transformer.py) alone. The encoder runs
once per batch and makes the decoder's cache, in which the cross-attention
keys and values of each sentence are projected once and read by all its
hypotheses (`attention.cached_attention`); each step feeds one token per
hypothesis through the decoder. `greedy_search` and `beam_search` take the
model and its variables, as the translator, eval and the compile mode call
them, and are jitted: the model and every option but `alpha` are static.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from transformer_jax.decode import search
from transformer_jax.decode.cache import SearchCache
from transformer_jax.model.decode_cache import (
  CACHE_COLLECTIONS,
  ROW_CACHE,
  SENTENCE_CACHE,
  split_cache,
)


def _search_cache(sentence, rows, row_axis: int, **shared) -> SearchCache:
  """The decoder's per-sentence cache entries with `shared` (the source ids; the encoder's
  output) as the shared part, its key/value buffers `[rows, heads, max_len, d]` (after a layers
  axis where the stack is scanned) as the rows (model/decode_cache.py tells which is which)."""
  return SearchCache(
    shared={"cache": sentence, **shared}, rows=rows, row_axis=row_axis, position_axis=row_axis + 2
  )


def _at(position, tokens):
  """The decoder's positions `[rows, 1]` for one step's `tokens` `[rows]`."""
  return jnp.full((tokens.shape[0], 1), position, jnp.int32)


def _log_probs(logits):
  """One step's logits `[rows, 1, vocab]` -> log-probabilities `[rows, vocab]`, float32 or wider."""
  return jax.nn.log_softmax(logits[:, 0].astype(jnp.promote_types(logits.dtype, jnp.float32)))


def searchable(model, variables=None) -> search.SearchModel:
  """A Transformer as the searches' encoder and step functions: the Linen
  `model.transformer.Transformer` with its `variables` (`{"params": ...}`), or the NNX
  `model.nnx_transformer.Transformer` (no variables; run the search inside `nnx.jit`)."""
  if isinstance(model, nnx.Module):
    return _nnx_searchable(model)
  row_axis = int(model.config.scan_layers)

  def decode(collections, encoded, inputs, targets, positions):
    """The decoder in decode mode over the cache `collections` ({}: makes them): (logits, the
    cache it leaves)."""
    logits, mutated = model.apply(
      {**variables, **collections},
      encoded,
      inputs,
      targets,
      targets_position=positions,
      decode=True,
      method=model.decode,
      mutable=CACHE_COLLECTIONS,
    )
    sentence, rows = mutated[SENTENCE_CACHE], mutated[ROW_CACHE]
    return logits, _search_cache(sentence, rows, row_axis, encoded=encoded, inputs=inputs)

  def encode(inputs, rows: int, max_len: int) -> SearchCache:
    encoded = model.apply(variables, inputs, method=model.encode)
    targets = jnp.zeros((rows, max_len), jnp.int32)  # Sizes the buffers; decodes nothing.
    return decode({}, encoded, inputs, targets, jnp.zeros_like(targets))[1]

  def step(tokens, position, cache: SearchCache):
    encoded, inputs = cache.shared["encoded"], cache.shared["inputs"]
    collections = {SENTENCE_CACHE: cache.shared["cache"], ROW_CACHE: cache.rows}
    logits, cache = decode(collections, encoded, inputs, tokens[:, None], _at(position, tokens))
    return _log_probs(logits), cache

  return search.SearchModel(encode, step, model.config.max_len)


def _nnx_searchable(model) -> search.SearchModel:
  """The NNX Transformer's functions: its decode state is split by variable type
  (`decode_cache.split_cache`)."""
  graphdef, state = nnx.split(model)
  # The structure of the model with its cache, fixed when the encoder (traced first) makes it.
  with_cache = {}

  def as_search_cache(decoding, inputs) -> SearchCache:
    _, sentence, rows, _ = split_cache(decoding)
    return _search_cache(sentence, rows, 0, inputs=inputs)

  def encode(inputs, rows: int, max_len: int) -> SearchCache:
    decoding = nnx.merge(graphdef, state)
    decoding.init_cache(decoding.encode(inputs, train=False), rows, max_len)
    with_cache["graphdef"], _, _, with_cache["rest"] = split_cache(decoding)
    return as_search_cache(decoding, inputs)

  def step(tokens, position, cache: SearchCache):
    decoding = nnx.merge(
      with_cache["graphdef"], cache.shared["cache"], cache.rows, with_cache["rest"]
    )
    inputs = cache.shared["inputs"]
    positions = _at(position, tokens)
    logits = decoding.decode(
      None, inputs, tokens[:, None], targets_position=positions, train=False, decode=True
    )
    return _log_probs(logits), as_search_cache(decoding, inputs)

  return search.SearchModel(encode, step, model.config.max_len)


# Everything the searches take but the model's variables, the inputs and `alpha` (traced, so a
# sweep over it does not recompile).
STATIC_OPTIONS = (
  "max_len",
  "max_extra",
  "eos_id",
  "force_eos",
  "renormalize",
  "beam_size",
  "length_normalization",
  "early_stopping",
)


def _over_the_transformer(run_search):
  def run(model, variables, inputs, **options):
    if isinstance(model, nnx.Module):  # Static, it would be compiled in with its parameters.
      raise TypeError(
        "an NNX model runs the searches inside nnx.jit: "
        f"nnx.jit(lambda m, x: search.{run_search.__name__}(searchable(m), x, ...))(model, inputs)"
      )
    return run_search(searchable(model, variables), inputs, **options)

  run.__name__ = run_search.__name__
  run.__doc__ = (
    f"`search.{run_search.__name__}` over a Transformer `model` with its `variables` "
    '(`{"params": ...}`) for source ids `inputs` `[batch, src_len]`, jitted.'
  )
  return jax.jit(run, static_argnums=0, static_argnames=STATIC_OPTIONS)


greedy_search = _over_the_transformer(search.greedy_search)
beam_search = _over_the_transformer(search.beam_search)
