"""Measures the training pipeline: batches per second in each batch mode (tokens, packed, padded),
or in an experiment's own data settings.

  python -m tools.data_benchmark --data_dir=/tmp/tfds --workdir=/tmp/work
  python -m tools.data_benchmark --config=experiments/multi30k.py:tiny --manual_dir=DIR ...

Reports the time to prepare the dataset and the vocabulary (first use only),
then for each mode the time to the first batch and the steady batches/s and
real tokens/s, over --seconds of pulling batches as fast as possible.
"""

import dataclasses
import time

from absl import app, flags

from transformer_jax import config as config_lib
from transformer_jax import data
from transformer_jax.workdir import Workdir

FLAGS = flags.FLAGS


def define_flags():
  """The command line's flags; defined only when run as a program, so importing defines none."""
  flags.DEFINE_string("data_dir", "", "TFDS data dir ('' = TFDS default).")
  flags.DEFINE_string(
    "workdir",
    "/tmp/transformer_jax_data_benchmark",
    "Where the vocabulary is kept (in its vocab/).",
  )
  flags.DEFINE_string("name", "embedded", "data.source.name")
  flags.DEFINE_float("seconds", 20.0, "Measuring time per mode.")
  flags.DEFINE_integer("num_workers", 0, "data.batch.num_workers")
  flags.DEFINE_string(
    "config",
    "",
    "An experiment (FILE[:VARIANT]) whose data settings are measured, in its own batch mode, "
    "instead of --name's defaults in every mode.",
  )
  flags.DEFINE_string(
    "manual_dir", "", "data.source.manual_dir (multi30k_tok: the directory holding data/task1)."
  )


def _settings() -> data.DataConfig:
  """The data settings measured: --config's, or --name's defaults; the flags' directories."""
  if not FLAGS.config:
    return data.DataConfig(source=data.SourceSettings(name=FLAGS.name))
  config = config_lib.load_file(FLAGS.config)
  if FLAGS.manual_dir:
    config.data.source.manual_dir = FLAGS.manual_dir
  return config_lib.parse(config).data


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
  base = _settings()
  base = dataclasses.replace(
    base,
    source=dataclasses.replace(base.source, data_dir=FLAGS.data_dir),
    batch=dataclasses.replace(base.batch, num_workers=FLAGS.num_workers),
  )
  start = time.perf_counter()
  tokenizer = data.get_tokenizer(base, Workdir(FLAGS.workdir).vocab)
  print(f"dataset + vocabulary ready in {time.perf_counter() - start:.1f} s")
  for mode in [base.batch.mode] if FLAGS.config else data.BATCH_MODES:
    c = dataclasses.replace(base, batch=dataclasses.replace(base.batch, mode=mode))
    b = c.batch
    shape = {
      "tokens": f"tokens={b.tokens}",
      "packed": f"[{b.size}, {b.max_length}]",
      "padded": f"tokens={b.tokens}, rows of {max(b.max_source_length, b.max_target_length)}",
    }[mode]
    first, rate, tokens, useful = _measure(c, tokenizer, FLAGS.seconds)
    print(
      f"{mode:>6} ({shape}, num_workers={b.num_workers}): first batch after "
      f"{first:.1f} s, {rate:.1f} batches/s, {tokens / 1e3:.0f}k real tokens/s, "
      f"{100 * useful:.0f}% of the batch is real tokens"
    )


if __name__ == "__main__":
  define_flags()
  app.run(main)
