"""The Marian tokenizer: ids in the project's order, source and target pieces from their own
SentencePiece models, found by `get_tokenizer` from a directory. (Its equality with Hugging
Face's `MarianTokenizer` is in test_pretrained.py.)"""

import io
import json
import os
import pickle

import pytest
import sentencepiece as spm

import helpers
from transformer_jax import data
from transformer_jax.conventions import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data import marian

SOURCES = ["the red house", "a green tree", "the tree is red", "houses and trees"] * 20
TARGETS = ["das rote haus", "ein gruener baum", "der baum ist rot", "haeuser und baeume"] * 20


def train(sentences, size):
  buffer = io.BytesIO()
  with open(os.devnull, "w") as quiet:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=buffer,
      vocab_size=size,
      logstream=quiet,
      model_type="unigram",
    )
  return buffer.getvalue()


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
  """A Marian tokenizer directory: eos 0, unk 1, every piece of both models, pad last."""
  path = tmp_path_factory.mktemp("marian")
  protos = {"source.spm": train(SOURCES, 20), "target.spm": train(TARGETS, 22)}
  vocab = {"</s>": 0, "<unk>": 1}
  for name, proto in protos.items():
    (path / name).write_bytes(proto)
    processor = spm.SentencePieceProcessor(model_proto=proto)
    for i in range(3, processor.get_piece_size()):
      vocab.setdefault(processor.id_to_piece(i), len(vocab))
  vocab["<pad>"] = len(vocab)
  (path / "vocab.json").write_text(json.dumps(vocab))
  return path, vocab


def test_project_order_puts_pad_eos_unk_at_the_project_ids_and_keeps_the_rest_in_order():
  vocab = {"</s>": 0, "<unk>": 1, "a": 2, "b": 3, "<pad>": 4}
  order = marian.project_order(vocab)
  assert [order[PAD_ID], order[EOS_ID], order[UNK_ID]] == [4, 0, 1]
  assert order == [4, 0, 1, 2, 3]


@pytest.mark.parametrize(
  "vocab, message",
  [
    ({"</s>": 0, "<unk>": 1, "<pad>": 3}, "without gaps"),
    ({"</s>": 0, "<unk>": 1, "a": 2}, "lacks the special tokens <pad>"),
  ],
)
def test_project_order_rejects_a_vocabulary_it_cannot_map(vocab, message):
  with pytest.raises(data.DataError, match=message):
    marian.project_order(vocab)


def test_get_tokenizer_loads_a_marian_directory_with_source_and_target_pieces(directory):
  path, vocab = directory
  tokenizer = data.get_tokenizer(
    helpers.data_config(vocab__path=str(path), vocab__size=len(vocab)), "unused"
  )
  assert isinstance(tokenizer, marian.MarianTokenizer) and tokenizer.vocab_size == len(vocab)
  order = marian.project_order(vocab)
  source_pieces = spm.SentencePieceProcessor(model_proto=(path / "source.spm").read_bytes()).encode(
    "the red tree", out_type=str
  )
  assert [order[i] for i in tokenizer.encode("the red tree")] == [vocab[p] for p in source_pieces]
  target_pieces = spm.SentencePieceProcessor(model_proto=(path / "target.spm").read_bytes()).encode(
    "der rote baum", out_type=str
  )
  assert [order[i] for i in tokenizer.encode_target("der rote baum")] == [
    vocab[p] for p in target_pieces
  ]
  assert UNK_ID in tokenizer.encode("the red 漢字")
  assert tokenizer.encode_batch(["the red tree", "the red 漢字"]) == [
    tokenizer.encode("the red tree"),
    tokenizer.encode("the red 漢字"),
  ]
  assert tokenizer.encode_target_batch(["der rote baum"]) == [
    tokenizer.encode_target("der rote baum")
  ]
  ids = tokenizer.encode_target("der rote baum")
  assert tokenizer.decode([*ids, UNK_ID, EOS_ID, 7]) == "der rote baum"
  assert tokenizer.decode([PAD_ID, *ids, PAD_ID]) == "der rote baum"
  again = pickle.loads(pickle.dumps(tokenizer))  # Grain workers get a copy.
  assert again.encode("the red tree") == tokenizer.encode("the red tree")
  assert again.digest == tokenizer.digest


def test_a_directory_without_the_marian_files_is_not_a_marian_tokenizer(directory, tmp_path):
  assert marian.is_marian_directory(str(directory[0]))
  (tmp_path / "vocab.json").write_text("{}")
  assert not marian.is_marian_directory(str(tmp_path))
