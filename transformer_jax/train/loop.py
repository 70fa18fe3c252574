"""The training loop of any model and loss (a `Trainer`'s): steps, checkpoints, evaluations,
preemption and runs of non-finite updates."""

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import schema
from transformer_jax.checkpoints import recovery
from transformer_jax.errors import FieldError, UserError
from transformer_jax.model.loss import add_sums
from transformer_jax.placement import COMPILE_AHEAD, host_cores
from transformer_jax.train.reporting import TrainLogger
from transformer_jax.train.run_times import RunTimes
from transformer_jax.train.step import Trainer, TrainState

log = logging.getLogger(__name__)


class PreemptionWatch:
  """Tells the loop to checkpoint and stop: on SIGTERM in a one-process run, or at the
  preemption sync point that JAX's distributed runtime sets when any host is preempted.

  Use as a context manager; the previous SIGTERM handler comes back on exit.
  If the process is still running `grace_seconds` after SIGTERM (a step,
  compilation, data read or save that does not end), it logs why and exits
  with status 143 (killed by SIGTERM) through `exit_fn`, without a checkpoint
  of the steps since the last one. `grace_seconds=0` waits indefinitely.
  """

  def __init__(self, manager, *, grace_seconds: float = 0.0, exit_fn=os._exit):
    self.manager = manager
    self.grace_seconds, self.exit_fn = grace_seconds, exit_fn
    self.signalled = False
    self._previous = None
    self._timer = None

  def __enter__(self):
    if jax.process_count() == 1:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    if self.signalled:
      return
    log.warning("SIGTERM: saving a checkpoint after this step, then stopping")
    self.signalled = True
    if self.grace_seconds > 0:
      self._timer = threading.Timer(self.grace_seconds, self._expire)
      self._timer.daemon = True
      self._timer.start()

  def _expire(self):
    log.error(
      "no checkpoint within %g s of SIGTERM (preemption_grace_seconds); "
      "exiting without one: the steps since the latest checkpoint in %s are lost",
      self.grace_seconds,
      self.manager.directory,
    )
    for handler in logging.getLogger().handlers:  # The line above, before the exit.
      handler.flush()
    self.exit_fn(128 + signal.SIGTERM)

  def __call__(self, step: int) -> bool:
    return self.signalled or self.manager.reached_preemption(step)

  def __exit__(self, *exc):
    if self._timer is not None:
      self._timer.cancel()
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class LostWorkdirError(UserError):
  """Another run took the work directory's lock over while this one was training."""


class NonFiniteError(UserError):
  """Too many updates in a row had a non-finite loss or gradient."""


@dataclasses.dataclass(frozen=True)
class FitSettings:
  """How `fit` runs (the experiment's `config.num_train_steps` ...); validated on construction
  (FieldError naming `fit.<field>`)."""

  num_train_steps: int = schema.setting(100_000, "the run stops at this step", ge=1)
  checkpoint_every_steps: int = schema.setting(
    1000, "also saved at the last step and on preemption", ge=1
  )
  keep_checkpoints: int = schema.setting(
    20, "the newest K checkpoints are kept, for averaging", ge=0, means={0: "keep all"}
  )
  final_checkpoint_every_steps: int = schema.setting(
    0,
    "in the run's last keep_checkpoints x N steps, checkpoints every N steps instead (the ones "
    "an average of the last checkpoints reads, as if saved every N steps throughout); "
    "checkpoint_every_steps before them may then be sparser: fewer saves, for resuming",
    ge=0,
    means={0: "off: checkpoint_every_steps to the end"},
  )
  log_every_steps: int = schema.setting(
    100, "a log line and TensorBoard scalars every N steps", ge=1
  )
  eval_every_steps: int = schema.setting(
    0, "validation loss and BLEU every N steps and after the last", ge=0, means={0: "never"}
  )
  max_consecutive_nonfinite_steps: int = schema.setting(
    10, "stop after this many skipped (non-finite) updates in a row", ge=1
  )
  compile_ahead: str = schema.setting(
    "accelerators",
    "the train step of every batch shape the data can produce, compiled before the first step "
    "on up to one thread per CPU core: always, never (each when its first batch comes), or on "
    "GPUs and TPUs only, whose hosts' cores are idle meanwhile",
    choices=COMPILE_AHEAD,
  )
  on_checkpoint_save_error: str = schema.setting(
    "stop",
    "a failed save stops the run, or training goes on and saves at the next checkpoint step",
    choices=("stop", "continue"),
  )

  def __post_init__(self):
    schema.check(self, "fit")
    if self.final_checkpoint_every_steps and not self.keep_checkpoints:
      raise FieldError(
        "fit",
        "final_checkpoint_every_steps",
        f"={self.final_checkpoint_every_steps} needs keep_checkpoints > 0: its stretch of the "
        "run is the last keep_checkpoints x final_checkpoint_every_steps steps",
      )

  def saves_at(self, step: int) -> bool:
    """Whether `fit` checkpoints after `step`, preemption aside: at the last step, and every
    `checkpoint_every_steps`, or every `final_checkpoint_every_steps` in the last
    `keep_checkpoints` times that many steps; so the checkpoints kept at the end are those that
    saving every `final_checkpoint_every_steps` throughout would keep."""
    last, final = self.num_train_steps, self.final_checkpoint_every_steps
    if step == last:
      return True
    if final and step > last - final * self.keep_checkpoints:
      return step % final == 0
    return step % self.checkpoint_every_steps == 0


