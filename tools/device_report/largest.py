"""Stage d's second step: the `base` train step at the largest batch that fits one device, timed
as stage c times its steps (`speed.measure`: the matmul beside it, steps back to back, its
executable's roofline floor).

The batch is the one the compile mode's fit search (`prediction:compile`) says
fits. Where that search has not ended (it runs on the CPU beside the device's
steps, and may still be compiling when this step's turn comes), the batch is
extrapolated from `speed:base`'s step on this device: its compiler's
temporaries grow with the rows, its arguments do not (`extrapolated_rows`, with
a margin); the record says which (`batch_from`). If it runs out of memory,
the step says `did not fit`: a finding about the prediction (or about the
memory a real run loses to fragmentation and library workspaces, which no
compiler counts)."""

import jax

from tools.device_report import speed

MARGIN = 0.9  # of the rows that the extrapolation says fill the device's memory
ROWS_MULTIPLE = 8


def extrapolated_rows(
  rows: int, total_bytes: int, temp_bytes: int, limit_bytes: int, multiple: int = ROWS_MULTIPLE
) -> int:
  """The rows whose step fills MARGIN of `limit_bytes`, if a step of `rows` rows needs
  `total_bytes` of which `temp_bytes` grow in proportion to the rows; rounded down to a
  `multiple`. 0 where not even the fixed part fits."""
  fixed = total_bytes - temp_bytes
  if rows <= 0 or temp_bytes <= 0 or limit_bytes <= fixed:
    return 0
  most = MARGIN * rows * (limit_bytes - fixed) / temp_bytes
  return int(most // multiple) * multiple


def _from_speed_base(context) -> dict | None:
  """The batch extrapolated from `speed:base` in this report and the device's memory limit
  (`environment`), or None where either is missing."""
  base = context.earlier("speed:base")
  local = base.get("predicted_local") or {}
  limit = context.earlier("environment").get("memory_bytes_limit")
  if not (local.get("total_bytes") and local.get("temp_bytes") and limit and base.get("rows")):
    return None
  rows = extrapolated_rows(base["rows"], local["total_bytes"], local["temp_bytes"], limit)
  return {"rows": rows, "length": base["length"], "limit_bytes": limit} if rows else None


def run(plan, step, result, context) -> None:
  del step
  if not plan.fit_search:
    result.not_applicable(f"the {plan.name} plan does not search for the largest batch")
    return
  prediction = context.earlier("prediction:compile")
  found = prediction.get("largest_batch")
  if found and found.get("rows"):
    result.put(compile_mode_says=found, batch_from="the compile mode's fit search")
  else:
    found = _from_speed_base(context)
    if not found:
      why = (
        "the prediction step found no largest batch (see prediction.compile), and speed:base "
        "left nothing to extrapolate from"
        if prediction
        else "neither prediction:compile nor speed:base ran in this report: run them "
        "(--stages=speed:base,prediction)"
      )
      result.put(skipped=why, complete=True)
      return
    result.put(
      extrapolated=found,
      batch_from=f"extrapolated from speed:base's compiled memory ({MARGIN:.0%} of the "
      "device's limit): the fit search gave none",
    )
  try:
    speed.measure(
      plan,
      "base",
      found["rows"],
      found["length"],
      plan.largest_timed_steps,
      result,
      chained_steps=plan.largest_timed_steps,
      target=context.target,
    )
    result.put(ran=True)
  except jax.errors.JaxRuntimeError as error:
    result.put(ran=False, status="did not fit", error=str(error).splitlines()[0][:500])
