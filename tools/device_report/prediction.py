"""Stage d, the prediction beside the measurement: the compile mode's per-device memory of the
train steps that stage c runs, compiled on the CPU for the one-GPU target of this device
(`--target=1xh100`, or `1xh200`), and the largest batch of `base` it says fits (its fit search).
`plan.predicted` names the variants; `base` must come first.

Stage c's records carry the other prediction, the compiler's for the local
device; `prediction:largest` then runs the train step at the largest batch.
"""

from tools.device_report.speed import experiment_of
from transformer_jax.compile import programs, targets


def run(plan, step, result, context) -> None:
  del step
  target = targets.parse_target(context.target)
  try:
    targets.compile_devices(target)
  except targets.TargetError as error:
    result.not_applicable(str(error))
    return
  result.put(target=context.target, usable_bytes=target.chip.usable_bytes)
  compiled, compilers = {}, {}

  def predict(name):
    spec, overrides = plan.variants[name]
    compilers[name] = programs.Compiler(experiment_of(spec, overrides), target)
    compiled[name] = compilers[name].train(plan.rows, plan.length)
    result.put(programs={n: p.record(target) for n, p in compiled.items()})

  # The paper's two models first, then the fit search (several compiles of base, up to the chip's
  # memory), then the other variants.
  for name in plan.predicted[:2]:
    predict(name)
  if plan.fit_search:
    largest = programs.largest_batch(compilers["base"], compiled["base"])
    result.put(
      largest_batch={k: v for k, v in largest.items() if k != "program"},
      largest_program=largest.get("program"),
    )
  for name in plan.predicted[2:]:
    predict(name)
