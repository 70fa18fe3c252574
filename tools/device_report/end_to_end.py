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
import struct
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
  spec: str, overrides: dict, work: pathlib.Path, result, context, *, splits: tuple[str, ...]
) -> dict:
  """Train the experiment of `spec` with `overrides` in the fresh directory `work` (its data
  directory there too), average its last checkpoints, and evaluate the averaged checkpoint on
  each of `splits` (names `decode.split` takes), each figure put into `result` as it is known.
  Returns the record."""
  cache = compilation_cache.enable(context.compilation_cache)
  shutil.rmtree(work, ignore_errors=True)
  experiment = experiment_of(spec, {**overrides, "data.source.data_dir": str(work / "tfds")})
  workdir = Workdir(str(work / "workdir"))
  steps = experiment.fit.num_train_steps
  result.put(experiment=spec, overrides=overrides, steps=steps)
  parts = {}  # wall seconds by part, in the order they ran
  start = time.monotonic()
  times = _train(experiment, workdir, result)
  parts["training_run"] = time.monotonic() - start
  result.put(train_seconds=parts["training_run"], steps_per_second=steps / parts["training_run"])
  if times is not None:
    parts.update(_split_of_training(times))
  result.put(**_speeds(workdir), wall_seconds_by_part=_parts(parts, start, context.started))
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
  return result.record


def _train(experiment, workdir: Workdir, result) -> dict | None:
  """Train; the library's split of the run's time (`RunTimes`) where this version of it keeps
  one (else None), put into `result` every PARTIAL_EVERY_SECONDS while it trains, so that a step
  stopped mid-run keeps it."""
  try:
    from transformer_jax.train.loop import RunTimes  # pylint: disable=import-outside-toplevel
  except ImportError:
    experiment_lib.train(experiment, workdir)
    return None
  times = RunTimes()
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
  }


def _parts(parts: dict, start: float, started: float) -> dict:
  """`parts` without the training run's total where its split is there, with `before` (the
  process's start and imports, up to the run) and `other` (what no part holds)."""
  shown = {k: v for k, v in parts.items() if k != "training_run" or "training" not in parts}
  shown = {"before": start - started, **shown} if started else shown
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


def _speeds(workdir: Workdir) -> dict:
  """Updates/s and target tokens/s of training over the logged intervals after the first (which
  holds compiling), from the run's TensorBoard scalars `train/tokens_per_s` and
  `train/s_per_step`, as its log reports them; {} where no such interval was logged."""
  scalars = read_scalars(
    pathlib.Path(workdir.tensorboard), ("train/tokens_per_s", "train/s_per_step")
  )
  rates, per_step = scalars["train/tokens_per_s"], scalars["train/s_per_step"]
  logged = sorted(set(rates) | set(per_step))
  tokens = seconds = updates = 0.0
  for previous, step in zip([0, *logged], logged):
    if step in rates and step in per_step:
      updates += step - previous
      seconds += per_step[step] * (step - previous)
      tokens += rates[step] * per_step[step] * (step - previous)
  if not seconds:
    return {}
  return {
    "updates_per_second": updates / seconds,
    "target_tokens_per_second": tokens / seconds,
    "speed_basis": f"{updates:.0f} updates in the logged intervals after the first, "
    f"{seconds:.1f} s",
  }


def read_scalars(directory: pathlib.Path, tags: tuple[str, ...]) -> dict:
  """{tag: {step: value}} of `tags` in the event files of `directory` as `train/events.py` writes
  them (TFRecords of `Event`s: wall_time, step, one scalar); a later file's value wins."""
  found = {tag: {} for tag in tags}
  for path in sorted(directory.glob("events.out.tfevents.*")):
    data, at = path.read_bytes(), 0
    while at + 12 <= len(data):
      (length,) = struct.unpack_from("<Q", data, at)
      if at + 12 + length + 4 > len(data):
        break  # A record cut short.
      step, tag, value = _scalar_event(data[at + 12 : at + 12 + length])
      if tag in found:
        found[tag][step] = value
      at += 12 + length + 4
  return found


def _varint(data: bytes, at: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = data[at]
    value |= (byte & 0x7F) << shift
    at, shift = at + 1, shift + 7
    if byte < 0x80:
      return value, at


def _fields(data: bytes):
  """(field number, value) of a protobuf message: ints, bytes, and float32/float64 as bytes."""
  at = 0
  while at < len(data):
    key, at = _varint(data, at)
    kind = key & 7
    if kind == 0:
      value, at = _varint(data, at)
    elif kind == 2:
      length, at = _varint(data, at)
      value, at = data[at : at + length], at + length
    else:
      size = 8 if kind == 1 else 4
      value, at = data[at : at + size], at + size
    yield key >> 3, value


def _scalar_event(data: bytes) -> tuple[int, str, float]:
  """(step, tag, value) of a serialized `Event` holding one scalar; tag '' for other events."""
  step, tag, value = 0, "", 0.0
  for number, field in _fields(data):
    if number == 2:
      step = field
    elif number == 5:  # Summary: value 1 { tag 1, simple_value 2 }.
      for _, summary_value in _fields(field):
        for inner, item in _fields(summary_value):
          if inner == 1:
            tag = item.decode()
          elif inner == 2:
            (value,) = struct.unpack("<f", item)
  return step, tag, value
