"""The library leaves the process as it found it: importing its modules, compiling for a target,
reading a checkpoint and building and reading a data pipeline change neither fsspec's
configuration, nor asyncio's event loop policy, nor the environment, nor absl's flags. What a
caller sets itself instead: docs/library.md#what-your-program-sets.

The process itself is under test, so each test runs in a fresh one and prints what it saw.
"""

import json
import subprocess
import sys

import pytest

from helpers import REPO, environment
from transformer_jax.compile import targets

# What a library could change of the process around it, as JSON. It also counts the calls that
# set an event loop policy from here on, a change that putting the old policy back would hide.
_STATE = """
import asyncio, json, os
from absl import flags

_policy_sets = []
for _module in (asyncio, asyncio.events):
  _set = _module.set_event_loop_policy
  _module.set_event_loop_policy = lambda policy, _set=_set: (_policy_sets.append(1), _set(policy))


def state():
  try:
    import fsspec
    conf = json.loads(json.dumps(fsspec.config.conf, default=repr))
  except ImportError:
    conf = None
  policy = getattr(asyncio.events, "_event_loop_policy", None)  # Made lazily, or set.
  return {
    "fsspec.config.conf": conf,
    "event loop policy": None if policy is None else type(policy).__qualname__,
    "event loop policies set": len(_policy_sets),
    "os.environ": dict(os.environ),
    "absl flags parsed": flags.FLAGS.is_parsed(),
    "absl flags present": sorted(name for name in flags.FLAGS if flags.FLAGS[name].present),
  }
"""


