"""Command line: convert Marian (OPUS-MT) models.

    python -m transformer_jax.pretrained import --marian=DIR --workdir=WORKDIR
    python -m transformer_jax.pretrained export --config=WORKDIR/config.py --workdir=WORKDIR \
        --output=DIR [--checkpoint=latest|averaged|best|STEP] [--config.<field>=<value>]

`import` writes WORKDIR/config.py, the tokenizer and the parameters (step 0),
ready for `python -m transformer_jax.main --config=WORKDIR/config.py
--workdir=WORKDIR --mode=translate|eval|train`. `export` writes a directory
that `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained`
load. A user's mistake ends with one `error: ...` line and status 1.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from transformer_jax import config as config_lib
from transformer_jax import experiment, fileio
from transformer_jax.errors import UserError
from transformer_jax.pretrained import convert
from transformer_jax.workdir import Workdir

_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "export: the experiment of the work directory (WORKDIR/config.py after "
  "import, or the config it was trained with).",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "The work directory.")
_MARIAN = flags.DEFINE_string(
  "marian",
  None,
  "import: the Marian directory (config.json, "
  "model.safetensors, source.spm, target.spm, vocab.json).",
)
_OUTPUT = flags.DEFINE_string("output", None, "export: the Marian directory to write.")
_CHECKPOINT = flags.DEFINE_string(
  "checkpoint", "latest", "export: the parameters: latest, a step number, averaged or best."
)
COMMANDS = ("import", "export")


def run(command: str) -> None:
  if _WORKDIR.value is None:
    raise UserError("--workdir is required")
  if command == "import":
    if _MARIAN.value is None:
      raise UserError("import needs --marian=DIR, the Marian model's directory")
    result = convert.import_marian(_MARIAN.value, Workdir(_WORKDIR.value))
    print(
      f"imported {result['parameters']:,} parameters; use "
      f"{convert.usage(result['config'], _WORKDIR.value)}"
    )
  else:
    if _CONFIG.value is None or _OUTPUT.value is None:
      raise UserError("export needs --config=FILE and --output=DIR")
    result = convert.export_marian(
      config_lib.parse(_CONFIG.value),
      Workdir(_WORKDIR.value),
      _OUTPUT.value,
      experiment.Checkpoint.parse(_CHECKPOINT.value),
    )
    print(f"exported {result['checkpoint']} to {result['directory']}")


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"give one command: {' or '.join(COMMANDS)}")
  fileio.list_stores_afresh()  # Checkpoints that runs wrote to the work directory.
  try:
    run(argv[1])
  except UserError as error:
    logging.debug("traceback of the error below", exc_info=True)
    sys.exit(f"error: {config_lib.user_message(error)}")


if __name__ == "__main__":
  app.run(main)
