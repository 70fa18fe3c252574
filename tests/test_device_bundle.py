"""The offline bundle: what it downloads, and that a Python holding only what a GPU machine's image
holds (as far as this environment has it) installs it offline and imports every module of the
package and of the tools beside it (`tools/`, from the checkout). Downloads from the package
index."""

import hashlib
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import venv

import pytest

import helpers
from test_data_multi30k import write_repo
from tools.device_report import bundle, bundle_data

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
NEEDED = {
  "grain",
  "array-record",
  "tensorflow-datasets",
  "ml-collections",
  "tensorboardx",
  "dm-tree",
  "promise",
  "simple-parsing",
  "tensorflow-metadata",
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
  """A bundle for this interpreter's Python (the GPU machine's is made the same way)."""
  directory = tmp_path_factory.mktemp("bundle")
  return directory, bundle.make(str(directory), python_version=HERE)


@pytest.mark.slow
def test_the_bundle_holds_what_the_image_lacks_and_nothing_it_has(made):
  directory, record = made
  names = {bundle.normalize(w["name"]) for w in record["wheels"]}
  assert NEEDED <= names, NEEDED - names
  assert not names & bundle.GPU_IMAGE
  assert {"jax", "jaxlib", "flax", "numpy"}.isdisjoint(names)
  assert record["total_bytes"] == sum(w["bytes"] for w in record["wheels"]) <= bundle.MAX_BYTES
  assert sorted(p.name for p in directory.glob("*.whl")) == sorted(
    w["file"] for w in record["wheels"]
  )
  assert json.loads((directory / bundle.LIST_NAME).read_text()) == record
  by_name = {bundle.normalize(w["name"]): w for w in record["wheels"]}
  assert by_name["promise"]["required_by"] == "tensorflow-datasets"
  assert by_name["grain"]["required_by"] == "transformer-jax"


def _image_like_python(root: pathlib.Path) -> pathlib.Path:
  """A new virtual environment holding, by symbolic links, the files of every distribution
  installed here that the GPU image also has, and nothing else; its python."""
  venv.EnvBuilder(with_pip=True, symlinks=True).create(root)
  python = root / "bin" / "python"
  site = pathlib.Path(
    subprocess.run(
      [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  )
  for dist in importlib.metadata.distributions():
    if bundle.normalize(dist.metadata["Name"]) not in bundle.GPU_IMAGE - {"pip"}:
      continue
    base = pathlib.Path(dist.locate_file(""))
    for file in dist.files or ():
      if file.parts[0] == ".." or (site / file).exists():
        continue
      (site / file).parent.mkdir(parents=True, exist_ok=True)
      (site / file).symlink_to(base / file)
  return python


# Imports the modules named in argv[2] ("all": every module of the package and of the tools beside
# it); prints what imported, what needs a distribution of the image that this environment lacks
# (argv[1]), what broke, and what defines a flag that a module imported before it defined too
# (command lines: each is imported again in a process of its own).
_IMPORT_MODULES = """
import importlib, json, pkgutil, sys
from absl import flags
import tools, transformer_jax
allowed = set(sys.argv[1].split(","))
names = sys.argv[2].split(",") if sys.argv[2] != "all" else [
    m.name for package in (transformer_jax, tools)
    for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
result = {"imported": [], "absent": [], "broken": [], "alone": []}
for name in names:
  try:
    importlib.import_module(name)
    result["imported"].append(name)
  except flags.DuplicateFlagError:
    result["alone"].append(name)
  except ModuleNotFoundError as error:
    result["absent" if error.name.split(".")[0] in allowed else "broken"].append(f"{name}: {error}")
  except Exception as error:
    result["broken"].append(f"{name}: {type(error).__name__}: {error}")
print(json.dumps(result))
"""


@pytest.mark.slow
def test_an_image_like_python_installs_the_bundle_offline_and_imports_every_module(made, tmp_path):
  directory, record = made
  python = _image_like_python(tmp_path / "venv")
  target = tmp_path / "private"
  env = dict(helpers.environment(), PIP_NO_INDEX="1", PYTHONPATH="")
  report = subprocess.run(
    [
      python,
      "-m",
      "tools.device_report",
      f"--out={tmp_path / 'out'}",
      f"--bundle={directory}",
      f"--bundle_target={target}",
      "--stages=environment",
      "--platform=cpu",
      "--tiny",
    ],
    cwd=helpers.REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert report.returncode == 0, report.stdout + report.stderr
  assert f"installed {len(record['wheels'])} wheels into {target}" in report.stdout
  assert "(already here: none)" in report.stdout
  environment = json.loads((tmp_path / "out" / "environment.json").read_text())
  step = environment["steps"]["environment"]
  assert step["bundle"]["unmet"] == [] and step["versions"]["grain"] is not None
  # Packages of the image that this environment lacks (an extra not installed here).
  allowed = {name.replace("-", "_") for name in bundle.GPU_IMAGE}

  def import_modules(modules: str) -> dict:
    imports = subprocess.run(
      [python, "-c", _IMPORT_MODULES, ",".join(sorted(allowed)), modules],
      cwd=helpers.REPO,
      env=dict(env, PYTHONPATH=os.pathsep.join([str(helpers.REPO), str(target)])),
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
    )
    assert imports.returncode == 0, imports.stderr
    return json.loads(imports.stdout.strip().splitlines()[-1])

  result = import_modules("all")
  for name in result.pop("alone"):
    alone = import_modules(name)
    assert not alone["alone"]
    for key in ("imported", "absent", "broken"):
      result[key] += alone[key]
  assert not result["broken"], result["broken"]
  assert {
    "transformer_jax.main",
    "transformer_jax.data.pipeline",
    "tools.device_report.__main__",
  } <= set(result["imported"])
  assert len(result["imported"]) > 50


def test_a_missing_or_incomplete_bundle_is_refused_with_what_to_do(tmp_path):
  with pytest.raises(bundle.BundleError, match="device-bundle DIR"):
    bundle.read(str(tmp_path))
  (tmp_path / bundle.LIST_NAME).write_text(json.dumps({"wheels": [{"file": "grain.whl"}]}))
  with pytest.raises(bundle.BundleError, match="lacks grain.whl: make it again"):
    bundle.read(str(tmp_path))


def test_requirements_apply_by_the_target_pythons_markers():
  from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel

  old = Requirement('importlib_resources; python_version < "3.9"')
  assert not bundle._applies(old, "3.12")  # pylint: disable=protected-access
  extra = Requirement('gcsfs; extra == "gcs"')
  assert not bundle._applies(extra, "3.12")  # pylint: disable=protected-access
  assert bundle._applies(extra, "3.12", {"gcs"})  # pylint: disable=protected-access
  requirements = [("jax>=0.1", "a"), ("no-such-distribution", "b"), ("numpy<1", "c")]
  assert bundle.unmet(requirements, []) == [
    "b: no-such-distribution (missing)",
    f"c: numpy<1 (found {importlib.metadata.version('numpy')})",
  ]


def _fake_make(directory, python_version):
  """`bundle.make` without the downloads: an empty list of wheels."""
  record = {"python_version": python_version, "total_bytes": 0, "wheels": []}
  (pathlib.Path(directory) / bundle.LIST_NAME).write_text(json.dumps(record))
  return record


def test_the_bundle_carries_the_multi30k_text_only_when_asked(tmp_path, monkeypatch, capsys):
  clone, out = tmp_path / "clone", tmp_path / "bundle"
  lines = write_repo(clone)
  monkeypatch.setattr(bundle, "make", _fake_make)
  assert bundle.main([str(out), f"--multi30k={clone}"]) == 0
  listed = json.loads((out / bundle.LIST_NAME).read_text())["data"]
  carried = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
  assert carried == sorted([bundle.LIST_NAME, *(item["file"] for item in listed)])
  assert {item["file"] for item in listed} == {
    f"multi30k/{name}" for name in bundle_data.MULTI30K_FILES
  }
  for item in listed:
    data = (out / item["file"]).read_bytes()
    assert item["bytes"] == len(data) and item["sha256"] == hashlib.sha256(data).hexdigest()
  german = (out / "multi30k/data/task1/tok/val.lc.norm.tok.de").read_text().splitlines()
  assert german == lines["multi30k_tok", "val", "de"]
  assert "(for the multi30k stage)" in capsys.readouterr().out
  # On the GPU machine the report checks the copies against the list.
  assert bundle_data.changed(str(out), listed) == []
  val = out / "multi30k/data/task1/tok/val.lc.norm.tok.de"
  val.write_bytes(val.read_bytes()[:-10])  # Cut short.
  (out / "multi30k/data/task1/tok/train.lc.norm.tok.en").unlink()
  assert bundle_data.changed(str(out), listed) == [
    "multi30k/data/task1/tok/train.lc.norm.tok.en",
    "multi30k/data/task1/tok/val.lc.norm.tok.de",
  ]
  # Made again without it, the bundle no longer carries it.
  assert bundle.main([str(out)]) == 0
  assert not (out / "multi30k").exists()
  assert "data" not in json.loads((out / bundle.LIST_NAME).read_text())


def test_a_clone_without_a_file_the_stage_reads_fails_in_one_line(tmp_path, monkeypatch, capsys):
  clone = tmp_path / "clone"
  write_repo(clone)
  (clone / "data/task1/tok/test_2016_flickr.lc.norm.tok.de").unlink()
  monkeypatch.setattr(bundle, "make", lambda *args: pytest.fail("downloaded before the check"))
  assert bundle.main([str(tmp_path / "bundle"), f"--multi30k={clone}"]) == 1
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and "lacks data/task1/tok/test_2016_flickr.lc.norm.tok.de" in error


def test_the_bundle_directory_is_not_committed():
  ignored = subprocess.run(
    ["git", "check-ignore", "-q", ".device-bundle/multi30k/data/task1/tok/train.lc.norm.tok.en"],
    cwd=helpers.REPO,
    check=False,
  )
  assert ignored.returncode == 0