def _run(script: str, *args, tmp_path=None, stdin="", timeout=300, **env) -> dict:
  """The last line of stdout of `script` (after _STATE), run in a fresh process (with `env` added
  to the tests' environment), as JSON."""
  code = _STATE + script
  if tmp_path is None:
    command = ["-c", code]
  else:  # An importable main file, for Grain's spawned worker processes.
    (tmp_path / "script.py").write_text(code)
    command = [str(tmp_path / "script.py")]
  result = subprocess.run(
    [sys.executable, *command, *map(str, args)],
    cwd=REPO,
    env=dict(environment(), **env),
    input=stdin,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


# Every module of the package, but a command line whose flags clash with another's (each runs in
# a process of its own) and one that needs an extra that is not installed.
_IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import transformer_jax

imported, clashing, lacking = [], [], []
for module in pkgutil.walk_packages(transformer_jax.__path__, "transformer_jax."):
  try:
    importlib.import_module(module.name)
    imported.append(module.name)
  except flags.DuplicateFlagError:
    clashing.append(module.name)
  except ModuleNotFoundError as error:
    if (error.name or "").startswith("transformer_jax"):
      raise
    lacking.append(module.name)
others = [name for name in sys.modules if name.split(".")[0] not in ("transformer_jax", "__main__")]
print(json.dumps({"state": state(), "imported": imported, "clashing": clashing, "others": others}))
"""

# The modules the package loaded (their names on stdin), alone, in the order it loaded them.
_IMPORT_THIRD_PARTY = """
import importlib, sys
for name in sys.stdin.read().split():
  try:
    importlib.import_module(name)
  except Exception:  # A module that loads only as part of another; its package is imported.
    pass
print(json.dumps({"state": state()}))
"""


def test_importing_every_module_changes_nothing_that_its_third_party_imports_do_not():
  package = _run(_IMPORT_EVERY_MODULE)
  assert len(package["imported"]) > 70
  command_lines = ("transformer_jax.pretrained.__main__",)
  assert all(name.startswith(command_lines) for name in package["clashing"]), package["clashing"]
  alone = _run(_IMPORT_THIRD_PARTY, stdin="\n".join(package["others"]))
  assert package["state"] == alone["state"]


_COMPILE = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from transformer_jax.compile import targets

before = state()
devices = targets.compile_devices(targets.parse_target(sys.argv[1]))
sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
rows = jax.ShapeDtypeStruct((8 * len(devices), 128), jnp.float32, sharding=sharding)
jax.jit(lambda x: (x @ x.T).sum()).trace(rows).lower().compile()
print(json.dumps({"before": before, "after": state()}))
"""


def _compile_target() -> str | None:
  if targets.installed("libtpu"):
    return "v5e-8"
  if any(targets.installed(module) for module in targets.CUDA_PLUGINS):
    return "8xh100"
  return None


@pytest.mark.slow
@pytest.mark.skipif(_compile_target() is None, reason="needs the tpu or the cuda extra")
def test_a_compile_for_a_target_puts_the_environment_back():
  # A value the caller set is the compiler's, and stays.
  seen = _run(_COMPILE, _compile_target(), TF_CPP_MIN_LOG_LEVEL="2")
  assert seen["after"] == seen["before"]
  assert seen["after"]["os.environ"]["TF_CPP_MIN_LOG_LEVEL"] == "2"
  assert "TPU_WORKER_HOSTNAMES" not in seen["after"]["os.environ"]


_READ_CHECKPOINTS = """
import pathlib, sys
import jax, numpy as np
from transformer_jax.checkpoints import store

device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
state0 = {"params": {"w": np.arange(4096, dtype=np.float32)}, "step": np.array(3, np.int32)}
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), state0)
manager = store.make_manager(sys.argv[1])
for step in (1, 2):
  store.save(manager, step, jax.device_put(state0, device))
manager.wait_until_finished()
before = state()
restored = store.restore(manager, abstract, step=1)
assert (np.asarray(restored["params"]["w"]) == state0["params"]["w"]).all()
largest = max((p for p in pathlib.Path(sys.argv[1], "2").rglob("*") if p.is_file()),
              key=lambda p: p.stat().st_size)
largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
try:
  store.restore(manager, abstract, step=2)
  raise AssertionError("a truncated checkpoint was read")
except store.CorruptCheckpointError:
  pass
print(json.dumps({"before": before, "after": state()}))
"""


def test_reading_a_checkpoint_good_or_broken_sets_no_event_loop_policy(tmp_path):
  seen = _run(_READ_CHECKPOINTS, tmp_path / "checkpoints")
  assert seen["after"] == seen["before"]
  assert seen["after"]["event loop policies set"] == 0


_READ_DATA = """
import dataclasses, pathlib, sys
from transformer_jax import data
from transformer_jax.errors import FieldError


class WordIds:  # "7 7 7" -> [7, 7, 7]
  path = None
  digest = "word-ids"

  def encode_batch(self, texts):
    return [[int(w) for w in text.split()] for text in texts]

  encode_target_batch = encode_batch


def main(root):
  for split, pairs in (("train", 60), ("dev", 5)):
    for side, repeat in (("xx", 3), ("yy", 4)):
      lines = "".join(f"{i + 3} " * repeat + "\\n" for i in range(pairs))
      (root / f"{split}.{side}").write_text(lines)
  config = data.DataConfig(
    source=data.SourceSettings(
      name="text", source_lang="xx", target_lang="yy", text_train=str(root / "train"),
      text_validation=str(root / "dev"), data_dir=str(root / "tfds")),
    batch=data.BatchSettings(multiple=2, tokens=512, window=32))
  make = lambda c: data.make_train_loader(c, WordIds(), seed=0, shard_index=0, shard_count=1)
  before = state()
  batches = iter(make(config))
  for _ in range(3):
    next(batches)
  batches.close()
  after_read = state()
  try:
    batches = iter(make(dataclasses.replace(
      config, batch=dataclasses.replace(config.batch, num_workers=1))))
    next(batches)
    batches.close()
    refused = None
  except FieldError as error:
    refused = str(error)
  print(json.dumps({"before": before, "after read": after_read, "after": state(),
                    "refused": refused}))


if __name__ == "__main__":  # Not in Grain's worker processes.
  main(pathlib.Path(sys.argv[1]))
"""


def test_a_data_pipeline_built_and_read_leaves_absl_flags_unparsed(tmp_path):
  """Grain's worker processes need absl's flags parsed; the library asks its caller to parse
  them rather than marking them parsed for the rest of the process."""
  seen = _run(_READ_DATA, tmp_path, tmp_path=tmp_path)
  assert seen["after read"] == seen["before"]
  assert seen["after"] == seen["before"] and not seen["after"]["absl flags parsed"]
  assert seen["refused"] is not None, "workers started with absl's flags unparsed"
  assert seen["refused"].startswith("data.batch.num_workers=1 starts Grain worker processes")
  assert "absl.flags.FLAGS.mark_as_parsed()" in seen["refused"]
