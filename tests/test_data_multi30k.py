"""Multi30k: a small copy of the repository's layout (gzip included) made here, read back through
`data.open_split` and the pipeline; nothing is downloaded."""

import gzip
import itertools
import os
import shutil

import numpy as np
import pytest
from etils import epath

import helpers
from transformer_jax import data
from transformer_jax.data import multi30k, parallel_text, sources
from transformer_jax.errors import FieldError

WORDS = {  # word i of one language translates word i of the others
  "en": "a man dog runs on the grass woman sits red small child".split(),
  "de": "ein Mann Hund läuft auf dem Gras Frau sitzt rot klein Kind".split(),
  "fr": "un homme chien court sur l'herbe été femme assise rouge petit enfant".split(),
  "cs": "muž pes běží na trávě žena sedí červený malý dítě a ten".split(),
}
FILES = {  # the repository's file names, their line counts, their languages
  "train": (40, ("en", "de", "fr", "cs")),
  "val": (7, ("en", "de", "fr", "cs")),
  "test_2016_flickr": (5, ("en", "de", "fr", "cs")),
  "test_2017_flickr": (4, ("en", "de", "fr")),
  "test_2017_mscoco": (3, ("en", "de", "fr")),
  "test_2018_flickr": (6, ("en", "de", "fr", "cs")),
}


def write_repo(root):
  """Writes data/task1/{raw,tok} under `root` as the repository has them; returns {(variant,
  file, lang): [lines]} (raw cased, tok lowercased with a final ' .', so they differ)."""
  lines = {}
  for seed, (file, (count, langs)) in enumerate(FILES.items()):
    picks = np.random.default_rng(seed).integers(0, len(WORDS["en"]), (count, 6))
    for lang in langs:
      raw = [
        " ".join(WORDS[lang][k] for k in row[: 2 + i % 5]).capitalize()
        for i, row in enumerate(picks)
      ]
      lines["multi30k", file, lang] = raw
      lines["multi30k_tok", file, lang] = [line.lower() + " ." for line in raw]
  for (name, file, lang), texts in lines.items():
    path = root / multi30k.relative_path(name, file, lang)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(t + "\n" for t in texts).encode("utf-8")
    path.write_bytes(gzip.compress(body) if path.suffix == ".gz" else body)
  return lines


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
  root = tmp_path_factory.mktemp("multi30k")
  return root, write_repo(root)


def config(root, tmp_path, name="multi30k", source="en", target="de", **overrides):
  return helpers.data_config(
    source__name=name,
    source__source_lang=source,
    source__target_lang=target,
    source__manual_dir=str(root),
    source__data_dir=str(tmp_path / "tfds"),
    **overrides,
  )


def test_the_layout_written_here_is_the_repository_s():
  assert (
    multi30k.relative_path("multi30k", "test_2017_mscoco", "fr")
    == "data/task1/raw/test_2017_mscoco.fr.gz"
  )
  assert multi30k.relative_path("multi30k_tok", "val", "cs") == "data/task1/tok/val.lc.norm.tok.cs"
  assert (
    sources.SOURCES["multi30k"].languages
    == sources.SOURCES["multi30k_tok"].languages
    == multi30k.LANGUAGES
  )


@pytest.mark.parametrize("pair", list(itertools.combinations(multi30k.LANGUAGES, 2)))
def test_every_pair_reads_back_the_lines_written_in_both_directions(repo, tmp_path, pair):
  root, lines = repo
  a, b = pair
  expected = list(zip(lines["multi30k", "train", a], lines["multi30k", "train", b]))
  source = data.open_split(config(root, tmp_path, source=a, target=b), "train")
  assert source.all_pairs() == expected
  source = data.open_split(config(root, tmp_path, source=b, target=a), "train")
  assert source.all_pairs() == [(y, x) for x, y in expected]


def test_the_tok_variant_reads_the_tok_files(repo, tmp_path):
  root, lines = repo
  for name in ("multi30k_tok", "multi30k"):
    source = data.open_split(config(root, tmp_path, name, "fr", "cs"), "validation")
    assert source.all_pairs() == list(zip(lines[name, "val", "fr"], lines[name, "val", "cs"]))


