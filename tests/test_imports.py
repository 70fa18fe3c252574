"""The import direction of the package, read from every module's import statements:

  conventions, errors <- schema, workdir, fileio <- model <- data, hosts, compilation_cache
  <- sharding <- checkpoints, placement <- decode <- train, supervisor <- experiment
  <- pretrained, compile <- config <- cli <- main; a package's `__main__.py` (a command line)
  ranks with main.

A module may import the project's modules of its own package or of lower ones. The lab tools
beside the package (`tools/`: benchmarks, the PyTorch reference, the device report) may import
any of it, and nothing in the package imports them: they are not installed with it. Importing
the data pipeline alone does not load Flax (Grain's worker processes import it), and the
command line loads no PyTorch (installed with the `hf` extra).
"""

import ast
import json
import pathlib
import re

from helpers import REPO, python
from transformer_jax import data

RANKS = {
  "conventions": 0,
  "errors": 0,
  "schema": 1,
  "workdir": 2,
  "fileio": 1,
  "model": 2,
  "data": 3,
  "hosts": 3,
  "compilation_cache": 3,
  "sharding": 4,
  "checkpoints": 5,
  "placement": 5,
  "decode": 6,
  "train": 7,
  "supervisor": 7,
  "experiment": 8,
  "pretrained": 9,
  "compile": 9,
  "config": 10,
  "cli": 11,
  "main": 12,
}
PACKAGE = REPO / "transformer_jax"
TOOLS = REPO / "tools"


def _imported(path: pathlib.Path) -> set[str]:
  """The top-level packages of transformer_jax that the module at `path` imports."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    names = []
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    found |= {
      name.split(".")[1]
      for name in names
      if name.startswith("transformer_jax.") and name.split(".")[1] in RANKS
    }
  return found


def _imports_tools(path: pathlib.Path) -> bool:
  """Whether the module at `path` imports the top-level `tools` package or a module of it."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [node.module]
    else:
      continue
    if any(name.split(".")[0] == "tools" for name in names):
      return True
  return False


def test_every_module_imports_only_its_own_package_or_lower_ones():
  modules = sorted(
    p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE
  )  # The root __init__ loads the model lazily.
  assert len(modules) > 30
  for path in modules:
    package = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    if path.name == "__main__.py":
      package = max("main", package, key=RANKS.get)
    for other in _imported(path) - {package}:
      assert RANKS[other] < RANKS[package], f"{path.relative_to(REPO)} imports {other}"


# The application layer: command lines, config files and flags. The rest of the package is
# libraries that take typed settings.
APPLICATION = ("main.py", "cli/", "config.py", "pretrained/__main__.py")
# The one line below it that names a command-line library: Grain's settings are absl flags.
GRAIN_FLAGS = "from absl import flags  # Grain reads its settings from these flags."


def _application(path: pathlib.Path) -> bool:
  return path.relative_to(PACKAGE).as_posix().startswith(APPLICATION)


def test_below_the_application_layer_nothing_knows_flags_or_config_files():
  libraries = [p for p in PACKAGE.rglob("*.py") if not _application(p)]
  assert len(libraries) > 50
  names = {
    "transformer_jax." + p.relative_to(PACKAGE).as_posix().removesuffix(".py").replace("/", ".")
    for p in PACKAGE.rglob("*.py")
    if _application(p)
  }
  for path in libraries:
    text = path.read_text()
    for line in text.splitlines():
      if re.search(r"ml_collections|ConfigDict|absl", line):
        assert line == GRAIN_FLAGS, f"{path.relative_to(REPO)}: {line}"
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, ast.ImportFrom) and node.module:
        imported = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
      elif isinstance(node, ast.Import):
        imported = {alias.name for alias in node.names}
      else:
        continue
      assert not imported & names, f"{path.relative_to(REPO)} imports the application layer"


def test_nothing_in_the_package_imports_the_tools_beside_it():
  modules = list(PACKAGE.rglob("*.py"))
  assert len(modules) > 50
  importing = [str(p.relative_to(REPO)) for p in modules if _imports_tools(p)]
  assert not importing, f"the installed package cannot import tools/: {importing}"


def test_outside_the_data_package_only_its_public_api_is_used():
  public = set(data.__all__)
  for path in [*PACKAGE.rglob("*.py"), *TOOLS.rglob("*.py")]:
    if path.is_relative_to(PACKAGE) and path.relative_to(PACKAGE).parts[0] == "data":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      module = node.module if isinstance(node, ast.ImportFrom) else None
      if (module or "").startswith("transformer_jax.data"):
        where = path.relative_to(REPO)
        assert node.module == "transformer_jax.data", f"{where} imports {node.module}"
        assert {alias.name for alias in node.names} <= public, f"{where}: not in data.__all__"


MAX_LINES = 400


def test_no_module_is_longer_than_max_lines():
  long = {
    str(p.relative_to(REPO)): n
    for p in [*PACKAGE.rglob("*.py"), *TOOLS.rglob("*.py")]
    if (n := len(p.read_text().splitlines())) > MAX_LINES
  }
  assert not long, f"split these modules by job (at most {MAX_LINES} lines): {long}"


def test_the_guard_sees_an_import_that_goes_up(tmp_path):
  module = tmp_path / "bad.py"
  module.write_text(
    "from transformer_jax.train import step\nimport transformer_jax.decode.search\n"
  )
  assert _imported(module) == {"train", "decode"}


def test_the_guard_sees_an_import_of_the_tools(tmp_path):
  module = tmp_path / "bad.py"
  for line in ("from tools import timing", "import tools.device_report.bundle as b"):
    module.write_text(f"import functools\n{line}\n")
    assert _imports_tools(module), line
  module.write_text("import functools\nfrom . import tools\nfrom transformer_jax import tools\n")
  assert not _imports_tools(module)


def test_the_data_pipeline_alone_does_not_load_flax_and_the_command_line_loads_no_torch():
  script = (
    "import json, sys, transformer_jax.data\n"
    "seen = lambda: sorted({m.split('.')[0] for m in sys.modules} | set(sys.modules))\n"
    "print(json.dumps(seen()))\n"
    "import transformer_jax.main\n"
    "print(json.dumps(seen()))\n"
  )
  result = python("-c", script, check=True)
  data_only, command_line = map(json.loads, result.stdout.splitlines()[-2:])
  assert "flax" not in data_only and "transformer_jax.model" not in data_only
  assert "flax" in command_line and "torch" not in command_line
  assert "tensorboardX" not in command_line
