"""Every mistake a user can make with their data, settings or flags: each ends with one `error:`
line that says what to change, exit status 1, no traceback, and nothing compiled.

One row per mistake: what it is (as docs/training.md's table says it), how to make it (files
under a folder, then a config or the command line's arguments) and a fragment of the line the
user reads. The rows run in this process through the functions the command line runs:
`flag_errors.config_flag_problem` for the config file and its overrides, and `config.parse` then
`modes.run` under `main.reports_user_errors` for everything else. Two rows, mistakes that absl
itself reports, run `python -m transformer_jax.main` for its exit status. docs/training.md's
table of mistakes is checked against the lines the rows print.
"""

import dataclasses
import os
import pathlib
import re
from collections.abc import Callable

import jax
import pytest

import helpers
from transformer_jax import main
from transformer_jax.cli import flag_errors, modes
from transformer_jax.workdir import Workdir

_WORDS = (
  "the cat dog sees a house small big red runs",
  "die katze hund sieht ein haus klein gross rot läuft",
)
DOCS = helpers.REPO / "docs" / "training.md"
BEGIN, END = (
  "<!-- BEGIN mistakes: generated from tests/test_bad_inputs.py -->",
  "<!-- END mistakes -->",
)


def _corpus(folder, name="corpus", source=None, target=None, lines=40):
  """`<folder>/<name>.en` and `.de`: `lines` pairs of a few words each, or the given bytes."""
  en, de = (w.split() for w in _WORDS)
  made = [
    "".join(
      " ".join(words[(i + k) % len(words)] for k in range(2 + i % 5)) + "\n" for i in range(lines)
    )
    for words in (en, de)
  ]
  (folder / f"{name}.en").write_bytes(source if source is not None else made[0].encode())
  (folder / f"{name}.de").write_bytes(target if target is not None else made[1].encode())
  return folder / name


def _text(folder, **overrides):
  """Overrides of a tiny run on `_corpus(folder)`, its vocabulary trained into `folder`."""
  return {
    "data__source__name": "text",
    "data__source__source_lang": "en",
    "data__source__target_lang": "de",
    "data__source__text_train": _corpus(folder),
    "data__vocab__size": 60,
    "data__vocab__path": folder / "vocab.model",
    "data__source__data_dir": folder / "tfds",
    **overrides,
  }


def _no_get_config(folder):
  (folder / "mine.py").write_text("import ml_collections\nCONFIG = ml_collections.ConfigDict()\n")
  return folder / "mine.py"


def _config_of_before(folder):
  """A config file that reads a data setting by its name from before the sections (as the
  config.py of a work directory imported then did)."""
  (folder / "old.py").write_text(
    "from transformer_jax import config as config_lib\n\n\ndef get_config():\n"
    "  config = config_lib.default_config()\n"
    '  config.data["max_length"] = min(config.data["max_length"], 64)\n'
    "  return config\n"
  )
  return folder / "old.py"


def _a_file(folder):
  (folder / "a_file").write_text("not a directory\n")
  return folder / "a_file"


def _broken_checkpoint(folder):
  (folder / "run" / "checkpoints" / "5").mkdir(parents=True)
  (folder / "run" / "checkpoints" / "5" / "state").write_text("junk")
  return {}


@dataclasses.dataclass(frozen=True)
class Row:
  """A mistake (`what`, as the docs say it), how to make it in a folder, and a fragment of the
  line it ends with (`{d}`: the folder). `make` gives the config overrides of a tiny run (`__`
  for `.`), or with `flags` the command line's arguments; `cli` runs those through the command
  line. A row stops before anything compiles, or with `restores` (it reads checkpoints, placing
  them on the devices) before the train step compiles."""

  what: str
  make: Callable[[pathlib.Path], dict | list]
  fragment: str
  flags: bool = False
  cli: bool = False
  restores: bool = False


