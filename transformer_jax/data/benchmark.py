"""Measures the training pipeline: batches per second in both batching modes.

  python -m transformer_jax.data.benchmark --data_dir=/tmp/tfds --workdir=/tmp/work

Reports the time to prepare the dataset and the vocabulary (first use only),
then for each mode the time to the first batch and the steady batches/s and
real tokens/s, over --seconds of pulling batches as fast as possible.
"""

import time

from absl import app
from absl import flags

from transformer_jax import data

_DATA_DIR = flags.DEFINE_string("data_dir", "", "TFDS data dir ('' = TFDS default).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/transformer_jax_data_benchmark",
                               "Where the vocabulary is kept.")
_NAME = flags.DEFINE_string("name", "embedded", "data.name")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Measuring time per mode.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 0, "data.num_workers")


def _measure(c, tokenizer, seconds):
  """(seconds to the first batch, batches/s, real tokens/s, padding-free fraction)."""
  start = time.perf_counter()
  it = iter(data.make_train_loader(c, tokenizer, seed=0, shard_index=0, shard_count=1))
  next(it)
  first = time.perf_counter() - start
  batches, real, total = 0, 0, 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(it)
    batches += 1
    mask = batch["inputs_segmentation"] > 0, batch["targets_segmentation"] > 0
    real += int(mask[0].sum() + mask[1].sum())
    total += 2 * batch["inputs"].size
  elapsed = time.perf_counter() - start
  it.close()
  return first, batches / elapsed, real / elapsed, real / max(total, 1)


def main(argv):
  del argv
  c = data.default_config()
  c.name, c.data_dir, c.num_workers = _NAME.value, _DATA_DIR.value, _NUM_WORKERS.value
  start = time.perf_counter()
  tokenizer = data.get_tokenizer(c, _WORKDIR.value)
  print(f"dataset + vocabulary ready in {time.perf_counter() - start:.1f} s")
  for mode in data.config.BATCH_MODES:
    c.batch_mode = mode
    shape = (f"tokens_per_batch={c.tokens_per_batch}" if mode == "tokens"
             else f"[{c.batch_size}, {c.max_length}]")
    first, rate, tokens, useful = _measure(c, tokenizer, _SECONDS.value)
    print(f"{mode:>6} ({shape}, num_workers={c.num_workers}): first batch after "
          f"{first:.1f} s, {rate:.1f} batches/s, {tokens / 1e3:.0f}k real tokens/s, "
          f"{100 * useful:.0f}% of the batch is real tokens")


if __name__ == "__main__":
  app.run(main)
