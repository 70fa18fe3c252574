"""The persistent XLA compilation cache: compiled programs kept on disk between runs.

`enable(config.compilation_cache_dir)` must run before the first compilation.
A run that compiles a program already in the cache (same program, shapes,
shardings, devices and jax version) loads it instead. The cache holds code
that the process will execute, so its directory must be the user's alone:
it is created with mode 0700, and one that belongs to someone else or that
others can write to is refused with a warning (the run goes on uncached).
On several processes JAX writes entries from process 0 only; the others read.
"""

import dataclasses
import logging
import os
import stat
import threading

import jax

from transformer_jax import fileio
from transformer_jax.errors import UserError

log = logging.getLogger(__name__)

AUTO = "auto"
# Every program is written (JAX's default skips those compiled in under 1 s): on a local disk
# loading even a small one is faster than compiling it, and a small model's run has dozens.
MIN_COMPILE_SECONDS = 0.0
_REQUEST = "/jax/compilation_cache/compile_requests_use_cache"
_HIT = "/jax/compilation_cache/cache_hits"
# XLA's compilation of a program, or the cache read that replaces it; and the tracing and
# lowering before it, which a cache hit does not spare.
_BACKEND = "/jax/core/compile/backend_compile_duration"
_TRACING = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
)


def directory(value: str, environ=os.environ) -> str | None:
  """The cache directory that `config.compilation_cache_dir` names: '' is none, 'auto' is
  $XDG_CACHE_HOME/transformer_jax/xla (default ~/.cache/transformer_jax/xla); a URL is a
  UserError."""
  if not value:
    return None
  if value == AUTO:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "transformer_jax", "xla")
  if fileio.is_url(value):  # It runs what it reads: a directory of this user's, on this machine.
    raise UserError(
      f"config.compilation_cache_dir={value}: the compilation cache must be a local directory "
      "(each machine keeps its own); use 'auto', a local path, or '' for none"
    )
  return os.path.abspath(os.path.expanduser(value))


def unsafe_reason(path: str) -> str | None:
  """Why `path` may not hold code this process runs (None when it may): it is not a directory,
  belongs to another user, or others can write to it."""
  info = os.stat(path)
  if not stat.S_ISDIR(info.st_mode):
    return "it is not a directory"
  if info.st_uid != os.getuid():
    return f"it belongs to another user (uid {info.st_uid})"
  if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return (
      f"others can write to it (mode {stat.S_IMODE(info.st_mode):o}), so what it holds "
      f"may not be yours; remove it and the next run makes it anew for you alone"
    )
  return None


@dataclasses.dataclass
class CacheUse:
  """What the cache did in this process: programs loaded from it and compiled anew, the seconds
  in XLA's compiler or reading the cache, and the seconds tracing and lowering programs."""

  path: str
  requests: int = 0  # Programs looked up in the cache.
  loaded: int = 0
  backend_seconds: float = 0.0
  tracing_seconds: float = 0.0

  def __post_init__(self):
    self._lock = threading.Lock()

  def count(self, event: str, **_) -> None:
    """A `jax.monitoring` event listener: counts cache lookups and hits."""
    with self._lock:
      self.requests += event == _REQUEST
      self.loaded += event == _HIT

  def add_time(self, event: str, seconds: float, **_) -> None:
    """A `jax.monitoring` duration listener: adds up the compile phases."""
    with self._lock:
      if event == _BACKEND:
        self.backend_seconds += seconds
      elif event in _TRACING:
        self.tracing_seconds += seconds

  def summary(self) -> str:
    """One line: whether the cache was used, and the time compiling."""
    if not self.requests:
      used = "no program went through it"
    elif not self.loaded:
      used = f"nothing loaded from it, {self.requests} programs compiled"
    else:
      used = f"{self.loaded} of {self.requests} programs loaded from it"
    return (
      f"compilation cache {self.path}: {used}; {self.backend_seconds:.1f} s compiling or "
      f"loading, {self.tracing_seconds:.1f} s tracing and lowering"
    )


def enable(value: str) -> CacheUse | None:
  """Point JAX's persistent compilation cache at the directory `value` names (see `directory`),
  creating it for this user only. None when it is off (logged), or unsafe or impossible to create
  (a warning); then no cache is used, not even one that $JAX_COMPILATION_CACHE_DIR names."""
  path = directory(value)
  problem = None
  if path is None:
    log.info("compilation cache off (config.compilation_cache_dir is empty)")
  else:
    try:
      os.makedirs(path, mode=0o700, exist_ok=True)
      problem = unsafe_reason(path)
    except OSError as error:
      problem = f"{error.strerror or error}"
    if problem:
      log.warning("not using the compilation cache %s: %s; compiling everything", path, problem)
  if path is None or problem:
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
  use = CacheUse(path)
  jax.monitoring.register_event_listener(use.count)
  jax.monitoring.register_event_duration_secs_listener(use.add_time)
  return use
