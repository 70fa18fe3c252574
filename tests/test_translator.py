"""The Translator: batched, sharded translation in input order, empty and overlong lines.

References: each sentence decoded alone (batch of one, one device) by the
searches of `decode.search`.
"""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from transformer_jax import sharding
from transformer_jax.conventions import EOS_ID as EOS
from transformer_jax.decode import search, transformer_search
from transformer_jax.decode.translator import DecodeSettings, Translator
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement

pytestmark = pytest.mark.device


class WordTokenizer:
  """Stand-in tokenizer: word `w<i>` is id i; decode writes the ids back as words."""

  def encode(self, text):
    return [int(word[1:]) for word in text.split()]

  def decode(self, ids):
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def model_and_params():
  """The placement (over the 8 simulated devices) and its parameters."""
  cfg = TransformerConfig(
    vocab_size=24, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=24, dropout_rate=0.0
  )
  placement = Placement(cfg, sharding.make_mesh({"data": -1}), sharding.logical_rules("dp"))
  params = nn.unbox(placement.boxed_params(jax.random.key(3)))
  return placement, params


def _translator(placement, beam_size, batch_size=4, compile_ahead="never"):
  settings = DecodeSettings(
    beam_size=beam_size, alpha=0.6, max_extra=5, batch_size=batch_size, compile_ahead=compile_ahead
  )
  return Translator(placement, WordTokenizer(), settings)


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_batched_sharded_translation_equals_each_sentence_alone_in_order(
  model_and_params, beam_size
):
  placement, params = model_and_params
  model = placement.model
  rng = np.random.default_rng(0)
  lengths = [5, 1, 12, 0, 3, 7, 2, 9, 4, 6, 11]  # 0: an empty line.
  sources = [list(rng.integers(3, 24, size=n)) + [EOS] if n else [] for n in lengths]
  translator = _translator(placement, beam_size)
  got = translator.translate_ids(params, sources)
  assert len(got) == len(sources) and got[3] == []
  for source, output in zip(sources, got):
    if not source:
      continue
    inputs = jnp.asarray([source + [0] * (16 - len(source))], jnp.int32)  # One shape: one compile.
    if beam_size == 1:
      alone = transformer_search.greedy_search(
        model, {"params": params}, inputs, max_len=24, max_extra=5
      )
    else:
      alone = transformer_search.beam_search(
        model, {"params": params}, inputs, beam_size=beam_size, alpha=0.6, max_len=24, max_extra=5
      )
    assert output == search.trim(alone.tokens)[0]
    assert len(output) <= len(source) + 5  # Input length (EOS included) + max_extra.


@pytest.mark.slow
def test_lines_without_tokens_give_empty_lines_and_long_lines_are_cut_with_a_warning(
  model_and_params, caplog
):
  placement, params = model_and_params
  model = placement.model
  translator = _translator(placement, beam_size=1)
  long_line = " ".join(f"w{3 + i % 20}" for i in range(40))
  lines = ["w5 w6 w7", "", "   ", long_line, "w9"]
  with caplog.at_level(logging.WARNING):
    sources = translator.encode(lines)
    out = translator.translate(params, lines)
  assert sources[1] == sources[2] == []
  assert len(sources[3]) == model.config.max_len and sources[3][-1] == EOS
  assert sources[3][:-1] == WordTokenizer().encode(long_line)[: model.config.max_len - 1]
  assert "line 4 has 41 tokens" in caplog.text and "line 1 " not in caplog.text
  assert len(out) == 5 and out[1] == out[2] == ""
  assert out[0] == WordTokenizer().decode(translator.translate_ids(params, [sources[0]])[0])


@pytest.mark.slow
def test_the_searches_compiled_ahead_are_those_the_batches_run(model_and_params, caplog):
  placement, params = model_and_params
  rng = np.random.default_rng(1)
  # Sorted by length, batches of 8: 8 rows of up to 8 tokens, 8 of up to 16, 1 of up to 16.
  lengths = [3, 5, 7, 2, 6, 4, 7, 5, 9, 12, 15, 10, 11, 14, 13, 9, 15]
  sources = [list(rng.integers(3, 24, size=n - 1)) + [EOS] for n in lengths]
  ahead = _translator(placement, 2, batch_size=8, compile_ahead="always")  # Beam 2: no other.
  with caplog.at_level(logging.INFO), helpers.compilations("beam_search") as compiled:
    outputs = ahead.translate_ids(params, sources)
    assert set(ahead.compiled_ahead) == {(8, 8), (8, 16)} and len(compiled) == 2
    assert "the beam2 for each of 2 batch shapes took" in caplog.text
    ahead.translate_ids(params, sources)  # Compiled already: nothing more.
  assert len(compiled) == 2
  assert outputs == _translator(placement, 2, batch_size=8).translate_ids(params, sources)
  # Parameters placed as a restored checkpoint's are (committed, sharded): programs of their own.
  placed = jax.device_put(params, placement.param_shardings)
  with helpers.compilations("beam_search") as compiled:
    assert ahead.translate_ids(placed, sources) == outputs
  assert len(compiled) == 2


@pytest.mark.slow
def test_a_search_whose_compile_failed_ahead_is_not_compiled_ahead_again(
  model_and_params, monkeypatch
):
  placement, params = model_and_params
  sources = [[5, 6, EOS]] * 8 + [[7] * 12 + [EOS]]  # Two batches of 8 rows, two shapes.
  calls = []

  def none_compiles(lowerings, threads):  # As Placement.compile_ahead where each compile failed.
    calls.append(len(lowerings))
    return [(None, 0.1)] * len(lowerings)

  monkeypatch.setattr(placement, "compile_ahead", none_compiles)
  translator = _translator(placement, 1, batch_size=8, compile_ahead="always")
  outputs = translator.translate_ids(params, sources)
  assert outputs == _translator(placement, 1, batch_size=8).translate_ids(params, sources)
  assert translator.translate_ids(params, sources) == outputs  # As at a later evaluation.
  assert calls == [2]
