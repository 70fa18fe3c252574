"""report.md: the stages' records as one page, the train steps measured beside the predictions."""

import time

from tools.device_report.markdown_time import VARIANT_NAMES, floor_rows, get, number, op_times

GIB = 2**30
# Goals on one H100 (docs/gpu.md says where they come from).
GOALS = {"base": 700_000, "big": 230_000}
MEMORY_GOAL = 0.10  # measured peak within 10% of the compile mode's prediction
CPU_BLEU = "95.68-96.08 (2-core CPUs)"


def _bytes(value) -> str:
  """Bytes in GiB, or MiB below 1 GiB."""
  if not value:
    return "-"
  return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.1f} MiB"


def _header(records: dict, plan) -> list[str]:
  env = get(records, "environment", "steps", "environment") or {}
  versions = env.get("versions") or {}
  gpus = get(env, "nvidia_smi", "gpus") or [{}]
  lines = [
    "# Device report",
    "",
    f"- Made {time.strftime('%Y-%m-%d %H:%M %Z')}, plan `{plan.name}`.",
    f"- Device: {env.get('device_count', '?')} x {env.get('device_kind', '?')} "
    f"(backend {env.get('backend', '?')}; {env.get('platform_version') or 'no platform version'}"
    f"; driver {gpus[0].get('driver_version', '-')}); memory limit "
    f"{_bytes(env.get('memory_bytes_limit'))}.",
    "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ".",
    f"- Python {env.get('python', '?')}; XLA_FLAGS `{env.get('xla_flags', '')}`.",
  ]
  bundle = env.get("bundle")
  if bundle:
    lines.append(
      f"- Installed from the bundle: {len(bundle['wheels'])} wheels into "
      f"{bundle['target']} in {bundle['seconds']:.1f} s; unmet requirements: "
      f"{', '.join(bundle.get('unmet', [])) or 'none'}."
    )
  return lines


def _stage_table(records: dict) -> list[str]:
  lines = [
    "",
    "## Stages",
    "",
    "| step | status | seconds | limit | note |",
    "|---|---|---|---|---|",
  ]
  for stage, record in records.items():
    for part, step in record["steps"].items():
      name = stage if part == stage else f"{stage}:{part}"
      note = next(
        (
          str(step[k]).splitlines()[0][:160]
          for k in ("reason", "not_applicable", "skipped", "error")
          if step.get(k)
        ),
        "",
      )
      lines.append(
        f"| {name} | {step['status']} | {step['seconds']:.0f} | "
        f"{step['limit_seconds']:.0f} | {note} |"
      )
  return lines


