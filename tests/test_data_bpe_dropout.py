"""BPE-dropout (`data.vocab.bpe_dropout`): SentencePiece's segmentation at p = 0 and its sampling's
distribution at p > 0, reproducible from the seed in any process, the text kept, the batch plans
made on the sampled lengths."""

import io
import random

import numpy as np
import pytest
import sentencepiece as spm

import helpers
from transformer_jax import data
from transformer_jax.conventions import BATCH_KEYS, EOS_ID
from transformer_jax.data import bpe_dropout, sources
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import FieldError

N = 120


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(config, [(source, target)], BPE tokenizer) of a text dataset of N distinct pairs of
  made-up words: long words that the vocabulary merges, so that dropping merges shows."""
  root = tmp_path_factory.mktemp("sampled")
  rng = np.random.default_rng(0)
  letters = list("abcdefghijklmnop")
  words = ["".join(rng.choice(letters, rng.integers(4, 10))) for _ in range(60)]
  pairs = [
    tuple(" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(2)) for _ in range(N)
  ]
  assert len(set(pairs)) == N
  for split in ("train", "dev"):
    for side, lang in enumerate(("xx", "yy")):
      (root / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs))
  c = helpers.text_data_config(
    root,
    vocab__size=200,
    batch__max_source_length=80,
    batch__max_target_length=80,
    batch__window=N,  # one epoch per window
    vocab__bpe_dropout=0.2,
  )
  tokenizer = tokenizer_lib.get_tokenizer(c, str(root / "vocab"))
  return c, pairs, tokenizer


def segments(batch, tokenizer):
  """[(source ids, target ids)] of every pair in `batch`, EOS included."""
  found = []
  for row in range(batch["inputs"].shape[0]):
    sides = []
    for key in ("inputs", "targets"):
      seg = batch[key + "_segmentation"][row]
      sides.append([batch[key][row][seg == k].tolist() for k in range(1, seg.max(initial=0) + 1)])
    found += list(zip(*sides))
  return found


def read(loader, n):
  it = iter(loader)
  try:
    return [next(it) for _ in range(n)]
  finally:
    it.close()


def by_pair(batches, pairs, tokenizer):
  """{pair index: [(source ids, target ids) each time it was read]}, checking the text kept."""
  index = {pair: i for i, pair in enumerate(pairs)}
  seen = {}
  for batch in batches:
    for src, tgt in segments(batch, tokenizer):
      assert src[-1] == EOS_ID and tgt[-1] == EOS_ID
      text = (tokenizer.decode(src), tokenizer.decode(tgt))
      seen.setdefault(index[text], []).append((src, tgt))
  return seen


def test_no_dropout_is_sentencepieces_segmentation(corpus):
  _, pairs, tokenizer = corpus
  texts = [text for pair in pairs for text in pair]
  texts += ["", " ", "  two   spaces ", "unknown ☃☃ runs ☃x and ☃", "ﬁ nfkc", "▁ literal ▁▁"]
  dropout = bpe_dropout.BpeDropout(tokenizer.model_proto)
  rng = random.Random(0)
  assert [dropout.encode(text, 0.0, rng) for text in texts] == tokenizer.encode_batch(texts)


def samples(tokenizer, texts, p, seed):
  dropout = bpe_dropout.BpeDropout(tokenizer.model_proto)
  rng = random.Random(seed)
  return [dropout.encode(text, p, rng) for text in texts]


def test_samples_are_reproducible_and_spell_the_text(corpus):
  _, pairs, tokenizer = corpus
  texts = [src for src, _ in pairs]
  first = samples(tokenizer, texts, 0.2, seed=1)
  assert samples(tokenizer, texts, 0.2, seed=1) == first
  assert sum(a != b for a, b in zip(first, samples(tokenizer, texts, 0.2, seed=2))) > N // 4
  plain = tokenizer.encode_batch(texts)
  assert sum(a != b for a, b in zip(first, plain)) > N // 4
  assert [tokenizer.decode(ids) for ids in first] == texts


@pytest.mark.parametrize("p", [0.1, 0.4])
def test_samples_are_as_long_as_sentencepieces_own(corpus, p):
  """The same algorithm as SentencePiece's sampling (random in every process, seed or not): the
  same mean length, within 3% (about 10 standard errors on 4,800 sentences), where the
  deterministic one is 10% or more shorter."""
  _, pairs, tokenizer = corpus
  texts = [text for pair in pairs for text in pair] * 20
  ours = np.mean([len(ids) for ids in samples(tokenizer, texts, p, seed=3)])
  processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
  theirs = np.mean(
    [len(ids) for ids in processor.encode(texts, enable_sampling=True, alpha=p, nbest_size=-1)]
  )
  plain = np.mean([len(ids) for ids in tokenizer.encode_batch(texts)])
  assert abs(ours / theirs - 1) < 0.03 and ours > 1.1 * plain


def test_every_epoch_reads_every_pair_once_in_a_new_segmentation(corpus):
  c, pairs, tokenizer = corpus
  loader = data.make_train_loader(c, tokenizer, seed=4, shard_index=0, shard_count=1)
  batches = read(loader, 60)
  shapes = set(data.train_batch_shapes(c))
  for batch in batches:
    assert batch["inputs"].shape in shapes and batch["targets"].shape in shapes
  seen = by_pair(batches, pairs, tokenizer)
  assert sorted(seen) == list(range(N))
  assert min(len(reads) for reads in seen.values()) >= 2, "60 batches hold two epochs"
  changed = sum(reads[0] != reads[1] for reads in seen.values())
  assert changed > N // 2, "a pair is segmented anew each epoch"
  plain = [tuple(ids + [EOS_ID] for ids in tokenizer.encode_batch(p)) for p in pairs]
  assert sum(reads[0] != plain[i] for i, reads in seen.items()) > N // 2


@pytest.mark.parametrize("sides,sampled", [("source", 0), ("target", 1)])
def test_one_side_sampled_the_other_as_the_vocabulary_segments_it(corpus, sides, sampled):
  c, pairs, tokenizer = corpus
  c = helpers.data_config(c, vocab__bpe_dropout_sides=sides)
  loader = data.make_train_loader(c, tokenizer, seed=4, shard_index=0, shard_count=1)
  seen = by_pair(read(loader, 20), pairs, tokenizer)
  plain = {i: [ids + [EOS_ID] for ids in tokenizer.encode_batch(pairs[i])] for i in seen}
  assert all(r[1 - sampled] == plain[i][1 - sampled] for i, reads in seen.items() for r in reads)
  assert sum(reads[0][sampled] != plain[i][sampled] for i, reads in seen.items()) > len(seen) // 2


def test_no_sampling_tokenizes_as_the_vocabulary_does(corpus):
  c, pairs, tokenizer = corpus
  c = helpers.data_config(c, vocab__bpe_dropout=0.0)
  loader = data.make_train_loader(c, tokenizer, seed=4, shard_index=0, shard_count=1)
  for i, reads in by_pair(read(loader, 20), pairs, tokenizer).items():
    src, tgt = (ids + [EOS_ID] for ids in tokenizer.encode_batch(pairs[i]))
    assert all(r == (src, tgt) for r in reads)


def test_host_shards_sample_alike_and_make_up_the_global_batch(corpus):
  c, _, tokenizer = corpus
  whole = read(data.make_train_loader(c, tokenizer, seed=5, shard_index=0, shard_count=1), 10)
  parts = [
    read(data.make_train_loader(c, tokenizer, seed=5, shard_index=h, shard_count=2), 10)
    for h in range(2)
  ]
  for step, batch in enumerate(whole):
    for key in BATCH_KEYS:
      np.testing.assert_array_equal(
        np.concatenate([parts[0][step][key], parts[1][step][key]]), batch[key]
      )


@pytest.mark.usefixtures("absl_flags_parsed")  # Grain's worker processes read them.
@pytest.mark.parametrize("workers", [0, 1])
def test_resume_through_orbax_reads_the_same_samples(corpus, tmp_path, workers):
  c, _, tokenizer = corpus
  c = helpers.data_config(c, batch__window=40, batch__num_workers=workers)
  make = lambda: data.make_train_loader(c, tokenizer, seed=6, shard_index=0, shard_count=1)
  helpers.assert_loader_resumes(make, tmp_path, before=9, after=12)  # crosses windows of 40 pairs


def test_a_sample_over_the_caps_falls_back_to_the_plain_segmentation(corpus):
  c, pairs, tokenizer = corpus
  source = sources.open_split(c, "train")
  plain = [tuple(ids + [EOS_ID] for ids in tokenizer.encode_batch(p)) for p in pairs]
  caps = np.array([max(len(s) for s, _ in plain), max(len(t) for _, t in plain)])
  sampled = bpe_dropout.PairSampler(source, tokenizer, 0.5, caps * 10, seed=0)(0, np.arange(N))
  capped = bpe_dropout.PairSampler(source, tokenizer, 0.5, caps, seed=0)(0, np.arange(N))
  over = [i for i, (s, t) in enumerate(sampled) if len(s) > caps[0] or len(t) > caps[1]]
  assert 0 < len(over) < N
  for i in range(N):
    assert capped[i] == (plain[i] if i in over else sampled[i])


def test_a_vocabulary_that_is_not_bpe_is_one_error(corpus, tmp_path):
  c, pairs, _ = corpus
  unigram = tokenizer_lib.Tokenizer(
    tokenizer_lib.train_model([t for p in pairs for t in p], 80, "unigram"), "uni.model"
  )

  class Marian:  # encodes, but carries no single SentencePiece model
    path = str(tmp_path)

  for vocabulary, name in ((unigram, "uni.model"), (Marian(), str(tmp_path))):
    with pytest.raises(
      FieldError, match=f"data.vocab.bpe_dropout=0.2 needs a SentencePiece BPE vocabulary.*; {name}"
    ):
      bpe_dropout.PairSampler(
        sources.open_split(c, "train"), vocabulary, 0.2, np.array([8, 8]), seed=0
      )


@pytest.mark.parametrize(
  "option,why",
  [
    ({"user_defined_symbols": ["<sep>"]}, "it has user-defined symbols"),
    ({"byte_fallback": True}, "it was trained with byte_fallback"),
    ({"split_by_whitespace": False}, "it was trained without split_by_whitespace"),
    ({"treat_whitespace_as_suffix": True}, "it was trained with treat_whitespace_as_suffix"),
  ],
)
def test_bpe_options_it_does_not_do_are_refused(corpus, option, why):
  """Options under which it would not segment as SentencePiece: one line, never other ids."""
  c, pairs, _ = corpus
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter([t for p in pairs for t in p]),
    model_writer=model,
    vocab_size=300,
    model_type="bpe",
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    minloglevel=2,
    **option,
  )
  vocabulary = tokenizer_lib.Tokenizer(model.getvalue(), "odd.model")
  with pytest.raises(FieldError, match=f"odd.model: {why}"):
    bpe_dropout.PairSampler(sources.open_split(c, "train"), vocabulary, 0.1, np.array([8, 8]), 0)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_dropout_outside_zero_to_one_names_the_field(value):
  with pytest.raises(FieldError, match=r"data.vocab.bpe_dropout"):
    helpers.data_config(vocab__bpe_dropout=value)
