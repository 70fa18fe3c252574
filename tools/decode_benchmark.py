"""The decoding benchmark: beam search and greedy decoding of a fixed shape, timed."""

import jax.numpy as jnp
import numpy as np

from tools.timing import summary, timed
from transformer_jax.conventions import UNK_ID
from transformer_jax.decode import transformer_search

SENTENCES, SOURCE_LENGTH, OUTPUT_LENGTH = 16, 32, 48


def measure_decoding(
  model,
  params,
  runs: int,
  *,
  sentences: int = SENTENCES,
  source_length: int = SOURCE_LENGTH,
  output_length: int = OUTPUT_LENGTH,
) -> dict:
  """Seconds per batch of `sentences` random sources of `source_length` tokens for beam 4
  (alpha 0.6) and greedy, forced to `output_length` tokens: the first call (compile included) and
  the median, min and max of `runs` more."""
  vocab = model.config.vocab_size
  inputs = jnp.asarray(
    np.random.default_rng(1).integers(UNK_ID + 1, vocab, (sentences, source_length)), jnp.int32
  )
  variables = {"params": params}
  common = dict(max_len=output_length, max_extra=output_length, eos_id=-1)
  searches = {
    "beam4": lambda: (
      transformer_search.beam_search(
        model, variables, inputs, beam_size=4, alpha=0.6, **common
      ).tokens
    ),
    "greedy": lambda: transformer_search.greedy_search(model, variables, inputs, **common).tokens,
  }
  results = {}
  for name, fn in searches.items():
    first = timed(fn)
    results[name] = {"first": first, **summary([timed(fn) for _ in range(runs)])}
  return results