ROWS = [
  # Data.
  Row(
    "`data.vocab.size` more than the training text supports",
    lambda d: _text(d, data__vocab__size=1000),
    "config.data.vocab.size=1000 is more than the training text supports: set it to at most ",
  ),
  Row(
    "`data.vocab.size` too small for the text's characters",
    lambda d: _text(d, data__vocab__size=16),
    "config.data.vocab.size=16 is too small for the characters of the training text: set it "
    "to at least ",
  ),
  Row(
    "The same file (or text) for both languages",
    lambda d: _text(d, data__source__text_train=_corpus(d, "same", b"a b\nc d\n", b"a b\nc d\n")),
    "same.de and {d}/same.en are the same text",
  ),
  Row(
    "Files of different line counts",
    lambda d: _text(d, data__source__text_train=_corpus(d, "uneven", b"a\nb\n", b"x\n")),
    "uneven.de has 1 lines but",
  ),
  Row(
    "An empty file",
    lambda d: _text(d, data__source__text_train=_corpus(d, "empty", b"a\nb\n", b"")),
    "empty.de is empty",
  ),
  Row(
    "A `data.source.text_train` prefix without files",
    lambda d: _text(d, data__source__text_train=d / "missing"),
    "config.data.source.text_train='{d}/missing': no file {d}/missing.de",
  ),
  Row(
    "A language code the files do not have (`data.source.target_lang=fr` for `corpus.en`, "
    "`corpus.de`)",
    lambda d: _text(d, data__source__target_lang="fr"),
    "config.data.source.text_train='{d}/corpus': no file {d}/corpus.fr (expected <prefix>.<lang> "
    "for data.source.source_lang and data.source.target_lang; found {d}/corpus.de, {d}/corpus.en)",
  ),
  Row(
    "A language the dataset does not have",
    lambda d: {"data__source__source_lang": "de"},
    "config.data.source.source_lang='de' is invalid: allowed a language of embedded_tiny: en | sy",
  ),
  Row(
    "A `data.source.text_validation` (or `text_test`) prefix without files",
    lambda d: _text(d, data__source__text_validation=d / "dev"),
    "config.data.source.text_validation='{d}/dev': no file {d}/dev.de",
  ),
  Row(
    "Evaluation (`config.eval_every_steps`) of text data without `data.source.text_validation`",
    lambda d: _text(d, eval_every_steps=1),
    "config.data.source.text_validation='': there is no validation split to read",
  ),
  Row(
    "A `data.vocab.path` that is not a SentencePiece model",
    lambda d: {"data__vocab__path": _a_file(d)},
    "a_file is not a SentencePiece model",
  ),
  Row(
    "A `data.vocab.path` that is a directory",
    lambda d: {"data__vocab__path": d},
    "cannot read the vocabulary",
  ),
  # Settings.
  Row(
    "A value out of its range",
    lambda d: {"num_train_steps": 0},
    "config.num_train_steps must be a positive integer; got 0",
  ),
  Row(
    "A value that is none of the allowed ones",
    lambda d: {"data__batch__mode": "rows"},
    "config.data.batch.mode must be 'tokens' or 'packed' or 'padded'; got 'rows'",
  ),
  Row(
    "Settings that do not go together",
    lambda d: {"model__num_heads": 5},
    "config.model.d_k: d_model=32 is not divisible by num_heads=5",
  ),
  Row(
    "A mesh the devices do not make",
    lambda d: {"mesh__data": 3},
    "config.mesh={{'data': 3, 'fsdp': 1, 'tensor': 1}} needs 3 devices but 8 are present",
  ),
  # The work directory.
  Row(
    "A `--workdir` that is a file",
    lambda d: {"workdir": _a_file(d)},
    "--workdir={d}/a_file is a file, not a directory",
  ),
  Row(
    "A `--workdir` inside a file",
    lambda d: {"workdir": _a_file(d) / "run"},
    "cannot make the directory: Not a directory",
  ),
  Row(
    "A `--workdir` in a bucket that does not exist",
    lambda d: {"workdir": "gs://nobucket/run"},
    "--workdir=gs://nobucket/run: no such bucket, or this account may not see it",
  ),
  Row(
    "Checkpoints none of which can be restored",
    _broken_checkpoint,
    "--config.on_bad_checkpoints=start_over",
    restores=True,
  ),
  # The config file and the flags.
  Row(
    "A config file that does not exist",
    lambda d: ["--config=experiments/nope.py", "--config.seed=1"],
    "--config=experiments/nope.py: there is no file experiments/nope.py (the config files in "
    "experiments: default.py,",
    flags=True,
  ),
  Row(
    "A config file without `get_config`",
    lambda d: [f"--config={_no_get_config(d)}"],
    "--config={d}/mine.py: the file has no get_config()",
    flags=True,
  ),
  Row(
    "A variant the config file does not take",
    lambda d: ["--config=experiments/default.py:big"],
    "experiments/default.py takes no variant; drop ':big'",
    flags=True,
  ),
  Row(
    "A variant the config file does not know",
    lambda d: ["--config=experiments/wmt14.py:huge"],
    "unknown variant 'huge'; variants: base, big, big_enfr",
    flags=True,
  ),
  Row(
    "A misspelled field",
    lambda d: ["--config=experiments/default.py", "--config.data.vocab_sise=8"],
    "--config.data.vocab_sise: config.data has no field 'vocab_sise'; did you mean "
    "--config.data.vocab.size?",
    flags=True,
  ),
  Row(
    "A data setting by its name from before the sections",
    lambda d: ["--config=experiments/default.py", "--config.data.tokens_per_batch=8192"],
    "--config.data.tokens_per_batch is now --config.data.batch.tokens",
    flags=True,
  ),
  Row(
    "A config file that reads a data setting by its name from before the sections",
    lambda d: [f"--config={_config_of_before(d)}"],
    "(data.max_length is now data.batch.max_length)",
    flags=True,
  ),
  Row(
    "A field in the wrong section",
    lambda d: ["--config=experiments/default.py", "--config.beam_size=8"],
    "did you mean --config.decode.beam_size?",
    flags=True,
  ),
  Row(
    "A field that is nowhere near a known one",
    lambda d: ["--config=experiments/default.py", "--config.nonsense=3"],
    "config has no field 'nonsense'; its fields: adam_b1,",
    flags=True,
  ),
  Row(
    "A value of the wrong type",
    lambda d: ["--config=experiments/default.py", "--config.seed=abc"],
    "flag --config.seed=abc: invalid literal for int()",
    flags=True,
    cli=True,
  ),
  Row(
    "An unknown flag",
    lambda d: ["--config=experiments/default.py", "--wokrdir=x"],
    "Unknown command line flag 'wokrdir'",
    flags=True,
    cli=True,
  ),
]


