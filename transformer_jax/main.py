"""Command line entry point: pick an experiment config, a work directory and a mode.

    python -m transformer_jax.main --mode=train \
        --config=experiments/wmt14.py:base --workdir=/path/to/workdir \
        --config.num_train_steps=1000 --config.mesh.fsdp=8

Modes: train (or resume), average (the last `config.average_last`
checkpoints into <workdir>/averaged), eval (decode `config.decode.split`,
print BLEU and perplexity, write them and the hypotheses under
<workdir>/eval), translate (lines of --input to lines of --output) and
compile (every program of the experiment compiled for --target, a TPU slice
or GPU machine, on this CPU: per-device memory, cost and fit, printed and
written to <workdir>/compile/<target>.json).
eval and translate read the parameters that --checkpoint names. Several
modes run one after another in one process: --mode=train,average,eval
(what ./launch.sh does).

`--config` is an `ml_collections` config file, optionally followed by
`:variant`; every field can be overridden with `--config.<field>=<value>`.
Unknown or invalid values stop the run before anything compiles.

A user's mistake (bad config, missing or bad data, unusable checkpoints) or
a run that must stop (non-finite losses, a failed checkpoint save), each a
`UserError`, ends with one error line and exit status 1, and so does a
mistake in the flags (`parse_flags`: a config file that is missing or has no
`get_config`, a variant it does not take, an unknown `--config.<field>`);
anything else is a bug and keeps its traceback. The config is logged at
`--verbosity=1` and written to <workdir>/config.txt by training.

On several processes (one per host), `jax.distributed.initialize()` connects
them first (see `--distributed`), and each process runs as the child of a
supervisor (`supervisor.py`). There a failed computation or collective (most
often: another process is gone) ends the process at once with a one-line
warning (its traceback at `--verbosity=1`), and the supervisor says in one
line which process went silent.
"""

import difflib
import functools
import json
import logging as std_logging
import os
import random
import re
import sys
import time

from absl import app, flags, logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
from ml_collections import config_flags

from transformer_jax import compilation_cache, hosts, supervisor
from transformer_jax import config as config_lib
from transformer_jax import experiment as experiment_lib
from transformer_jax.compile import experiment as compile_experiment
from transformer_jax.compile import table as compile_table
from transformer_jax.compile import targets as compile_targets
from transformer_jax.decode import files
from transformer_jax.errors import UserError
from transformer_jax.workdir import Workdir

_CONFIG = config_flags.DEFINE_config_file(
    "config", None,
    "Experiment config file, optionally with a variant: experiments/wmt14.py:big. "
    "Override any field with --config.<field>=<value>.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Work directory: checkpoints/, tensorboard/ and the tokenizer. A run with the same "
    "work directory resumes from its latest checkpoint.")
MODES = ("train", "average", "eval", "translate", "compile")
_MODE = flags.DEFINE_list(
    "mode", ["train"],
    "What to do: train (or resume); average the last config.average_last checkpoints; eval "
    "(BLEU and perplexity on config.decode.split); translate --input into --output; compile "
    "every program for --target. Several, comma-separated, run one after another in one "
    "process: train,average,eval (compile runs alone).")
_TARGET = flags.DEFINE_string(
    "target", None,
    f"compile: the TPU slice or GPU machine to compile for. TPUs: {compile_targets.TPU_EXAMPLES}; "
    f"GPUs: {compile_targets.GPU_EXAMPLES}.")
_FIND_LARGEST_BATCH = flags.DEFINE_bool(
    "find_largest_batch", False,
    "compile: also find the largest batch (data.tokens_per_batch, or data.batch_size for "
    "packed rows) whose train step fits the target (a few more compiles); done anyway when the "
    "configured batch does not fit.")

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest",
    "eval and translate: the parameters to use: latest, a step number, averaged (written by "
    "--mode=average) or best (the best validation BLEU of training).")
_INPUT = flags.DEFINE_string(
    "input", None, "translate: the file of sentences, one per line, UTF-8 (default or '-': stdin).")
