"""The Grain pipeline: packing, token budgets, resume, per-host shards, evaluation batches.

The data are plain text files made here: pair i is the word "i+3" repeated
(source and target lengths drawn at random), and a whitespace tokenizer maps
the word to the id, so every token names the pair it came from.
"""

import logging

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import helpers
from transformer_jax import data
from transformer_jax.conventions import BATCH_KEYS, EOS_ID
from transformer_jax.data import pipeline
from transformer_jax.errors import FieldError

N = 400


class WordIds:
  """A tokenizer stand-in: "7 7 7" -> [7, 7, 7]."""

  path = None
  digest = "word-ids"

  def encode(self, text):
    return [int(w) for w in text.split()]

  def encode_batch(self, texts):
    return [self.encode(text) for text in texts]

  encode_target = encode
  encode_target_batch = encode_batch


def pair_id(token):
  return int(token) - 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """(source lengths, target lengths, config) of a text dataset of N pairs."""
  root = tmp_path_factory.mktemp("text")
  rng = np.random.default_rng(0)
  src_len = rng.integers(1, 40, N)
  tgt_len = rng.integers(1, 40, N)
  src_len[:5] = 70  # over-long pairs (more than 63 tokens with EOS)
  for split, n in (("train", N), ("dev", 37)):
    with open(root / f"{split}.xx", "w") as fx, open(root / f"{split}.yy", "w") as fy:
      for i in range(n):
        fx.write(" ".join([str(i + 3)] * src_len[i]) + "\n")
        fy.write(" ".join([str(i + 3)] * tgt_len[i]) + "\n")
  c = helpers.text_data_config(
    root,
    batch__max_source_length=63,
    batch__max_target_length=63,
    batch__window=N - 5,  # one epoch of the pairs that are not over-long
    batch__size=8,
    batch__max_length=64,
  )
  return src_len + 1, tgt_len + 1, c  # lengths with EOS


def config(corpus, **overrides):
  return helpers.data_config(corpus[2], **overrides)


def take(loader, n):
  it = iter(loader)
  try:
    return [next(it) for _ in range(n)]
  finally:
    it.close()


def unpack(batch):
  """[(pair id, source length, target length)] of every row segment, checking the layout."""
  found = []
  for row in range(batch["inputs"].shape[0]):
    side = {}
    for key in ("inputs", "targets"):
      tokens = batch[key][row]
      seg = batch[key + "_segmentation"][row]
      pos = batch[key + "_position"][row]
      used = int((seg > 0).sum())
      # Real tokens first, then padding that is 0 everywhere.
      assert (seg[:used] > 0).all() and not seg[used:].any()
      assert not tokens[used:].any() and not pos[used:].any()
      segments = []
      for k in range(1, int(seg.max(initial=0)) + 1):
        where = np.flatnonzero(seg == k)
        assert len(where) and (np.diff(where) == 1).all(), "a segment is contiguous"
        assert (pos[where] == np.arange(len(where))).all()
        ids = tokens[where]
        # Every token of the pair, in order: its id repeated, then EOS (unless cut).
        body = ids[:-1] if ids[-1] == EOS_ID else ids
        assert len(body) and (body == body[0]).all()
        segments.append((pair_id(body[0]), len(where)))
      side[key] = segments
    assert [s[0] for s in side["inputs"]] == [t[0] for t in side["targets"]]
    found += [(s[0], s[1], t[1]) for s, t in zip(side["inputs"], side["targets"])]
  return found


def one_epoch(loader, n_pairs):
  """Batches until n_pairs pairs were seen (the window is the whole dataset)."""
  batches, seen = [], 0
  it = iter(loader)
  try:
    while seen < n_pairs:
      batches.append(next(it))
      seen += len(unpack(batches[-1]))
  finally:
    it.close()
  assert seen == n_pairs, "the epoch ends at a batch boundary"
  return batches