def _train_rows(records: dict) -> list[str]:
  speed = get(records, "speed", "steps") or {}
  largest = get(records, "prediction", "steps", "largest")
  predicted = get(records, "prediction", "steps", "compile", "programs") or {}
  target = get(records, "prediction", "steps", "compile", "target") or "target"
  lines = [
    "",
    "## Train steps: measured beside predicted",
    "",
    f"| train step | status | batch | compile s | step ms: median (min-max) | target tok/s "
    f"| goal | MFU vs matmul | MFU vs spec | peak memory | this device's compiler | "
    f"compile mode ({target}, CPU) | peak / compile mode |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  rows = list(speed.items()) + ([("largest", largest)] if largest else [])
  for name, step in rows:
    batch = f"{step.get('rows', '?')}x{step.get('length', '?')}"
    step_s = step.get("step_seconds") or {}
    median, low, high = (number(step_s.get(k), ".1f", 1e3) for k in ("median", "min", "max"))
    timing = f"{median} ({low}-{high})" if step_s else "-"
    mode = (
      get(predicted, name, "total_bytes")
      if name != "largest"
      else get(records, "prediction", "steps", "compile", "largest_program", "total_bytes")
    )
    peak = step.get("peak_bytes")
    ratio = (
      f"{peak / mode:.2f} ({'within' if abs(peak / mode - 1) <= MEMORY_GOAL else 'outside'}"
      f" {MEMORY_GOAL:.0%})"
      if peak and mode
      else "-"
    )
    goal = GOALS.get(name)
    lines.append(
      f"| {VARIANT_NAMES.get(name, name)} | {step['status']} | {batch} | "
      f"{number(step.get('compile_seconds'), '.1f')} | {timing} | "
      f"{number(step.get('target_tokens_per_second'))} | {number(goal)} | "
      f"{number(step.get('mfu_vs_measured_matmul'), '.1%')} | "
      f"{number(step.get('mfu_vs_spec'), '.1%')} | {_bytes(peak)} | "
      f"{_bytes(get(step, 'predicted_local', 'total_bytes'))} | {_bytes(mode)} | {ratio} |"
    )
  lines += [
    "",
    "target tok/s counts the batch's non-padding target tokens; MFU vs matmul is against the bf16 "
    "matmul measured in the step's own process right before its timing (below).",
  ]
  return lines


def _correctness(records: dict) -> list[str]:
  steps = get(records, "correctness", "steps") or {}
  lines = ["", "## Correct on the device", ""]
  attention = get(steps, "attention", "attention")
  if attention:
    lines.append(
      f"Fused attention ({attention['implementation']}, bf16, shape "
      f"{attention['shape']}) against {attention['reference']}; cuDNN calls in the "
      f"compiled HLO: {attention['cudnn_calls_in_hlo']}; all within tolerance: "
      f"{attention['ok']}."
    )
    lines += [
      "",
      "| mask | output error | gradient error (q, k, v) | empty rows zero | finite |",
      "|---|---|---|---|---|",
    ]
    for name, case in attention["cases"].items():
      grads = ", ".join(f"{v:.2e}" for v in case["gradient_errors"].values())
      lines.append(
        f"| {name} | {case['output_error']:.2e} | {grads} | "
        f"{case['empty_rows_zero'] and case['empty_rows_zero_dq']} "
        f"({case['empty_rows']} rows) | {case['finite']} |"
      )
  tests = get(steps, "tests", "device_tests")
  if tests:
    counts = ", ".join(f"{v} {k}" for k, v in sorted(tests["counts"].items())) or "none ran"
    workers = tests.get("workers", 1)
    processes = f"{workers} processes" if workers > 1 else "one process"
    lines += [
      "",
      f"Tests marked `device`: {counts} of {tests['collected']} collected ({tests['status']}), "
      f"in {processes}.",
    ]
    lines += [f"- failed: `{f['test']}`" for f in tests["failures"][:20]]
    not_run = tests.get("not_run") or []
    lines += [f"- did not run: `{test}`" for test in not_run[:20]]
    if (tests.get("not_run_count") or 0) > min(len(not_run), 20):
      lines.append(f"- and {tests['not_run_count'] - min(len(not_run), 20)} more that did not run")
  return lines


def _decoding_and_end_to_end(records: dict) -> list[str]:
  lines = ["", "## Decoding and trained models", ""]
  decoding = get(records, "decoding", "steps", "decoding") or {}
  for name, figures in (decoding.get("searches") or {}).items():
    lines.append(
      f"- {name} of `base`, {decoding['sentences']} sentences of "
      f"{decoding['source_length']} tokens to {decoding['output_length']}: "
      f"{figures['sentences_per_second']:,.1f} sentences/s, "
      f"{figures['tokens_per_second']:,.0f} tokens/s (compile and first call "
      f"{figures['compile_and_first_seconds']:.1f} s)."
    )
  for stage in ("end_to_end", "multi30k"):
    lines += _experiment_run(stage, get(records, stage, "steps", stage) or {})
  return lines


def _experiment_run(stage: str, run: dict) -> list[str]:
  """One experiment's run through train, average and eval: its splits' BLEU, speed, the wall
  time by part and what the compilation cache did."""
  if not run:
    return []
  if not run.get("splits"):
    note = run.get("not_applicable") or run.get("reason") or run.get("error") or ""
    return [f"- {stage}: {run.get('status')}{f' ({note})' if note else ''}"]
  overrides = run.get("overrides") or {}
  dtype = f" with {overrides['model.dtype']}" if "model.dtype" in overrides else ""
  scores = "; ".join(
    f"{name} BLEU {split['bleu']:.2f}"
    + (f", as is {split['bleu_as_is']:.2f}" if "bleu_as_is" in split else "")
    + f", perplexity {split['perplexity']:.3f} ({split['sentences']} sentences)"
    for name, split in run["splits"].items()
  )
  if stage == "end_to_end":
    scores += f" (CPU: {CPU_BLEU})"
  speeds = (
    f"{run['updates_per_second']:,.1f} updates/s, {run['target_tokens_per_second']:,.0f} "
    "target tok/s"
    if "updates_per_second" in run
    else f"{run['steps_per_second']:.1f} steps/s, data and vocabulary included"
  )
  parts = ", ".join(f"{k} {v:.1f}" for k, v in (run.get("wall_seconds_by_part") or {}).items())
  cache = run.get("compilation_cache")
  lines = [
    f"- `{run['experiment']}`{dtype} ({run['status']}): {run['steps']} steps, {speeds}; {scores}.",
    f"  Wall time by part (s): {parts}.",
    "  Compilation cache: "
    + (
      f"{cache['loaded']} of {cache['requests']} programs loaded from {cache['path']}, "
      f"{cache['backend_seconds']:.1f} s compiling or loading."
      if cache
      else "none."
    ),
  ]
  programs = (run.get("run_times") or {}).get("programs") or []
  if programs:
    lines.append(
      f"  First step {run['run_times']['first_step']:.1f} s after the run's start; "
      "train-step programs compiled: "
      + ", ".join(
        f"{'ahead' if p['step'] is None else 'step ' + str(p['step'])} {p['shape']} "
        f"{p['seconds']:.1f} s"
        for p in programs
      )
      + "."
    )
  goal = run.get("goal")
  if goal:
    lines.append(f"  Goal, {goal['goal']}: {goal['verdict']}.")
  return lines


def _second_call(missed: list[str], second: str) -> list[str]:
  if not missed:
    return []
  lines = ["", "## Not brought back", "", f"These steps did not end ok: {', '.join(missed)}."]
  if second:
    lines += ["", "A second call runs them:", "", f"    {second}"]
  return lines


def _verdict(value, goal, at_least: bool = True) -> str:
  if value is None:
    return "not measured"
  return "met" if (value >= goal if at_least else value <= goal) else "not met"


def _goals(records: dict) -> list[str]:
  """Each goal of docs/gpu.md with what was measured and whether it is met (on an H100)."""
  speed = get(records, "speed", "steps") or {}
  attention = get(records, "correctness", "steps", "attention", "attention") or {}
  predicted = get(records, "prediction", "steps", "compile", "programs") or {}
  kind = get(records, "environment", "steps", "environment", "device_kind") or ""
  lines = ["", "## Goals (one H100)", "", "| goal | measured | verdict |", "|---|---|---|"]
  goal = get(records, "multi30k", "steps", "multi30k", "goal")
  if goal:
    measured = "-" if goal["bleu_as_is"] is None else f"{goal['bleu_as_is']:.2f}"
    verdict = goal["verdict"]
    if goal["met"] is not None and "H100" not in kind:
      verdict = f"for an H100, not {kind or '?'}"
    lines.append(f"| Multi30k {goal['goal']} | {measured} in {goal['seconds']:.0f} s | {verdict} |")
  for name, goal in GOALS.items():
    tokens = get(speed, name, "target_tokens_per_second")
    verdict = _verdict(tokens, goal) if "H100" in kind else f"for an H100, not {kind or '?'}"
    lines.append(f"| `{name}` at least {goal:,} target tokens/s | {number(tokens)} | {verdict} |")
  ok = attention.get("ok")
  lines.append(
    f"| fused attention equal to the reference | "
    f"{'-' if ok is None else 'within tolerance' if ok else 'outside tolerance'} | "
    f"{'not measured' if ok is None else 'met' if ok else 'not met'} |"
  )
  for name in GOALS:
    peak, mode = get(speed, name, "peak_bytes"), get(predicted, name, "total_bytes")
    off = abs(peak / mode - 1) if peak and mode else None
    lines.append(
      f"| `{name}` peak memory within {MEMORY_GOAL:.0%} of the compile mode's | "
      f"{'-' if off is None else f'{off:.1%} off'} | "
      f"{_verdict(off, MEMORY_GOAL, at_least=False)} |"
    )
  return lines


def render(records: dict, plan, missed: list[str] = (), second: str = "") -> str:
  """The whole page; `missed`, the steps that did not end ok, and `second`, the command of a
  second call that runs them, at its end."""
  lines = (
    _header(records, plan)
    + _stage_table(records)
    + _goals(records)
    + _train_rows(records)
    + floor_rows(records)
    + op_times(records)
    + _correctness(records)
    + _decoding_and_end_to_end(records)
    + _second_call(list(missed), second)
  )
  return "\n".join(lines) + "\n"
