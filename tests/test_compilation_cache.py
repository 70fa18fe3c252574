"""The persistent compilation cache: where it lives, which directories it refuses, and two runs
of the command line where the second loads what the first compiled."""

import logging
import os
import re
import stat

import jax
import pytest

import helpers
from transformer_jax import compilation_cache
from transformer_jax.errors import UserError


def test_the_directory_of_each_setting(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert compilation_cache.directory("") is None
  assert compilation_cache.directory("auto", {"XDG_CACHE_HOME": "/x"}) == "/x/transformer_jax/xla"
  home = os.path.expanduser("~")
  assert compilation_cache.directory("auto", {}) == f"{home}/.cache/transformer_jax/xla"
  assert compilation_cache.directory("c") == str(tmp_path / "c")
  assert compilation_cache.directory("~/c") == f"{home}/c"
  with pytest.raises(UserError, match="gs://b/c: the compilation cache must be a local directory"):
    compilation_cache.directory("gs://b/c")


def test_a_directory_others_can_write_to_is_unsafe(tmp_path, monkeypatch):
  path = tmp_path / "cache"
  path.mkdir(mode=0o700)
  assert compilation_cache.unsafe_reason(str(path)) is None
  for mode in (0o770, 0o707, 0o777):
    path.chmod(mode)
    assert "others can write to it" in compilation_cache.unsafe_reason(str(path)), oct(mode)
  path.chmod(0o755)
  assert compilation_cache.unsafe_reason(str(path)) is None
  monkeypatch.setattr(os, "getuid", lambda: os.stat(path).st_uid + 1)
  assert "belongs to another user" in compilation_cache.unsafe_reason(str(path))
  monkeypatch.undo()
  (tmp_path / "file").write_text("")
  assert compilation_cache.unsafe_reason(str(tmp_path / "file")) == "it is not a directory"


def test_the_summary_says_whether_the_cache_was_used():
  use = compilation_cache.CacheUse("/c")
  assert "no program went through it" in use.summary()
  for event in ("/jax/compilation_cache/compile_requests_use_cache",) * 2 + ("/other",):
    use.count(event)
  use.add_time("/jax/core/compile/backend_compile_duration", 1.5)
  use.add_time("/jax/core/compile/jaxpr_trace_duration", 0.25)
  use.add_time("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.5)
  use.add_time("/jax/other", 9.0)
  assert use.summary() == (
    "compilation cache /c: nothing loaded from it, 2 programs compiled; "
    "1.5 s compiling or loading, 0.8 s tracing and lowering"
  )
  use.count("/jax/compilation_cache/compile_requests_use_cache")
  use.count("/jax/compilation_cache/cache_hits")
  assert use.summary().startswith("compilation cache /c: 1 of 3 programs loaded from it;")


def _summary(run: helpers.Run) -> str:
  lines = [line for line in run.lines if "compilation cache" in line]
  assert len(lines) == 1, run.lines[-20:]
  return lines[0]


def _programs(run: helpers.Run) -> list[str]:
  """The train-step programs a run compiled or loaded: their batch shapes, from its log (each
  step's line, or the one line of those compiled ahead)."""
  ahead = re.search(r"before the first step, the train step for each of .*: (.*)", run.output)
  if ahead:
    return re.findall(r"\(\d+, \d+\)", ahead.group(1))
  return re.findall(r"the train step for batch shape (.*) took [\d.]+ s to compile", run.output)


@pytest.mark.slow
@pytest.mark.parametrize("compile_ahead", ["never", "always"])
def test_a_second_run_loads_every_train_step_the_first_compiled(shared, tmp_path, compile_ahead):
  """The default experiment's own batches (bucketed by length: a program per batch shape), on a
  tiny model, compiled as they come or all before the first step: the second run compiles none
  of them."""
  cache = tmp_path / "cache"
  runs = {}
  for name in ("first", "second"):
    runs[name] = helpers.Run(
      shared,
      tmp_path / name,
      num_train_steps=8,
      data__batch__mode="tokens",
      data__batch__tokens=512,
      compilation_cache_dir=cache,
      compile_ahead=compile_ahead,
    )
    assert runs[name].finish() == 0, runs[name].lines[-20:]
    if name == "first":
      assert re.search(r"nothing loaded from it, \d+ programs compiled", _summary(runs[name]))
      assert stat.S_IMODE(cache.stat().st_mode) == 0o700
      written = sorted(cache.glob("*-cache"))
      assert any(path.name.startswith("jit_train_step") for path in written), written
  shapes = _programs(runs["first"])
  assert len(shapes) >= 2 and _programs(runs["second"]) == shapes, shapes
  for run in runs.values():
    assert ("before the first step" in run.output) == (compile_ahead == "always")
  loaded, total = map(
    int, re.search(r"(\d+) of (\d+) programs loaded", _summary(runs["second"])).groups()
  )
  assert loaded == total, _summary(runs["second"])
  assert sorted(cache.glob("*-cache")) == written  # Nothing new to compile.


@pytest.mark.slow
def test_an_unsafe_setting_runs_uncached(shared, tmp_path):
  cache = tmp_path / "cache"
  cache.mkdir()
  cache.chmod(0o777)
  # Programs of a model no other test compiles, and $JAX_COMPILATION_CACHE_DIR set (as every run
  # of the tests has it): neither directory may get them.
  elsewhere = shared / "jax_cache"
  before = set(elsewhere.iterdir()) if elsewhere.exists() else set()
  run = helpers.Run(
    shared, tmp_path / "run", num_train_steps=1, model__d_model=24, compilation_cache_dir=cache
  )
  assert run.finish() == 0, run.lines[-20:]
  expected = f"not using the compilation cache {cache}: others can write to it"
  assert any(expected in line for line in run.lines), run.lines[-20:]
  assert not list(cache.iterdir())
  assert (set(elsewhere.iterdir()) if elsewhere.exists() else set()) == before


def test_an_empty_setting_turns_off_even_the_cache_the_environment_names(tmp_path, caplog):
  """The path the unsafe setting above takes through the command line, from `enable` on."""
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))  # As $JAX_COMPILATION_CACHE_DIR.
  try:
    with caplog.at_level(logging.INFO):
      assert compilation_cache.enable("") is None
    assert jax.config.jax_compilation_cache_dir is None
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
  assert "compilation cache off (config.compilation_cache_dir is empty)" in caplog.text