@pytest.mark.parametrize("mode", ["tokens", "packed", "padded"])
def test_every_pair_exactly_once_in_order_with_segments_and_positions(corpus, mode):
  src_len, tgt_len, _ = corpus
  c = config(corpus, batch__mode=mode)
  batches = one_epoch(
    data.make_train_loader(c, WordIds(), seed=1, shard_index=0, shard_count=1), N - 5
  )
  found = [f for b in batches for f in unpack(b)]
  ids = sorted(f[0] for f in found)
  assert ids == list(range(5, N)), "each pair once; the 5 over-long ones dropped"
  for pid, s, t in found:
    assert (s, t) == (src_len[pid], tgt_len[pid]), "nothing cut"
  for b in batches:
    assert set(b) == set(BATCH_KEYS)
    assert all(v.dtype == np.int32 and v.shape == b["inputs"].shape for v in b.values())
    if mode == "packed":
      assert b["inputs"].shape == (8, 64)
    if mode == "padded":
      assert b["inputs"].shape == (8, 63), "512 tokens // the longest pair, even rows"
      assert (b["inputs_segmentation"].max(axis=1) <= 1).all(), "one pair per row"
  if mode == "packed":
    real = sum(int((b["inputs_segmentation"] > 0).sum()) for b in batches)
    assert real / sum(b["inputs"].size for b in batches) > 0.6, "rows are packed"


