"""Sources: plain text files (and every way they can be bad), the embedded builder, the WMT
path up to the network, and text files and data dirs in a bucket (the tests' local server)."""

import importlib
import logging
import os
import pickle
import re

import pytest
import sentencepiece as spm
import tensorflow_datasets as tfds
from etils import epath

import helpers
from transformer_jax import data
from transformer_jax.data import (
  embedded,
  embedded_source,
  parallel_text,
  sources,
  tfds_prepare,
  tokenizer,
  wmt,
)
from transformer_jax.errors import FieldError


def text_config(tmp_path, lines_en, lines_de, **overrides):
  for lang, lines in (("en", lines_en), ("de", lines_de)):
    (tmp_path / f"train.{lang}").write_text(
      "".join(line + "\n" for line in lines), encoding="utf-8"
    )
  return helpers.data_config(
    source__name="text",
    source__source_lang="en",
    source__target_lang="de",
    source__text_train=str(tmp_path / "train"),
    source__data_dir=str(tmp_path / "tfds"),
    **overrides,
  )


def test_text_files_become_an_arrayrecord_source_in_file_order(tmp_path):
  en = ["Hello world.", "  spaces kept  ", "x", "Grüße, ünïcode ✓ \r inside"]
  de = ["Hallo Welt.", "Leerzeichen", "leer links", "Grüße"]
  c = text_config(tmp_path, en, de)
  source = sources.open_split(c, "train")
  assert len(source) == 4
  assert source.pairs(range(4)) == list(zip(en, de))
  files = list((tmp_path / "tfds").rglob("*.array_record*"))
  assert files, "stored as ArrayRecord"

  c = helpers.data_config(
    c, source__source_lang="de", source__target_lang="en"
  )  # The other direction.
  assert sources.open_split(c, "train").pairs([0, 3]) == [(de[0], en[0]), (de[3], en[3])]
  assert list((tmp_path / "tfds").rglob("*.array_record*")) == files, "converted once"


def test_text_conversion_is_reused_not_repeated(tmp_path, monkeypatch):
  c = text_config(tmp_path, ["a", "b"], ["x", "y"])
  sources.open_split(c, "train")

  def fail(*args, **kwargs):
    raise AssertionError("prepared again")

  monkeypatch.setattr(parallel_text.TransformerJaxParallelText, "download_and_prepare", fail)
  assert sources.open_split(c, "train").pairs([1]) == [("b", "y")]


def test_text_files_of_different_lengths_are_refused(tmp_path):
  c = text_config(tmp_path, ["a", "b", "c"], ["x", "y"])
  with pytest.raises(
    data.DataError,
    match=r"train.de has 3 lines but .*train.en has 2|"
    r"train.de has 2 lines but .*train.en has 3",
  ):
    sources.open_split(c, "train")


def test_missing_text_file_names_the_field(tmp_path):
  c = text_config(tmp_path, ["a"], ["x"], source__text_validation=str(tmp_path / "nope"))
  with pytest.raises(FieldError, match="data.source.text_validation="):
    sources.open_split(c, "train")


def test_unknown_split_lists_the_splits(tmp_path):
  c = text_config(tmp_path, ["a"], ["x"])
  with pytest.raises(data.DataError, match="has no split 'dev': it has train"):
    sources.open_split(c, "dev")


def test_embedded_builder_holds_the_seeded_corpus_in_order(tmp_path):
  c = helpers.data_config(source__name="embedded_tiny", source__data_dir=str(tmp_path))
  sizes = {"train": 2_000, "validation": 200, "test": 200}
  expected = embedded.generate_corpus(1, sizes)  # the tiny config's seed
  for split, n in sizes.items():
    source = sources.open_split(c, split)
    assert source.pairs(range(n)) == expected[split]


@pytest.fixture
def offline(monkeypatch):
  """No host is reachable, and any download attempt fails the test."""
  monkeypatch.setattr(wmt, "reachable", lambda host, port: False)

  def no_download(*args, **kwargs):
    raise AssertionError("tried to download")

  monkeypatch.setattr(tfds.download.DownloadManager, "download", no_download)
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", no_download)


