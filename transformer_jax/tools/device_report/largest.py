"""Stage d's second step: the `base` train step at the largest batch that the compile mode's fit
search (`prediction:compile`) says fits one device, run on it. If it runs out of memory, the step
says `did not fit`: a finding about the prediction (or about the memory a real run loses to
fragmentation and library workspaces, which no compiler counts)."""

import jax

from transformer_jax.tools.device_report import speed


def run(plan, step, result, context) -> None:
  del step
  if not plan.fit_search:
    result.not_applicable(f"the {plan.name} plan does not search for the largest batch")
    return
  prediction = context.earlier("prediction:compile")
  found = prediction.get("largest_batch")
  if not found or not found.get("rows"):
    why = (
      "the prediction step found no largest batch (see prediction.compile)"
      if prediction
      else "prediction:compile did not run in this report: run both (--stages=prediction)"
    )
    result.put(skipped=why, complete=True)
    return
  result.put(compile_mode_says=found)
  try:
    speed.measure(plan, "base", found["rows"], found["length"], plan.largest_timed_steps, result)
    result.put(ran=True)
  except jax.errors.JaxRuntimeError as error:
    result.put(ran=False, status="did not fit", error=str(error).splitlines()[0][:500])