def test_token_batches_keep_the_budget_and_declared_shapes(corpus):
  c = config(corpus, batch__mode="tokens")
  shapes = set()
  for b in take(data.make_train_loader(c, WordIds(), seed=2, shard_index=0, shard_count=1), 40):
    rows, length = b["inputs"].shape
    shapes.add((rows, length))
    assert rows * length <= 512, "padded tokens within the budget, each side"
    assert rows % 2 == 0, "rows are a multiple of batch_multiple"
    assert (b["inputs_segmentation"].max(axis=1) <= 1).all(), "one pair per row"
  allowed = {(512 // n // 2 * 2, n) for n in (8, 16, 24, 32, 40, 56, 63)}
  assert shapes <= allowed and len(shapes) > 3


def test_epochs_repeat_in_a_new_order(corpus):
  c = config(corpus, batch__mode="tokens")
  loader = data.make_train_loader(c, WordIds(), seed=3, shard_index=0, shard_count=1)
  first = one_epoch(loader, N - 5)
  both = one_epoch(loader, 2 * (N - 5))
  second = both[len(first) :]
  assert [np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(first, both)] == [True] * len(
    first
  ), "same seed, same stream"
  ids = lambda bs: [f[0] for b in bs for f in unpack(b)]
  assert sorted(ids(second)) == sorted(ids(first)) and ids(second) != ids(first)


def test_other_seed_other_order(corpus):
  c = config(corpus)
  a, b = (
    take(data.make_train_loader(c, WordIds(), seed=s, shard_index=0, shard_count=1), 3)
    for s in (4, 5)
  )
  assert any(
    x["inputs"].shape != y["inputs"].shape or not np.array_equal(x["inputs"], y["inputs"])
    for x, y in zip(a, b)
  )


def test_overlong_pairs_truncated_and_counted(corpus, caplog):
  src_len, _, _ = corpus
  c = config(corpus, batch__overlong="truncate", batch__window=N)
  with caplog.at_level(logging.INFO):
    loader = data.make_train_loader(c, WordIds(), seed=6, shard_index=0, shard_count=1)
  assert "5 of 400 training pairs exceed 63 source / 63 target tokens: truncated" in (caplog.text)
  found = {f[0]: f for b in one_epoch(loader, N) for f in unpack(b)}
  assert sorted(found) == list(range(N))
  for pid in range(5):
    assert found[pid][1] == 63 < src_len[pid]


@pytest.mark.parametrize("mode", ["tokens", "packed"])
def test_host_shards_are_disjoint_and_make_up_the_global_batch(corpus, mode):
  c = config(corpus, batch__mode=mode)
  whole = take(data.make_train_loader(c, WordIds(), seed=7, shard_index=0, shard_count=1), 12)
  parts = [
    take(data.make_train_loader(c, WordIds(), seed=7, shard_index=h, shard_count=2), 12)
    for h in range(2)
  ]
  for step, batch in enumerate(whole):
    host0, host1 = parts[0][step], parts[1][step]
    assert host0["inputs"].shape == host1["inputs"].shape, "hosts agree on shapes"
    ids0 = {f[0] for f in unpack(host0)}
    ids1 = {f[0] for f in unpack(host1)}
    assert not ids0 & ids1
    assert ids0 | ids1 == {f[0] for f in unpack(batch)}
    for key in BATCH_KEYS:
      np.testing.assert_array_equal(np.concatenate([host0[key], host1[key]]), batch[key])


@pytest.mark.slow
@pytest.mark.usefixtures("absl_flags_parsed")  # Grain's worker processes read them.
@pytest.mark.parametrize("mode,workers", [("tokens", 0), ("packed", 0), ("tokens", 1)])
def test_resume_through_orbax_sees_the_same_batches(corpus, tmp_path, mode, workers):
  c = config(corpus, batch__mode=mode, batch__num_workers=workers, batch__window=64)
  make = lambda: data.make_train_loader(c, WordIds(), seed=8, shard_index=0, shard_count=1)
  helpers.assert_loader_resumes(make, tmp_path, before=7, after=10)  # crosses windows of 64 pairs


def test_eval_batches_cover_the_split_in_order_without_dropping(corpus):
  c = config(corpus, batch__eval_size=8, batch__max_source_length=8)  # caps do not apply
  batches = data.make_eval_batches(c, WordIds(), "validation")
  sources, targets = data.split_texts(c, "validation")
  assert len(batches) == 5 and len(sources) == len(targets) == 37
  order = []
  for number, batch in enumerate(batches):
    found = unpack(batch)
    rows = slice(8 * number, 8 * number + 8)
    assert [f[0] for f in found] == [pair_id(s.split()[0]) for s in sources[rows]]
    assert [f[0] for f in found] == [pair_id(t.split()[0]) for t in targets[rows]]
    order += found
    rows, length = batch["inputs"].shape
    assert rows == 8 and length in (8, 16, 24, 32, 40, 56, 72)
    assert length >= max(max(f[1], f[2]) for f in found)
  src_len, tgt_len, _ = corpus
  assert order == [(i, src_len[i], tgt_len[i]) for i in range(37)]
  last = batches[-1]
  assert (last["inputs_segmentation"][5:] == 0).all(), "3 padding rows marked by 0"


def test_eval_batches_fit_the_models_positions(corpus, caplog):
  c = config(corpus, batch__eval_size=8)
  whole = data.make_eval_batches(c, WordIds(), "validation")
  longest = max(max(f[1], f[2]) for batch in whole for f in unpack(batch))
  limit = longest - 3  # Some pairs are longer, and a batch padded up past it would not fit.
  with caplog.at_level("WARNING"):
    batches = data.make_eval_batches(c, WordIds(), "validation", max_length=limit)
  assert max(batch["inputs"].shape[1] for batch in batches) == limit
  cut = sum(max(f[1], f[2]) > limit for batch in whole for f in unpack(batch))
  assert cut > 0 and f"{cut} of 37 pairs have a side longer than the model's {limit}" in (
    caplog.text
  )
  for full, short in zip(whole, batches):
    assert [f[0] for f in unpack(full)] == [f[0] for f in unpack(short)]  # Nothing dropped.
    for key in ("inputs", "targets"):
      real = short[f"{key}_segmentation"] > 0
      np.testing.assert_array_equal(short[key][real], full[key][:, :limit][real])


def test_eval_shards_are_consecutive_parts_of_the_same_batches(corpus):
  c = config(corpus, batch__eval_size=8)
  whole = data.make_eval_batches(c, WordIds(), "validation")
  parts = [
    data.make_eval_batches(c, WordIds(), "validation", shard_index=h, shard_count=2)
    for h in range(2)
  ]
  assert len(parts[0]) == len(parts[1]) == len(whole)
  for batch, b0, b1 in zip(whole, *parts):
    for key in BATCH_KEYS:
      np.testing.assert_array_equal(np.concatenate([b0[key], b1[key]]), batch[key])


def test_bucket_lengths():
  assert pipeline.bucket_lengths(64) == (8, 16, 24, 32, 40, 56, 64)
  assert pipeline.bucket_lengths(256) == (8, 16, 24, 32, 40, 56, 72, 96, 120, 152, 192, 240, 256)
  assert [pipeline.padded_length(n) for n in (1, 8, 9, 57, 97, 300)] == [8, 8, 16, 72, 120, 304]
  assert pipeline.bucket_lengths(256, growth=2) == (8, 16, 32, 64, 128, 256)
  assert pipeline.bucket_lengths(100, growth=1.5) == (8, 16, 24, 40, 64, 96, 100)
  # 1.1 * 400 is 440.00000000000006 in floating point: exactly 440, not 448.
  assert pipeline._next_length(400, growth=1.1) == 440  # pylint: disable=protected-access


def test_train_batch_shapes_follow_from_the_batch_settings_alone():
  c = helpers.data_config(
    batch__tokens=1000,
    batch__max_source_length=40,
    batch__max_target_length=64,
    batch__multiple=8,
    batch__bucket_growth=2,
  )
  # Rows: 1000 // length, down to a multiple of 8 (data.batch.multiple; one host).
  assert data.train_batch_shapes(c) == [(120, 8), (56, 16), (24, 32), (8, 64)]
  # 3 hosts: rows in multiples of lcm(8, 3) = 24, and the longest bucket gets none.
  with pytest.raises(FieldError, match="needs at least 1536 for 24 rows"):
    data.train_batch_shapes(c, shard_count=3)
  assert data.train_batch_shapes(helpers.data_config(c, batch__mode="padded")) == [(8, 64)]
  packed = helpers.data_config(c, batch__mode="packed", batch__size=32, batch__max_length=128)
  assert data.train_batch_shapes(packed) == [(32, 128)]
  with pytest.raises(FieldError, match="data.batch.tokens=100 is too small"):
    data.train_batch_shapes(helpers.data_config(c, batch__tokens=100))


def test_layout_packs_by_hand():
  batch = pipeline.layout(
    [([5, 6, 1], [7, 1]), ([8, 1], [9, 9, 9, 1]), ([4, 1], [1])],
    rows=[0, 0, 2],
    num_rows=3,
    length=6,
  )
  np.testing.assert_array_equal(batch["inputs"], [[5, 6, 1, 8, 1, 0], [0] * 6, [4, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(
    batch["targets_segmentation"], [[1, 1, 2, 2, 2, 2], [0] * 6, [1, 0, 0, 0, 0, 0]]
  )
  np.testing.assert_array_equal(batch["targets_position"], [[0, 1, 0, 1, 2, 3], [0] * 6, [0] * 6])
  np.testing.assert_array_equal(
    batch["inputs_position"], [[0, 1, 2, 0, 1, 0], [0] * 6, [0, 1, 0, 0, 0, 0]]
  )


@pytest.mark.parametrize(
  "field,value,allowed",
  [
    ("source.name", "wmt99", "embedded"),
    ("batch.mode", "buckets", "tokens | packed | padded"),
    ("batch.overlong", "keep", "drop | truncate"),
    ("batch.tokens", 0, "a positive integer"),
    ("batch.bucket_growth", 1, r"a number in \(1, 4\]"),
    ("batch.num_workers", -1, "an integer >= 0"),
    ("vocab.size", 8, "an integer >= 16"),
    ("source.target_lang", "fr", "en | sy"),
    ("batch.eval_size", 12, "a multiple of data.batch.multiple=8"),
  ],
)
def test_config_errors_name_the_field(field, value, allowed):
  with pytest.raises(FieldError, match=f"data.{field}.*{allowed}"):
    helpers.data_config(**{field.replace(".", "__"): value})


def test_loader_rejects_a_budget_below_one_longest_row(corpus):
  c = config(corpus, batch__tokens=100)
  with pytest.raises(FieldError, match="data.batch.tokens=100 is too small"):
    data.make_train_loader(c, WordIds(), seed=0, shard_index=0, shard_count=1)


@pytest.mark.parametrize("mode", ["tokens", "packed"])
def test_batches_feed_make_array_from_process_local_data(corpus, mode):
  mesh = Mesh(np.array(jax.devices()), ("data",))
  c = config(corpus, batch__mode=mode, batch__multiple=jax.device_count())
  for batch in take(data.make_train_loader(c, WordIds(), seed=9, shard_index=0, shard_count=1), 3):
    for value in batch.values():
      array = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("data")), value
      )
      np.testing.assert_array_equal(np.asarray(array), value)