@pytest.mark.parametrize(
  "split,file",
  [
    ("train", "train"),
    ("validation", "val"),
    ("test", "test_2016_flickr"),
    ("test_2016_flickr", "test_2016_flickr"),
    ("test_2017_flickr", "test_2017_flickr"),
    ("test_2017_mscoco", "test_2017_mscoco"),
    ("test_2018_flickr", "test_2018_flickr"),
  ],
)
def test_every_split_name_reads_its_file(repo, tmp_path, split, file):
  root, lines = repo
  for name in multi30k.NAMES:
    source = data.open_split(config(root, tmp_path, name, "de", "en"), split)
    assert source.all_pairs() == list(zip(lines[name, file, "de"], lines[name, file, "en"]))


def test_converted_once_then_reused(repo, tmp_path, monkeypatch):
  root, lines = repo
  c = config(root, tmp_path)
  data.open_split(c, "train")

  def fail(*args, **kwargs):
    raise AssertionError("prepared again")

  monkeypatch.setattr(parallel_text.TransformerJaxParallelText, "download_and_prepare", fail)
  assert data.open_split(c, "test").pairs([1]) == [
    (lines["multi30k", "test_2016_flickr", "en"][1], lines["multi30k", "test_2016_flickr", "de"][1])
  ]


def test_a_changed_file_is_converted_again_under_another_fingerprint(tmp_path):
  root = tmp_path / "copy"
  write_repo(root)
  c = config(root, tmp_path)
  before = data.open_split(c, "validation")
  path = root / multi30k.relative_path("multi30k", "val", "en")
  changed = [f"Changed line {i}" for i in range(FILES["val"][0])]
  path.write_bytes(gzip.compress("".join(t + "\n" for t in changed).encode()))
  after = data.open_split(c, "validation")
  assert after.fingerprint != before.fingerprint
  assert [source for source, _ in after.all_pairs()] == changed


def test_without_manual_dir_one_line_says_how_to_get_the_data(tmp_path):
  c = config("", tmp_path)
  with pytest.raises(data.DataUnavailableError) as error:
    data.open_split(c, "train")
  message = str(error.value)
  assert "\n" not in message
  assert "data.source.manual_dir is not set" in message
  assert "git clone https://github.com/multi30k/dataset" in message
  assert "--config.data.source.manual_dir=" in message


def test_a_missing_file_is_named_with_where_to_put_it(tmp_path):
  root = tmp_path / "copy"
  write_repo(root)
  os.remove(root / "data/task1/raw/test_2018_flickr.de.gz")
  shutil.rmtree(root / "data/task1/tok")
  with pytest.raises(data.DataUnavailableError) as error:
    data.open_split(config(root, tmp_path), "train")
  message = str(error.value)
  assert "\n" not in message
  assert (
    f"{root} (data.source.manual_dir) lacks 1 of the 12 files of en-de: "
    "data/task1/raw/test_2018_flickr.de.gz." in message
  )
  assert "git clone https://github.com/multi30k/dataset" in message
  with pytest.raises(
    data.DataUnavailableError,
    match="lacks 12 of the 12 files of en-de: "
    "data/task1/tok/train.lc.norm.tok.de, data/task1/tok/train.lc.norm.tok.en",
  ):
    data.open_split(config(root, tmp_path, "multi30k_tok"), "train")


@pytest.mark.parametrize("split", ["test_2017_flickr", "test_2017_mscoco"])
def test_a_split_without_czech_is_an_error_listing_the_splits_there_are(repo, tmp_path, split):
  root, _ = repo
  with pytest.raises(
    data.DataError,
    match=f"multi30k has no cs text for split '{split}' "
    r"\(the repository's .* is en, de, fr only\): cs-en has train \| "
    r"validation \| test_2016_flickr \| test_2018_flickr \| test ",
  ):
    data.open_split(config(root, tmp_path, source="cs", target="en"), split)


def test_an_unknown_split_lists_the_splits(repo, tmp_path):
  root, _ = repo
  with pytest.raises(
    data.DataError,
    match="multi30k has no split 'val': it has train \\| "
    "validation \\| test_2016_flickr .* \\| test",
  ):
    data.open_split(config(root, tmp_path), "val")


def test_a_language_multi30k_lacks_names_the_field(repo, tmp_path):
  with pytest.raises(
    FieldError,
    match="data.source.target_lang='es' is invalid: allowed a language of multi30k: "
    "en | de | fr | cs",
  ):
    config(repo[0], tmp_path, target="es")


