"""The measured train step beside what its own program predicts: the kernels, HBM bytes, FLOPs and
roofline floor read off the optimized HLO of the very executable that ran (`compile/kernels.py`;
estimates, never measurements), the ratio of the measured time to that floor, and the profile's
ops (`op_times.py`) matched to the kernels they are, grouped by kind and by source line.

The floor of a kernel is the longer of its FLOPs at the chip's peak and its
bytes at the chip's memory bandwidth, all its launches together: a lower bound
on its time, not a predicted time. A measured/floor ratio of 1 would be a step
that runs every kernel at the roofline.
"""

import collections

from transformer_jax.compile import kernels as kernels_lib
from transformer_jax.compile.targets import Chip
from transformer_jax.compile.thunks import Thunks

TOP_OPS = 20  # ops kept in the JSON, most time first
TOP_SOURCES = 10  # source lines kept, most time first
UNMATCHED = "not a kernel of the program"  # the group of an op the HLO does not name
NO_SOURCE = "no source line in the HLO"


def program_kernels(
  hlo_text: str, chip: Chip, chip_basis: str, program: str, read: Thunks | None = None
) -> tuple[dict, dict]:
  """`(record, kernels by name)`: `kernels.summary` of a program's optimized HLO against `chip`'s
  peak and bandwidth, labelled with what the program is and why that chip (a JSON-ready dict of
  estimates); and by HLO instruction name, what the kernel of that name predicts per call of
  the program (`by_name`)."""
  found, loops = kernels_lib.read_kernels(hlo_text, read)
  summary = kernels_lib.summary(found, loops, chip.peak_flops, chip.memory_bandwidth, read)
  record = {
    "program": program,
    "chip": chip.name,
    "chip_basis": chip_basis,
    "peak_flops": chip.peak_flops,
    "memory_bandwidth": chip.memory_bandwidth,
    **summary,
  }
  return record, by_name(found, chip)


def by_name(found: list[kernels_lib.Kernel], chip: Chip) -> dict:
  """Per HLO instruction name, its kernels' predicted launches, bytes, FLOPs and floor per call of
  the program, with its category and source: a loop body that two loops run counts in both."""
  named = {}
  for kernel in found:
    entry = named.setdefault(
      kernel.name,
      {
        "category": kernel.category,
        "launches": 0,
        "bytes": 0,
        "flops": 0.0,
        "floor_seconds": 0.0,
        "source": kernel.source,
      },
    )
    entry["launches"] += kernel.launches
    entry["bytes"] += kernel.bytes * kernel.launches
    entry["flops"] += kernel.flops * kernel.launches
    entry["floor_seconds"] += kernel.floor_seconds(chip.peak_flops, chip.memory_bandwidth)
  return named


def over(measured: float | None, floor: float | None) -> float | None:
  """measured / floor, or None where either is missing or the floor is not positive."""
  if measured is None or not floor or floor <= 0:
    return None
  return measured / floor


def group_of(kernel: dict | None, what: str) -> str:
  """The group of an op: its kernel's category with the fusion's kind or the custom call's
  target (`gemm __cublas$lt$matmul`, `gemm kCustom`, `fusion kLoop`, `cudnn
  __cudnn$fmhaSoftmaxBackward`), read off `what` (`op_times.describe`); UNMATCHED without one."""
  if kernel is None:
    return UNMATCHED
  words = what.split(" ")
  detail = (
    words[1] if len(words) > 2 and not words[1].startswith("(") and "[" not in words[1] else ""
  )
  return f"{kernel['category']} {detail}".strip()


def _totals(rows: list[dict], busy: float) -> dict:
  seconds = sum(r["seconds_per_step"] for r in rows)
  floors = [r["predicted"]["floor_seconds"] for r in rows if r["predicted"]]
  floor = sum(floors) if floors else None
  return {
    "ops": len(rows),
    "seconds_per_step": seconds,
    "share_of_busy": seconds / busy if busy else None,
    "predicted_floor_seconds": floor,
    "over_floor": over(seconds, floor),
  }


def attribute(ops: list[dict], busy: float, kernels: dict) -> dict:
  """The profile's ops (every one of them, `op_times.summarize` with `top=None`) beside the
  kernels of the program that ran (`by_name`): each op with its kernel's predicted launches,
  bytes, FLOPs, floor and source (None where the HLO has no such instruction) and its
  measured/floor; the ops
  grouped by `group_of` and by source line, each group's measured time beside its kernels'
  floor, most time first. Returns `ops` (the TOP_OPS costliest), `groups`, `by_source` (the
  TOP_SOURCES costliest lines) and `matched_share` (the share of the busy time in ops that are
  kernels of the program)."""
  rows = []
  for op in ops:
    predicted = kernels.get(op["op"])
    rows.append(
      {
        **op,
        "group": group_of(predicted, op.get("what", "")),
        "predicted": predicted,
        "over_floor": over(op["seconds_per_step"], predicted and predicted["floor_seconds"]),
      }
    )
  rows.sort(key=lambda r: -r["seconds_per_step"])
  by_group, by_source = collections.defaultdict(list), collections.defaultdict(list)
  for row in rows:
    by_group[row["group"]].append(row)
    source = row["predicted"] and (row["predicted"]["source"] or NO_SOURCE)
    by_source[source or UNMATCHED].append(row)
  ranked = lambda groups, key: sorted(
    ({key: name, **_totals(members, busy)} for name, members in groups.items()),
    key=lambda g: -g["seconds_per_step"],
  )
  matched = sum(r["seconds_per_step"] for r in rows if r["predicted"])
  return {
    "ops": rows[:TOP_OPS],
    "groups": ranked(by_group, "group"),
    "by_source": ranked(by_source, "source")[:TOP_SOURCES],
    "matched_share": matched / busy if busy else None,
  }
