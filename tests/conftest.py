"""Test set-up: CPU only, with 8 simulated devices for the sharding tests, and the command
line's compilation cache in the session's temporary directory.

The flags must be set before jax is first imported, which is why they live here.
"""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()


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