@pytest.mark.parametrize(
  "name,expected_file",
  [
    ("wmt14_translate/de-en", "training-parallel-europarl-v7.tgz"),
    ("wmt14_translate/fr-en", "training-giga-fren.tar"),
    ("wmt17_translate/de-en", "rapid2016.tgz"),
  ],
)
def test_wmt_offline_fails_at_once_with_one_clear_message(tmp_path, offline, name, expected_file):
  c = helpers.data_config(
    source__name=name,
    source__source_lang="en",
    source__target_lang=name[-5:-3],
    source__data_dir=str(tmp_path),
  )
  with pytest.raises(data.DataUnavailableError) as error:
    data.make_eval_batches(c, None, "test")
  message = str(error.value)
  manual = os.path.join(str(tmp_path), "downloads", "manual")
  assert f"{name}/1.0.0 is not prepared in {tmp_path}" in message
  assert "cannot be downloaded: no network connection to " in message
  assert "www.statmt.org" in message
  assert "run once with network access" in message
  assert f"put them in {manual} (set by data.source.manual_dir)" in message
  assert expected_file in message
  assert error.value.__cause__ is None and error.value.__context__ is None


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_wmt_with_every_file_in_the_manual_dir_goes_on_to_prepare(
  tmp_path, offline, monkeypatch, request, where
):
  manual = str(tmp_path / "manual") if where == "local" else request.getfixturevalue("bucket_dir")
  c = helpers.data_config(
    source__name="wmt14_translate/fr-en",
    source__source_lang="en",
    source__target_lang="fr",
    source__data_dir=str(tmp_path / "tfds"),
    source__manual_dir=manual,
  )
  importlib.import_module("tensorflow_datasets.translate.wmt14")  # registers it
  builder = tfds.builder(c.source.name, data_dir=c.source.data_dir)
  for _, filename, _ in wmt.downloads(builder):
    path = epath.Path(manual) / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(filename.encode())
  giga = "http://www.statmt.org/wmt10/training-giga-fren.tar"
  assert giga not in builder.url_infos, "TFDS registers no checksum for it"
  calls = []

  def prepare(self, **kwargs):
    calls.append(kwargs)
    raise KeyboardInterrupt  # stop here: the real files are not in the test

  monkeypatch.setattr(type(builder), "download_and_prepare", prepare)
  try:
    with pytest.raises(KeyboardInterrupt):
      sources.open_split(c, "train")
    assert calls[0]["file_format"] == "array_record"
    assert str(calls[0]["download_config"].manual_dir) == c.source.manual_dir
    # ... and TFDS will take giga-fren from the manual dir: its checksum is known.
    assert builder.url_infos[giga].filename == "training-giga-fren.tar"
    assert builder.url_infos[giga].size == len("training-giga-fren.tar")
  finally:
    builder.url_infos.pop(giga, None)
    builder.url_infos.pop("http://www.statmt.org/wmt13/training-parallel-un.tgz", None)


def _text(tmp_path, source: bytes, target: bytes):
  (tmp_path / "corpus.en").write_bytes(source)
  (tmp_path / "corpus.de").write_bytes(target)
  return helpers.data_config(
    source__name="text",
    source__source_lang="en",
    source__target_lang="de",
    source__text_train=str(tmp_path / "corpus"),
    source__data_dir=str(tmp_path / "tfds"),
  )


def test_a_missing_file_names_the_field_and_the_path(tmp_path):
  c = _text(tmp_path, b"a\n", b"b\n")
  c = helpers.data_config(c, source__text_validation=str(tmp_path / "nowhere"))
  with pytest.raises(FieldError, match=r"data.source.text_validation=.* no file .*nowhere.de"):
    sources.open_split(c, "train")


def test_an_empty_file_is_an_error_naming_it(tmp_path):
  with pytest.raises(data.DataError, match=r"corpus.de is empty"):
    sources.open_split(_text(tmp_path, b"a\nb\n", b""), "train")


def test_files_of_different_line_counts_are_an_error_naming_both(tmp_path):
  with pytest.raises(data.DataError, match=r"corpus.de has 1 lines but .*corpus.en has 2"):
    sources.open_split(_text(tmp_path, b"a\nb\n", b"x\n"), "train")


def test_lines_not_utf8_or_too_long_are_skipped_counted_and_logged(tmp_path, caplog):
  long_line = b"word " * 20_000  # 100k bytes.
  source = b"one\n\xff\xfe broken\nthree\n" + long_line + b"\nfive\n"
  target = b"eins\nzwei\ndrei\nvier\nf\xc3\xbcnf\n"
  with caplog.at_level(logging.WARNING):
    split = sources.open_split(_text(tmp_path, source, target), "train")
  assert split.pairs(range(len(split))) == [("one", "eins"), ("three", "drei"), ("five", "fünf")]
  assert re.search(
    r"corpus.de, .*corpus.en: skipped 1 line pairs not UTF-8 \(lines 2\)", caplog.text
  )
  assert re.search(r"skipped 1 line pairs with a line over 16384 bytes \(lines 4\)", caplog.text)


