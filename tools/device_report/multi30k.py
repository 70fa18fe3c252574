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

from tools.device_report.bundle_data import missing_multi30k
from tools.device_report.end_to_end import run_experiment

GOAL_BLEU = 41.0
GOAL_SECONDS = 180.0
SPLITS = ("test_2016_flickr", "validation")
HOW_TO_CARRY = (
  "make the bundle with ./launch.sh device-bundle DIR --multi30k=<clone of "
  "https://github.com/multi30k/dataset>, or give --multi30k=<the directory holding data/task1>"
)


def run(plan, step, result, context) -> None:
  del step
  root = context.multi30k
  if not root:
    result.not_applicable(f"no Multi30k text here: {HOW_TO_CARRY}")
    return
  if lacking := missing_multi30k(root):
    result.not_applicable(f"{root} lacks {', '.join(lacking)}: {HOW_TO_CARRY}")
    return
  spec, overrides = plan.multi30k

  def test_known(split: str, record: dict) -> None:
    """The goal, once the test split's BLEU is known (validation may not end within the cap);
    with it the stage has brought back what it is for, and a second call need not run it."""
    if split == SPLITS[0]:
      result.put(
        goal=goal(plan.name, record.get("bleu_as_is"), record["known_after_seconds"]),
        brought_back=True,
      )

  run_experiment(
    spec,
    {**overrides, "data.source.manual_dir": str(pathlib.Path(root).resolve())},
    context.work / "multi30k",
    result,
    context,
    splits=SPLITS,
    on_split=test_known,
  )


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
