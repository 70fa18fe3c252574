"""What the installed package holds: the wheel built from this pyproject.toml (offline, from a
copy of the checkout) carries the package alone, not the lab tools beside it (`tools/`: the
benchmarks, the PyTorch reference, the device report and its bundle, the makers of generated
docs), no pytest plugin, and no runtime requirement that only those tools need."""

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from helpers import REPO

# Module names (a part of a dotted name) of the tools beside the package.
TOOL_MODULES = re.compile(
  r"(^|\.)(tools|device_report|\w*benchmark|torch_reference|torch_training|reference_parameters|"
  r"training_curves|compare_training|sweep|pod_table|config_reference|kernel_row|pytest_log|"
  r"bundle)(\.|$)"
)
# What only the tools need.
TOOL_REQUIREMENTS = ("packaging", "torch", "matplotlib")
# What a checkout holds that could be picked up as packages.
COPIED = ("pyproject.toml", "README.md", "transformer_jax", "tools", "tests", "experiments")


def _requirement_name(requirement: str) -> str:
  return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
  """The wheel that `pip wheel` builds from a copy of the checkout, offline."""
  source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
  for name in COPIED:
    if (REPO / name).is_dir():
      shutil.copytree(
        REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
      )
    else:
      shutil.copy(REPO / name, source / name)
  command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
  command += ["--no-index", "--quiet", "--disable-pip-version-check", "-w", str(out), str(source)]
  subprocess.run(command, check=True, capture_output=True, timeout=300)
  (path,) = out.glob("transformer_jax-*.whl")
  return zipfile.ZipFile(path)


def _modules(wheel: zipfile.ZipFile) -> list[str]:
  return [
    name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    for name in wheel.namelist()
    if name.endswith(".py")
  ]


def test_the_wheel_holds_the_package_alone(wheel):
  modules = _modules(wheel)
  assert "transformer_jax.main" in modules and "transformer_jax.cli.inspect_checkpoints" in modules
  assert len(modules) > 70
  tops = {name.split("/")[0] for name in wheel.namelist()}
  assert tops == {"transformer_jax", "transformer_jax-0.1.0.dist-info"}, tops
  tools = [m for m in modules if TOOL_MODULES.search(m)]
  assert not tools, f"the lab tools belong in tools/, beside the package: {tools}"


def test_the_wheel_carries_no_pytest_plugin(wheel):
  for name in wheel.namelist():
    if name.endswith(".dist-info/entry_points.txt"):
      assert "[pytest11]" not in wheel.read(name).decode()
  hooks = [
    name
    for name in wheel.namelist()
    if name.endswith(".py") and re.search(r"^def pytest_\w+\(", wheel.read(name).decode(), re.M)
  ]
  assert not hooks, f"pytest hooks in the installed package: {hooks}"


def test_what_only_the_tools_need_is_no_runtime_requirement(wheel):
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  runtime = {_requirement_name(r) for r in project["dependencies"]}
  assert runtime.isdisjoint(TOOL_REQUIREMENTS), runtime & set(TOOL_REQUIREMENTS)
  (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
  requires = [
    line.removeprefix("Requires-Dist: ")
    for line in wheel.read(metadata).decode().splitlines()
    if line.startswith("Requires-Dist: ")
  ]
  unconditional = {_requirement_name(r) for r in requires if "extra ==" not in r}
  assert unconditional == runtime
  # The tools' own requirement comes with an extra that CI and ./launch.sh's set-up install.
  assert "packaging" in {_requirement_name(r) for r in project["optional-dependencies"]["test"]}


def test_the_guard_sees_a_tool_in_the_package():
  for name in (
    "transformer_jax.lab.step_benchmark",
    "transformer_jax.device_report.runner",
    "transformer_jax.cli.tools",
    "transformer_jax.sweep",
    "transformer_jax.experiment.data_benchmark",
    "transformer_jax.pod_table",
    "tools",
  ):
    assert TOOL_MODULES.search(name), name
  for name in ("transformer_jax.compile.kernels", "transformer_jax.decode.search"):
    assert not TOOL_MODULES.search(name), name
