"""./launch.sh's modes that run the lab tools beside the package (`tools/`) and the checkpoint
inspector reach their modules: each mode's --help comes from the module it names, run from the
checkout with nothing on PYTHONPATH. The set-up is not run: $TJ_VENV is a stand-in environment
whose python is this one and whose stamp matches pyproject.toml."""

import hashlib
import subprocess
import sys

import pytest

import helpers
from helpers import REPO

# mode -> the file whose flags its --help lists (absl) or its usage line (argparse).
MODES = {
  "bench": "tools/benchmark.py:",
  "kernels": "tools/kernel_row.py:",
  "inspect": "transformer_jax/cli/inspect_checkpoints.py:",
  "device-report": "tools/device_report/__main__.py:",
  "device-bundle": "usage: ./launch.sh device-bundle",
}


def _stand_in_venv(root, python: str):
  """A $TJ_VENV in `root` that ./launch.sh takes as set up for this pyproject.toml (so no set-up
  runs), whose python runs the shell command `python`."""
  (root / "bin").mkdir()
  (root / "bin" / "python").write_text(f"#!/bin/sh\n{python}\n")
  (root / "bin" / "python").chmod(0o755)
  stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
  (root / ".transformer_jax-installed").write_text(stamp + "\n")
  return root


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
  """A stand-in $TJ_VENV whose python is this one."""
  return _stand_in_venv(tmp_path_factory.mktemp("venv"), f'exec "{sys.executable}" "$@"')


def _launch(venv, *args) -> str:
  env = dict(helpers.environment(), TJ_VENV=str(venv), TJ_PYTHON=sys.executable, PYTHONPATH="")
  result = subprocess.run(
    [str(REPO / "launch.sh"), *args],
    cwd=venv,  # Elsewhere: launch.sh goes to the checkout itself.
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  output = result.stdout + result.stderr
  # absl's --help exits with status 1, argparse's with 0; a module that is not found says so.
  assert result.returncode in (0, 1) and "Traceback" not in output, output[-3000:]
  assert "setting up" not in output, output[-3000:]
  return output


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_each_tool_mode_runs_its_module(venv, mode):
  output = _launch(venv, mode, "--help")
  expected = MODES[mode]
  if expected.endswith(".py:"):
    expected = f"{REPO / expected}"
  assert expected in output, output[-3000:]


@pytest.mark.slow
def test_the_device_report_with_a_bundle_runs_without_the_virtual_environment(tmp_path):
  # With --bundle, $TJ_PYTHON (a GPU machine's own python3) runs it, here this Python; the
  # virtual environment's python would fail.
  venv = _stand_in_venv(tmp_path, "echo the virtual environment was used; exit 3")
  output = _launch(venv, "device-report", "--bundle=.device-bundle", "--help")
  assert f"{REPO / 'tools/device_report/__main__.py'}:" in output, output[-3000:]


def test_the_help_names_the_tools_modules():
  result = subprocess.run(
    [str(REPO / "launch.sh"), "help"], capture_output=True, text=True, timeout=60, check=True
  )
  for module in ("tools.benchmark", "tools.kernel_row", "transformer_jax.cli.inspect_checkpoints"):
    assert module in result.stdout, module
