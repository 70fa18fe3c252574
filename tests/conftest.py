"""Test set-up: the CPU with 8 simulated devices for the sharding tests, compiling quickly
rather than well (unless $JAX_PLATFORMS names an accelerator, for the tests marked `device`),
and the command line's compilation cache in the session's temporary directory.

The flags must be set before jax is first imported, which is why they live here.
"""

import os
import subprocess
import sys
import uuid

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ON_CPU = os.environ["JAX_PLATFORMS"] == "cpu"
if not ON_CPU:
  # The processes the tests start (the command line) share the accelerator with this one, which
  # would otherwise hold 75% of its memory from the first computation on.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The tests' programs are tiny: compiling them costs more than running them. Without LLVM's
# optimizations, without the CPU's newer fusion emitters and without splitting code generation
# across threads (two test workers keep both cores busy), the HLO is the same, compiling takes
# much less time, and the numbers agree to within the tests' tolerances (their bitwise
# comparisons compare runs compiled alike); docs/testing.md has the measured times.
_FASTER_CPU_COMPILES = (
  "--xla_cpu_use_fusion_emitters=false",
  "--xla_cpu_parallel_codegen_split_count=1",
)


def _missing(flags) -> list[str]:
  """The `flags` whose names $XLA_FLAGS does not set."""
  names = [flag.split("=")[0] for flag in os.environ.get("XLA_FLAGS", "").split()]
  return [flag for flag in flags if flag.split("=")[0] not in names]


def _add_xla_flags(flags) -> None:
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_missing(flags)]).strip()


def _known_to_xla(flags) -> bool:
  """Whether this jax's XLA takes `flags` (it ends a process given a flag it does not know)."""
  try:
    probe = subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices()"],
      env=dict(os.environ, XLA_FLAGS=" ".join(flags)),
      capture_output=True,
      check=False,
      timeout=120,
    )
  except subprocess.TimeoutExpired:
    return False
  return probe.returncode == 0


if ON_CPU:
  _add_xla_flags(["--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"])
  # Checked by the first process of the session: xdist's workers inherit the flags.
  if _missing(_FASTER_CPU_COMPILES) and _known_to_xla(_FASTER_CPU_COMPILES):
    _add_xla_flags(_FASTER_CPU_COMPILES)


@pytest.fixture(autouse=True, scope="session")
def _compilation_cache_of_the_session(tmp_path_factory):
  """The command line's default compilation cache ('auto': $XDG_CACHE_HOME/...) in the session's
  temporary directory, never the user's."""
  saved = os.environ.get("XDG_CACHE_HOME")
  os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
  yield
  if saved is None:
    del os.environ["XDG_CACHE_HOME"]
  else:
    os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(autouse=True, scope="session")
def _float32_matmuls_in_full_on_an_accelerator():
  """On a GPU or TPU, float32 matmuls in full precision (not TF32 or bfloat16 passes), as the
  float64 references of the `device` tests assume; the CPU computes them so anyway."""
  if not ON_CPU:
    import jax  # pylint: disable=import-outside-toplevel  # After the flags above.

    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
  """The session's corpus, vocabulary and compilation cache of tiny runs (`helpers.shared_dir`)."""
  import helpers  # pylint: disable=import-outside-toplevel  # It imports jax: after the flags.

  return helpers.shared_dir(tmp_path_factory)


GCS_BUCKET = "tjtest"


# Where each client of gs:// looks for the server: gcsfs (through epath), and TensorStore (Orbax's
# arrays), which then takes any token as its credentials.
_STORAGE_VARIABLES = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")


@pytest.fixture(scope="session")
def gcs_server():
  """A Google Cloud Storage server on localhost that speaks the JSON API (`gcs_stand_in`: the
  emulator, in memory, in a thread of this process), with bucket `GCS_BUCKET`; every gs://
  client of this process and of the processes it starts talks to it, and each of their listings
  asks the server (`fileio.list_stores_afresh`, as the command line does)."""
  import fsspec  # pylint: disable=import-outside-toplevel

  import gcs_stand_in  # pylint: disable=import-outside-toplevel  # Only where a test needs it.
  import helpers  # pylint: disable=import-outside-toplevel  # It imports jax: after the flags.
  from transformer_jax import fileio  # pylint: disable=import-outside-toplevel

  port = helpers.free_port()
  server = gcs_stand_in.create_server("localhost", port, in_memory=True, default_bucket=GCS_BUCKET)
  server.start()
  names = (*_STORAGE_VARIABLES, "GOOGLE_AUTH_TOKEN_FOR_TESTING")
  saved = {name: os.environ.get(name) for name in names}
  os.environ.update({name: f"http://localhost:{port}" for name in _STORAGE_VARIABLES})
  os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "tests"
  gs_config = fsspec.config.conf.get("gs")
  fsspec.config.conf["gs"] = dict(gs_config or {})
  fileio.list_stores_afresh()
  yield os.environ["STORAGE_EMULATOR_HOST"]
  server.stop()
  if gs_config is None:
    fsspec.config.conf.pop("gs", None)
  else:
    fsspec.config.conf["gs"] = gs_config
  for name, value in saved.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value


@pytest.fixture
def absl_flags_parsed():
  """absl's flags parsed, as the command line has them, which Grain's worker processes need
  (`data.batch.num_workers` > 0: docs/library.md); unparsed again after, as pytest found them."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  if flags.FLAGS.is_parsed():
    yield
    return
  flags.FLAGS.mark_as_parsed()
  try:
    yield
  finally:
    flags.FLAGS.unparse_flags()


@pytest.fixture
def bucket_dir(gcs_server):
  """A directory of its own in the local server's bucket: `gs://tjtest/<random>`."""
  del gcs_server
  return f"gs://{GCS_BUCKET}/{uuid.uuid4().hex[:12]}"


def pytest_collection_modifyitems(items):
  """Whole files, the longest first (those with processes of a multi-process run, then by their
  number of `slow` tests), so that the worker processes of `-n 2 --dist=loadfile` end together;
  the order of the tests within a file stays."""
  weight = {}
  for item in items:
    multiprocess, slow = weight.get(item.path, (0, 0))
    weight[item.path] = (
      multiprocess or item.get_closest_marker("multiprocess") is not None,
      slow + (item.get_closest_marker("slow") is not None),
    )
  items.sort(key=lambda item: tuple(-w for w in weight[item.path]))
