"""The compile report as the terminal shows it, and the one line that says what does not fit."""

from transformer_jax.compile import targets

_COLUMNS = (
  "program",
  "compile s",
  "args GiB",
  "temp GiB",
  "code GiB",
  "total GiB",
  "of usable",
  "compiler TFLOP",
  "model TFLOP",
  "est. step s",
  "est. tokens/s",
  "est. MFU",
)
# GPU targets: the kernels read off the optimized HLO (kernels.py), estimates all.
_GPU_COLUMNS = ("kernels", "1x1x1 grid", "HBM GB", "est. floor ms")


def _gib(value) -> str:
  return f"{value / targets.GIB:.2f}"


def _maybe(value, spec: str) -> str:
  return "-" if value is None else format(value, spec)


def _kernel_cells(kernels: dict | None) -> tuple[str, ...]:
  if not kernels:
    return ("-",) * len(_GPU_COLUMNS)
  return (
    f"{kernels['kernels']:,}",
    f"{kernels['one_block_kernels']:,}",
    f"{kernels['bytes'] / 1e9:.1f}",
    f"{kernels['floor_seconds'] * 1e3:.1f}",
  )


def columns(record: dict) -> tuple[str, ...]:
  """The table's header: the GPU columns only for a GPU target."""
  return _COLUMNS + (_GPU_COLUMNS if record["target"]["platform"] == "gpu" else ())


def rows(record: dict) -> list[tuple[str, ...]]:
  """One row of strings per program of a report record (`Report.record()`)."""
  usable = record["target"]["usable_bytes"]
  gpu = record["target"]["platform"] == "gpu"
  out = []
  for p in record["programs"]:
    estimate = p["compiler_estimate"] or {}
    model = p["model_flops_per_device"]
    out.append(
      (
        p["name"],
        f"{p['compile_seconds']:.1f}",
        _gib(p["argument_bytes"]),
        _gib(p["temp_bytes"]),
        _gib(p["code_bytes"]),
        (">" if p["refused"] else "") + _gib(p["total_bytes"]),
        "refused"
        if p["refused"]
        else f"{p['total_bytes'] / usable:.0%}" + ("" if p["fits"] else " NO"),
        _maybe(p["flops"] and p["flops"] / 1e12, ".3g"),
        _maybe(model and model / 1e12, ".3g"),
        _maybe(estimate.get("step_seconds"), ".4f"),
        _maybe(estimate.get("tokens_per_second"), ",.0f"),
        _maybe(estimate.get("mfu"), ".1%"),
      )
      + (_kernel_cells(p.get("kernels")) if gpu else ())
    )
  return out


def format_report(record: dict) -> str:
  """The report as lines of text: the target, the parameters, then a table of the programs."""
  t, params = record["target"], record["parameters"]
  lines = [
    f"target {t['name']} ({t['topology']}): {t['chips']} x {t['chip']} on {t['hosts']} "
    f"host(s); {_gib(t['usable_bytes'])} GiB usable per chip of {_gib(t['memory_bytes'])}, "
    f"{t['peak_flops'] / 1e12:.0f} TFLOP/s bf16 peak ({t['source']})",
    f"mesh {record['mesh']}, rules {record['sharding_rules']}, attention "
    f"{record['attention']}; {params['count']:,} parameters x 12 bytes (float32 + Adam) = "
    f"{_gib(params['state_bytes_total'])} GiB, {_gib(params['state_bytes_per_device'])} GiB "
    f"per device; batches read by {record['data_shards']} host(s)",
  ]
  header = columns(record)
  table = [header, *rows(record)]
  widths = [max(len(row[i]) for row in table) for i in range(len(header))]
  for row in table:
    lines.append(
      "  ".join(
        cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
      )
    )
  bases = sorted({p["estimate_basis"] for p in record["programs"]})
  lines.append("estimates (est.): " + "; ".join(bases))
  if record["target"]["platform"] == "gpu":
    lines.append(
      "kernels, 1x1x1 grid, HBM GB (operands + outputs of every kernel) and est. floor ms "
      "(each kernel at peak FLOP/s or memory bandwidth): read off the optimized HLO, "
      "estimates, not measurements"
    )
    for p in record["programs"]:
      unknown = [x for x in (p.get("kernels") or {}).get("loops", []) if x["trips"] is None]
      if unknown:
        lines.append(
          f"{p['name']}: {len(unknown)} loop(s) of unknown trip count, each body counted once"
        )
  lines.append(f"compiled {len(record['programs'])} programs in {record['compile_seconds']:.0f} s")
  largest = record["largest_batch"]
  if largest is not None:
    lines.append(_largest_line(largest))
  return "\n".join(lines)


def _largest_line(largest: dict) -> str:
  if not largest["value"]:
    return "no batch fits: even the fewest rows are too many"
  line = (
    f"largest batch that fits: {largest['field']}={largest['value']} "
    f"({largest['rows']}x{largest['length']}; {largest['compiles']} extra compiles)"
  )
  estimate = (largest.get("program") or {}).get("compiler_estimate")
  if estimate:
    line += (
      f", estimated {estimate['step_seconds']:.4f} s/step, "
      f"{estimate['tokens_per_second']:,.0f} tokens/s"
    )
  return line


def does_not_fit(record: dict) -> str | None:
  """The one line that says which program does not fit, what it needs and what would fit; None
  when every program fits."""
  too_big = [p for p in record["programs"] if not p["fits"]]
  if not too_big:
    return None
  worst = max(too_big, key=lambda p: (p["refused"] != "", p["total_bytes"]))
  t = record["target"]
  needs = (
    f"more than {_gib(worst['total_bytes'])} GiB per device (the compiler refused it)"
    if worst["refused"]
    else f"{_gib(worst['total_bytes'])} GiB per device"
  )
  line = (
    f"{worst['name']} needs {needs}; a {t['chip']} of {t['name']} has "
    f"{_gib(t['usable_bytes'])} GiB usable"
  )
  if len(too_big) > 1:
    line += f" ({len(too_big)} programs do not fit)"
  largest = record["largest_batch"]
  if worst["kind"] == "train" and largest is not None:
    line += "; " + (
      f"the largest {largest['field']} that fits is {largest['value']}"
      if largest["value"]
      else "no batch fits: shard the parameters (sharding_rules fsdp or tp) or use a larger target"
    )
  elif worst["kind"] in ("beam", "greedy"):
    line += "; lower config.decode.batch_size"
  elif worst["kind"] == "eval":
    line += "; lower config.data.batch.eval_size"
  return line
