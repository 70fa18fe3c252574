"""report.md's sections on where a train step's time goes: each measured step beside the kernels,
bytes, FLOPs and roofline floor predicted for its program (estimates, labelled so), and the
profile's costliest ops, grouped by kind and by source line, beside their kernels' floors."""

from transformer_jax.compile import thunks

VARIANT_NAMES = {
  "base": "base",
  "big": "big",
  "base_xla": "base, attention=xla",
  "base_remat": "base, remat=full",
  "largest": "base at the largest batch",
}


def number(value, spec: str = ",.0f", scale: float = 1.0) -> str:
  if value is None or isinstance(value, str):
    return value or "-"
  return format(value * scale, spec)


def get(record: dict | None, *path, default=None):
  for key in path:
    if not isinstance(record, dict) or key not in record:
      return default
    record = record[key]
  return record


def _ms(seconds) -> str:
  return number(seconds, ".1f", 1e3)


def _ratio(value) -> str:
  return number(value, ".2f")


def floor_rows(records: dict) -> list[str]:
  """Each train step's measured times beside the kernels, bytes, FLOPs and roofline floor
  predicted for it, from the executable that ran and from the compile mode (estimates both)."""
  steps = list((get(records, "speed", "steps") or {}).items())
  largest = get(records, "prediction", "steps", "largest")
  steps += [("largest", largest)] if largest and largest.get("step_seconds") else []
  compile_step = get(records, "prediction", "steps", "compile") or {}
  if not any(step.get("step_seconds") for _, step in steps):
    return []
  lines = [
    "",
    "## Train steps beside their predicted kernels and roofline floor",
    "",
    "| train step | batch | step ms: median of single steps | back to back: ms per step "
    "(steps) | back to back: target tok/s | bf16 matmul TFLOP/s: before, after | kernels (est.) "
    "| host launches (graphs) | HBM GB (est.) | TFLOP (est.) | floor ms (est., the executable "
    "that ran) | measured / floor | floor ms (est., compile mode) | measured / compile mode's "
    "floor |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  chips = set()
  for name, step in steps:
    if not step.get("step_seconds"):
      continue
    median = step["step_seconds"]["median"]
    chained = step.get("back_to_back") or {}
    mode = (
      compile_step.get("largest_program")
      if name == "largest"
      else get(compile_step, "programs", name)
    )
    mode_floor = get(mode, "kernels", "floor_seconds")
    own = step.get("predicted_kernels") or {}
    if own.get("chip"):
      chips.add(f"{own['chip']} ({own.get('chip_basis', '')})")
    rates = (step.get("matmul_flops_per_second"), step.get("matmul_after_flops_per_second"))
    lines.append(
      f"| {VARIANT_NAMES.get(name, name)} | {step.get('rows', '?')}x{step.get('length', '?')} | "
      f"{_ms(median)} | {_ms(chained.get('step_seconds'))} ({chained.get('steps', '-')}) | "
      f"{number(chained.get('target_tokens_per_second'))} | "
      f"{', '.join(number(r, '.1f', 1e-12) for r in rates)} | "
      f"{number(own.get('kernels'))} | {thunks.launches_cell(own.get('host_launches'))} | "
      f"{number(own.get('bytes'), '.1f', 1e-9)} | "
      f"{number(own.get('flops'), '.2f', 1e-12)} | {_ms(own.get('floor_seconds'))} | "
      f"{_ratio(step.get('measured_over_floor'))} | {_ms(mode_floor)} | "
      f"{_ratio(median / mode_floor if mode_floor else None)} |"
    )
  lines += [
    "",
    "(est.): read off the optimized HLO (`compile/kernels.py`), not measured: the floor is each "
    "kernel's FLOPs at the chip's peak or its bytes at its bandwidth, whichever is longer, "
    "summed: a lower bound, not a predicted time. Host launches: the thunks the host runs a "
    "step (kernels, library calls, copies), a command buffer (CUDA graph) one for all of its "
    "own. "
    f"Chip: {'; '.join(sorted(chips)) or '-'}. "
    "The compile mode's program is compiled on the CPU for the target, without autotuning.",
  ]
  return lines


def _op_table(ops: dict, top: int) -> list[str]:
  """The costliest ops, each beside its kernel's floor where the program was read."""
  lines = [
    "| op | what | group | ms per step | calls per step | share of busy | floor ms (est.) "
    "| measured / floor | source |",
    "|---|---|---|---:|---:|---:|---:|---:|---|",
  ]
  for op in ops["ops"][:top]:
    predicted = op.get("predicted") or {}
    lines.append(
      f"| `{op['op'][:60]}` | {op.get('what', '')[:80]} | {op.get('group', '-')} | "
      f"{op['seconds_per_step'] * 1e3:.2f} | {op['calls_per_step']:.0f} | "
      f"{op['share_of_busy']:.1%} | {number(predicted.get('floor_seconds'), '.2f', 1e3)} | "
      f"{_ratio(op.get('over_floor'))} | {predicted.get('source', '-')} |"
    )
  return lines


def _grouped(rows: list[dict], key: str, title: str) -> list[str]:
  lines = [
    "",
    f"| {title} | ops | ms per step | share of busy | floor ms (est.) | measured / floor |",
    "|---|---:|---:|---:|---:|---:|",
  ]
  lines += [
    f"| {row[key]} | {row['ops']} | {row['seconds_per_step'] * 1e3:.2f} | "
    f"{number(row['share_of_busy'], '.1%')} | "
    f"{number(row['predicted_floor_seconds'], '.2f', 1e3)} | {_ratio(row['over_floor'])} |"
    for row in rows
  ]
  return lines


def op_times(records: dict, top: int = 10) -> list[str]:
  """Each traced train step's busy time beside its measured time, its costliest ops, and its
  ops grouped by kind and by source line, each beside the predicted floor of its kernels."""
  lines = []
  for name, record in (get(records, "speed", "steps") or {}).items():
    ops = record.get("op_times")
    if not ops:
      continue
    step = get(record, "step_seconds", "median")
    if "error" in ops or "skipped" in ops:
      why = f"failed: {ops['error']}" if "error" in ops else f"skipped: {ops['skipped']}"
      lines += ["", f"`{name}`: the trace {why}"]
      continue
    matched = ops.get("matched_share")
    lines += [
      "",
      f"### Where `{VARIANT_NAMES.get(name, name)}`'s step goes",
      "",
      f"{ops['traced_steps']} steps traced: {ops['busy_seconds_per_step'] * 1e3:.1f} ms busy per "
      f"step on the device, the step {_ms(step)} ms; {ops['distinct_ops']} "
      f"distinct ops (from {', '.join(ops['sources']) or 'nothing'})"
      + (f"; {matched:.1%} of the busy time in kernels of the program." if matched else "."),
      "",
      *_op_table(ops, top),
    ]
    if ops.get("groups"):
      lines += _grouped(ops["groups"], "group", "group")
    if ops.get("by_source"):
      lines += _grouped(ops["by_source"], "source", "source line")
  if lines:
    lines[:0] = [
      "",
      "## Where the train step's time goes",
      "",
      "Measured by the profiler; each op's floor (est.) is its kernel's, read off the program.",
    ]
  return lines
