"""The command line of `training_curves`: our training and the PyTorch reference, side by side.

  python -m tools.compare_training --config=experiments/multi30k.py:tiny \\
      --config.data.source.manual_dir=DIR --workdir=DIR --updates=600 --out=curves.json \\
      [--reference_init=fairseq|copied] [--reference_device=cpu|cuda] [--plot=curves.png]

Our model trains on jax's first device; the reference on --reference_device.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from tools.torch_training import INITS
from tools.training_curves import compare, plot
from transformer_jax import config as config_lib
from transformer_jax.errors import UserError
from transformer_jax.workdir import Workdir

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "The experiment (experiments/*.py:variant)."
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Where the experiment's vocabulary is made or kept."
)
_UPDATES = flags.DEFINE_integer("updates", 600, "Updates of each model.", lower_bound=1)
_INIT = flags.DEFINE_enum(
  "reference_init",
  "fairseq",
  list(INITS),
  "The reference's initial parameters: fairseq's initialisation, or a copy of ours.",
)
_DEVICE = flags.DEFINE_string(
  "reference_device", "cpu", "The torch device the reference trains on: cpu, cuda, cuda:1 ..."
)
_OUT = flags.DEFINE_string("out", "training_curves.json", "The JSON of both curves.")
_PLOT = flags.DEFINE_string("plot", None, "Also draw the curves to this PNG (needs matplotlib).")
_LOG_EVERY = flags.DEFINE_integer(
  "log_every", 50, "Log and write the JSON every this many updates.", lower_bound=1
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    experiment = config_lib.parse(_CONFIG.value)
    result = compare(
      experiment,
      Workdir(_WORKDIR.value),
      updates=_UPDATES.value,
      reference_init=_INIT.value,
      reference_device=_DEVICE.value,
      log_every=_LOG_EVERY.value,
      out=_OUT.value,
    )
  except UserError as error:  # Config, data and workdir mistakes: one line.
    sys.exit(f"error: {config_lib.user_message(error)}")
  if _PLOT.value:
    plot(
      {
        "transformer_jax": result["ours"]["loss"],
        f"PyTorch reference ({_INIT.value} init)": result["reference"]["loss"],
      },
      _PLOT.value,
      title=f"{experiment.model.norm}-LN",
    )


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
