"""Stage g, Multi30k: `experiments/multi30k.py:tiny` (the literature's Transformer-Tiny recipe,
its settings untouched) through train, average and eval of test_2016_flickr and validation with
the averaged checkpoint, in one process and a fresh work directory (`end_to_end.run_experiment`):
the wall time split by part, training updates/s and target tokens/s, BLEU as is and sacreBLEU of
both splits, and the goal: test BLEU as is of at least GOAL_BLEU within GOAL_SECONDS of the
stage's start, compiling included (on the full plan; the tiny plan's shrunken run says nothing of
it).

The tokenized EN-DE text comes from `--multi30k` (the directory holding `data/task1`, as the
bundle carries it: `./launch.sh device-bundle DIR --multi30k=CLONE`); nothing is downloaded.
"""

import pathlib

from tools.device_report.end_to_end import run_experiment
from transformer_jax.data import multi30k as multi30k_data

GOAL_BLEU = 41.0
GOAL_SECONDS = 180.0
SPLITS = ("test_2016_flickr", "validation")
SOURCE, TARGET = "en", "de"
FILES = tuple(
  multi30k_data.relative_path("multi30k_tok", multi30k_data.SPLITS[split][0], lang)
  for split in ("train", *SPLITS)
  for lang in (SOURCE, TARGET)
)
HOW_TO_CARRY = (
  "no Multi30k text here: make the bundle with ./launch.sh device-bundle DIR "
  f"--multi30k=<clone of {multi30k_data.URL}>, or give --multi30k=<the directory holding "
  "data/task1>"
)


def run(plan, step, result, context) -> None:
  del step
  root = context.multi30k
  missing = [f for f in FILES if not root or not (pathlib.Path(root) / f).is_file()]
  if missing:
    why = HOW_TO_CARRY if not root else f"{root} lacks {', '.join(missing)}; {HOW_TO_CARRY}"
    result.not_applicable(why)
    return
  spec, overrides = plan.multi30k
  record = run_experiment(
    spec,
    {**overrides, "data.source.manual_dir": str(pathlib.Path(root).resolve())},
    context.work / "multi30k",
    result,
    context,
    splits=SPLITS,
  )
  test = record["splits"][SPLITS[0]]
  result.put(goal=goal(plan.name, test.get("bleu_as_is"), test["known_after_seconds"]))


def goal(plan_name: str, bleu_as_is: float | None, seconds: float) -> dict:
  """The goal's record: test BLEU as is `bleu_as_is`, known `seconds` after the stage's start."""
  record = {
    "goal": f"test_2016_flickr BLEU as is >= {GOAL_BLEU} within {GOAL_SECONDS:.0f} s of the "
    "stage's start, compiling included",
    "bleu_as_is": bleu_as_is,
    "seconds": round(seconds, 1),
  }
  if plan_name != "full":
    return {**record, "met": None, "verdict": f"not applicable on the {plan_name} plan"}
  met = bleu_as_is is not None and bleu_as_is >= GOAL_BLEU and seconds <= GOAL_SECONDS
  return {**record, "met": met, "verdict": "met" if met else "not met"}
