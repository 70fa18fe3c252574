"""The modes of the command line (`--mode`), run one after another in one process."""

import dataclasses
import json
import os
import random
import time

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from transformer_jax import compilation_cache, fileio, supervisor
from transformer_jax import experiment as experiment_lib
from transformer_jax.cli.distributed import Coordination
from transformer_jax.compile import programs
from transformer_jax.compile import table as compile_table
from transformer_jax.compile import targets as compile_targets
from transformer_jax.errors import UserError
from transformer_jax.hosts import liveness
from transformer_jax.workdir import Workdir

MODES = ("train", "average", "eval", "translate", "compile")


@dataclasses.dataclass(frozen=True)
class Request:
  """What eval and translate are asked for: --checkpoint, --input and --output."""

  checkpoint: str = "latest"
  input: str | None = None
  output: str | None = None


def compile_for_target(
  experiment: experiment_lib.Experiment,
  workdir: Workdir,
  target_name: str | None,
  find_largest_batch: bool,
) -> None:
  """--mode=compile: the report of every program compiled for the target named on stdout and in
  <workdir>/compile/<target>.json; DoesNotFitError (exit 1) naming what does not fit."""
  if not target_name:
    raise UserError("--mode=compile needs --target (e.g. --target=v5e-8 or --target=8xh100)")
  target = compile_targets.parse_target(target_name)
  report = programs.compile_experiment(
    experiment, target, find_largest_batch=find_largest_batch
  ).record()
  path = workdir.compile_report(target.name)
  fileio.write_json(path, report)
  print(compile_table.format_report(report))
  print(f"report: {path}")
  problem = compile_table.does_not_fit(report)
  if problem:
    raise programs.DoesNotFitError(problem)


def run(
  selected: list[str],
  experiment: experiment_lib.Experiment,
  workdir: Workdir,
  description: str,
  request: Request = Request(),
) -> None:
  """Run the selected modes in order, with the compilation cache on
  (`compilation_cache_dir`), and log what the cache did; results meant for the user go to stdout
  (translations, or one summary line per mode). Training (whose config.txt is `description`)
  stopped before its last step (a preemption) ends the list there. A mode that fails ends the run
  without the cache's line."""
  cache = compilation_cache.enable(experiment.compilation_cache_dir)
  for index, mode in enumerate(selected):
    start = time.perf_counter()
    finished = run_mode(mode, experiment, workdir, description, request)
    logging.info("--mode=%s took %.1f s", mode, time.perf_counter() - start)
    if not finished and index + 1 < len(selected):
      logging.warning(
        "training stopped before step %d: not running --mode=%s",
        experiment.fit.num_train_steps,
        ",".join(selected[index + 1 :]),
      )
      break
  if cache is not None:  # An error ends the run with its own line, the last.
    logging.info("%s", cache.summary())


def run_mode(
  mode: str,
  experiment: experiment_lib.Experiment,
  workdir: Workdir,
  description: str,
  request: Request = Request(),
) -> bool:
  """Run one mode (`--mode`); False when training stopped before its last step."""
  if mode == "train":
    state = experiment_lib.train(experiment, workdir, description=description)
    return int(jax.device_get(state.step)) >= experiment.fit.num_train_steps
  if mode == "average":
    result = experiment_lib.average(experiment, workdir)
    print(f"averaged steps {', '.join(map(str, result['steps']))} into {result['directory']}")
  elif mode == "eval":
    record = experiment_lib.evaluate_split(
      experiment, workdir, experiment_lib.Checkpoint.parse(request.checkpoint)
    )
    if "bleu" not in record:  # A language model's.
      print(
        f"{record['split']} perplexity {record['perplexity']:.3f} | {record['checkpoint']} | "
        f"{record['tokens']} tokens | {record['record']}"
      )
    else:
      print(
        f"{record['split']} BLEU {record['bleu']:.2f}"
        + (f" (tokenized {record['bleu_tokenized']:.2f})" if "bleu_tokenized" in record else "")
        + (f" (as is {record['bleu_as_is']:.2f})" if "bleu_as_is" in record else "")
        + f" | perplexity {record['perplexity']:.3f} | {record['checkpoint']} | "
        f"{record['sentences']} sentences, {record['sentences_per_second']:.1f}/s | "
        f"{record['hypotheses']}"
      )
    logging.info("eval record: %s", json.dumps(record))
  elif mode == "translate":
    result = experiment_lib.translate_file(
      experiment,
      workdir,
      experiment_lib.Checkpoint.parse(request.checkpoint),
      request.input,
      request.output,
    )
    logging.info("translated %d lines in %.1f s", result["lines"], result["seconds"])
  return True


def run_connected(
  selected: list[str],
  experiment: experiment_lib.Experiment,
  workdir: Workdir,
  description: str,
  request: Request,
  coordination: Coordination,
) -> None:
  """`run` in a process of a multi-process run: it beats (`liveness.Heartbeat`), and a failed
  computation or collective ends it with `supervisor.LOST_CONTACT_STATUS` for its supervisor to
  explain."""
  timeout_seconds = experiment.host_timeout_seconds
  coordination.initialize(timeout_seconds)  # Before anything touches the devices.
  workdir.create()
  run_id = int(multihost_utils.broadcast_one_to_all(np.int32(random.getrandbits(31))))
  record = liveness.own_record(
    process=jax.process_index(), processes=jax.process_count(), supervisor=os.getppid(), run=run_id
  )
  with liveness.Heartbeat(
    [workdir.heartbeat_file(jax.process_index())], record, liveness.beat_interval(timeout_seconds)
  ):
    try:
      run(selected, experiment, workdir, description, request)
    except jax.errors.JaxRuntimeError as error:
      logging.debug("traceback of the failure below", exc_info=True)
      logging.warning("a computation or collective failed: %s", str(error).splitlines()[0])
      logging.flush()
      os._exit(supervisor.LOST_CONTACT_STATUS)  # Without JAX's shutdown, which waits for all.
