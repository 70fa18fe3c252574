"""Stage f, end to end: the default experiment (`experiments/default.py`, in bfloat16 on the
device) through train, average and eval, as `./launch.sh` runs it, in a fresh work directory and
data directory: the wall time split by part, training updates/s and target tokens/s, the test
BLEU.

`run_experiment` is that run for any experiment; the Multi30k stage (`multi30k.py`) uses it too.
Both use the persistent compilation cache the report names (`--compilation_cache`), shared by
its steps and by a second call on the same machine, and record what it loaded.
"""

import dataclasses
import pathlib
import shutil
import threading
import time

from tools.device_report.speed import experiment_of
from transformer_jax import compilation_cache
from transformer_jax import experiment as experiment_lib
from transformer_jax.workdir import Workdir

PARTIAL_EVERY_SECONDS = 5.0  # how often the training's times so far reach the result


def run(plan, step, result, context) -> None:
  del step
  spec, overrides = plan.end_to_end
  run_experiment(spec, overrides, context.work / "end_to_end", result, context, splits=("test",))


def run_experiment(
  spec: str,
  overrides: dict,
  work: pathlib.Path,
  result,
  context,
  *,
  splits: tuple[str, ...],
  on_split=lambda split, record: None,
) -> dict:
  """Train the experiment of `spec` with `overrides` in the fresh directory `work` (its data
  directory there too), average its last checkpoints, and evaluate the averaged checkpoint on
  each of `splits` (names `decode.split` takes), each figure put into `result` as it is known;
  `on_split(split, record)` as each split's figures are in. Returns the record."""
  cache = compilation_cache.enable(context.compilation_cache)
  shutil.rmtree(work, ignore_errors=True)
  experiment = experiment_of(spec, {**overrides, "data.source.data_dir": str(work / "tfds")})
  workdir = Workdir(str(work / "workdir"))
  steps = experiment.fit.num_train_steps
  result.put(experiment=spec, overrides=overrides, steps=steps)
  parts = {}  # wall seconds by part, in the order they ran
  start = time.monotonic()
  times = _train(experiment, workdir, result)
  train_seconds = time.monotonic() - start
  result.put(train_seconds=train_seconds, steps_per_second=steps / train_seconds)
  parts.update(_split_of_training(times))
  result.put(**_speeds(times), wall_seconds_by_part=_parts(parts, start, context.started))
  _put_cache(result, cache)
  averaged = time.monotonic()
  steps_averaged = experiment_lib.average(experiment, workdir)["steps"]
  parts["averaging"] = time.monotonic() - averaged
  result.put(average_seconds=parts["averaging"], averaged_steps=steps_averaged)
  records = {}
  for split in splits:
    evaluated = time.monotonic()
    record = experiment_lib.evaluate_split(
      dataclasses.replace(experiment, decode=dataclasses.replace(experiment.decode, split=split)),
      workdir,
      experiment_lib.Checkpoint("averaged"),
    )
    parts[f"decoding_{split}"] = time.monotonic() - evaluated
    records[split] = {
      key: record[key]
      for key in ("split", "sentences", "bleu", "bleu_as_is", "perplexity", "decode_seconds")
      if key in record
    }
    records[split].update(
      seconds=parts[f"decoding_{split}"],
      sentences_per_second=record["sentences_per_second"],
      known_after_seconds=time.monotonic() - (context.started or start),
    )
    result.put(
      splits=records,
      wall_seconds=time.monotonic() - start,
      wall_seconds_by_part=_parts(parts, start, context.started),
    )
    _put_cache(result, cache)
    on_split(split, records[split])
  return result.record


def _train(experiment, workdir: Workdir, result) -> dict:
  """Train; the library's split of the run's time (`RunTimes`), put into `result` every
  PARTIAL_EVERY_SECONDS while it trains, so that a step stopped mid-run keeps it. The thread that
  puts it is the only writer of `result` until it is joined (both would write one file)."""
  times = experiment_lib.RunTimes()
  done = threading.Event()

  def put_partial() -> None:
    while not done.wait(PARTIAL_EVERY_SECONDS):
      result.put(run_times=times.to_json())

  thread = threading.Thread(target=put_partial, daemon=True)
  thread.start()
  try:
    experiment_lib.train(experiment, workdir, times=times)
  finally:
    done.set()
    thread.join()
  record = times.to_json()
  result.put(run_times=record)
  return record


def _split_of_training(times: dict) -> dict:
  """The training run's wall seconds by part, from the library's `RunTimes` record."""
  phases = times["phases"]
  return {
    "preparing_data": times["preparing_data"],
    "setting_up": times["setting_up"],
    "compiling": phases["compiling"],
    "training": phases["training"],
    "checkpointing": phases["checkpointing"],
    "evaluating_while_training": phases["evaluating"],
    "waiting_for_data": phases["waiting_for_data"],
  }


def _parts(parts: dict, start: float, started: float) -> dict:
  """`parts` with `before` (the process's start and imports, up to the run) and `other` (what no
  part holds)."""
  shown = {"before": start - started, **parts} if started else dict(parts)
  total = time.monotonic() - (started or start)
  return {k: round(v, 3) for k, v in {**shown, "other": total - sum(shown.values())}.items()}


def _put_cache(result, cache) -> None:
  if cache is None:
    result.put(compilation_cache=None)
    return
  record = dataclasses.asdict(cache)
  result.put(
    compilation_cache={k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}
  )


def _speeds(times: dict) -> dict:
  """Updates/s and target tokens/s of training and waiting for data (the run's time less
  compiling, checkpointing and evaluating: `RunTimes`)."""
  seconds = times["phases"]["training"] + times["phases"]["waiting_for_data"]
  if not times["steps"] or seconds <= 0:
    return {}
  return {
    "updates_per_second": times["steps"] / seconds,
    "target_tokens_per_second": times["target_tokens"] / seconds,
  }
