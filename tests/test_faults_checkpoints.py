"""Broken checkpoints and failed saves: detected, reported by name, skipped; good ones never harmed.

A tiny train state on one device is saved at steps 1, 2 and 3 (each with
distinct random values and a data position), then the files are damaged the
way interrupted writes, bad disks and careless hands damage them.
"""

import asyncio
import logging
import os
import pathlib
import re
import shutil
import types

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from helpers import fit_batches, make_trainer, python, synthetic_batch
from helpers import random_state as _state
from transformer_jax.checkpoints import reading, recovery, store
from transformer_jax.cli import inspect_checkpoints
from transformer_jax.train import loop


@pytest.fixture(scope="module")
def trainer():
  return make_trainer()


def _iterator():
  return iter(grain.MapDataset.range(1000).batch(4).to_iter_dataset())


@pytest.fixture
def saved(trainer, tmp_path):
  """The checkpoint directory with steps 1, 2, 3; after step s, the iterator yielded s batches."""
  manager = store.make_manager(str(tmp_path))
  data = _iterator()
  for step in (1, 2, 3):
    next(data)
    store.save(manager, step, _state(trainer, step), data)
  manager.close()
  return tmp_path


def _largest_file(directory: pathlib.Path) -> pathlib.Path:
  return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(path: pathlib.Path):
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_middle_byte(path: pathlib.Path):
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x5A
  path.write_bytes(bytes(data))


DAMAGE = {
  # An interrupted write: Orbax never renamed the temporary directory.
  "interrupted write": lambda step: step.rename(step.parent / "3.orbax-checkpoint-tmp-1712"),
  "truncated array data": lambda step: _truncate(_largest_file(step / "state")),
  # Silently read back as other numbers without the fingerprints.
  "altered array data": lambda step: _flip_middle_byte(
    _largest_file(step / "state" / "ocdbt.process_0")
  ),
  # Silently read back as another position without the fingerprints.
  "altered data position": lambda step: (step / "data" / "process_0-of-1.json").write_text(
    '{"next_index": 7}'
  ),
  "truncated metadata": lambda step: _truncate(step / "state" / "_METADATA"),
  "missing arrays": lambda step: shutil.rmtree(step / "state"),
  "empty step directory": lambda step: [
    shutil.rmtree(p) if p.is_dir() else p.unlink() for p in list(step.iterdir())
  ],
}


def _equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


# A failed read leaves none of Orbax's other reads of that step unfinished to end as "Exception
# ignored" noise (`reading.reads_that_finish`).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_broken_newest_checkpoint_is_reported_and_the_one_before_is_used(
  trainer, saved, damage, caplog
):
  DAMAGE[damage](saved / "3")
  manager = store.make_manager(str(saved))
  data = _iterator()
  with caplog.at_level(logging.WARNING):
    state = recovery.resume(manager, trainer.abstract_state, data)
  _equal(state, _state(trainer, 2))
  np.testing.assert_array_equal(next(data), [8, 9, 10, 11])  # The third batch.
  warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
  assert os.path.join(str(saved), "3") in warnings, warnings
  names = sorted(os.listdir(saved))
  if damage == "interrupted write":
    assert names == ["1", "2"]  # The leftover is removed.
  else:
    assert names[:2] == ["1", "2"] and names[2].startswith("3.unusable-"), names
    assert "resuming from step 2" in warnings
  assert manager.all_steps() == [1, 2]


class _OneFailsEarly:
  """An engine of Orbax's reads whose second read fails while the first is still pending."""

  async def execute_restore(self, requests):
    del requests
    self.slow = asyncio.ensure_future(asyncio.sleep(60))
    await asyncio.gather(self.slow, self._fail())

  async def _fail(self):
    raise OSError("truncated")


def test_a_failed_read_ends_the_reads_beside_it_before_orbax_closes_its_event_loop():
  handler = types.SimpleNamespace(_async_io_engine=_OneFailsEarly())
  engine = reading.reads_that_finish(handler)._async_io_engine
  loop = asyncio.new_event_loop()  # As Orbax runs a read: until it ends, then closed.
  try:
    with pytest.raises(OSError, match="truncated"):
      loop.run_until_complete(engine.execute_restore([]))
  finally:
    loop.close()
  assert engine.slow.cancelled()


@pytest.mark.parametrize("handler", [ocp.StandardCheckpointHandler, ocp.PyTreeCheckpointHandler])
def test_orbax_s_array_reads_are_where_reads_that_finish_looks(handler, caplog):
  with caplog.at_level(logging.WARNING):
    reading.reads_that_finish(handler())
  assert not caplog.records, caplog.text


def test_without_a_good_checkpoint_the_run_refuses_to_start_over_unless_asked(
  trainer, saved, caplog
):
  for step in ("1", "2", "3"):
    DAMAGE["altered array data"](saved / step)
  manager = store.make_manager(str(saved))
  with pytest.raises(
    recovery.UnusableCheckpointsError,
    match=r"none of the 3 checkpoints in .* \(steps 1, 2, 3\) can be restored.*"
    r"or start over \(start_over\)",
  ):
    recovery.resume(manager, trainer.abstract_state, _iterator())
  assert sorted(os.listdir(saved)) == ["1", "2", "3"]  # Left as they were.
  data = _iterator()
  with caplog.at_level(logging.WARNING):
    assert recovery.resume(manager, trainer.abstract_state, data, start_over=True) is None
  np.testing.assert_array_equal(next(data), [0, 1, 2, 3])  # From the start.
  assert manager.all_steps() == []
  assert all(".unusable-" in name for name in os.listdir(saved))
  assert "starting over from step 0" in caplog.text