def test_a_split_left_without_pairs_is_an_error(tmp_path):
  with pytest.raises(data.DataError, match=r"corpus.de, .*corpus.en: no usable line pairs"):
    sources.open_split(_text(tmp_path, b"\xff\n", b"x\n"), "train")


def test_windows_line_ends_a_byte_order_mark_and_no_final_newline_are_plain_text(tmp_path):
  en = "\ufeffHello world.\r\nThe cat sleeps.\r\nA last line"
  de = "\ufeffHallo Welt.\r\nDie Katze schläft.\r\nEine letzte Zeile"
  split = sources.open_split(_text(tmp_path, en.encode(), de.encode()), "train")
  pairs = split.pairs(range(len(split)))
  assert pairs == [
    ("Hello world.", "Hallo Welt."),
    ("The cat sleeps.", "Die Katze schläft."),
    ("A last line", "Eine letzte Zeile"),
  ]
  sentences = [text for pair in pairs for text in pair]
  characters = set("".join(sentences).replace(" ", ""))
  model = spm.SentencePieceProcessor(
    model_proto=tokenizer.train_model(sentences, len(characters) + 4 + 10)
  )  # "▁", pad, EOS, unk, and a few merges.
  pieces = [model.id_to_piece(i) for i in range(model.get_piece_size())]
  assert not [piece for piece in pieces if "\ufeff" in piece or "\r" in piece]
  first = model.encode("Hello world.", out_type=str)
  assert first[0].startswith("▁H") and model.decode(model.encode(sentences[0])) == "Hello world."


