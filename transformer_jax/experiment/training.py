"""`train(experiment, workdir)`: the experiment's data, model, checkpoints and validation, wired
to `fit`; each evaluation also scores validation BLEU and keeps the best parameters
(`train.validation`).
"""

import contextlib
import dataclasses
import logging
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax import data, fileio
from transformer_jax.checkpoints import integrity, recovery, store
from transformer_jax.decode import metrics
from transformer_jax.decode.translator import Translator
from transformer_jax.errors import first_line
from transformer_jax.experiment.settings import Experiment
from transformer_jax.hosts import liveness, workdir_lock
from transformer_jax.train import validation
from transformer_jax.train.loop import PreemptionWatch, fit
from transformer_jax.train.reporting import TrainLogger, measure_matmul_flops
from transformer_jax.train.run_times import RunTimes
from transformer_jax.train.step import Trainer, TrainState
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)


def make_trainer(experiment: Experiment, *, vocab_size: int, devices=None):
  """`(trainer, learning-rate schedule)` of `experiment` over `devices` (default: all), for a
  vocabulary of `vocab_size` tokens."""
  placement = experiment.placement(vocab_size=vocab_size, devices=devices)
  optimizer, schedule = experiment.optimizer.make(
    placement.model.config.d_model, experiment.fit.num_train_steps
  )
  trainer = Trainer(
    placement,
    optimizer,
    experiment.loss(),
    grad_accum_steps=experiment.grad_accum_steps,
    seed=experiment.seed,
  )
  return trainer, schedule


def train(
  experiment: Experiment, workdir: Workdir, *, description: str = "", times: RunTimes | None = None
) -> TrainState:
  """Train `experiment` in `workdir`, resuming from its latest checkpoint.

  Writes `checkpoints/` (Orbax), `tensorboard/`, `vocab/` and `config.txt`
  (`description`, default the experiment's settings) under `workdir`
  (`Workdir`). Each evaluation of a translation model also scores BLEU on the
  first `eval_bleu_sentences` sentences and keeps the best parameters in
  `best/` with `best.json`. Returns the final state. SIGTERM from here on stops the
  run at the next step boundary with a checkpoint (`PreemptionWatch`);
  broken checkpoints are skipped (`recovery.resume`). `times`, if given, is filled with where
  the run's time went (`RunTimes`: preparing data, setting up, each program's compiling, the
  first step, training, checkpointing, evaluating, waiting for data).
  """
  times = RunTimes() if times is None else times
  times.started = time.perf_counter()
  experiment.check_devices(jax.device_count())
  workdir.create()
  with _holding(workdir, experiment.host_timeout_seconds) as lock_kept:
    if jax.process_index() == 0:
      fileio.write_atomically(workdir.config_file, description or f"{experiment}\n")
    # No limit of its own: fit deletes old steps, safely (recovery.delete_steps).
    manager = store.make_manager(workdir.checkpoints)
    with PreemptionWatch(manager, grace_seconds=experiment.preemption_grace_seconds) as preemption:
      state = _train(experiment, workdir, manager, preemption, lock_kept, times)
    manager.close()
  return state


@contextlib.contextmanager
def _holding(workdir: Workdir, timeout_seconds: int):
  """Hold the work directory's lock (`WorkdirLock`, one per run: process 0 takes it for all) while
  in the block; every process raises when process 0 could not take it. Yields `lock_kept()`,
  which every process calls at the same points: whether the lock still names this run (process
  0's answer, for all)."""
  lock = workdir_lock.WorkdirLock(workdir, stale_after=timeout_seconds)
  record = liveness.own_record(processes=jax.process_count())
  refused = None
  if jax.process_index() == 0:
    try:
      taken_over = lock.acquire(record)
    except Exception as error:  # Whatever it is, the other processes must hear of it.
      refused = error
    else:
      if taken_over:
        log.warning("%s", taken_over)
  try:
    if jax.process_count() > 1:
      held = multihost_utils.broadcast_one_to_all(np.int32(refused is None))
      if not held and refused is None:
        refused = workdir_lock.WorkdirInUseError(
          f"process 0 could not take the lock {lock.path} of the work directory (see its error)"
        )
    if refused is not None:
      raise refused
    beating = (
      lock.heartbeat(record, liveness.beat_interval(timeout_seconds))
      if jax.process_index() == 0
      else contextlib.nullcontext()
    )
    with beating:

      def lock_kept() -> bool:
        kept = jax.process_index() != 0 or not beating.lost
        if jax.process_count() > 1:
          kept = bool(multihost_utils.broadcast_one_to_all(np.int32(kept)))
        return kept

      yield lock_kept
  finally:
    if jax.process_index() == 0 and refused is None:
      try:
        lock.release(record)
      except Exception as error:  # Not to replace what ended the run; the lock goes stale.
        log.warning("could not release the lock %s: %s", lock.path, first_line(error))


