"""Every mistake a user can make with their data or their flags, through the command line: each
ends with exit status 1 and one `error:` line that says what to change, no traceback, and
before anything compiles.

One row per mistake: what it is, how to make it (files under `tmp_path`, then the command line's
arguments), and a fragment of the message the user sees.
"""

import concurrent.futures
import subprocess
import sys

import pytest

import helpers

_WORDS = ("the cat dog sees a house small big red runs", "die katze hund sieht ein haus klein "
          "gross rot läuft")


def _corpus(folder, name="corpus", source=None, target=None, lines=40):
  """`<folder>/<name>.en` and `.de`: `lines` pairs of a few words each, or the given bytes."""
  en, de = (w.split() for w in _WORDS)
  made = ["".join(" ".join(words[(i + k) % len(words)] for k in range(2 + i % 5)) + "\n"
                  for i in range(lines)) for words in (en, de)]
  (folder / f"{name}.en").write_bytes(source if source is not None else made[0].encode())
  (folder / f"{name}.de").write_bytes(target if target is not None else made[1].encode())
  return folder / name


def _text(folder, **overrides):
  """Overrides of a tiny run on `_corpus(folder)`, its vocabulary trained into `folder`."""
  return {"data__name": "text", "data__source_lang": "en", "data__target_lang": "de",
          "data__text_train": _corpus(folder), "data__vocab_size": 60,
          "data__vocab_path": folder / "vocab.model", "data__data_dir": folder / "tfds",
          **overrides}


def _tiny(shared, folder, *extra, **overrides):
  """The arguments of a tiny run (`helpers.flags` of `shared`) in `folder/run`, then `extra`."""
  return [f"--workdir={folder / 'run'}", *helpers.flags(shared, **overrides), *extra]


def _no_get_config(folder):
  (folder / "mine.py").write_text("import ml_collections\nCONFIG = ml_collections.ConfigDict()\n")
  return folder / "mine.py"


def _a_file(folder):
  (folder / "a_file").write_text("not a directory\n")
  return folder / "a_file"


CASES = [
    # Data.
    ("a vocabulary larger than the text supports",
     lambda shared, d: _tiny(shared, d, **_text(d, data__vocab_size=1000)),
     "config.data.vocab_size=1000 is more than the training text supports: set it to at most "),
    ("a vocabulary too small for the characters",
     lambda shared, d: _tiny(shared, d, **_text(d, data__vocab_size=16)),
     "config.data.vocab_size=16 is too small for the characters of the training text: set it "
     "to at least "),
    ("the same file for both languages",
     lambda shared, d: _tiny(shared, d, **_text(
         d, data__text_train=_corpus(d, "same", b"a b\nc d\n", b"a b\nc d\n"))),
     "same.de and {d}/same.en are the same text"),
    ("files of different line counts",
     lambda shared, d: _tiny(shared, d, **_text(
         d, data__text_train=_corpus(d, "uneven", b"a\nb\n", b"x\n"))),
     "uneven.de has 1 lines but"),
    ("an empty file",
     lambda shared, d: _tiny(shared, d, **_text(
         d, data__text_train=_corpus(d, "empty", b"a\nb\n", b""))),
     "empty.de is empty"),
    ("a language code the files do not have",
     lambda shared, d: _tiny(shared, d, **_text(d, data__target_lang="fr")),
     "config.data.text_train='{d}/corpus': no file {d}/corpus.fr (expected <prefix>.<lang> for "
     "data.source_lang and data.target_lang; found {d}/corpus.de, {d}/corpus.en)"),
    ("a language the dataset does not have",
     lambda shared, d: _tiny(shared, d, data__source_lang="de"),
     "config.data.source_lang='de' is invalid: allowed a language of embedded_tiny: en | sy"),
    ("a validation prefix with no files",
     lambda shared, d: _tiny(shared, d, **_text(d, data__text_validation=d / "dev")),
     "config.data.text_validation='{d}/dev': no file {d}/dev.de"),
    ("evaluation without a validation split",
     lambda shared, d: _tiny(shared, d, **_text(d, eval_every_steps=1)),
     "config.data.text_validation='': there is no validation split to read"),
    ("a vocab_path that is a text file",
     lambda shared, d: _tiny(shared, d, data__vocab_path=_a_file(d)),
     "a_file is not a SentencePiece model"),
    ("a workdir that is a file",
     lambda shared, d: [f"--workdir={_a_file(d)}", *helpers.flags(shared)],
     "--workdir={d}/a_file is a file, not a directory"),
    # The config file and the flags.
    ("a config file that does not exist",
     lambda shared, d: ["--workdir=x", "--config=experiments/nope.py", "--config.seed=1"],
     "--config=experiments/nope.py: there is no file experiments/nope.py (the config files in "
     "experiments: default.py,"),
    ("a config file without get_config",
     lambda shared, d: ["--workdir=x", f"--config={_no_get_config(d)}"],
     "--config={d}/mine.py: the file has no get_config()"),
    ("a variant the config file does not take",
     lambda shared, d: ["--workdir=x", "--config=experiments/default.py:big"],
     "experiments/default.py takes no variant; drop ':big'"),
    ("a variant the config file does not know",
     lambda shared, d: ["--workdir=x", "--config=experiments/wmt14.py:huge"],
     "unknown variant 'huge'; variants: base, big, big_enfr"),
    ("a misspelled field",
     lambda shared, d: _tiny(shared, d, "--config.data.vocab_sise=8"),
     "--config.data.vocab_sise: config.data has no field 'vocab_sise'; did you mean "
     "--config.data.vocab_size?"),
    ("a field in the wrong section",
     lambda shared, d: _tiny(shared, d, "--config.beam_size=8"),
     "did you mean --config.decode.beam_size?"),
    ("a field that is nowhere",
     lambda shared, d: _tiny(shared, d, "--config.nonsense=3"),
     "config has no field 'nonsense'; its fields: adam_b1,"),
    ("a value of the wrong type",
     lambda shared, d: _tiny(shared, d, "--config.seed=abc"),
     "flag --config.seed=abc: invalid literal for int()"),
    ("an unknown flag",
     lambda shared, d: _tiny(shared, d, "--wokrdir=x"),
     "Unknown command line flag 'wokrdir'"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """{row: (folder, finished process)} of every row, run four at a time (each is mostly start-up).

  The tiny runs' shared corpus and vocabulary are never reached: every row stops before them.
  """
  unused = tmp_path_factory.mktemp("unused")

  def run(case):
    folder = tmp_path_factory.mktemp("case")
    return folder, subprocess.run(
        [sys.executable, "-m", "transformer_jax.main", *case[1](unused, folder)],
        cwd=helpers.REPO, env=helpers.environment(), capture_output=True, text=True, timeout=300)

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return dict(zip((case[0] for case in CASES), pool.map(run, CASES)))


@pytest.mark.parametrize("row, fragment", [(case[0], case[2]) for case in CASES],
                         ids=[case[0] for case in CASES])
def test_a_mistake_ends_in_one_error_line(results, row, fragment):
  folder, result = results[row]
  output = result.stdout + result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 1 and len(errors) == 1, output[-3000:]
  assert fragment.format(d=folder) in errors[0], output[-3000:]
  assert "Traceback" not in output and "compiling" not in output, output[-3000:]
