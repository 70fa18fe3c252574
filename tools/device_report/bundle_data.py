"""Data the bundle carries beside its wheels, when asked: the Multi30k text the report's multi30k
stage reads, copied from a clone of github.com/multi30k/dataset (never downloaded here).

    ./launch.sh device-bundle DIR --multi30k=CLONE

copies the EN-DE tokenized files of train, val and test_2016_flickr (about 4 MB) into
`DIR/multi30k/data/task1/tok/` and lists each with its size and SHA-256 in `bundle.json`.
"""

import hashlib
import pathlib
import shutil

MULTI30K_DIR = "multi30k"
# The files `data.source.name=multi30k_tok` reads for EN -> DE (transformer_jax/data/multi30k.py).
MULTI30K_FILES = tuple(
  f"data/task1/tok/{file}.lc.norm.tok.{lang}"
  for file in ("train", "val", "test_2016_flickr")
  for lang in ("en", "de")
)


class MissingDataError(Exception):
  """A file the bundle is to carry is not where it should be; the message says which."""


def missing_multi30k(root: str) -> list[str]:
  """The files of MULTI30K_FILES that `root` (the directory holding data/task1) lacks."""
  return [f for f in MULTI30K_FILES if not (pathlib.Path(root) / f).is_file()]


def copy_multi30k(clone: str, directory: str) -> list[dict]:
  """Copy MULTI30K_FILES from `clone` (the directory holding data/task1) into
  `directory`/MULTI30K_DIR, replacing what was there; return [{file, bytes, sha256}].
  MissingDataError, before anything is copied, when `clone` lacks one of them."""
  source = pathlib.Path(clone)
  if missing := missing_multi30k(clone):
    raise MissingDataError(
      f"{clone} is not a clone of github.com/multi30k/dataset with the tokenized text: it lacks "
      f"{', '.join(missing)}"
    )
  out = pathlib.Path(directory) / MULTI30K_DIR
  shutil.rmtree(out, ignore_errors=True)
  listed = []
  for name in MULTI30K_FILES:
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / name, out / name)
    data = (out / name).read_bytes()
    listed.append({"file": f"{MULTI30K_DIR}/{name}", "bytes": len(data), "sha256": _sha256(data)})
  return listed


def changed(directory: str, listed: list[dict]) -> list[str]:
  """The files of `listed` (bundle.json's `data`, under `directory`) that are missing or whose
  bytes are not those listed: a copy cut short on its way to the GPU machine."""
  paths = {item["file"]: pathlib.Path(directory) / item["file"] for item in listed}
  return [
    item["file"]
    for item in listed
    if not paths[item["file"]].is_file()
    or _sha256(paths[item["file"]].read_bytes()) != item["sha256"]
  ]


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def carry(directory: str, multi30k: str | None) -> list[dict]:
  """What `copy_multi30k` lists where `multi30k` names a clone; else [], with the Multi30k copy
  of an earlier bundle in `directory` removed (the bundle carries only what it was asked for)."""
  if multi30k:
    return copy_multi30k(multi30k, directory)
  shutil.rmtree(pathlib.Path(directory) / MULTI30K_DIR, ignore_errors=True)
  return []