def test_line_pairs_with_an_empty_side_are_skipped_counted_and_logged(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    split = sources.open_split(_text(tmp_path, b"a\n\nc\n  \ne\n", b"v\nw\n\t\ny\nz\n"), "train")
  assert split.pairs(range(len(split))) == [("a", "v"), ("e", "z")]
  assert re.search(r"skipped 3 line pairs with an empty side \(lines 2, 3, 4\)", caplog.text)


def test_two_files_of_the_same_text_are_an_error(tmp_path):
  with pytest.raises(data.DataError, match=r"corpus.de and .*corpus.en are the same text"):
    sources.open_split(_text(tmp_path, b"a\nb\n", b"a\nb\n"), "train")


def test_a_language_without_a_file_lists_the_files_there_are(tmp_path):
  c = _text(tmp_path, b"a\n", b"b\n")
  c = helpers.data_config(c, source__target_lang="fr")
  with pytest.raises(
    FieldError,
    match=r"data.source.text_train=.*: no file .*corpus.fr \(expected "
    r".*; found .*corpus.de, .*corpus.en\)",
  ):
    sources.open_split(c, "train")


@pytest.mark.parametrize("split", ["validation", "test"])
def test_an_evaluation_split_without_files_names_its_field(tmp_path, split):
  with pytest.raises(FieldError, match=f"data.source.text_{split}='': there is no {split} split"):
    sources.open_split(_text(tmp_path, b"a\n", b"b\n"), split)


def upload(local, url):
  """Copies the files under the local directory `local` to the same names under `url`."""
  for path in local.rglob("*"):
    if path.is_file():
      (epath.Path(url) / str(path.relative_to(local))).write_bytes(path.read_bytes())


def test_text_files_in_a_bucket_read_as_the_same_files_on_disk(tmp_path, bucket_dir):
  en = "\ufeffHello world.\r\nThe cat sleeps.\n\xff\nA last line"
  de = "\ufeffHallo Welt.\r\nDie Katze schläft.\nkaputt\nEine letzte Zeile"
  local = _text(tmp_path, en.encode(), de.encode().replace(b"kaputt", b"\xfe"))
  upload(tmp_path, f"{bucket_dir}/text")
  c = helpers.data_config(
    local, source__text_train=f"{bucket_dir}/text/corpus", source__data_dir=str(tmp_path / "b")
  )
  split = sources.open_split(c, "train")
  expected = sources.open_split(local, "train")
  assert split.all_pairs() == expected.all_pairs() and len(split) == 3
  assert split.fingerprint != expected.fingerprint  # Prepared from the bucket's files.


def test_a_missing_text_file_in_a_bucket_is_one_line_naming_its_url(tmp_path, bucket_dir):
  (epath.Path(bucket_dir) / "corpus.en").write_bytes(b"a\n")
  c = helpers.data_config(
    source__name="text",
    source__source_lang="en",
    source__target_lang="de",
    source__text_train=f"{bucket_dir}/corpus",
    source__data_dir=str(tmp_path / "tfds"),
  )
  with pytest.raises(FieldError) as error:
    sources.open_split(c, "train")
  assert str(error.value).endswith(
    f"data.source.text_train='{bucket_dir}/corpus': no file {bucket_dir}/corpus.de (expected "
    "<prefix>.<lang> for data.source.source_lang and data.source.target_lang; "
    f"found {bucket_dir}/corpus.en)."
  )
  assert "\n" not in str(error.value)
  c = helpers.data_config(c, source__text_train=f"{bucket_dir}/nowhere/corpus")
  with pytest.raises(
    FieldError, match=r"no file gs://\S+/nowhere/corpus.de .*no <prefix>.\* exists"
  ):
    sources.open_split(c, "train")


def _no_preparing(monkeypatch, builder_class):
  def fail(*args, **kwargs):
    raise AssertionError("prepared again")

  monkeypatch.setattr(builder_class, "download_and_prepare", fail)


def test_a_data_dir_in_a_bucket_is_read_from_a_local_copy_of_a_dataset_prepared_on_disk(
  tmp_path, bucket_dir, monkeypatch
):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  local = helpers.data_config(source__name="embedded_tiny", source__data_dir=str(tmp_path / "tfds"))
  expected = sources.open_split(local, "validation").all_pairs()
  upload(tmp_path / "tfds", f"{bucket_dir}/tfds")
  _no_preparing(monkeypatch, embedded_source.TransformerJaxEmbedded)
  c = helpers.data_config(local, source__data_dir=f"{bucket_dir}/tfds")
  split = sources.open_split(c, "validation")
  assert f":{bucket_dir}/tfds/transformer_jax_embedded/tiny/1.0.0:" in split.fingerprint
  assert split.all_pairs() == expected
  assert pickle.loads(pickle.dumps(split)).pairs([7, 3]) == [expected[7], expected[3]]  # Workers
  copy = tmp_path / "cache/transformer_jax/tfds/gs" / bucket_dir[5:] / "tfds"
  assert tfds_prepare.local_copy_root(c.source.data_dir) == str(copy)
  version = copy / "transformer_jax_embedded/tiny/1.0.0"
  assert sorted(p.name for p in version.iterdir()) == sorted(
    p.name for p in (tmp_path / "tfds/transformer_jax_embedded/tiny/1.0.0").iterdir()
  )
  shard = version / "transformer_jax_embedded-validation.array_record-00000-of-00001"
  before = shard.stat().st_mtime_ns
  assert sources.open_split(c, "validation").all_pairs() == expected
  assert shard.stat().st_mtime_ns == before, "copied once"


def test_a_dataset_for_a_data_dir_in_a_bucket_is_prepared_on_disk_and_uploaded(
  tmp_path, bucket_dir, monkeypatch
):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  local = _text(tmp_path, b"one\ntwo\nthree\n", b"eins\nzwei\ndrei\n")
  c = helpers.data_config(local, source__data_dir=f"{bucket_dir}/tfds")
  split = sources.open_split(c, "train")
  assert split.all_pairs() == [("one", "eins"), ("two", "zwei"), ("three", "drei")]
  builder = sources.get_builder(c)
  assert str(builder.data_path).startswith(f"{bucket_dir}/tfds/")
  assert {path.name for path in builder.data_path.iterdir()} == {
    "dataset_info.json",
    "features.json",
    "transformer_jax_parallel_text-train.array_record-00000-of-00001",
  }
  prepared_here = tfds_prepare.local_copy_root(c.source.data_dir)
  assert prepared_here.startswith(str(tmp_path / "cache"))
  assert list(epath.Path(prepared_here).glob("*/*/1.1.0/*.array_record-*"))

  # Another machine (another local copy) reads what was uploaded, without preparing it.
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
  _no_preparing(monkeypatch, parallel_text.TransformerJaxParallelText)
  assert sources.open_split(c, "train").pairs([2]) == [("three", "drei")]
  assert list((tmp_path / "other").rglob("*.array_record-*"))