@jax.jit
def _nonfinite_streak(streak, longest, nonfinite):
  """The current run of non-finite steps, and the longest since the last reset."""
  streak = jnp.where(nonfinite > 0, streak + 1, 0)
  return streak, jnp.maximum(longest, streak)


class _Interval:
  """The steps since the last log line: their metrics summed on the device, the run of
  non-finite updates, and when the interval started (the first one includes compilation)."""

  def __init__(self, start: float):
    self.sums, self.steps, self.start, self.compiling = None, 0, start, True
    self.streak = self.longest = jnp.zeros((), jnp.int32)

  def add(self, metrics) -> None:
    self.sums = metrics if self.sums is None else add_sums(self.sums, metrics)
    self.streak, self.longest = _nonfinite_streak(self.streak, self.longest, metrics["nonfinite"])
    self.steps += 1

  def report(self, logger: TrainLogger, step: int) -> int:
    """Log the interval ending at `step` and start the next; returns the longest run of
    non-finite updates in it."""
    fetched, longest = jax.device_get((self.sums, self.longest))
    now = time.perf_counter()
    logger.train(step, fetched, self.steps, now - self.start, compiling=self.compiling)
    self.sums, self.steps, self.start, self.compiling = None, 0, now, False
    self.longest = jnp.zeros((), jnp.int32)
    return int(longest)


def _next_batch(train_iter, step: int, trainer: Trainer, shapes: set) -> tuple[dict, str | None]:
  """The next batch, and its shapes described when they are new: then it is checked and announced
  (it compiles the step)."""
  try:
    batch = next(train_iter)
  except StopIteration:
    raise RuntimeError(f"the training data ran out at step {step}") from None
  keys = trainer.placement.spec.batch_keys
  shape = tuple(np.shape(batch[k]) if k in batch else None for k in keys)
  if shape in shapes:
    return batch, None
  trainer.check_batch(batch)
  shapes.add(shape)
  if shape in trainer.compiled_ahead:
    return batch, None
  named = {}
  for key, key_shape in zip(keys, shape):
    named.setdefault(key_shape, []).append(key)
  described = ", ".join(f"{s} ({', '.join(k)})" for s, k in named.items())
  described = str(shape[0]) if len(named) == 1 else described
  log.info("step %d: compiling the train step for batch shape %s", step + 1, described)
  return batch, described


def _compile_ahead(trainer: Trainer, batch_shapes, times: RunTimes) -> None:
  threads = min(len(batch_shapes), host_cores())
  log.info("compiling the train step for %d batch shapes on %d threads", len(batch_shapes), threads)
  start = time.perf_counter()
  with times.timing("compiling"):
    compiled = trainer.compile_ahead(batch_shapes, threads)  # Failures logged: steps compile.
  if compiled:
    times.record_compiled_ahead(compiled, time.perf_counter() - start, threads)


def _every(step: int, every: int, last: int) -> bool:
  return step % every == 0 or step == last


