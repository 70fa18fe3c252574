"""The Translator and the line-based file side of --mode=translate, in process.

References: each sentence decoded alone (batch of one, one device) by
`decoding`, and hand-written byte strings.
"""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import decoding, sharding, translate
from transformer_jax.errors import UserError
from transformer_jax.model import Transformer, TransformerConfig

EOS = decoding.EOS_ID


class WordTokenizer:
  """Stand-in tokenizer: word `w<i>` is id i; decode writes the ids back as words."""

  def encode(self, text):
    return [int(word[1:]) for word in text.split()]

  def decode(self, ids):
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def model_and_params():
  cfg = TransformerConfig(vocab_size=24, num_layers=2, d_model=32, d_ff=64, num_heads=4,
                          max_len=24, dropout_rate=0.0)
  model = Transformer(cfg)
  params = nn.unbox(model.init(jax.random.key(3), jnp.ones((1, 4), jnp.int32),
                               jnp.ones((1, 4), jnp.int32)))["params"]
  return model, params


def _translator(model, beam_size, batch_size=4):
  mesh = sharding.make_mesh({"data": -1})  # The 8 simulated devices.
  return translate.Translator(model, WordTokenizer(), mesh, sharding.logical_rules("dp"),
                              beam_size=beam_size, alpha=0.6, max_extra=5,
                              batch_size=batch_size)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_batched_sharded_translation_equals_each_sentence_alone_in_order(model_and_params,
                                                                         beam_size):
  model, params = model_and_params
  rng = np.random.default_rng(0)
  lengths = [5, 1, 12, 0, 3, 7, 2, 9, 4, 6, 11]  # 0: an empty line.
  sources = [list(rng.integers(3, 24, size=n)) + [EOS] if n else [] for n in lengths]
  translator = _translator(model, beam_size)
  got = translator.translate_ids(params, sources)
  assert len(got) == len(sources) and got[3] == []
  for source, output in zip(sources, got):
    if not source:
      continue
    inputs = jnp.asarray([source + [0] * (16 - len(source))], jnp.int32)  # One shape: one compile.
    if beam_size == 1:
      alone = decoding.greedy_decode(model, {"params": params}, inputs, max_len=24, max_extra=5)
    else:
      alone = decoding.beam_search(model, {"params": params}, inputs, beam_size=beam_size,
                                   alpha=0.6, max_len=24, max_extra=5)
    assert output == decoding.trim(alone.tokens)[0]
    assert len(output) <= len(source) + 5  # Input length (EOS included) + max_extra.


def test_lines_without_tokens_give_empty_lines_and_long_lines_are_cut_with_a_warning(
    model_and_params, caplog):
  model, params = model_and_params
  translator = _translator(model, beam_size=1)
  long_line = " ".join(f"w{3 + i % 20}" for i in range(40))
  lines = ["w5 w6 w7", "", "   ", long_line, "w9"]
  with caplog.at_level(logging.WARNING, logger="absl"):
    sources = translator.encode(lines)
    out = translator.translate(params, lines)
  assert sources[1] == sources[2] == []
  assert len(sources[3]) == model.config.max_len and sources[3][-1] == EOS
  assert sources[3][:-1] == WordTokenizer().encode(long_line)[:model.config.max_len - 1]
  assert "line 4 has 41 tokens" in caplog.text and "line 1 " not in caplog.text
  assert len(out) == 5 and out[1] == out[2] == ""
  assert out[0] == WordTokenizer().decode(translator.translate_ids(params, [sources[0]])[0])


def test_read_lines_splits_at_newlines_only(tmp_path):
  path = tmp_path / "in.txt"
  cases = {b"": [], b"a\n": ["a"], b"a": ["a"], b"\n": [""], b"a\n\nb c\r\n": ["a", "", "b c\r"],
           "é ü\n".encode(): ["é ü"]}
  for raw, lines in cases.items():
    path.write_bytes(raw)
    assert translate.read_lines(str(path)) == lines, raw


def test_read_lines_names_the_first_line_that_is_not_utf8(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"fine\n\nstill fine\nbad \xff byte\n\xfe too\n")
  with pytest.raises(UserError, match=r"line 4: not valid UTF-8 \(byte 0xff at byte 5"):
    translate.read_lines(str(path))
  with pytest.raises(UserError, match="cannot read the input"):
    translate.read_lines(str(tmp_path / "missing.txt"))


def test_write_lines_ends_every_line(tmp_path):
  path = tmp_path / "sub" / "out.txt"
  translate.write_lines(str(path), ["a", "", "ü"])
  assert path.read_bytes() == "a\n\nü\n".encode()
