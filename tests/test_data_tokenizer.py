"""The shared SentencePiece BPE vocabulary, trained on the (tiny) embedded corpus."""

import io
import os
import pickle

import numpy as np
import pytest
import sentencepiece as spm

from transformer_jax import data
from transformer_jax.data import embedded
from transformer_jax.data import tokenizer as tokenizer_lib

TINY = {"train": 2_000, "validation": 200, "test": 200}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(config, workdir, tokenizer) for the tiny embedded corpus, vocabulary of 400."""
  root = tmp_path_factory.mktemp("tok")
  c = data.default_config()
  c.name, c.data_dir, c.vocab_size = "embedded_tiny", str(root / "tfds"), 400
  workdir = str(root / "work")
  return c, workdir, data.get_tokenizer(c, workdir)


def test_trained_once_saved_in_the_workdir_with_the_fixed_ids(setup):
  c, workdir, tok = setup
  path = os.path.join(workdir, "vocab", "embedded_tiny-en-sy-400.model")
  assert tok.path == path and os.path.isfile(path)
  assert tok.vocab_size == 400
  sp = spm.SentencePieceProcessor(model_file=path)
  assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  assert (data.PAD_ID, data.EOS_ID, data.UNK_ID) == (0, 1, 2) and sp.bos_id() == -1


def test_round_trip_on_both_sides_of_unseen_pairs(setup):
  _, _, tok = setup
  for src, tgt in embedded.generate_corpus(1, TINY)["test"]:
    for text in (src, tgt):
      ids = tok.encode(text)
      assert data.EOS_ID not in ids and data.PAD_ID not in ids
      assert data.UNK_ID not in ids, "one vocabulary covers both languages"
      assert tok.decode(ids) == text


def test_bpe_splits_target_words_into_stems_and_endings(setup):
  _, _, tok = setup
  src, tgt = embedded.generate_corpus(1, TINY)["train"][0]
  assert len(tok.encode(tgt)) > len(tgt.split()), "subwords, not whole words"


def test_decode_stops_at_eos_and_ignores_padding(setup):
  _, _, tok = setup
  text = "The dog sees the cat."
  ids = tok.encode(text)
  assert tok.decode(np.array(ids + [data.EOS_ID] + ids + [0, 0], np.int32)) == text
  assert tok.decode([0] + ids[:2] + [0] + ids[2:]) == text
  assert tok.decode([data.EOS_ID] + ids) == ""


def test_second_call_loads_instead_of_training(setup, monkeypatch):
  c, workdir, tok = setup
  monkeypatch.setattr(tokenizer_lib, "train_model", None)  # would fail if called
  again = data.get_tokenizer(c, workdir)
  assert again.digest == tok.digest


def test_pickles_for_grain_workers(setup):
  _, _, tok = setup
  copy = pickle.loads(pickle.dumps(tok))
  assert copy.encode("A cat sleeps.") == tok.encode("A cat sleeps.")
  assert copy.path == tok.path


def test_trains_on_a_bounded_evenly_spaced_sample(setup):
  c, _, _ = setup
  c = c.copy_and_resolve_references()
  c.tokenizer_sample_size = 5
  train = embedded.generate_corpus(1, TINY)["train"]
  expected = [text for i in (0, 500, 1000, 1499, 1999) for text in train[i]]
  assert list(tokenizer_lib._training_sentences(c)) == expected


def test_rejects_a_model_with_other_special_ids():
  buffer = io.BytesIO()  # SentencePiece's default ids: unk 0, bos 1, eos 2, no pad
  with open(os.devnull, "w") as quiet:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c d e f g"] * 10), model_writer=buffer,
        vocab_size=12, model_type="bpe", logstream=quiet)
  with pytest.raises(ValueError, match=r"\(pad, eos, unk, bos\) ids \(-1, 2, 0, 1\)"):
    data.Tokenizer(buffer.getvalue())
