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

import os
import pathlib
import signal
import subprocess
import sys

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


def run_device_tests(
  arguments, seconds: float, log_path: pathlib.Path, test_timeout: int, platform: str
) -> dict:
  """The tests `arguments` select (pytest, one process, on `platform`), stopped after `seconds`
  with everything it started: counts of each outcome, the failures and whether they all ran."""
  env = dict(os.environ, **{pytest_log.ENV: str(log_path)})
  env["JAX_PLATFORMS"] = {"gpu": "cuda"}.get(platform, platform)
  # Tests that start the command line share the device with the test process.
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
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
  if targets.installed("xdist"):
    command += ["-p", "no:xdist"]
  log_path.unlink(missing_ok=True)
  process = subprocess.Popen(command, env=env, cwd=bundle.REPO, start_new_session=True)
  try:
    status, code = "finished", process.wait(timeout=max(seconds, 1.0))
  except subprocess.TimeoutExpired:
    status, code = f"stopped after {seconds:.0f} s", None
  try:
    os.killpg(process.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  process.wait()
  return {
    "command": " ".join(command[1:]),
    "status": status,
    "exit_status": code,
    **pytest_log.summary(log_path),
  }


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
