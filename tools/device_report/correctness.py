"""Stage b, correct on the device: the fused attention against the reference path
(`correctness:attention`), then the tests marked `device` (`correctness:tests`).

The fused path (cuDNN on a GPU, XLA's fused attention elsewhere) runs in
bfloat16 with padding, causal and packed-segment masks, the causal ones both
folded into the mask and through the kernel's own causal path (`is_causal`,
the path the decoder's self-attention takes); its output and its
gradients are compared with the reference path in float32 on the same
(upcast) inputs by ||fused - reference|| / ||reference||. Rows whose keys are
all masked must give exactly zero, and nothing may be NaN, gradients
included. On a GPU the compiled programs must call cuDNN's fused attention.
"""

import importlib.metadata
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from tools.device_report import bundle, pytest_log
from transformer_jax.compile import targets
from transformer_jax.compile.analysis import cudnn_attention_calls
from transformer_jax.model import attention

# bfloat16 operands land between 1e-3 and 1e-2 against a float32 reference; their gradients (a
# bfloat16 backward pass) somewhat above.
OUTPUT_TOLERANCE, GRADIENT_TOLERANCE = 1e-2, 2e-2


def _masks(batch: int, length: int, rng: np.random.Generator) -> dict:
  """`(mask, is_causal)` per case: boolean masks `[batch, 1, length, length]`, and whether the
  kernel adds the causal mask itself (`is_causal`)."""
  lengths = rng.integers(length // 2, length, batch)
  lengths[0] = length  # One row without padding.
  tokens = np.where(np.arange(length)[None] < lengths[:, None], 5, 0)
  segments = np.zeros((batch, length), np.int32)
  for row in range(batch):  # Pairs of random lengths, packed until the row's real length.
    start, segment = 0, 1
    while start < lengths[row]:
      end = min(lengths[row], start + int(rng.integers(1, max(2, length // 3))))
      segments[row, start:end] = segment
      start, segment = end, segment + 1
  padding = attention.padding_mask(tokens, tokens)
  causal = attention.causal_mask(length)
  packed = attention.segment_mask(segments, segments)
  return {
    "padding": (padding, False),
    "causal": (padding & causal, False),
    "packed": (packed, False),
    "packed_causal": (packed & causal, False),
    "padding_is_causal": (padding, True),
    "packed_is_causal": (packed, True),
  }


def _relative_error(value, reference) -> float:
  value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
  return float(np.linalg.norm(value - reference) / max(np.linalg.norm(reference), 1e-30))


def check_attention(shape, platform: str, seed: int = 0) -> dict:
  """The fused attention against the reference, per mask case; `ok` when every figure holds."""
  batch, length, heads, size = shape
  rng = np.random.default_rng(seed)
  fused = "cudnn" if platform == "gpu" else "xla"
  q, k, v, cotangent = (
    jnp.asarray(rng.standard_normal((batch, length, heads, size)), jnp.bfloat16) for _ in range(4)
  )

  def loss(implementation, dtype):
    def f(q, k, v, mask, is_causal):
      out = attention.dot_product_attention(
        *(x.astype(dtype) for x in (q, k, v)),
        mask,
        is_causal=is_causal,
        implementation=implementation,
      )
      return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out

    return jax.jit(
      jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True), static_argnames="is_causal"
    )

  fused_fn, reference_fn = loss(fused, jnp.bfloat16), loss("reference", jnp.float32)
  cases = {}
  for name, (mask, is_causal) in _masks(batch, length, rng).items():
    (_, out), grads = fused_fn(q, k, v, mask, is_causal=is_causal)
    if is_causal:  # The reference gets the causal mask folded in: no is_causal on its side.
      mask = mask & attention.causal_mask(length)
    with jax.default_matmul_precision("highest"):
      (_, ref_out), ref_grads = reference_fn(q, k, v, mask, is_causal=False)
    empty = ~np.asarray(jnp.any(jnp.broadcast_to(mask, (batch, 1, length, length)), axis=-1))[:, 0]
    arrays = [np.asarray(a, np.float32) for a in (out, *grads)]
    case = {
      "output_error": _relative_error(out, ref_out),
      "gradient_errors": {n: _relative_error(g, r) for n, g, r in zip("qkv", grads, ref_grads)},
      "empty_rows": int(empty.sum()),
      "empty_rows_zero": bool(np.all(np.asarray(out, np.float32)[empty] == 0)),
      "empty_rows_zero_dq": bool(np.all(np.asarray(grads[0], np.float32)[empty] == 0)),
      "finite": bool(all(np.all(np.isfinite(a)) for a in arrays)),
    }
    case["ok"] = (
      case["output_error"] <= OUTPUT_TOLERANCE
      and case["finite"]
      and max(case["gradient_errors"].values()) <= GRADIENT_TOLERANCE
      and case["empty_rows_zero"]
      and case["empty_rows_zero_dq"]
    )
    cases[name] = case
  packed, _ = _masks(batch, length, rng)["packed"]
  text = fused_fn.lower(q, k, v, packed, is_causal=True).compile().as_text()
  calls = cudnn_attention_calls(text)
  record = {
    "implementation": fused,
    "shape": list(shape),
    "dtype": "bfloat16",
    "reference": "float32 on the same inputs, matmuls at highest precision",
    "tolerance": {"output": OUTPUT_TOLERANCE, "gradients": GRADIENT_TOLERANCE},
    "cases": cases,
    "cudnn_calls_in_hlo": calls,
  }
  ok = all(case["ok"] for case in cases.values())
  if platform == "gpu":
    ok = ok and calls >= 2  # forward and backward
  else:
    record["cudnn"] = f"not applicable on {platform}: cuDNN runs on NVIDIA GPUs (checked: XLA's)"
  record["ok"] = ok
  return record


def device_test_files(tests: pathlib.Path) -> list[str]:
  """The test files that mark tests `device` (collecting only these spares importing the rest)."""
  return sorted(
    str(p.relative_to(tests.parent))
    for p in tests.glob("test_*.py")
    if "mark.device" in p.read_text(encoding="utf-8")
  )


# The device's memory shared out among the tests' processes, each its share: with no
# preallocation XLA_PYTHON_CLIENT_MEM_FRACTION is the most a process's allocator grows to. The
# command lines some tests start inherit their worker's share, so the total may pass this.
TESTS_MEMORY_FRACTION = 0.9


def device_test_workers(cores: int | None = None) -> int:
  """The processes the device tests run in: half the cores, at most 8, at least 1. Each is a JAX
  process whose compiles and XLA thread pools want cores of their own, and some tests start a
  command line beside it; 8 keeps each one's share of the device's memory at 11% (9 GB of an
  H100's 80). On 2 cores (CI's dry run of the tiny plan: 4 tests) one process: a second would
  start JAX again on the same two cores the tests compute on, for no time saved (on a loaded
  2-core machine the two took 14-24 s alike)."""
  cores = len(os.sched_getaffinity(0)) if cores is None else cores
  return max(1, min(8, cores // 2))


def _distribution() -> str:
  """xdist's `worksteal` (3.2 on) sends each worker a contiguous run of the collection (the tests
  of a file mostly in one process, sharing its module fixtures and compiled functions, as
  `loadfile` would) and then moves pending tests to the workers that finish first; `loadfile`
  would hold all of test_search.py, nearly half the device tests, to one worker. Before 3.2:
  `load`."""
  version = importlib.metadata.version("pytest-xdist").split(".")
  return "worksteal" if tuple(int(v) for v in version[:2] if v.isdigit()) >= (3, 2) else "load"


def run_device_tests(
  arguments,
  seconds: float,
  log_path: pathlib.Path,
  test_timeout: int,
  platform: str,
  workers: int | None = None,
) -> dict:
  """The tests `arguments` select (pytest on `platform`, in `workers` processes where xdist is
  installed, else one; by default device_test_workers()), stopped after `seconds` with
  everything it started: counts of each outcome, the failures, the tests that did not run and
  whether they all ran. It runs in the repository's root: name tests elsewhere by absolute path."""
  workers = device_test_workers() if workers is None else workers
  if not targets.installed("xdist"):
    workers = 1
  env = dict(os.environ, **{pytest_log.ENV: str(log_path)})
  for name in [name for name in env if name.startswith("PYTEST_XDIST_")]:
    del env[name]  # Run from an xdist worker (the project's tests), its pytest is its own.
  env["JAX_PLATFORMS"] = {"gpu": "cuda"}.get(platform, platform)
  # The test processes, and the command lines some tests start, share the device.
  env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  fraction = None
  if platform == "gpu":
    fraction = f"{int(TESTS_MEMORY_FRACTION / workers * 1000) / 1000:.3f}"  # Rounded down.
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
  command = [
    sys.executable,
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "tools.device_report.pytest_log",
    *arguments,
  ]
  if targets.installed("pytest_timeout"):
    command.append(f"--timeout={test_timeout}")
  if workers > 1:
    command += ["-n", str(workers), f"--dist={_distribution()}"]
  elif targets.installed("xdist"):
    command += ["-p", "no:xdist"]
  log_path.unlink(missing_ok=True)
  process = subprocess.Popen(command, env=env, cwd=bundle.REPO, start_new_session=True)
  try:
    status, code = "finished", process.wait(timeout=max(seconds, 1.0))
  except subprocess.TimeoutExpired:
    status, code = f"stopped after {seconds:.0f} s", None
  _end_group(process)
  return {
    "command": " ".join(command[1:]),
    "status": status,
    "exit_status": code,
    "workers": workers,
    "memory_fraction": fraction,
    **pytest_log.summary(log_path),
  }


def _running_in_group(group: int) -> bool:
  """Whether a process of `group` still runs (not a zombie: that one has let go of the device)."""
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue  # Ended meanwhile.
    if fields[0] != "Z" and int(fields[2]) == group:
      return True
  return False


def _end_group(process: subprocess.Popen, wait_seconds: float = 1.5) -> None:
  """Kills what is left of `process`'s session, xdist's workers with it (they are in its
  process group), and waits a little for them to end, so that the device's memory is free (at
  most `wait_seconds`: within the 2 s the step keeps after its tests' time)."""
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  process.wait()
  end = time.monotonic() + wait_seconds
  while _running_in_group(process.pid) and time.monotonic() < end:
    time.sleep(0.05)


def run(plan, step, result, context) -> None:
  if step.part == "attention":
    record = check_attention(plan.attention_shape, jax.default_backend())
    result.put(attention=record, status="ok" if record["ok"] else "problems found")
    return
  # The tests get the device alone: this process does not start JAX's backends, and reads the
  # platform off the environment step.
  platform = context.earlier("environment").get("backend") or "cpu"
  files = list(plan.device_test_files) or device_test_files(bundle.REPO / "tests")
  tests = run_device_tests(
    [*files, "-m", "device"],
    result.left() - 2.0,
    context.work / "pytest_log.jsonl",
    plan.test_timeout_seconds,
    platform,
  )
  result.put(device_tests=tests, status=_tests_status(tests))


def _tests_status(tests: dict) -> str:
  """ok when every test ran and passed; incomplete when stopped for time before a failure."""
  if tests["failures"] or tests["status"] == "finished" and tests["exit_status"] != 0:
    return "problems found"
  return "ok" if tests["status"] == "finished" else "incomplete"
