"""The offline bundle: wheels of what the project needs that a GPU machine's image lacks.

    python -m tools.device_report.bundle DIR [--python_version=3.12] [--multi30k=CLONE]
    (./launch.sh device-bundle DIR [--multi30k=CLONE]; the data: bundle_data.py)

Downloaded on a machine with network for the GPU machine's Python (CPython
3.12, Linux x86-64): the project's requirements and its test extra, and what
they require in turn, leaving out every distribution the image already has
(`GPU_IMAGE`); `DIR/bundle.json` lists them. There, with no network, `install`
puts them into a private directory with `pip install --no-index --no-deps
--target` (the machine's jax, flax and the rest stay as they are) and `unmet`
says which requirements the result still does not satisfy. `install` and
`unmet` use the standard library alone (and `packaging` where the machine has
it), so they run before anything of the project is importable.
"""

import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import zipfile

from tools.device_report import bundle_data

LIST_NAME = "bundle.json"
DEFAULT_PYTHON = "3.12"
MAX_BYTES = 40 * 2**20
PLATFORMS = (
  "manylinux_2_28_x86_64",
  "manylinux_2_17_x86_64",
  "manylinux2014_x86_64",
  "linux_x86_64",
)
EXTRAS = ("test",)  # The device tests run there.
# Of the test extra, what the device tests do not use: the gs:// tests' client and server.
NOT_CARRIED = frozenset({"gcsfs", "gcp-storage-emulator"})
REPO = pathlib.Path(__file__).resolve().parents[2]

# The distributions the GPU machines' image holds (its `pip list`, read on 2026-11-17), by their
# normalized names. A requirement on one of them is taken as met there.
GPU_IMAGE = frozenset(
  """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
""".split()
)


class BundleError(Exception):
  """A bundle that cannot be made, read or installed; the message says why and what to do."""


def normalize(name: str) -> str:
  """A distribution's name as package indexes compare them (PEP 503)."""
  return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(repo: pathlib.Path = REPO) -> list[str]:
  """The requirement strings of the project and of its EXTRAS but NOT_CARRIED, from
  pyproject.toml (Python 3.11 or later: tomllib)."""
  import tomllib  # pylint: disable=import-outside-toplevel  # Only where bundles are made.

  project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
  extras = project.get("optional-dependencies", {})
  wanted = [r for extra in EXTRAS for r in extras.get(extra, [])]
  return list(project["dependencies"]) + [
    r for r in wanted if normalize(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) not in NOT_CARRIED
  ]


def _marker_environment(python_version: str) -> dict:
  return {
    "python_version": python_version,
    "python_full_version": f"{python_version}.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
  }


def _applies(requirement, python_version: str, extras=()) -> bool:
  """Whether `requirement` (a packaging Requirement) applies on the target with `extras`."""
  if requirement.marker is None:
    return True
  environment = _marker_environment(python_version)
  return any(requirement.marker.evaluate(dict(environment, extra=extra)) for extra in ("", *extras))


def _wheel_requirements(wheel: pathlib.Path) -> tuple[str, str, list[str]]:
  """(name, version, Requires-Dist lines) from a wheel's METADATA."""
  with zipfile.ZipFile(wheel) as archive:
    metadata = next(
      n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
    )
    text = archive.read(metadata).decode("utf-8")
  headers = {}
  requires = []
  for line in text.split("\n\n", 1)[0].splitlines():
    key, _, value = line.partition(": ")
    if key == "Requires-Dist":
      requires.append(value)
    else:
      headers.setdefault(key, value)
  return headers["Name"], headers["Version"], requires


