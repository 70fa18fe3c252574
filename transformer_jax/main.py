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
mistake in the flags (`cli.flag_errors`: a config file that is missing or has no
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

import functools
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax import config as config_lib
from transformer_jax import fileio, supervisor
from transformer_jax.cli import distributed, flag_errors, log_filter, modes
from transformer_jax.compile import targets as compile_targets
from transformer_jax.errors import UserError
from transformer_jax.workdir import Workdir

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "Experiment config file, optionally with a variant: experiments/wmt14.py:big. "
  "Override any field with --config.<field>=<value>.",
)
_WORKDIR = flags.DEFINE_string(
  "workdir",
  None,
  "Work directory: checkpoints/, tensorboard/ and the tokenizer. A run with the same "
  "work directory resumes from its latest checkpoint.",
)
_MODE = flags.DEFINE_list(
  "mode",
  ["train"],
  "What to do: train (or resume); average the last config.average_last checkpoints; eval "
  "(BLEU and perplexity on config.decode.split); translate --input into --output; compile "
  "every program for --target. Several, comma-separated, run one after another in one "
  "process: train,average,eval (compile runs alone).",
)
_TARGET = flags.DEFINE_string(
  "target",
  None,
  f"compile: the TPU slice or GPU machine to compile for. TPUs: {compile_targets.TPU_EXAMPLES}; "
  f"GPUs: {compile_targets.GPU_EXAMPLES}.",
)
_FIND_LARGEST_BATCH = flags.DEFINE_bool(
  "find_largest_batch",
  False,
  "compile: also find the largest batch (data.batch.tokens, or data.batch.size for "
  "packed rows) whose train step fits the target (a few more compiles); done anyway when the "
  "configured batch does not fit.",
)

_CHECKPOINT = flags.DEFINE_string(
  "checkpoint",
  "latest",
  "eval and translate: the parameters to use: latest, a step number, averaged (written by "
  "--mode=average) or best (the best validation BLEU of training).",
)
_INPUT = flags.DEFINE_string(
  "input", None, "translate: the file of sentences, one per line, UTF-8 (default or '-': stdin)."
)
_OUTPUT = flags.DEFINE_string(
  "output",
  None,
  "translate: where the translations go, one line per input line (default or '-': stdout).",
)
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  ["auto", "on", "off"],
  "Call jax.distributed.initialize() before anything else. auto: when "
  "JAX_COORDINATOR_ADDRESS is set or SLURM runs more than one task; on: always "
  "(a TPU pod slice, or any launcher that jax.distributed detects); off: never.",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "host:port of process 0, for jax.distributed.initialize (default: from the cluster environment).",
)
_NUM_PROCESSES = flags.DEFINE_integer(
  "num_processes", None, "Number of processes, for jax.distributed.initialize."
)
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "This process's index, for jax.distributed.initialize."
)


@flags.validator("mode")
def _known_modes(selected: list[str]) -> bool:
  unknown = [mode for mode in selected if mode not in modes.MODES] or ([] if selected else [""])
  if unknown:
    raise flags.ValidationError(
      f"{unknown[0]!r} is not a mode; --mode takes one or more of "
      f"{', '.join(modes.MODES)}, comma-separated"
    )
  if "compile" in selected and len(selected) > 1:
    raise flags.ValidationError("--mode=compile runs alone")
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


@reports_user_errors
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  log_filter.install()
  fileio.list_stores_afresh()  # A run reads what other processes write to its work directory.
  config = _CONFIG.value
  logging.debug("config %s:\n%s", config_flags.get_config_filename(flags.FLAGS["config"]), config)
  experiment = config_lib.parse(config)
  workdir = Workdir(_WORKDIR.value)
  if _MODE.value == ["compile"]:
    # The target's compiler runs beside the CPU backend, in one process for all its hosts; no
    # compilation cache (compile-only programs cannot be stored).
    jax.config.update("jax_platforms", "cpu")
    modes.compile_for_target(experiment, workdir, _TARGET.value, _FIND_LARGEST_BATCH.value)
    return
  request = modes.Request(_CHECKPOINT.value, _INPUT.value, _OUTPUT.value)
  coordination = distributed.Coordination(
    _DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value
  )
  if not coordination.wanted():
    modes.run(_MODE.value, experiment, workdir, str(config), request)
  elif supervisor.SUPERVISED_ENV in os.environ:
    modes.run_connected(_MODE.value, experiment, workdir, str(config), request, coordination)
  else:
    sys.exit(supervisor.supervise(sys.argv, workdir, experiment.host_timeout_seconds))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=flag_errors.parse_flags)