def test_a_checkpoint_of_another_model_is_a_config_error_not_a_broken_file(saved):
  manager = store.make_manager(str(saved))
  with pytest.raises(
    store.CheckpointMismatchError,
    match=(r"embed/embedding: \(40, 32\) in the checkpoint, \(48, 32\) expected"),
  ):
    recovery.resume(manager, make_trainer(vocab_size=48).abstract_state, _iterator())
  assert sorted(os.listdir(saved)) == ["1", "2", "3"]


def test_only_interrupted_writes_means_a_fresh_start(trainer, tmp_path, caplog):
  (tmp_path / "2.orbax-checkpoint-tmp-99" / "state").mkdir(parents=True)
  with caplog.at_level(logging.WARNING):
    manager = store.make_manager(str(tmp_path))
    assert recovery.resume(manager, trainer.abstract_state) is None
  assert "2.orbax-checkpoint-tmp-99" in caplog.text and os.listdir(tmp_path) == []


def _break_directory(directory: pathlib.Path) -> pathlib.Path:
  """Move the checkpoints away and put a file where they were: every write there fails."""
  aside = directory.with_name(directory.name + "-aside")
  directory.rename(aside)
  directory.write_text("not a directory")
  return aside


def _mend_directory(directory: pathlib.Path, aside: pathlib.Path):
  directory.unlink()
  aside.rename(directory)


@pytest.mark.parametrize("on_error", ["stop", "continue"])
def test_a_failed_save_is_reported_and_leaves_the_good_checkpoints_intact(
  trainer, tmp_path, on_error, caplog
):
  directory = tmp_path / "checkpoints"
  manager = store.make_manager(str(directory))
  writer = recovery.CheckpointWriter(manager, on_error=on_error, keep=2)
  data = _iterator()
  for step in (1, 2):
    writer.save(step, _state(trainer, step), data)
  writer.finish()
  aside = _break_directory(directory)
  with caplog.at_level(logging.ERROR):
    if on_error == "stop":
      with pytest.raises(
        recovery.CheckpointSaveError,
        match=r"could not save the checkpoint of step 3 in .*checkpoints: .*"
        r"latest good checkpoint is step 2; stopping",
      ):
        writer.save(3, _state(trainer, 3), data)
        writer.finish()
    else:
      writer.save(3, _state(trainer, 3), data)
      writer.save(4, _state(trainer, 4), data)
      with pytest.raises(recovery.CheckpointSaveError, match="step 4 could not be written"):
        writer.finish()
      for step in (3, 4):
        assert f"could not save the checkpoint of step {step}" in caplog.text
  _mend_directory(directory, aside)
  assert sorted(os.listdir(directory)) == ["1", "2"]
  fresh = store.make_manager(str(directory))
  for step in (1, 2):
    _equal(store.restore(fresh, trainer.abstract_state, step=step), _state(trainer, step))
  if on_error == "continue":  # Saving works again once the disk does, keeping the last 2.
    manager.reload()
    writer.save(5, _state(trainer, 5), data)
    writer.finish()
    assert manager.all_steps() == [2, 5] and sorted(os.listdir(directory)) == ["2", "5"]


def test_a_run_that_may_no_longer_save_stops_at_its_checkpoint_without_saving(trainer, tmp_path):
  """`fit` asks `may_save()` before each checkpoint: the first answer saves step 2, the second
  (the lock taken over, in a real run) stops the run at step 4 with step 2 the latest."""
  answers = iter([True, False])
  with pytest.raises(
    loop.LostWorkdirError, match=r"this run stopped at step 4 without saving it.*checkpoints"
  ):
    fit_batches(
      trainer,
      [synthetic_batch(seed) for seed in range(6)],
      tmp_path,
      may_save=lambda: next(answers),
      checkpoint_every_steps=2,
      log_every_steps=2,
    )
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]


@pytest.mark.slow
def test_inspect_checkpoints_lists_the_steps_and_finds_the_broken_one(saved, tmp_path_factory):
  DAMAGE["altered array data"](saved / "3")
  (saved / "4.orbax-checkpoint-tmp").mkdir()
  lines, good = inspect_checkpoints.describe(str(saved), verify=True)
  assert not good and len(lines) == 4, lines
  for step in (1, 2):
    assert re.fullmatch(
      rf"step {step}: [\d.]+ MB, \d+ arrays \([\d,]+ parameters\), data "
      rf'position {{"next_index": {step}}}, verified',
      lines[step - 1],
    ), lines
  # The flipped byte lands in array data (read back as other numbers, caught by the
  # fingerprints) or in a chunk's framing (a read error), depending on the file's layout.
  assert re.fullmatch(
    r"step 3: [\d.]+ MB, .*UNUSABLE: (the arrays differ from those saved"
    r"|.*error while reading.*)",
    lines[2],
  ), lines
  assert lines[3] == "4.orbax-checkpoint-tmp: an interrupted write (the next run removes it)"
  # The command line: the same lines, and status 1.
  workdir = tmp_path_factory.mktemp("inspect")
  shutil.copytree(saved, workdir / "checkpoints")
  result = python(
    "-m", "transformer_jax.cli.inspect_checkpoints", f"--workdir={workdir}", "--verify"
  )
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stdout.splitlines() == lines