_OUTPUT = flags.DEFINE_string(
    "output", None, "translate: where the translations go, one line per input line (default or "
                    "'-': stdout).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Call jax.distributed.initialize() before anything else. auto: when "
    "JAX_COORDINATOR_ADDRESS is set or SLURM runs more than one task; on: always "
    "(a TPU pod slice, or any launcher that jax.distributed detects); off: never.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "host:port of process 0, for jax.distributed.initialize (default: from the cluster "
    "environment).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Number of processes, for jax.distributed.initialize.")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's index, for jax.distributed.initialize.")


@flags.validator("mode")
def _known_modes(modes: list[str]) -> bool:
  unknown = [mode for mode in modes if mode not in MODES] or ([] if modes else [""])
  if unknown:
    raise flags.ValidationError(f"{unknown[0]!r} is not a mode; --mode takes one or more of "
                                f"{', '.join(MODES)}, comma-separated")
  if "compile" in modes and len(modes) > 1:
    raise flags.ValidationError("--mode=compile runs alone")
  return True


def launched_on_several_processes(environ=os.environ) -> bool:
  """Whether the environment says several processes were started (coordinator or SLURM tasks)."""
  return bool(environ.get("JAX_COORDINATOR_ADDRESS")) or int(environ.get("SLURM_NTASKS", "1")) > 1


def distributed(mode: str) -> bool:
  """Whether this run connects several processes (`--distributed` `mode`: auto, on or off)."""
  explicit = _COORDINATOR.value is not None or _NUM_PROCESSES.value is not None
  return mode == "on" or (mode == "auto" and (explicit or launched_on_several_processes()))


def initialize_distributed(timeout_seconds: int) -> None:
  """Connect the processes of a multi-process run; one silent for `timeout_seconds` is lost."""
  jax.distributed.initialize(coordinator_address=_COORDINATOR.value,
                             num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                             heartbeat_timeout_seconds=timeout_seconds)
  logging.info("process %d of %d; %d local and %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


_QUIET_PACKAGES = ("orbax", "grain", "asyncio")
_QUIET_FILES = (os.path.join("jax", "_src", "xla_bridge.py"),)  # "Unable to initialize backend"


class _LibraryLogFilter(std_logging.Filter):
  """Drops INFO and below from Orbax and Grain, which log every checkpoint file they touch, and
  JAX's probe of backends that are not there.

  Below verbosity 1 it also drops the tracebacks that Orbax and asyncio attach
  to the errors of a failed background checkpoint write (their message
  stays); `recovery.CheckpointWriter` reports the failure itself.
  """

  def filter(self, record):
    quiet = (any(f"{os.sep}{package}{os.sep}" in record.pathname for package in _QUIET_PACKAGES)
             or record.pathname.endswith(_QUIET_FILES))
    if not quiet:
      return True
    if record.levelno < std_logging.WARNING:
      return False
    if logging.get_verbosity() < 1:
      record.exc_info, record.exc_text = None, None
    return True


def _unraisable_at_verbosity_1(unraisable) -> None:
  """Show the errors that Python can only report, not raise, at `--verbosity=1` only: here they
  come from the background reads of a broken checkpoint file, still completing after the read
  failed (and was reported) when the program ends."""
  if logging.get_verbosity() >= 1:
    sys.__unraisablehook__(unraisable)


def _config_arguments(argv: list[str]) -> tuple[str | None, list[str]]:
  """(the value of the last --config, the field paths of its --config.<path> overrides)."""
  spec, overrides = None, []
  for i, arg in enumerate(argv[1:], 1):
    if match := re.fullmatch(r"--?config(?:=(.*))?", arg, re.DOTALL):
      spec = match[1] if match[1] is not None else (argv[i + 1] if i + 1 < len(argv) else "")
    elif match := re.match(r"--?(?:no)?config\.([^=]*)", arg):
      overrides.append(match[1])
  return spec, overrides


def _field_paths(config, prefix: str = "") -> list[str]:
  """The dotted paths of every field and section of `config`."""
  paths = []
  for name, value in config.items():
    paths.append(prefix + name)
    if isinstance(value, ml_collections.ConfigDict):
      paths += _field_paths(value, f"{prefix}{name}.")
  return paths


def _check_override(config: ml_collections.ConfigDict, path: str) -> None:
  """UserError unless the override `--config.<path>` names a field of `config`; it names the
  closest known field."""
  parts, node = path.split("."), config
  for depth, part in enumerate(parts):
    holder = ".".join(["config", *parts[:depth]])
    if not isinstance(node, ml_collections.ConfigDict):
      raise UserError(f"--config.{path}: {holder} is a value, not a section of fields")
    if part not in node:
      known = _field_paths(config)
      close = (difflib.get_close_matches(path, known, n=1) or
               [p for p in known if p.rsplit(".", 1)[-1] in
                difflib.get_close_matches(parts[-1], [k.rsplit(".", 1)[-1] for k in known], 1)])
      hint = (f"did you mean --config.{close[0]}?" if close else
              f"its fields: {', '.join(node)}")
      raise UserError(f"--config.{path}: {holder} has no field {part!r}; {hint}")
    node = node[part]


def config_flag_problem(argv: list[str]) -> str | None:
  """What is wrong with `--config` and its overrides in `argv` (a missing or broken config file,
  a variant it does not take, an unknown field), or None."""
  spec, overrides = _config_arguments(argv)
  if spec is None:
    return None
  try:
    config = config_lib.load_file(spec)
    for path in overrides:
      _check_override(config, path)
  except UserError as error:
    return str(error)
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, where a mistake in the flags or the config file ends the program with
  one `error:` line (status 1) instead of what `ml_collections` raises (a traceback, or an
  object that fails later); the arguments left for `main`."""
  try:
    remaining = flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except  # ml_collections: KeyError, ...
    problem = config_flag_problem(argv)
    if problem is None and not isinstance(error, flags.Error):
      raise
    sys.exit(f"error: {problem or str(error).splitlines()[0]}")
  if not isinstance(_CONFIG.value, ml_collections.ConfigDict):  # A file that failed to load.
    sys.exit(f"error: {config_flag_problem(argv) or '--config gave no ConfigDict'}")
  return remaining


def compile_for_target(experiment: experiment_lib.Experiment, workdir: Workdir,
                       target_name: str | None, find_largest_batch: bool) -> None:
  """--mode=compile: the report of every program compiled for the target named on stdout and in
  <workdir>/compile/<target>.json; DoesNotFitError (exit 1) naming what does not fit."""
  if not target_name:
    raise UserError("--mode=compile needs --target (e.g. --target=v5e-8 or --target=8xh100)")
  target = compile_targets.parse_target(target_name)
  report = compile_experiment.compile_experiment(
      experiment, target, find_largest_batch=find_largest_batch).record()
  path = workdir.compile_report(target.name)
  files.write_json(path, report)
  print(compile_table.format_report(report))
  print(f"report: {path}")
  problem = compile_table.does_not_fit(report)
  if problem:
    raise compile_experiment.DoesNotFitError(problem)


def run(selected: list[str], experiment: experiment_lib.Experiment, workdir: Workdir,
        description: str) -> None:
  """Run the selected modes in order, with the compilation cache on
  (`compilation_cache_dir`), and log what the cache did; results meant for the user go to stdout
  (translations, or one summary line per mode). Training (whose config.txt is `description`)
  stopped before its last step (a preemption) ends the list there. A mode that fails ends the run
  without the cache's line."""
  cache = compilation_cache.enable(experiment.compilation_cache_dir)
  for index, mode in enumerate(selected):
    start = time.perf_counter()
    finished = run_mode(mode, experiment, workdir, description)
    logging.info("--mode=%s took %.1f s", mode, time.perf_counter() - start)
    if not finished and index + 1 < len(selected):
      logging.warning("training stopped before step %d: not running --mode=%s",
                      experiment.fit.num_train_steps, ",".join(selected[index + 1:]))
      break
  if cache is not None:  # An error ends the run with its own line, the last.
    logging.info("%s", cache.summary())


def run_mode(mode: str, experiment: experiment_lib.Experiment, workdir: Workdir,
             description: str) -> bool:
  """Run one mode (`--mode`); False when training stopped before its last step."""
  if mode == "train":
    state = experiment_lib.train(experiment, workdir, description=description)
    return int(jax.device_get(state.step)) >= experiment.fit.num_train_steps
  if mode == "average":
    result = experiment_lib.average(experiment, workdir)
    print(f"averaged steps {', '.join(map(str, result['steps']))} into {result['directory']}")
  elif mode == "eval":
    record = experiment_lib.evaluate_split(experiment, workdir,
                                           experiment_lib.Checkpoint.parse(_CHECKPOINT.value))
    print(f"{record['split']} BLEU {record['bleu']:.2f}" + (
        f" (tokenized {record['bleu_tokenized']:.2f})" if "bleu_tokenized" in record else "")
        + (f" (as is {record['bleu_as_is']:.2f})" if "bleu_as_is" in record else "")
        + f" | perplexity {record['perplexity']:.3f} | {record['checkpoint']} | "
        f"{record['sentences']} sentences, {record['sentences_per_second']:.1f}/s | "
        f"{record['hypotheses']}")
    logging.info("eval record: %s", json.dumps(record))
  elif mode == "translate":
    result = experiment_lib.translate_file(
        experiment, workdir, experiment_lib.Checkpoint.parse(_CHECKPOINT.value), _INPUT.value,
        _OUTPUT.value)
    logging.info("translated %d lines in %.1f s", result["lines"], result["seconds"])
  return True


def reports_user_errors(fn):
  """Wrap `fn` so that a UserError (config, data, checkpoints, a run that must stop) ends the
  program with `error: <message>` on stderr and status 1; any other exception propagates.

  The traceback of a UserError is logged at verbosity 1 (`--verbosity=1` shows it).
  """
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except UserError as error:
      logging.debug("traceback of the error below", exc_info=True)
      logging.flush()
      sys.exit(f"error: {config_lib.user_message(error)}")  # One line on stderr, status 1.
  return wrapped


def run_connected(experiment: experiment_lib.Experiment, workdir: Workdir,
                  description: str) -> None:
  """`run` in a process of a multi-process run: it beats (`hosts.Heartbeat`), and a failed
  computation or collective ends it with `supervisor.LOST_CONTACT_STATUS` for its supervisor to
  explain."""
  timeout_seconds = experiment.host_timeout_seconds
  initialize_distributed(timeout_seconds)  # Before anything touches the devices.
  workdir.create()
  run_id = int(multihost_utils.broadcast_one_to_all(np.int32(random.getrandbits(31))))
  record = hosts.own_record(process=jax.process_index(), processes=jax.process_count(),
                            supervisor=os.getppid(), run=run_id)
  with hosts.Heartbeat([workdir.heartbeat_file(jax.process_index())], record,
                       hosts.beat_interval(timeout_seconds)):
    try:
      run(_MODE.value, experiment, workdir, description)
    except jax.errors.JaxRuntimeError as error:
      logging.debug("traceback of the failure below", exc_info=True)
      logging.warning("a computation or collective failed: %s", str(error).splitlines()[0])
      logging.flush()
      os._exit(supervisor.LOST_CONTACT_STATUS)  # Without JAX's shutdown, which waits for all.


@reports_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.get_absl_handler().addFilter(_LibraryLogFilter())
  sys.unraisablehook = _unraisable_at_verbosity_1
  config = _CONFIG.value
  logging.debug("config %s:\n%s", config_flags.get_config_filename(flags.FLAGS["config"]), config)
  experiment = config_lib.parse(config)
  workdir = Workdir(_WORKDIR.value)
  if _MODE.value == ["compile"]:
    # The target's compiler runs beside the CPU backend, in one process for all its hosts; no
    # compilation cache (compile-only programs cannot be stored).
    jax.config.update("jax_platforms", "cpu")
    compile_for_target(experiment, workdir, _TARGET.value, _FIND_LARGEST_BATCH.value)
    return
  if not distributed(_DISTRIBUTED.value):
    run(_MODE.value, experiment, workdir, str(config))
  elif supervisor.SUPERVISED_ENV in os.environ:
    run_connected(experiment, workdir, str(config))
  else:
    sys.exit(supervisor.supervise(sys.argv, workdir, experiment.host_timeout_seconds))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=parse_flags)