def test_files_of_different_line_counts_are_an_error_naming_both(tmp_path):
  root = tmp_path / "copy"
  lines = write_repo(root)
  path = root / multi30k.relative_path("multi30k_tok", "test_2016_flickr", "fr")
  path.write_text("".join(t + "\n" for t in lines["multi30k_tok", "test_2016_flickr", "fr"][:-1]))
  with pytest.raises(
    data.DataError,
    match=r"test_2016_flickr.lc.norm.tok.en has 5 lines but "
    r".*test_2016_flickr.lc.norm.tok.fr has 4",
  ):
    data.open_split(config(root, tmp_path, "multi30k_tok", "fr", "en"), "train")


def test_a_file_that_is_not_gzip_is_an_error_naming_it(tmp_path):
  root = tmp_path / "copy"
  write_repo(root)
  path = root / "data/task1/raw/val.en.gz"
  path.write_text("plain text\n")
  with pytest.raises(data.DataError, match=f"cannot read {path}: Not a gzipped file"):
    data.open_split(config(root, tmp_path), "train")


def test_batches_of_multi30k_hold_its_sentences(repo, tmp_path):
  root, lines = repo
  c = config(
    root,
    tmp_path,
    vocab__size=80,
    batch__eval_size=8,
    batch__tokens=256,
    batch__max_source_length=32,
    batch__max_target_length=32,
    batch__window=40,
  )
  tokenizer = data.get_tokenizer(c, str(tmp_path / "vocab"))

  def texts(batch, key):
    rows = batch[key + "_segmentation"].any(axis=1)
    return [tokenizer.decode(ids) for ids in batch[key][rows]]

  batches = data.make_eval_batches(c, tokenizer, "validation")
  assert [t for b in batches for t in texts(b, "inputs")] == lines["multi30k", "val", "en"]
  assert [t for b in batches for t in texts(b, "targets")] == lines["multi30k", "val", "de"]

  it = iter(data.make_train_loader(c, tokenizer, seed=0, shard_index=0, shard_count=1))
  try:
    batch = next(it)
  finally:
    it.close()
  pairs = list(zip(texts(batch, "inputs"), texts(batch, "targets")))
  assert pairs and set(pairs) <= set(
    zip(lines["multi30k", "train", "en"], lines["multi30k", "train", "de"])
  )


def upload(root, url, under="data/task1/raw"):
  """Copies the files under `root`/`under` to the same names under `url`."""
  for path in (root / under).rglob("*"):
    (epath.Path(url) / str(path.relative_to(root))).write_bytes(path.read_bytes())


def test_a_copy_in_a_bucket_reads_as_the_copy_on_disk(repo, tmp_path, bucket_dir):
  root, lines = repo
  upload(root, bucket_dir)
  c = config(bucket_dir, tmp_path, source="de", target="en")
  for split, file in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr")):
    source = data.open_split(c, split)
    assert source.all_pairs() == list(
      zip(lines["multi30k", file, "de"], lines["multi30k", file, "en"])
    )
  assert "gs://" not in source.fingerprint  # Converted into the local data dir.


def test_a_file_changed_in_a_bucket_is_converted_again(repo, tmp_path, bucket_dir):
  root, _ = repo
  upload(root, bucket_dir)
  c = config(bucket_dir, tmp_path)
  before = data.open_split(c, "validation")
  changed = [f"Changed line {i}" for i in range(FILES["val"][0])]
  url = epath.Path(bucket_dir) / multi30k.relative_path("multi30k", "val", "en")
  url.write_bytes(gzip.compress("".join(t + "\n" for t in changed).encode()))
  after = data.open_split(c, "validation")
  assert after.fingerprint != before.fingerprint
  assert [source for source, _ in after.all_pairs()] == changed


def test_a_file_missing_in_a_bucket_is_one_line_naming_the_url(repo, tmp_path, bucket_dir):
  root, _ = repo
  upload(root, bucket_dir)
  (epath.Path(bucket_dir) / "data/task1/raw/test_2018_flickr.de.gz").unlink()
  with pytest.raises(data.DataUnavailableError) as error:
    data.open_split(config(bucket_dir, tmp_path), "train")
  message = str(error.value)
  assert "\n" not in message
  assert (
    f"multi30k: {bucket_dir} (data.source.manual_dir) lacks 1 of the 12 files of en-de: "
    "data/task1/raw/test_2018_flickr.de.gz. Put a copy of" in message
  )
  with pytest.raises(data.DataUnavailableError, match=f"{bucket_dir} .*lacks 12 of the 12 files"):
    data.open_split(config(bucket_dir, tmp_path, "multi30k_tok"), "train")
