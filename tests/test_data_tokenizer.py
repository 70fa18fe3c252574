"""The shared SentencePiece vocabulary (BPE; unigram on request) on the tiny embedded corpus, and
the pipeline with it."""

import io
import logging
import os
import pickle

import numpy as np
import pytest
import sentencepiece as spm
from etils import epath
from sentencepiece import sentencepiece_model_pb2

import helpers
from transformer_jax import data
from transformer_jax.conventions import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data import embedded, sources
from transformer_jax.data import lengths as lengths_lib
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import FieldError

TINY = {"train": 2_000, "validation": 200, "test": 200}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(config, vocabulary directory, tokenizer) for the tiny embedded corpus, vocabulary of 400."""
  root = tmp_path_factory.mktemp("tok")
  c = helpers.data_config(
    source__name="embedded_tiny", source__data_dir=str(root / "tfds"), vocab__size=400
  )
  vocab_dir = str(root / "work" / "vocab")
  return c, vocab_dir, data.get_tokenizer(c, vocab_dir)


def test_trained_once_saved_in_the_vocabulary_directory_with_the_fixed_ids(setup):
  c, vocab_dir, tok = setup
  path = os.path.join(vocab_dir, "embedded_tiny-en-sy-400.model")
  assert tok.path == path and os.path.isfile(path)
  assert tok.vocab_size == 400
  sp = spm.SentencePieceProcessor(model_file=path)
  assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  assert (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2) and sp.bos_id() == -1


def _model_type(path):
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(epath.Path(path).read_bytes())
  return model.trainer_spec.model_type


def test_a_unigram_vocabulary_is_trained_on_request_beside_the_bpe_one(setup):
  c, vocab_dir, bpe = setup
  unigram = data.get_tokenizer(helpers.data_config(c, vocab__model="unigram"), vocab_dir)
  assert unigram.path == os.path.join(vocab_dir, "embedded_tiny-en-sy-400-unigram.model")
  assert _model_type(unigram.path) == sentencepiece_model_pb2.TrainerSpec.UNIGRAM
  assert _model_type(bpe.path) == sentencepiece_model_pb2.TrainerSpec.BPE
  assert unigram.vocab_size == 400 and unigram.digest != bpe.digest
  sp = spm.SentencePieceProcessor(model_file=unigram.path)
  assert [sp.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  for src, tgt in embedded.generate_corpus(1, TINY)["test"][:20]:
    for text in (src, tgt):
      assert unigram.decode(unigram.encode(text)) == text


def test_round_trip_on_both_sides_of_unseen_pairs(setup):
  _, _, tok = setup
  for src, tgt in embedded.generate_corpus(1, TINY)["test"]:
    for text in (src, tgt):
      ids = tok.encode(text)
      assert EOS_ID not in ids and PAD_ID not in ids
      assert UNK_ID not in ids, "one vocabulary covers both languages"
      assert tok.decode(ids) == text


def test_a_batch_encodes_as_its_sentences_one_by_one(setup):
  _, _, tok = setup
  texts = [text for pair in embedded.generate_corpus(2, TINY)["test"] for text in pair]
  assert tok.encode_batch(texts) == [tok.encode(text) for text in texts]
  assert tok.encode_target_batch(texts) == [tok.encode_target(text) for text in texts]


def test_bpe_splits_target_words_into_stems_and_endings(setup):
  _, _, tok = setup
  src, tgt = embedded.generate_corpus(1, TINY)["train"][0]
  assert len(tok.encode(tgt)) > len(tgt.split()), "subwords, not whole words"


def test_decode_stops_at_eos_and_ignores_padding(setup):
  _, _, tok = setup
  text = "The dog sees the cat."
  ids = tok.encode(text)
  assert tok.decode(np.array(ids + [EOS_ID] + ids + [0, 0], np.int32)) == text
  assert tok.decode([0] + ids[:2] + [0] + ids[2:]) == text
  assert tok.decode([EOS_ID] + ids) == ""


def test_second_call_loads_instead_of_training(setup, monkeypatch):
  c, vocab_dir, tok = setup
  monkeypatch.setattr(tokenizer_lib, "train_model", None)  # would fail if called
  again = data.get_tokenizer(c, vocab_dir)
  assert again.digest == tok.digest


def test_pickles_for_grain_workers(setup):
  _, _, tok = setup
  copy = pickle.loads(pickle.dumps(tok))
  assert copy.encode("A cat sleeps.") == tok.encode("A cat sleeps.")
  assert copy.path == tok.path


def test_trains_on_a_bounded_evenly_spaced_sample(setup):
  c, _, _ = setup
  source = sources.open_split(c, "train")
  train = embedded.generate_corpus(1, TINY)["train"]
  expected = [text for i in (0, 500, 1000, 1499, 1999) for text in train[i]]
  assert list(tokenizer_lib._training_sentences(source, 5)) == expected


@pytest.mark.parametrize(
  "sample_size, logged",
  [
    (
      5,
      "a 400-token SentencePiece bpe vocabulary on 5 of the 2000 train pairs of embedded_tiny "
      "(10 sentences)",
    ),
    (200_000, "on 2000 of the 2000 train pairs of embedded_tiny (4000 sentences)"),
  ],
)
def test_the_log_gives_the_sample_actually_trained_on(
  setup, tmp_path, monkeypatch, caplog, sample_size, logged
):
  c, _, tok = setup
  c = helpers.data_config(c, vocab__sample_size=sample_size)
  seen = []
  monkeypatch.setattr(
    tokenizer_lib,
    "train_model",
    lambda sentences, size, model_type: seen.extend(sentences) or tok.model_proto,
  )
  with caplog.at_level(logging.INFO):
    data.get_tokenizer(c, str(tmp_path))
  assert logged in caplog.text
  assert len(seen) == 2 * min(sample_size, 2000)


# Ten short pairs: few characters, few merges.
_SENTENCES = [
  f"{w} sees {v}"
  for w, v in zip("cat dog bird fish cow".split(), "tree house car sun moon".split())
] * 2


def test_a_vocabulary_larger_than_the_text_supports_names_the_largest_that_works():
  with pytest.raises(
    FieldError,
    match=r"^data.vocab.size=1000 is more than the training text "
    r"supports: set it to at most \d+$",
  ) as info:
    tokenizer_lib.train_model(_SENTENCES, 1000)
  largest = int(str(info.value).rsplit(" ", 1)[1])
  assert data.Tokenizer(tokenizer_lib.train_model(_SENTENCES, largest)).vocab_size == largest
  with pytest.raises(FieldError, match=f"at most {largest}$"):
    tokenizer_lib.train_model(_SENTENCES, largest + 1)


def test_a_vocabulary_smaller_than_the_characters_names_the_smallest_that_works():
  characters = len(set("".join(_SENTENCES).replace(" ", "")))  # Space becomes the piece "▁".
  smallest = characters + 1 + 3  # "▁", and pad, EOS, unk.
  with pytest.raises(
    FieldError,
    match=f"^data.vocab.size=16 is too small for the characters of "
    f"the training text: set it to at least {smallest}$",
  ):
    tokenizer_lib.train_model(_SENTENCES, 16)
  assert data.Tokenizer(tokenizer_lib.train_model(_SENTENCES, smallest)).vocab_size == smallest


def test_rejects_a_model_with_other_special_ids():
  buffer = io.BytesIO()  # SentencePiece's default ids: unk 0, bos 1, eos 2, no pad
  with open(os.devnull, "w") as quiet:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(["a b c d e f g"] * 10),
      model_writer=buffer,
      vocab_size=12,
      model_type="bpe",
      logstream=quiet,
    )
  with pytest.raises(data.DataError, match=r"\(pad, eos, unk, bos\) ids \(-1, 2, 0, 1\)"):
    data.Tokenizer(buffer.getvalue())


def test_length_table_is_counted_once_and_cached_beside_the_vocabulary(setup, monkeypatch):
  c, _, tok = setup
  source = sources.open_split(c, "train")
  lengths = lengths_lib.pair_lengths(source, tok)
  train = embedded.generate_corpus(1, TINY)["train"]
  assert lengths.tolist() == [[len(tok.encode(s)) + 1, len(tok.encode(t)) + 1] for s, t in train]
  assert os.listdir(os.path.join(os.path.dirname(tok.path), "lengths"))
  monkeypatch.setattr(lengths_lib, "_TokenizeChunk", None)  # would fail if counted again
  np.testing.assert_array_equal(lengths_lib.pair_lengths(source, tok), lengths)


def test_token_table_is_made_with_the_lengths_and_mapped_from_its_cache(setup, monkeypatch):
  c, _, tok = setup
  source = sources.open_split(c, "train")
  train = embedded.generate_corpus(1, TINY)["train"]
  table = lengths_lib.token_table(source, tok)
  want = [(tok.encode(s) + [EOS_ID], tok.encode(t) + [EOS_ID]) for s, t in train]
  assert table.lengths.tolist() == [[len(s), len(t)] for s, t in want]
  assert table.ids.dtype == np.uint16 and table.ids.tolist() == [i for s, t in want for i in s + t]
  cached = os.listdir(os.path.join(os.path.dirname(tok.path), "lengths"))
  assert sorted(name.split(".", 1)[1] for name in cached) == ["ids.npy", "npy"]
  assert table.path and table.path.endswith(".ids.npy")  # Mapped from the file it wrote.
  np.testing.assert_array_equal(lengths_lib.pair_lengths(source, tok), table.lengths)
  monkeypatch.setattr(lengths_lib, "_TokenizeChunk", None)  # would fail if counted again
  again = lengths_lib.token_table(source, tok)
  assert again.path == table.path and again.ids.tolist() == table.ids.tolist()


def test_a_token_table_that_does_not_fit_its_lengths_is_made_again(setup):
  c, _, tok = setup
  source = sources.open_split(c, "validation")
  table = lengths_lib.token_table(source, tok)
  shorter = os.path.join(os.path.dirname(table.path), "shorter.npy")
  np.save(shorter, table.ids[:-1])  # Cut short, as by another version's table; mapped files are
  os.replace(shorter, table.path)  # replaced, never written over, as `fileio.write_atomically`.
  again = lengths_lib.token_table(source, tok)
  assert again.ids.tolist() == table.ids.tolist() and again.ids.size == table.lengths.sum()


def test_tables_another_host_wrote_meanwhile_are_kept_and_mapped(setup, monkeypatch):
  c, _, tok = setup
  source = sources.open_split(c, "test")
  path = lengths_lib.token_table(source, tok).path
  os.remove(path)
  tokenize, written = lengths_lib._tokenize_split, []

  def tokenize_while_another_host_writes(*args, **kwargs):
    lengths, ids = tokenize(*args, **kwargs)
    np.save(f"{path}.other.npy", ids)
    os.replace(f"{path}.other.npy", path)
    written.append(os.stat(path).st_ino)
    return lengths, ids

  monkeypatch.setattr(lengths_lib, "_tokenize_split", tokenize_while_another_host_writes)
  table = lengths_lib.token_table(source, tok)
  assert table.path == path and written == [os.stat(path).st_ino]  # Its file, not replaced.


@pytest.mark.parametrize("mode,workers", [("tokens", 0), ("packed", 0), ("tokens", 1)])
def test_end_to_end_batches_decode_to_the_corpus(setup, mode, workers, absl_flags_parsed):
  """With a worker process, the table mapped from its file is mapped again there."""
  del absl_flags_parsed
  c, _, tok = setup
  c = helpers.data_config(
    c,
    batch__mode=mode,
    batch__tokens=1024,
    batch__size=8,
    batch__max_length=128,
    batch__num_workers=workers,
  )
  assert lengths_lib.token_table(sources.open_split(c, "train"), tok).path  # Mapped.
  train = embedded.generate_corpus(1, TINY)["train"]
  it = iter(data.make_train_loader(c, tok, seed=0, shard_index=0, shard_count=1))
  batch = next(it)
  it.close()
  pairs = set(train)
  for row in range(batch["inputs"].shape[0]):
    for k in range(1, batch["inputs_segmentation"][row].max() + 1):
      src = batch["inputs"][row][batch["inputs_segmentation"][row] == k]
      tgt = batch["targets"][row][batch["targets_segmentation"][row] == k]
      assert src[-1] == tgt[-1] == EOS_ID
      assert (tok.decode(src), tok.decode(tgt)) in pairs


def test_eval_batches_in_both_directions(setup):
  c, _, tok = setup
  test = embedded.generate_corpus(1, TINY)["test"]
  batches = data.make_eval_batches(c, tok, "test")
  assert data.split_texts(c, "test") == ([p[0] for p in test], [p[1] for p in test])
  assert tok.decode(batches[0]["inputs"][0]) == test[0][0]
  reverse = helpers.data_config(c, source__source_lang="sy", source__target_lang="en")
  batch = data.make_eval_batches(reverse, tok, "test")[0]
  srcs, tgts = data.split_texts(reverse, "test")
  assert (srcs[0], tgts[0]) == (test[0][1], test[0][0])
  assert tok.decode(batch["inputs"][0]) == test[0][1]
  assert tok.decode(batch["targets"][0]) == test[0][0]


def test_a_vocab_path_in_a_bucket_loads_the_file_there(setup, bucket_dir):
  c, _, local = setup
  url = f"{bucket_dir}/shared/my.model"
  epath.Path(url).write_bytes(epath.Path(local.path).read_bytes())
  tok = data.load_tokenizer(helpers.data_config(c, vocab__path=url), "unused")
  assert (tok.path, tok.digest) == (url, local.digest)
  with pytest.raises(data.DataError, match=f"^no vocabulary at {bucket_dir}/shared/none.model$"):
    data.load_tokenizer(helpers.data_config(c, vocab__path=f"{bucket_dir}/shared/none.model"), "")


def test_a_vocabulary_and_its_length_table_in_a_bucket(setup, bucket_dir, tmp_path, monkeypatch):
  c, _, local = setup
  monkeypatch.chdir(tmp_path)  # Where `os.path.abspath` would have put a `gs:/...` directory.
  tok = data.get_tokenizer(c, f"{bucket_dir}/vocab")
  assert tok.path.startswith(f"{bucket_dir}/vocab/") and tok.digest == local.digest
  assert epath.Path(tok.path).exists() and not os.listdir(tmp_path)
  source = sources.open_split(c, "validation")
  lengths = lengths_lib.pair_lengths(source, tok)
  cached = epath.Path(bucket_dir) / "vocab" / "lengths"
  assert [p.suffix for p in cached.iterdir()] == [".npy"]
  table = lengths_lib.token_table(source, tok)
  tables = [p.name.split(".", 1)[1] for p in cached.iterdir()]
  assert sorted(tables) == ["ids.npy", "npy"] and table.path is None  # Read, not mapped.
  monkeypatch.setattr(tokenizer_lib, "train_model", None)  # Would fail if trained again.
  monkeypatch.setattr(lengths_lib, "_TokenizeChunk", None)  # Would fail if counted again.
  assert data.load_tokenizer(c, f"{bucket_dir}/vocab").digest == tok.digest
  np.testing.assert_array_equal(lengths_lib.pair_lengths(source, tok), lengths)
  again = lengths_lib.token_table(source, tok)
  assert again.path is None and again.ids.tolist() == table.ids.tolist()
  np.testing.assert_array_equal(again.lengths, lengths)
  assert not os.listdir(tmp_path)
