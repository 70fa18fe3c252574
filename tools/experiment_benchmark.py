"""The experiment benchmark: an experiment's own model on batches of its own data in each batch
mode, in real tokens per second; or its train step compiled ahead for every batch shape."""

import dataclasses
import time

import jax

from tools import decode_benchmark
from tools.timing import batch_flops, real_tokens, summary
from transformer_jax import data
from transformer_jax.experiment import Experiment, make_trainer
from transformer_jax.train.reporting import measure_matmul_flops
from transformer_jax.workdir import Workdir


def measure_batch_mode(trainer, state, batches) -> tuple[dict, object]:
  """Train on `batches`, timing each step after one untimed step of every new shape.

  Returns (figures, state): real tokens/s over all timed steps, their median
  step time, the fraction of batch positions that are real tokens, MFU.
  """
  compiled, times, real, total, flops = set(), [], 0, 0, 0.0
  for batch in batches:
    shape = batch["inputs"].shape + batch["targets"].shape
    if shape not in compiled:
      state, _ = trainer.train_step(state, batch)
      jax.block_until_ready(state)
      compiled.add(shape)
    start = time.perf_counter()
    state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    real += real_tokens(batch)
    total += batch["inputs"].size + batch["targets"].size
    flops += batch_flops(trainer.placement.model.config, batch)
  seconds = sum(times)
  return {
    "steps": len(times),
    "shapes": len(compiled),
    "step_s": summary(times),
    "tokens_per_s": real / seconds,
    "real_fraction": real / total,
    "flops_per_s": flops / seconds,
  }, state


def run_experiment(
  experiment: Experiment, workdir: Workdir, *, steps: int, decode_runs: int
) -> dict:
  """Real tokens/s of `experiment`'s model on `steps` batches of each batch mode.

  All modes train one state on batches of the experiment's own data, sized
  by its data config: 'tokens' (`data.batch.tokens`, length buckets),
  'packed' (`data.batch.size` rows of `data.batch.max_length`) and 'padded'
  (`data.batch.tokens`, every row as long as the longest pair allowed).
  """
  experiment.refuse_for_language_model("the experiment benchmark (it decodes)")
  experiment.check_devices(jax.device_count())
  tokenizer = data.get_tokenizer(experiment.data, workdir.vocab)
  trainer, _ = make_trainer(experiment, vocab_size=tokenizer.vocab_size)
  model = trainer.placement.model
  matmul_rate = measure_matmul_flops(model.config.compute_dtype)
  state = trainer.init()
  results = {
    "config": model.config.record(),
    "device": str(jax.local_devices()[0].device_kind),
    "devices": jax.device_count(),
    "matmul_flops_per_s": matmul_rate,
    "modes": {},
  }
  shard_index, shard_count = trainer.placement.data_shard
  for mode in data.BATCH_MODES:
    # Checked as a whole: e.g. rows that fit the model's positions.
    batch = dataclasses.replace(experiment.data.batch, mode=mode)
    data_config = dataclasses.replace(
      experiment, data=dataclasses.replace(experiment.data, batch=batch)
    ).data
    iterator = iter(
      data.make_train_loader(
        data_config,
        tokenizer,
        seed=experiment.seed,
        shard_index=shard_index,
        shard_count=shard_count,
      )
    )
    batches = [next(iterator) for _ in range(steps)]
    iterator.close()
    figures, state = measure_batch_mode(trainer, state, batches)
    hosts = jax.process_count()  # Each host counted its own rows.
    figures["tokens_per_s"] *= hosts
    figures["mfu"] = hosts * figures.pop("flops_per_s") / (matmul_rate * jax.device_count())
    results["modes"][mode] = figures
  results["decode_s"] = decode_benchmark.measure_decoding(model, state.params, decode_runs)
  return results


def compile_ahead(experiment: Experiment, threads: int) -> dict:
  """The seconds that compiling `experiment`'s train step for every batch shape its data can
  produce took on `threads` threads (`Trainer.compile_ahead`, as a run does before its first
  step), each shape's and in all. No data is read: the vocabulary has `data.vocab.size` tokens.
  In a fresh process, without the compilation cache: a process keeps what it compiled."""
  trainer, _ = make_trainer(experiment, vocab_size=experiment.data.vocab.size)
  shapes = data.train_batch_shapes(experiment.data, trainer.placement.data_shard[1])
  start = time.perf_counter()
  compiled = trainer.compile_ahead(shapes, threads)
  if len(compiled) < len(shapes):
    raise RuntimeError(f"{len(shapes) - len(compiled)} of {len(shapes)} shapes failed (the log)")
  return {
    "device": str(jax.local_devices()[0].device_kind),
    "threads": min(threads, len(shapes)),
    "shapes": [{"rows": r, "length": n, "seconds": t} for (r, n), t in compiled],
    "wall_seconds": time.perf_counter() - start,
  }


def format_compile_ahead(results: dict) -> str:
  """Each shape's compile seconds, then the wall time on the threads."""
  lines = [f"{r['rows']}x{r['length']}: {r['seconds']:.1f} s" for r in results["shapes"]]
  lines.append(
    f"{len(results['shapes'])} train-step programs in {results['wall_seconds']:.1f} s on "
    f"{results['threads']} threads ({results['device']})"
  )
  return "\n".join(lines)


def format_experiment_table(results: dict) -> str:
  """Per batch mode: real tokens/s, its ratio to 'padded', real fraction, step time, MFU."""
  modes = results["modes"]
  padded = modes["padded"]["tokens_per_s"]
  lines = [
    f"{'batch mode':<12}{'real tok/s':>12}{'vs padded':>11}{'real %':>9}"
    f"{'s/step':>9}{'shapes':>8}{'MFU %':>8}"
  ]
  for mode, m in modes.items():
    lines.append(
      f"{mode:<12}{m['tokens_per_s']:>12,.0f}{m['tokens_per_s'] / padded:>11.2f}"
      f"{100 * m['real_fraction']:>9.1f}{m['step_s']['median']:>9.3f}"
      f"{m['shapes']:>8}{100 * m['mfu']:>8.1f}"
    )
  decode = results["decode_s"]
  lines.append(
    f"beam 4: {decode['beam4']['median']:.3f} s/batch, greedy: "
    f"{decode['greedy']['median']:.3f} s/batch ({decode_benchmark.SENTENCES} sentences "
    f"of {decode_benchmark.SOURCE_LENGTH} tokens -> {decode_benchmark.OUTPUT_LENGTH})"
  )
  lines.append(
    f"matmul rate: {results['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s on {results['device']}"
  )
  return "\n".join(lines)