def _train_in_process(folder: pathlib.Path, overrides: dict) -> tuple[str, list[str]]:
  """(the `error:` line, the programs compiled) of `--mode=train` of a tiny run with `overrides`,
  as `main.main` runs it once the flags are parsed."""
  overrides = {"num_train_steps": 1, **overrides}
  workdir = str(overrides.pop("workdir", folder / "run"))
  compiled = []

  def count(event, duration, fun_name="", **kwargs):
    del duration, kwargs
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(fun_name)

  def train():
    modes.run(
      ["train"], helpers.tiny_experiment(folder / "unused", **overrides), Workdir(workdir), ""
    )

  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    with pytest.raises(SystemExit) as exit_info:
      main.reports_user_errors(train)()
  finally:
    jax.monitoring.unregister_event_duration_listener(count)
  return exit_info.value.code, compiled


def _command_line(folder: pathlib.Path, arguments: list) -> tuple[str, int]:
  """(the `error:` line, 0) of `python -m transformer_jax.main`, which must exit with status 1
  and print nothing else that looks like an error or a compile."""
  result = helpers.python("-m", "transformer_jax.main", f"--workdir={folder / 'run'}", *arguments)
  output = result.stdout + result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 1 and len(errors) == 1, output[-3000:]
  assert "Traceback" not in output and "compiling" not in output, output[-3000:]
  return errors[0], []


