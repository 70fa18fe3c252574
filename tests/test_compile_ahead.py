"""The train step of every batch shape compiled before the first step, on several threads
(`FitSettings.compile_ahead`, `Trainer.compile_ahead`): the steps then compile nothing and train
exactly as the steps that compile their own programs."""

import logging

import jax
import numpy as np
import pytest

import helpers
from transformer_jax.placement import Placement
from transformer_jax.train import loop, run_times

BATCHES = [(0, 8, 12), (1, 8, 16), (2, 8, 16)]  # (seed, rows, length): two shapes, one twice.
SHAPES = [(8, 12), (8, 16), (16, 12)]  # The global batches' (rows, length); the last never comes.


def _fit(tmp_path, compile_ahead: str, trainer=None):
  """`(final state, RunTimes, train-step compilations jax logged)` of a run over BATCHES."""
  times = run_times.RunTimes()
  with helpers.compilations("train_step") as compiles:
    state = helpers.fit_batches(
      trainer or helpers.make_trainer(),
      [helpers.synthetic_batch(seed, rows, length) for seed, rows, length in BATCHES],
      tmp_path,
      times=times,
      batch_shapes=SHAPES,
      compile_ahead=compile_ahead,
      checkpoint_every_steps=100,
    )
  return state, times, compiles


@pytest.mark.slow
def test_every_shape_compiled_ahead_and_no_step_compiles_again(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="transformer_jax.train"):
    ahead, times, compiles = _fit(tmp_path / "ahead", "always")
  # One compilation per shape, the one that never comes included, and none at the steps.
  assert len(compiles) == len(SHAPES)
  assert [(p["step"], p["shape"]) for p in times.programs] == [
    (None, "(8, 12)"),
    (None, "(8, 16)"),
    (None, "(16, 12)"),
  ]
  assert all(p["seconds"] > 0 for p in times.programs)
  assert times.phases["compiling"] >= max(p["seconds"] for p in times.programs)
  assert times.first_step > times.phases["compiling"]
  assert "before the first step, the train step for each of 3 batch shapes took" in caplog.text
  assert "compiling the train step for batch shape" not in caplog.text  # No step announces one.
  # The same programs as those the steps compile themselves: the same state, bit for bit.
  lazy, lazy_times, lazy_compiles = _fit(tmp_path / "lazy", "never")
  assert len(lazy_compiles) == 2 and [p["step"] for p in lazy_times.programs] == [1, 2]
  for a, b in zip(jax.tree.leaves(ahead), jax.tree.leaves(lazy), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_batch_split_over_devices_finds_its_programs_compiled_ahead(tmp_path):
  trainer = helpers.make_trainer({"data": 4}, devices=jax.devices()[:4])
  _, times, compiles = _fit(tmp_path, "always", trainer)
  assert len(compiles) == len(SHAPES) and [p["step"] for p in times.programs] == [None] * 3


@pytest.mark.slow
def test_each_process_keys_its_programs_by_its_own_rows(monkeypatch):
  trainer = helpers.make_trainer()
  monkeypatch.setattr(trainer.placement, "data_shard", (1, 2))  # The second of two processes.
  (compiled,) = trainer.compile_ahead([(16, 12)], threads=1)
  assert compiled[0] == (8, 12) and compiled[1] > 0
  assert list(trainer.compiled_ahead) == [((8, 12),) * len(trainer.placement.spec.batch_keys)]


@pytest.mark.slow
def test_a_failure_to_compile_ahead_leaves_each_step_to_compile_its_own(tmp_path, caplog):
  trainer = helpers.make_trainer()

  def fail(rows, length):  # The train step's lowering for the first shape fails.
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while lowering\nmore lines")

  trainer.placement.abstract_batch = fail
  with caplog.at_level(logging.WARNING):
    _, times, compiles = _fit(tmp_path, "always", trainer)
  assert [p["step"] for p in times.programs] == [1, 2] and len(compiles) == 2
  assert (
    "lowering a program to compile ahead failed (RuntimeError: RESOURCE_EXHAUSTED: out of memory "
    f"while lowering): it and the {len(SHAPES) - 1} after it compile at their first calls"
    in caplog.text
  )


@pytest.mark.slow
def test_accelerators_only_leaves_a_cpu_run_to_compile_each_shape_when_it_comes(tmp_path):
  _, times, compiles = _fit(tmp_path, "accelerators")
  assert [p["step"] for p in times.programs] == [1, 2] and len(compiles) == 2


def test_compile_ahead_names_its_choices():
  with pytest.raises(ValueError, match="compile_ahead"):
    loop.FitSettings(compile_ahead="sometimes")


class _FailingCompile:
  """A lowered program whose compile fails, as XLA's may when several autotune at once."""

  def compile(self):
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")


def _placement():
  return Placement.data_parallel(helpers.tiny_model_config(), jax.devices()[:1])


def test_programs_compiled_ahead_keep_the_callers_contexts():
  matmul, x = jax.jit(lambda a: a @ a), jax.numpy.ones((4, 4))
  with jax.default_matmul_precision("highest"):  # Thread-local: the caller's alone.
    ((program, seconds),) = _placement().compile_ahead([lambda: matmul.lower(x)], threads=2)
  assert "operand_precision={highest,highest}" in program.as_text() and seconds > 0
  np.testing.assert_array_equal(np.asarray(program(x)), np.full((4, 4), 4.0))


def test_a_program_that_fails_to_compile_ahead_leaves_the_others(caplog):
  double, x = jax.jit(lambda a: 2 * a), jax.numpy.ones(3)
  lowerings = [lambda: double.lower(x), _FailingCompile, lambda: double.lower(x[:2])]
  with caplog.at_level(logging.WARNING):
    (first, _), (failed, _), (last, _) = _placement().compile_ahead(lowerings, threads=2)
  assert failed is None and list(np.asarray(last(x[:2]))) == [2.0, 2.0] and first is not None
  assert "compiling a program ahead failed (RuntimeError: RESOURCE_EXHAUSTED" in caplog.text


def test_a_lowering_that_fails_leaves_it_and_the_programs_after_it_to_their_first_calls(caplog):
  def fail():
    raise TypeError("a bug in the program")

  double, x = jax.jit(lambda a: 2 * a), jax.numpy.ones(3)
  lowerings = [lambda: double.lower(x), fail, _FailingCompile]  # The last is never compiled.
  with caplog.at_level(logging.WARNING):
    (first, _), failed, after = _placement().compile_ahead(lowerings, threads=1)
  assert list(np.asarray(first(x))) == [2.0] * 3 and failed == after == (None, 0.0)
  assert (
    "lowering a program to compile ahead failed (TypeError: a bug in the program): it and the 1 "
    "after it compile at their first calls" in caplog.text
  )
  assert "compiling a program ahead failed" not in caplog.text