def _download(requirement: str, directory: pathlib.Path, python_version: str) -> None:
  """`pip download` the wheel of `requirement` alone (no dependencies) for the target; where the
  index has only a source archive, build the wheel here, which must then be pure Python."""
  platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
  command = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--quiet",
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    python_version,
    "--implementation",
    "cp",
    *platforms,
    "--dest",
    str(directory),
    requirement,
  ]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if result.returncode == 0:
    return
  before = set(directory.glob("*.whl"))
  built = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--quiet",
      "--no-deps",
      "--wheel-dir",
      str(directory),
      requirement,
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  new = set(directory.glob("*.whl")) - before
  if built.returncode or any(not w.name.endswith("-none-any.whl") for w in new):
    for wheel in new:
      wheel.unlink()
    raise BundleError(
      f"no wheel of {requirement} for CPython {python_version} on Linux x86-64, "
      f"and none could be built here:\n{result.stderr.strip()}\n"
      f"{built.stderr.strip()}"
    )


def make(
  directory: str,
  python_version: str = DEFAULT_PYTHON,
  requirements: list[str] | None = None,
  image=GPU_IMAGE,
) -> dict:
  """Download into `directory` the wheels of `requirements` (default: the project's) that `image`
  lacks, and of what they require, level by level; write and return the list (LIST_NAME).
  BundleError when a download fails or the wheels exceed MAX_BYTES."""
  from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel

  out = pathlib.Path(directory).resolve()
  out.mkdir(parents=True, exist_ok=True)
  for old in out.glob("*.whl"):
    old.unlink()
  wanted = {}  # normalized name -> (requirement text, required by)
  level = [(Requirement(r), "transformer-jax") for r in requirements or project_requirements()]
  wheels = {}
  while level:
    new = {}
    for requirement, by in level:
      name = normalize(requirement.name)
      if name in image or name in wanted or name in new:
        continue
      new[name] = (f"{requirement.name}{requirement.specifier}", by)
    if not new:
      break
    before = set(out.glob("*.whl"))
    for text, _ in new.values():
      _download(text, out, python_version)
    wanted.update(new)
    level = []
    for wheel in sorted(set(out.glob("*.whl")) - before):
      name, version, requires = _wheel_requirements(wheel)
      wheels[normalize(name)] = {
        "name": name,
        "version": version,
        "file": wheel.name,
        "bytes": wheel.stat().st_size,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "required_by": wanted[normalize(name)][1],
      }
      extras = set(Requirement(wanted[normalize(name)][0]).extras)
      level += [
        (Requirement(r), name) for r in requires if _applies(Requirement(r), python_version, extras)
      ]
  total = sum(w["bytes"] for w in wheels.values())
  record = {
    "python_version": python_version,
    "platforms": list(PLATFORMS),
    "made": time.strftime("%Y-%m-%d"),
    "total_bytes": total,
    "wheels": sorted(wheels.values(), key=lambda w: w["name"].lower()),
  }
  (out / LIST_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
  if total > MAX_BYTES:
    raise BundleError(
      f"the bundle in {out} holds {total / 2**20:.1f} MiB of wheels, over the "
      f"{MAX_BYTES / 2**20:.0f} MiB it may carry"
    )
  return record


def read(directory: str) -> dict:
  """The list of a bundle made by `make`; BundleError when it is missing or a wheel is."""
  path = pathlib.Path(directory) / LIST_NAME
  if not path.is_file():
    raise BundleError(
      f"{directory} holds no bundle (no {LIST_NAME}): make one where there is "
      "network with ./launch.sh device-bundle DIR"
    )
  record = json.loads(path.read_text(encoding="utf-8"))
  missing = [w["file"] for w in record["wheels"] if not (path.parent / w["file"]).is_file()]
  if missing:
    raise BundleError(f"the bundle in {directory} lacks {', '.join(missing)}: make it again")
  return record


def install(directory: str, target: str) -> dict:
  """Install the bundle in `directory` into the private directory `target` with pip, offline and
  without dependencies; a wheel of a distribution this Python already has is left out, so the
  machine's own stays in use. The directory is made afresh unless it already holds this very
  bundle. Returns the list with `target`, `skipped` (name: version found), `seconds` and `python`
  (this one's version); BundleError when pip fails."""
  record = read(directory)
  found = {
    normalize(d.metadata["Name"]): d.version
    for d in importlib.metadata.distributions()
    if str(d.locate_file("")).rstrip("/") != str(pathlib.Path(target).resolve())
  }
  skipped = {
    w["name"]: found[normalize(w["name"])]
    for w in record["wheels"]
    if normalize(w["name"]) in found
  }
  wanted = [w for w in record["wheels"] if w["name"] not in skipped]
  digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()
  done = pathlib.Path(target) / ".bundle-installed"
  start = time.perf_counter()
  if not (done.is_file() and done.read_text(encoding="utf-8") == digest):
    shutil.rmtree(target, ignore_errors=True)
    wheels = [str(pathlib.Path(directory) / w["file"]) for w in wanted]
    command = [
      sys.executable,
      "-m",
      "pip",
      "install",
      "--quiet",
      "--no-index",
      "--no-deps",
      "--disable-pip-version-check",
      "--target",
      target,
      *wheels,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
      raise BundleError(f"installing the bundle into {target} failed:\n{result.stderr.strip()}")
    done.write_text(digest, encoding="utf-8")
  python = f"{sys.version_info.major}.{sys.version_info.minor}"
  return {
    **record,
    "wheels": wanted,
    "skipped": skipped,
    "target": target,
    "seconds": time.perf_counter() - start,
    "python": python,
  }


def bundled_requirements(paths: list[str]) -> list[tuple[str, str]]:
  """(requirement, the distribution that has it) of every distribution installed in `paths`."""
  return [
    (r, dist.metadata["Name"])
    for dist in importlib.metadata.distributions(path=paths)
    for r in dist.requires or ()
  ]


def unmet(requirements: list[tuple[str, str]], paths: list[str]) -> list[str]:
  """Which of `requirements` ((requirement, whose)) the distributions on `paths` (then this
  interpreter's) do not meet: 'whose: name (missing)' or 'whose: name>=x (found y)'. Extras are
  not followed. Empty where `packaging` is not installed."""
  try:
    from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  found = {}
  for dist in importlib.metadata.distributions(path=[*paths, *sys.path]):
    found.setdefault(normalize(dist.metadata["Name"]), dist.version)
  problems = []
  for text, whose in dict.fromkeys(requirements):
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
      continue
    version = found.get(normalize(requirement.name))
    if version is None:
      problems.append(f"{whose}: {requirement.name} (missing)")
    elif not requirement.specifier.contains(version, prereleases=True):
      problems.append(f"{whose}: {requirement.name}{requirement.specifier} (found {version})")
  return problems


def main(argv: list[str]) -> int:
  import argparse  # pylint: disable=import-outside-toplevel

  parser = argparse.ArgumentParser(
    prog="./launch.sh device-bundle", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("directory", help="where the wheels and bundle.json go (e.g. .device-bundle)")
  parser.add_argument(
    "--python_version",
    default=DEFAULT_PYTHON,
    help="the GPU machine's Python, major.minor (default %(default)s)",
  )
  parser.add_argument(
    "--multi30k",
    help="a clone of github.com/multi30k/dataset: its EN-DE tok files travel in DIR/multi30k",
  )
  args = parser.parse_args(argv)

  try:  # The data first: a file missing there fails before the downloads.
    data = bundle_data.carry(args.directory, args.multi30k)
    record = make(args.directory, args.python_version)
  except (BundleError, bundle_data.MissingDataError) as error:
    print(f"error: {error}", file=sys.stderr)
    return 1
  if data:
    record["data"] = data
    path = pathlib.Path(args.directory) / LIST_NAME
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
  for item in data:
    print(f"{item['file']:<72} {item['bytes'] / 2**20:6.2f} MiB  (for the multi30k stage)")
  for wheel in record["wheels"]:
    print(f"{wheel['file']:<72} {wheel['bytes'] / 2**20:6.2f} MiB  (for {wheel['required_by']})")
  print(
    f"{len(record['wheels'])} wheels, {record['total_bytes'] / 2**20:.1f} MiB in "
    f"{os.path.abspath(args.directory)}; carry it with the checkout and start the report with "
    f"--bundle={args.directory}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
