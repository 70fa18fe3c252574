"""The table of sources: a source added as one entry reads, trains a vocabulary, makes batches
and trains a model, with nothing else changed; and what a work directory keeps of its data (the
vocabulary's name, the split's fingerprint, which names its length tables) is what it was."""

import hashlib

import numpy as np
import pytest

import helpers
from transformer_jax import data, experiment
from transformer_jax.data import sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import FieldError

WORDS = {
  "de": "der die das Hund Katze Haus sieht klein gross rot".split(),
  "en": "the the the dog cat house sees small big red".split(),
}


def write_pairs(folder, split: str, count: int) -> list[tuple[str, str]]:
  """`<folder>/<split>.de` and `.en`: `count` pairs, word k of one translating word k of the
  other; returns them as (en, de)."""
  picks = np.random.default_rng(len(split)).integers(0, len(WORDS["en"]), (count, 6))
  pairs = [
    tuple(" ".join(WORDS[lang][k] for k in row[: 2 + i % 5]) for lang in ("en", "de"))
    for i, row in enumerate(picks)
  ]
  for side, lang in enumerate(("en", "de")):
    (folder / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs))
  return pairs


@pytest.fixture
def pairs_source(tmp_path, monkeypatch):
  """The source of docs/data.md's "Adding a source", its files written here, added to the table
  as it says: one entry. Returns {split: [(en, de)]}."""
  folder = tmp_path / "wmt"
  folder.mkdir()
  written = {"train": write_pairs(folder, "train", 48), "validation": write_pairs(folder, "dev", 8)}
  code = helpers.code_block("docs/data.md", "## Adding a source\n")
  for old, new in (("/data/wmt/europarl-v7.de-en", "train"), ("/data/wmt/newstest2013", "dev")):
    assert code.count(old) == 2, old
    code = code.replace(old, str(folder / new))
  module = {}
  exec(compile(code, "docs/data.md", "exec"), module)  # pylint: disable=exec-used
  monkeypatch.setitem(sources.SOURCES, "europarl", module["SOURCE"])
  return written


def pairs_config(tmp_path, **fields):
  return helpers.data_config(
    **{
      "source__name": "europarl",
      "source__source_lang": "en",
      "source__target_lang": "de",
      "source__data_dir": str(tmp_path / "tfds"),
      **fields,
    }
  )


def test_a_source_added_as_one_entry_reads_its_splits_in_order(tmp_path, pairs_source):
  c = pairs_config(tmp_path)
  assert data.open_split(c, "train").all_pairs() == pairs_source["train"]
  assert data.split_texts(c, "validation") == tuple(map(list, zip(*pairs_source["validation"])))
  with pytest.raises(
    data.DataError, match=r"europarl has no split 'test': it has train \| validation\."
  ):
    data.open_split(c, "test")
  with pytest.raises(FieldError, match="data.source.target_lang='fr' is invalid: allowed a lang"):
    pairs_config(tmp_path, source__target_lang="fr")


def test_a_source_added_as_one_entry_trains_a_vocabulary_and_a_model(tmp_path, pairs_source):
  settings = helpers.tiny_experiment(
    tmp_path,
    data__source__name="europarl",
    data__source__source_lang="en",
    data__source__target_lang="de",
    data__source__data_dir=str(tmp_path / "tfds"),
    data__vocab__path="",
    data__vocab__size=40,
    data__batch__max_length=32,
    data__batch__max_source_length=32,
    data__batch__max_target_length=32,
    model__num_layers=1,
    model__max_len=32,
  )
  vocab = tmp_path / "vocab"
  tokenizer = data.get_tokenizer(settings.data, str(vocab))
  assert tokenizer.path == str(vocab / "europarl-de-en-40.model")  # <source>-<languages>-<size>
  trainer, _ = experiment.make_trainer(settings, vocab_size=tokenizer.vocab_size)
  state, losses = trainer.init(), []
  batches = iter(
    data.make_train_loader(settings.data, tokenizer, seed=0, shard_index=0, shard_count=1)
  )
  try:
    for _ in range(2):
      batch = next(batches)
      firsts = [ids[at == 1] for ids, at in zip(batch["inputs"], batch["inputs_segmentation"])]
      texts = {tokenizer.decode(ids) for ids in firsts if len(ids)}
      assert texts and texts <= {en for en, _ in pairs_source["train"]}
      state, metrics = trainer.train_step(state, batch)
      losses.append(float(metrics["loss"]))
  finally:
    batches.close()
  assert int(state.step) == 2 and np.isfinite(losses).all(), losses


def test_every_entry_is_under_its_own_name():
  assert all(name == source.name for name, source in sources.SOURCES.items())
  assert set(sources.SOURCES) == {
    "embedded",
    "embedded_tiny",
    "wmt14_translate/de-en",
    "wmt14_translate/fr-en",
    "wmt17_translate/de-en",
    "multi30k",
    "multi30k_tok",
    "text",
  }


def test_what_a_work_directory_keeps_of_its_data_is_named_as_before(shared, tmp_path):
  """A work directory's vocabulary and length tables are found by these names: a run resumed in
  one written before the table of sources and the sections of the data settings finds its own."""
  c = helpers.data_config(source__name="embedded_tiny", source__data_dir=str(shared / "tfds"))
  version = "transformer_jax_embedded/tiny/1.0.0"
  assert data.open_split(c, "validation").fingerprint == (
    f"{version}:{shared}/tfds/{version}:validation:200:en->sy"
  )
  assert tokenizer_lib.default_vocab_path(c, "/v") == "/v/embedded_tiny-en-sy-1000.model"
  for lang in ("en", "de"):
    (tmp_path / f"corpus.{lang}").write_text("a b\nc d\n" if lang == "en" else "x y\nz w\n")
  text = helpers.data_config(
    source__name="text",
    source__source_lang="de",
    source__target_lang="en",
    source__text_train=str(tmp_path / "corpus"),
    vocab__size=500,
    vocab__model="unigram",
  )
  key = hashlib.sha1(str(tmp_path / "corpus").encode()).hexdigest()[:8]
  assert tokenizer_lib.default_vocab_path(text, "/v") == f"/v/text_{key}-de-en-500-unigram.model"
