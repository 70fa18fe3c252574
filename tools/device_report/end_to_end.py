"""Stage f, end to end: the default experiment (`experiments/default.py`, in bfloat16 on the
device) through train, average and eval, as `./launch.sh` runs it, in a fresh work directory and
data directory: each mode's wall time, training steps/s and the test BLEU."""

import shutil
import time

from tools.device_report.speed import experiment_of
from transformer_jax import experiment as experiment_lib
from transformer_jax.workdir import Workdir


def run(plan, step, result, context) -> None:
  del step
  spec, overrides = plan.end_to_end
  work = context.work / "end_to_end"
  shutil.rmtree(work, ignore_errors=True)
  experiment = experiment_of(spec, {**overrides, "data.source.data_dir": str(work / "tfds")})
  workdir = Workdir(str(work / "workdir"))
  result.put(experiment=spec, overrides=overrides, steps=experiment.fit.num_train_steps)
  start = time.perf_counter()
  experiment_lib.train(experiment, workdir)
  train_seconds = time.perf_counter() - start
  result.put(
    train_seconds=train_seconds, steps_per_second=experiment.fit.num_train_steps / train_seconds
  )
  averaged = time.perf_counter()
  steps = experiment_lib.average(experiment, workdir)["steps"]
  result.put(average_seconds=time.perf_counter() - averaged, averaged_steps=steps)
  evaluated = time.perf_counter()
  record = experiment_lib.evaluate_split(experiment, workdir, experiment_lib.Checkpoint("averaged"))
  result.put(
    eval_seconds=time.perf_counter() - evaluated,
    wall_seconds=time.perf_counter() - start,
    split=record["split"],
    bleu=record["bleu"],
    perplexity=record["perplexity"],
    sentences=record["sentences"],
    sentences_per_second=record["sentences_per_second"],
  )
