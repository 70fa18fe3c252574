"""The import direction of the package: model <- data <- (sharding, config) <- checkpoints, decode,
train <- main, tools. Each lower module is imported alone and must not load a higher one."""

import json
import subprocess
import sys

from helpers import REPO

# Module imported alone -> packages of the project it must not load.
NOT_ABOVE = {
    "transformer_jax.data": ("model", "sharding", "config", "checkpoints", "decode", "train",
                             "tools", "main"),
    "transformer_jax.model.transformer": ("data", "sharding", "config", "checkpoints", "decode",
                                          "train", "tools", "main"),
    "transformer_jax.model.loss": ("data", "sharding", "config", "checkpoints", "decode", "train"),
    "transformer_jax.sharding": ("data", "config", "checkpoints", "decode", "train", "tools"),
    "transformer_jax.config": ("checkpoints", "decode", "train", "tools", "main"),
    "transformer_jax.checkpoints.recovery": ("model", "data", "config", "decode", "train"),
    "transformer_jax.checkpoints.inspect": ("model", "data", "config", "decode", "train"),
    "transformer_jax.decode.modes": ("train", "tools", "main"),
    "transformer_jax.train.step": ("data", "decode", "tools", "main"),
    "transformer_jax.train.loop": ("data", "decode", "tools", "main"),
    "transformer_jax.train.run": ("tools", "main"),
}

_SCRIPT = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("transformer_jax.")),
                  "flax": "flax" in sys.modules}))
"""


def test_lower_modules_do_not_load_higher_ones():
  processes = {name: subprocess.Popen([sys.executable, "-c", _SCRIPT, name], cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in NOT_ABOVE}
  loaded = {}
  for name, process in processes.items():
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    loaded[name] = json.loads(out.splitlines()[-1])
  for name, forbidden in NOT_ABOVE.items():
    packages = {m.split(".")[1] for m in loaded[name]["modules"]}
    assert not packages & set(forbidden), (name, sorted(packages & set(forbidden)))
  # The data pipeline (and so Grain's worker processes) does not load Flax.
  assert not loaded["transformer_jax.data"]["flax"]
