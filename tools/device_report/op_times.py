"""Where a step's time goes on the device: a few steps traced with `jax.profiler`, their events
summed by XLA op (the `hlo_op` the runtime attaches, else the kernel's own name).

The device's planes (`/device:GPU:0`, `/device:TPU:0`) are read where the trace has them: only
their `XLA Ops` line where there is one (other lines repeat its time), else every line (a GPU's
streams). A CPU trace has no device plane: there, the host's events that name an `hlo_op` are the
ops. Busy time sums the events' durations over lines; streams that overlap count twice.
"""

import collections
import pathlib
import re
import tempfile

import jax

DEVICE_PLANES = ("/device:GPU", "/device:TPU")
OPS_LINE = "XLA Ops"


def trace(step, steps: int):
  """`step()` run `steps` times under the profiler, each to its end; the trace as ProfileData
  (read into memory: its temporary directory is removed)."""
  with tempfile.TemporaryDirectory(prefix="transformer_jax_trace_") as directory:
    with jax.profiler.trace(directory):
      for _ in range(steps):
        jax.block_until_ready(step())
    files = sorted(pathlib.Path(directory).rglob("*.xplane.pb"))
    if not files:
      raise RuntimeError("the profiler wrote no trace")
    return jax.profiler.ProfileData.from_serialized_xspace(files[-1].read_bytes())


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_DETAILS = re.compile(r'(kind=\w+|custom_call_target="[^"]+")')


def _closing(text: str) -> int:
  """The index of the parenthesis that closes the one `text` starts with."""
  depth = 0
  for index, char in enumerate(text):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      return index
  return len(text) - 1


def describe(hlo_text: str) -> dict:
  """What each instruction of an HLO module's text is: name -> "opcode shape", with the fusion's
  kind or the custom call's target (`fusion kLoop bf16[104,256,2048]`)."""
  described = {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    rest = line[match.end() :]
    if rest.startswith("("):  # A tuple shape: up to its closing parenthesis.
      end = _closing(rest)
      shape, rest = rest[: end + 1], rest[end + 1 :].lstrip()
    else:
      shape, _, rest = rest.partition(" ")
    opcode = rest.partition("(")[0]
    details = [d.partition("=")[2].strip('"') for d in _DETAILS.findall(rest)]
    described[match.group(1)] = " ".join([opcode, *details, shape])
  return described


def _lines(planes) -> list:
  """(plane, line) pairs whose events are the ops, by the rule of the module's docstring."""
  planes = list(planes)  # ProfileData's planes can be read once only.
  device = [p for p in planes if p.name.startswith(DEVICE_PLANES)]
  if not device:
    return [(p, line) for p in planes if p.name == "/host:CPU" for line in p.lines]
  chosen = []
  for plane in device:
    lines = list(plane.lines)
    ops = [line for line in lines if line.name == OPS_LINE]
    chosen += [(plane, line) for line in ops or lines]
  return chosen


def summarize(planes, steps: int, top: int | None = 20, described: dict | None = None) -> dict:
  """Seconds per step by op, most first (`top` of them), from the planes of a trace of `steps`;
  each op with what `described` (`describe` of the program's HLO) says it is; `top` None: all."""
  described = described or {}
  seconds, calls, stat_names = collections.Counter(), collections.Counter(), set()
  sources = []
  for plane, line in _lines(planes):
    on_device = plane.name.startswith(DEVICE_PLANES)
    found = 0
    for event in line.events:
      stats = dict(event.stats)
      op = stats.get("hlo_op") or (event.name if on_device else None)
      if not op or event.duration_ns <= 0:
        continue
      if on_device:
        stat_names.update(stats)
      seconds[op] += event.duration_ns * 1e-9 / steps
      calls[op] += 1
      found += 1
    if found:
      sources.append(f"{plane.name} {line.name}")
  busy = sum(seconds.values())
  return {
    "traced_steps": steps,
    "sources": sources,
    "busy_seconds_per_step": busy,
    "distinct_ops": len(seconds),
    "ops": [
      {
        "op": op,
        "what": described.get(op, ""),
        "seconds_per_step": value,
        "calls_per_step": calls[op] / steps,
        "share_of_busy": value / busy,
      }
      for op, value in seconds.most_common(top)
    ],
    "device_event_stats": sorted(str(name) for name in stat_names)[:40],
  }