def _resume(experiment: Experiment, manager, trainer: Trainer, train_iter) -> TrainState | None:
  """`recovery.resume`, its errors saying which config fields to look at."""
  try:
    return recovery.resume(
      manager,
      trainer.abstract_state,
      train_iter,
      start_over=experiment.on_bad_checkpoints == "start_over",
    )
  except store.CheckpointMismatchError as error:
    raise store.CheckpointMismatchError(
      f"{error}. Was config.model, config.data.vocab.size (or the vocabulary file) or "
      "config.grad_clip_norm changed? Use the config it was trained with, or another "
      "--workdir"
    ) from None
  except recovery.UnusableCheckpointsError as error:
    raise recovery.UnusableCheckpointsError(
      f"{error}: --config.on_bad_checkpoints=start_over"
    ) from None


def _imported_start(manager, trainer: Trainer) -> TrainState | None:
  """When the only checkpoint is a params-only step 0 (an imported model, see
  `transformer_jax.pretrained`): a fresh state at step 0 with those parameters; else None."""
  manager.reload()
  if integrity.process_zero_steps(manager.all_steps()) != [0]:
    return None
  if not integrity.gather_codes(int(store.is_params_only(manager, 0)))[0]:  # Process 0's answer.
    return None
  params = store.restore_params(
    manager,
    trainer.abstract_state.params,
    step=0,
    hint=("Train the imported model with the config the import wrote (<workdir>/config.py)"),
  )
  return trainer.init().replace(params=params)


def _train(
  experiment: Experiment, workdir: Workdir, manager, preemption, lock_kept, times: RunTimes
) -> TrainState:
  start = time.perf_counter()
  tokenizer = data.get_tokenizer(experiment.data, workdir.vocab)
  if experiment.fit.eval_every_steps:  # A split that is not there stops the run now, not later.
    data.open_split(experiment.data, experiment.data.source.eval_split)
  times.preparing_data = time.perf_counter() - start
  trainer, schedule = make_trainer(experiment, vocab_size=tokenizer.vocab_size)
  placement = trainer.placement
  model_config = placement.model.config
  log.info(
    "model: %s, %s parameters; mesh %s; sharding rules %s",
    model_config,
    f"{experiment.count_params(placement):,}",
    dict(placement.mesh.shape),
    placement.rules,
  )
  shard_index, shard_count = placement.data_shard
  loading = time.perf_counter()
  train_iter = iter(
    data.make_train_loader(
      experiment.data,
      tokenizer,
      seed=experiment.seed,
      shard_index=shard_index,
      shard_count=shard_count,
    )
  )
  times.preparing_data += time.perf_counter() - loading
  state = _imported_start(manager, trainer)
  if state is not None:
    log.info("starting from the imported parameters of %s/0", manager.directory)
  else:
    state = _resume(experiment, manager, trainer, train_iter)
    if state is None:
      state = trainer.init()
    else:
      log.info("resumed from %s at step %d", manager.directory, int(state.step))
  peak = experiment.peak_flops_per_device or measure_matmul_flops(model_config.compute_dtype)
  log.info(
    "peak FLOP/s per device for MFU: %.3g (%s)",
    peak,
    "config.peak_flops_per_device"
    if experiment.peak_flops_per_device
    else "measured on a square matmul",
  )
  logger = TrainLogger(
    workdir.tensorboard,
    total_steps=experiment.fit.num_train_steps,
    start_step=int(state.step),
    learning_rate_fn=schedule,
    peak_flops=peak * jax.device_count(),
    peak_measured=not experiment.peak_flops_per_device,
  )
  times.setting_up = time.perf_counter() - times.started - times.preparing_data
  log.info(
    "set-up took %.1f s: the vocabulary and the data %.1f s; the rest (parameters or checkpoint, "
    "peak FLOP/s) %.1f s",
    times.preparing_data + times.setting_up,
    times.preparing_data,
    times.setting_up,
  )
  return fit(
    trainer,
    state,
    train_iter,
    experiment.fit,
    logger=logger,
    manager=manager,
    stop_requested=preemption,
    evaluate=_evaluator(experiment, workdir, placement, tokenizer),
    may_save=lock_kept,
    times=times,
    batch_shapes=data.train_batch_shapes(experiment.data, shard_count),
  )


def _evaluator(experiment: Experiment, workdir: Workdir, placement, tokenizer):
  """`evaluate(state) -> (split, sums)` for `fit`: loss sums on `data.source.eval_split` and, with
  `eval_bleu_sentences`, the BLEU of that many of its sentences (a translation model's)."""
  split = experiment.data.source.eval_split
  loss = metrics.TeacherForcedLoss(placement, experiment.loss())
  validation_bleu = None
  if not experiment.is_language_model:
    settings = dataclasses.replace(experiment.decode, beam_size=experiment.eval_bleu_beam_size)
    validation_bleu = validation.ValidationBleu(
      Translator(placement, tokenizer, settings),
      experiment.data,
      workdir,
      split=split,
      sentences=experiment.eval_bleu_sentences,
    )
  batches = []

  def evaluate(state):
    if not batches:  # The split is read at the first evaluation.
      shard_index, shard_count = placement.data_shard
      batches.extend(
        data.make_eval_batches(
          experiment.data,
          tokenizer,
          split,
          shard_index=shard_index,
          shard_count=shard_count,
          max_length=placement.model.config.max_len,
        )
      )
    sums = loss(state.params, batches)
    if validation_bleu is not None and experiment.eval_bleu_sentences:
      sums = {**sums, "bleu": validation_bleu(int(state.step), state.params)}
    return split, sums

  return evaluate
