"""docs/config.md: every field of an experiment config and every flag of the command line, written
from their declarations (the settings classes' schema and `transformer_jax.main`'s flags).

    python -m tools.config_reference    # rewrites docs/config.md
"""

import pathlib

from absl import app, flags

from transformer_jax import main as main_lib
from transformer_jax import schema
from transformer_jax.experiment import Experiment

PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "config.md"

_INTRO = """\
# Config reference

Every field of an experiment config and every flag of `python -m transformer_jax.main`
(`./launch.sh MODE ...`), with its default, the values it allows and what it does. This page is
generated from the code: `python -m tools.config_reference` rewrites it, and
`tests/test_config.py` fails when it is stale.

A config file (`experiments/*.py`) starts from these defaults (`transformer_jax.config.
default_config()`) and sets what its experiment changes; any field can then be overridden on
the command line, `--config.<field>=<value>` (`--config.data.batch.size=4096`). Every value is
checked before anything compiles, and a mistake ends the run with one line naming the field and
what it allows. [training.md](training.md) says how the experiments use them.
"""

_SECTIONS = {
  "": "Training, checkpoints, evaluation and the optimizer (`config.<field>`)",
  "model": (
    "The model (`config.model.<field>`; presets of the paper: "
    "`transformer_jax.config.model_fields(preset)`)"
  ),
  "data.source": "The data's source (`config.data.source.<field>`; see [data.md](data.md))",
  "data.vocab": "Its vocabulary (`config.data.vocab.<field>`; see [data.md](data.md))",
  "data.batch": "Its batches (`config.data.batch.<field>`; see [data.md](data.md))",
  "decode": "Search and evaluation (`config.decode.<field>`)",
  "mesh": "The device mesh (`config.mesh.<field>`; see [multihost.md](multihost.md))",
}


def _cell(text: str) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _value(value) -> str:
  return "(derived)" if value is None else f"`{value!r}`"


def _fields() -> list[str]:
  rows = {section: [] for section in _SECTIONS}
  for path, default, allowed, help_ in schema.describe(Experiment):
    section, _, name = path.rpartition(".")
    rows[section].append(f"| `{name}` | {_value(default)} | {_cell(allowed)} | {_cell(help_)} |")
  out = []
  for section, title in _SECTIONS.items():
    out += [
      f"## {title}",
      "",
      "| Field | Default | Allowed | What it does |",
      "| --- | --- | --- | --- |",
      *rows.pop(section),
      "",
    ]
  if rows:
    raise ValueError(f"settings sections without a title here: {', '.join(rows)}")
  return out


def _flags() -> list[str]:
  out = [
    "## Command-line flags",
    "",
    "`--config` and `--workdir` are required; `--verbosity=1` (absl's) shows the config, "
    "debug logs and the traceback behind an `error:` line.",
    "",
    "| Flag | Default | What it does |",
    "| --- | --- | --- |",
  ]
  for flag in flags.FLAGS.get_flags_for_module(main_lib):
    default = "" if flag.default is None else f"`{flag.default_as_str.strip(chr(39))}`"
    out.append(f"| `--{flag.name}` | {default} | {_cell(flag.help)} |")
  return out + [""]


def render() -> str:
  """The whole of docs/config.md."""
  return "\n".join([_INTRO, *_fields(), *_flags()])


def main(argv):
  del argv
  PATH.write_text(render())
  print(f"wrote {PATH}")


if __name__ == "__main__":
  app.run(main)