def _error_line(row: Row, folder: pathlib.Path) -> tuple[str, int]:
  made = row.make(folder)
  if row.cli:
    return _command_line(folder, made)
  if row.flags:
    problem = flag_errors.config_flag_problem(["main", f"--workdir={folder / 'run'}", *made])
    assert problem is not None, row.what
    return f"error: {problem}", []
  return _train_in_process(folder, made)


@pytest.fixture(scope="module")
def lines(tmp_path_factory, gcs_server):
  """{row: (its folder, its error line)}, from the repository's root (config paths are
  relative to it); gs:// paths go to the tests' storage server."""
  del gcs_server
  cwd = os.getcwd()
  os.chdir(helpers.REPO)
  try:
    out = {}
    for row in ROWS:
      folder = tmp_path_factory.mktemp("mistake")
      line, compiled = _error_line(row, folder)
      if row.restores:
        assert "jit(train_step)" not in compiled, (row.what, line, compiled)
      else:
        assert compiled == [], (row.what, line, compiled)
      out[row.what] = folder, line
    return out
  finally:
    os.chdir(cwd)


@pytest.mark.parametrize("row", ROWS, ids=[row.what for row in ROWS])
def test_a_mistake_ends_in_one_error_line(lines, row):
  folder, line = lines[row.what]
  assert line.startswith("error: ") and "\n" not in line, line
  assert row.fragment.format(d=folder) in line, line


@pytest.mark.parametrize(
  "bucket, fragment",
  [
    ("tjtest-noauth", "the storage service found no credentials it accepts (Anonymous caller"),
    ("tjtest-readonly", "no permission to write there (reader@tjtest.iam.gserviceaccount.com"),
  ],
  ids=["without credentials", "read-only"],
)
def test_a_workdir_in_a_bucket_that_refuses_the_caller_ends_in_one_error_line(
  gcs_server, tmp_path, bucket, fragment
):
  """`gcs_stand_in`'s buckets that answer 401 and 403 as the service does; not rows of the table
  above, whose lines are the mistakes' table in docs/training.md."""
  del gcs_server
  workdir = f"gs://{bucket}/run"
  arguments = ["--mode=train", *helpers.flags(tmp_path, num_train_steps=1)]
  # The later --workdir wins; `_command_line` checks the exit status, the one line, and that
  # nothing compiled.
  line, _ = _command_line(tmp_path, [*arguments, f"--workdir={workdir}"])
  assert line.startswith(f"error: --workdir={workdir}: {fragment}"), line


def _table(lines) -> str:
  """docs/training.md's table of the mistakes and the lines they print (`D`: the folder)."""
  out = ["| Mistake | What the run prints |", "| --- | --- |"]
  for what, (folder, line) in lines.items():
    shown = re.sub(
      r"(its fields: [^,]+, [^,]+), .*", r"\1, ... (all of them)", line.replace(str(folder), "D")
    )
    out.append(f"| {what} | `{shown.replace('|', chr(92) + '|')}` |")
  return "\n".join(out)


def test_the_docs_table_of_mistakes_is_what_the_rows_print(lines):
  text = DOCS.read_text()
  assert BEGIN in text and END in text, f"{DOCS} lacks the markers of its table of mistakes"
  written = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
  table = _table(lines)
  if os.environ.get("TJ_WRITE_DOCS") and written != table:
    DOCS.write_text(text.replace(written, table))
    written = table
  assert written == table, (
    f"{DOCS}'s table of mistakes is stale; rewrite it with "
    f"TJ_WRITE_DOCS=1 ./launch.sh test {__file__}, or paste:\n{table}"
  )
