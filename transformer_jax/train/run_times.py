"""Where a training run's wall time goes (`RunTimes`): data, set-up, each train-step program's
compiling, the first step, then training, checkpointing, evaluating and waiting for data."""

import contextlib
import dataclasses
import logging
import time

import jax

from transformer_jax.placement import compiled_ahead_line

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunTimes:
  """Where a training run's wall time went, in seconds: filled by `experiment.train` and `fit`
  (pass a new one to either, one per run, to read it afterwards).

  `preparing_data`: the vocabulary, the data's preparation and its loaders; `setting_up`: the
  parameters or the checkpoint, and the peak FLOP/s; `first_step`: from `started` (the run's
  start: `experiment.train` sets it, else it is when this was made) to the end of its first
  step, compiling included; `programs`: one per train-step program compiled (or loaded from the
  compilation cache), with its batch shape, its first step (None for one compiled ahead, before
  the first step) and its seconds; `phases`: `fit`'s time compiling, checkpointing, evaluating,
  waiting for the next batch (`waiting_for_data`, the first batch's start-up included; the device
  may have been running queued steps meanwhile, so it bounds from above the time the input
  pipeline left the device idle) and, the rest of it, training; `steps` and `target_tokens`: this
  run's steps and their non-padding target tokens.
  """

  preparing_data: float = 0.0
  setting_up: float = 0.0
  first_step: float | None = None
  programs: list[dict] = dataclasses.field(default_factory=list)
  phases: dict[str, float] = dataclasses.field(
    default_factory=lambda: {
      "compiling": 0.0,
      "checkpointing": 0.0,
      "evaluating": 0.0,
      "waiting_for_data": 0.0,
    }
  )
  steps: int = 0
  target_tokens: float = 0.0
  started: float = dataclasses.field(default_factory=time.perf_counter)

  @contextlib.contextmanager
  def timing(self, phase: str, state=None):
    """Add the block's time to `phase`; with `state`, after the steps queued up to it have run
    (they are training's time, not the phase's)."""
    if state is not None:
      jax.block_until_ready(state)
    start = time.perf_counter()
    try:
      yield
    finally:
      self.phases[phase] += time.perf_counter() - start

  def compiled(self, step: int, shape: str, seconds: float) -> None:
    self.programs.append({"step": step, "shape": shape, "seconds": seconds})
    log.info(
      "step %d: the train step for batch shape %s took %.1f s to compile (or to load, from a "
      "cache of compiled programs)",
      step,
      shape,
      seconds,
    )

  def record_compiled_ahead(self, compiled: list[tuple], wall: float, threads: int) -> None:
    """Programs compiled before the first step (`Trainer.compile_ahead`'s `(shape, seconds)`),
    `wall` seconds in all on `threads` threads: their `step` is None."""
    self.programs.extend({"step": None, "shape": str(s), "seconds": t} for s, t in compiled)
    log.info(
      "%s", compiled_ahead_line("before the first step, the train step", compiled, wall, threads)
    )

  def first_step_ended(self) -> None:
    self.first_step = time.perf_counter() - self.started
    log.info(
      "the first step ended %.1f s after the run's start (preparing data %.1f s, setting up "
      "%.1f s, waiting for the first batch %.1f s, compiling %.1f s)",
      self.first_step,
      self.preparing_data,
      self.setting_up,
      self.phases["waiting_for_data"],
      self.phases["compiling"],
    )

  def summary(self, total: float) -> dict:
    """`fit`'s phases, training being what the others leave of its `total` seconds."""
    rest = {k: v for k, v in self.phases.items() if k != "training"}
    return {"training": total - sum(rest.values()), **rest}

  def to_json(self) -> dict:
    return {k: v for k, v in dataclasses.asdict(self).items() if k != "started"}