def fit(
  trainer: Trainer,
  state: TrainState,
  train_iter,
  settings: FitSettings,
  *,
  logger: TrainLogger,
  manager,
  stop_requested: Callable[[int], bool] = lambda step: False,
  evaluate=None,
  may_save: Callable[[], bool] = lambda: True,
  times: RunTimes | None = None,
  batch_shapes: Sequence[tuple[int, int]] = (),
) -> TrainState:
  """Run train steps from `state.step` to `settings.num_train_steps`, logging and checkpointing.

  `train_iter` yields this process's numpy batches and has Grain's
  checkpointable state, saved with every checkpoint. Metrics stay on the
  device, summed, and are fetched only at log steps. The first step of the
  run (which compiles) is reported on its own, and every new batch shape
  (which compiles again, unless compiled ahead) is announced. A checkpoint is written at the steps
  `settings.saves_at` names (every `checkpoint_every_steps`, the last), when
  `stop_requested(step)` (then the loop ends; it is also asked once before the
  first step), through `recovery.CheckpointWriter` (give `manager` no limit of its
  own). `evaluate(state)`, if given, returns `(split, sums)`; it runs every
  `eval_every_steps` steps and after the last step, and its time is left out
  of the training speed. Updates with a non-finite loss or gradient are
  skipped (`skip_nonfinite`); after `max_consecutive_nonfinite_steps` of them
  in a row, seen at the next log step, NonFiniteError is raised. Before each checkpoint,
  `may_save()` (every process calls it) says whether the work directory is still this run's;
  when it is not, LostWorkdirError is raised and nothing more is saved. `times` (a `RunTimes`,
  default a new one) gets each program's compile time, the first step's end and the phases.
  `batch_shapes`: the global `(rows, length)` of every batch `train_iter` can yield; as
  `settings.compile_ahead` says, their train steps are compiled before the first step.
  """
  last = settings.num_train_steps
  step = int(jax.device_get(state.step))
  start_step, start = step, time.perf_counter()
  interval, shapes = _Interval(start), set()
  writer = recovery.CheckpointWriter(
    manager, on_error=settings.on_checkpoint_save_error, keep=settings.keep_checkpoints
  )
  stop = step < last and stop_requested(step)
  if stop:
    log.warning("stopped before the first step of this run (step %d); nothing new to save", step)
  times = RunTimes() if times is None else times
  ahead = len(batch_shapes) > 0 and trainer.placement.should_compile_ahead(settings.compile_ahead)
  if step < last and not stop and ahead:
    _compile_ahead(trainer, batch_shapes, times)
  while step < last and not stop:
    with times.timing("waiting_for_data"):
      batch, new_shape = _next_batch(train_iter, step, trainer, shapes)
    # The call returns once the step is compiled and dispatched, before it has run.
    compiling = times.phases["compiling"]
    with times.timing("compiling") if new_shape else contextlib.nullcontext():
      state, metrics = trainer.train_step(state, batch)
    if new_shape:
      times.compiled(step + 1, new_shape, times.phases["compiling"] - compiling)
    step += 1
    interval.add(metrics)
    logger.advance()
    if interval.compiling or _every(step, settings.log_every_steps, last):
      first = interval.compiling  # The first interval is the first step alone.
      in_a_row = interval.report(logger, step)
      if first:
        times.first_step_ended()
      limit = settings.max_consecutive_nonfinite_steps
      if limit and in_a_row >= limit:
        writer.finish()
        raise NonFiniteError(
          f"{in_a_row} updates in a row, the last at step {step}, had a non-finite loss or "
          f"gradient and were skipped (the limit is max_consecutive_nonfinite_steps={limit}); "
          f"the latest checkpoint in {manager.directory} is step {manager.latest_step()}. "
          "Lower the learning rate, clip the gradients (grad_clip_norm) or check the training "
          "data"
        )
    stop = stop_requested(step)
    if stop or settings.saves_at(step):
      if not may_save():
        writer.finish()
        raise LostWorkdirError(
          f"the work directory's lock was taken over by another run (see the error above): this "
          f"run stopped at step {step} without saving it, so as not to write over that run's "
          f"checkpoints in {manager.directory}"
        )
      with times.timing("checkpointing", state):
        writer.save(step, state, train_iter)
    if (
      not stop
      and evaluate is not None
      and settings.eval_every_steps
      and _every(step, settings.eval_every_steps, last)
    ):
      evaluated = times.phases["evaluating"]
      with times.timing("evaluating", state):
        logger.evaluation(step, *evaluate(state))
      interval.start += times.phases["evaluating"] - evaluated
  with times.timing("checkpointing"):
    writer.finish()
  if stop and step > start_step:
    log.warning("stopped at step %d for preemption; checkpoint saved", step)
  seconds = time.perf_counter() - start
  times.phases = times.summary(seconds)
  unlogged = 0.0 if interval.sums is None else float(jax.device_get(interval.sums["tokens"]))
  times.steps, times.target_tokens = step - start_step, logger.tokens + unlogged
  logger.close(
    step,
    seconds=seconds,
    steps=step - start_step,
    checkpoints=f"{manager.directory} (latest {manager.latest_step()})",
    phases=times.phases,
  )
  return state
