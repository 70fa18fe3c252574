"""The sources 'embedded' and 'embedded_tiny': the synthetic corpus of `embedded.py` as a TFDS
builder of this package, generated into the data dir on first use."""

import tensorflow_datasets as tfds

from transformer_jax.data import embedded
from transformer_jax.data.source import Source


class EmbeddedConfig(tfds.core.BuilderConfig):
  """Sizes and seed of one variant of the embedded corpus."""

  def __init__(self, *, sizes, seed, **kwargs):
    # Bump the version whenever embedded.py or embedded_lexicon.py changes what a seed generates.
    super().__init__(version=tfds.core.Version("1.0.0"), **kwargs)
    self.sizes = sizes
    self.seed = seed


class TransformerJaxEmbedded(tfds.core.GeneratorBasedBuilder):
  """The embedded synthetic parallel corpus (see `embedded.py`), in generation order."""

  BUILDER_CONFIGS = [
    EmbeddedConfig(
      name="full",
      seed=0,
      description="100k/2k/2k pairs",
      sizes={"train": 100_000, "validation": 2_000, "test": 2_000},
    ),
    EmbeddedConfig(
      name="tiny",
      seed=1,
      description="2k/200/200 pairs, for tests",
      sizes={"train": 2_000, "validation": 200, "test": 200},
    ),
  ]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Synthetic English-like to invented-language translation.",
      features=tfds.features.Translation(languages=(embedded.SOURCE_LANG, embedded.TARGET_LANG)),
      supervised_keys=(embedded.SOURCE_LANG, embedded.TARGET_LANG),
      disable_shuffling=True,
    )  # keep the generated order

  def _split_generators(self, dl_manager):
    del dl_manager
    corpus = embedded.generate_corpus(self.builder_config.seed, self.builder_config.sizes)
    return {split: self._generate_examples(pairs) for split, pairs in corpus.items()}

  def _generate_examples(self, pairs):
    for i, (src, tgt) in enumerate(pairs):
      yield i, {embedded.SOURCE_LANG: src, embedded.TARGET_LANG: tgt}


def _builder(variant: str):
  """`Source.builder` of the variant `variant` ('full' or 'tiny')."""

  def make(c):
    return TransformerJaxEmbedded(
      config=variant, data_dir=c.data_dir or None, file_format="array_record"
    )

  return make


LANGUAGES = (embedded.SOURCE_LANG, embedded.TARGET_LANG)
SOURCES = (
  Source("embedded", LANGUAGES, _builder("full")),
  Source("embedded_tiny", LANGUAGES, _builder("tiny")),
)
