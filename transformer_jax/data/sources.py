"""Parallel-text sources, all prepared as ArrayRecord and read through TFDS data sources.

Four kinds, chosen by `data.name` (no TensorFlow anywhere):
  * 'embedded' / 'embedded_tiny': the synthetic corpus of `embedded.py`, a TFDS
    builder in this package, generated into the data dir on first use;
  * 'wmt14_translate/de-en', 'wmt14_translate/fr-en', 'wmt17_translate/de-en':
    TFDS's WMT builders (download, or TFDS's manual dir, then prepare once);
  * 'text': the user's files `<prefix>.<lang>` (one sentence per line),
    converted once into the same form (`parallel_text.py`). Lines end at '\n'
    or '\r\n', the last one may lack it, and a UTF-8 byte-order mark at the
    start of a file is dropped. Missing or empty files, files of different
    line counts and two identical files are errors; a line pair with bytes
    that are not UTF-8, with a line over `parallel_text.MAX_LINE_BYTES` bytes,
    or with a side that is empty (or only white space) is skipped at
    conversion, and the skips are counted and logged with their line numbers;
  * 'multi30k', 'multi30k_tok': a copy of the Multi30k repository in
    data.manual_dir, converted once the same way (see `multi30k.py`).
`open_split` returns a `ParallelSource`: random access to (source, target) strings.
Several processes may prepare the same dataset at once (hosts sharing a data dir).

The text files, Multi30k's copy, WMT's manual dir and the data dir may be in a bucket (URLs
such as gs://), read through etils epath (gcsfs). A dataset whose data dir is in a bucket is
read from a copy on each machine (`local_copy_root`), made on first use: ArrayRecord would read
a bucket's file one example at a time, a request each, and it writes local files only, so a
dataset not yet in the bucket is prepared in that copy and then uploaded.
"""

import dataclasses
import importlib
import logging
import os
import shutil
import socket
import urllib.parse

import tensorflow_datasets as tfds
from etils import epath

from transformer_jax import fileio
from transformer_jax.data import embedded, multi30k, parallel_text
from transformer_jax.data.config import DataConfig
from transformer_jax.data.errors import DataError, DataUnavailableError
from transformer_jax.errors import FieldError

log = logging.getLogger(__name__)


_WMT_MODULES = {
  "wmt14_translate": "tensorflow_datasets.translate.wmt14",
  "wmt17_translate": "tensorflow_datasets.translate.wmt17",
}


@dataclasses.dataclass(frozen=True)
class ParallelSource:
  """Random access to the (source, target) sentence pairs of one split.

  Picklable, so Grain worker processes can read from it.
  """

  records: object  # a TFDS ArrayRecord data source of {language: bytes} dicts
  source_lang: str
  target_lang: str
  fingerprint: str  # identifies the split's contents and the direction

  def __len__(self):
    return len(self.records)

  def pairs(self, ids):
    """[(source text, target text)] for the example indices `ids`."""
    records = self.records.__getitems__([int(i) for i in ids])
    return [
      (r[self.source_lang].decode("utf-8"), r[self.target_lang].decode("utf-8")) for r in records
    ]

  def all_pairs(self, chunk: int = 4096):
    """Every (source text, target text) of the split, in order, read `chunk` at a time."""
    return [
      pair
      for start in range(0, len(self), chunk)
      for pair in self.pairs(range(start, min(start + chunk, len(self))))
    ]


class EmbeddedConfig(tfds.core.BuilderConfig):
  """Sizes and seed of one variant of the embedded corpus."""

  def __init__(self, *, sizes, seed, **kwargs):
    # Bump the version whenever embedded.py or embedded_lexicon.py changes what a seed generates.
    super().__init__(version=tfds.core.Version("1.0.0"), **kwargs)
    self.sizes = sizes
    self.seed = seed


class TransformerJaxEmbedded(tfds.core.GeneratorBasedBuilder):
  """The embedded synthetic parallel corpus (see `embedded.py`), in generation order."""

  BUILDER_CONFIGS = [
    EmbeddedConfig(
      name="full",
      seed=0,
      description="100k/2k/2k pairs",
      sizes={"train": 100_000, "validation": 2_000, "test": 2_000},
    ),
    EmbeddedConfig(
      name="tiny",
      seed=1,
      description="2k/200/200 pairs, for tests",
      sizes={"train": 2_000, "validation": 200, "test": 200},
    ),
  ]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Synthetic English-like to invented-language translation.",
      features=tfds.features.Translation(languages=(embedded.SOURCE_LANG, embedded.TARGET_LANG)),
      supervised_keys=(embedded.SOURCE_LANG, embedded.TARGET_LANG),
      disable_shuffling=True,
    )  # keep the generated order

  def _split_generators(self, dl_manager):
    del dl_manager
    corpus = embedded.generate_corpus(self.builder_config.seed, self.builder_config.sizes)
    return {split: self._generate_examples(pairs) for split, pairs in corpus.items()}

  def _generate_examples(self, pairs):
    for i, (src, tgt) in enumerate(pairs):
      yield i, {embedded.SOURCE_LANG: src, embedded.TARGET_LANG: tgt}


def _text_builder(c: DataConfig):
  languages = tuple(sorted((c.source_lang, c.target_lang)))
  files = {}
  for split, prefix in (
    ("train", c.text_train),
    ("validation", c.text_validation),
    ("test", c.text_test),
  ):
    if not prefix:
      continue
    base = fileio.absolute(prefix)
    paths = tuple(f"{base}.{lang}" for lang in languages)
    for p in paths:
      if not epath.Path(p).is_file():
        found = _names_starting(f"{base}.")
        raise FieldError(
          "data",
          f"text_{split}",
          f"={prefix!r}: no file {p} (expected "
          "<prefix>.<lang> for data.source_lang and data.target_lang; "
          f"{'found ' + ', '.join(found) if found else 'no <prefix>.* exists'}).",
        )
    files[split] = paths
  return parallel_text.builder(files, languages, c.data_dir)


def _names_starting(start: str) -> list[str]:
  """The paths (sorted) in the directory of `start` (a path or a URL) whose names begin with
  the last part of `start` (the files `<prefix>.*` for `<prefix>.`)."""
  start = epath.Path(start)
  try:
    entries = list(start.parent.iterdir())
  except OSError:  # Missing, not a directory, or not readable: nothing to list.
    return []
  return sorted(str(entry) for entry in entries if entry.name.startswith(start.name))


def _wmt_downloads(builder):
  """[(url, file name, size in bytes or None)] that preparing `builder` downloads."""
  wmt = importlib.import_module("tensorflow_datasets.translate.wmt")
  source = builder.builder_config.language_pair[0]
  infos = builder.url_infos or {}
  out = []
  for names in builder.subsets.values():
    for name in names:
      for url in wmt.DATASET_MAP[name].get_url(source):
        info = infos.get(url)
        filename = info.filename if info and info.filename else url.rsplit("/", 1)[-1]
        out.append((url, filename, int(info.size) if info else None))
  return sorted(set(out))


def _reachable(host, port):
  """Whether a TCP connection to host:port opens within a few seconds."""
  try:
    socket.create_connection((host, port), timeout=5).close()
    return True
  except OSError:
    return False


def _prepare_wmt(builder, manual_dir):
  """Download and prepare a WMT builder (as `_prepare`), or raise one clear DataUnavailableError."""
  downloads = _wmt_downloads(builder)
  missing = [d for d in downloads if not (epath.Path(manual_dir) / d[1]).exists()]
  hosts = sorted(
    {
      (u.hostname, u.port or (443 if u.scheme == "https" else 80))
      for u in (urllib.parse.urlparse(url) for url, _, _ in missing)
    }
  )
  unreachable = [h for h, p in hosts if not _reachable(h, p)]
  if unreachable:
    sizes = [size for _, _, size in missing]
    size = (
      "about " if None not in sizes else "more than "
    ) + f"{sum(s or 0 for s in sizes) / 1e9:.1f} GB"
    files = "\n".join(f"  {name}  <-  {url}" for url, name, _ in missing)
    raise DataUnavailableError(
      f"{builder.info.full_name} is not prepared in {builder.data_dir_root} and "
      f"cannot be downloaded: no network connection to {', '.join(unreachable)}. "
      f"Either run once with network access (it downloads {len(missing)} files, "
      f"{size}, then writes ArrayRecord files there), or download these files "
      f"elsewhere and put them in {manual_dir} (set by data.manual_dir):\n{files}"
    )
  # TFDS takes a file from the manual dir only if it knows the file's checksum;
  # some WMT files have none registered (wmt14's giga-fren, UN): add them.
  infos = builder.url_infos
  for url, name, _ in downloads:
    path = epath.Path(manual_dir) / name
    if infos is not None and url not in infos and path.exists():
      infos[url] = tfds.core.download.checksums.compute_url_info(path)
  log.info("Preparing %s (downloading %d files)", builder.info.full_name, len(missing))
  return _prepare(builder, download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))


def _prepare(builder, **kwargs) -> bool:
  """Prepare `builder`; False if it must be made again to read the data: another process
  finished preparing it first, or (a data dir in a bucket) it was prepared and uploaded."""
  if fileio.is_url(builder.data_dir_root):
    if builder.is_prepared():
      return True
    _prepare_and_upload(builder, **kwargs)
    return False
  try:
    builder.download_and_prepare(file_format="array_record", **kwargs)
  except FileExistsError:  # TFDS's final rename lost the race with another process.
    if not builder.is_prepared():
      raise
    log.info("%s was prepared by another process meanwhile", builder.info.full_name)
    return False
  except OSError as error:  # An unwritable data dir, an unreadable file, a full disk.
    raise DataError(
      f"cannot prepare {builder.info.full_name} in {builder.data_dir_root} (data.data_dir): {error}"
    ) from None
  return True


_INFO = "dataset_info.json"  # TFDS writes it last; a dataset is prepared once it is there.


def local_copy_root(url: str) -> str:
  """The local data dir that holds this machine's copies of the datasets of the data dir `url`
  (a bucket): $XDG_CACHE_HOME/transformer_jax/tfds/<scheme>/<bucket>/<path> (default
  ~/.cache/...)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  scheme, _, rest = url.partition("://")
  parts = [part for part in rest.split("/") if part not in ("", ".", "..")]
  return os.path.join(base, "transformer_jax", "tfds", scheme, *parts)


def _local_builder(builder):
  """The dataset of `builder`, whose data dir is in a bucket, in `local_copy_root` instead."""
  config = builder.builder_config
  return type(builder)(
    # A config of the class by its name: TFDS refuses an object named as one (once unpickled).
    config=config.name if config.name in type(builder).builder_configs else config,
    version=str(builder.version),
    data_dir=local_copy_root(str(builder.data_dir_root)),
    file_format="array_record",
  )


def _local_dir(builder) -> str:
  """The directory in `local_copy_root` of the version of `builder`'s dataset."""
  root = str(epath.Path(builder.data_dir_root))
  relative = str(builder.data_path).removeprefix(root).strip("/")
  return os.path.join(local_copy_root(str(builder.data_dir_root)), *relative.split("/"))


def _copy(source, target, what: str) -> None:
  """Copy the file `source` to `target` (epath paths) in 16 MiB pieces; DataError naming
  `what` when that fails."""
  try:
    with source.open("rb") as reader, target.open("wb") as writer:
      shutil.copyfileobj(reader, writer, 16 << 20)
  except OSError as error:
    raise DataError(
      f"cannot copy {source} to {target} ({what}): {getattr(error, 'strerror', None) or error}"
    ) from None


def _prepare_and_upload(builder, **kwargs) -> None:
  """Prepare `builder`, whose data dir is in a bucket, in `local_copy_root` (TFDS's ArrayRecord
  writer writes local files only), then upload its files: dataset_info.json, which makes it
  prepared (`is_prepared`), last, so that no process reads a part of it. Processes preparing it
  at once upload the same files."""
  local = _local_builder(builder)
  _prepare(local, **kwargs)
  prepared = epath.Path(local.data_path)
  names = sorted((path.name for path in prepared.iterdir()), key=lambda name: (name == _INFO, name))
  target = epath.Path(builder.data_path)
  log.info("Uploading %s (%d files) to %s", builder.info.full_name, len(names), target)
  for name in names:
    _copy(prepared / name, target / name, "data.data_dir")


def _local_copy(builder):
  """A builder reading this machine's copy of the prepared dataset of `builder`, whose data dir
  is in a bucket; copied first unless the copy's dataset_info.json is the bucket's."""
  remote = epath.Path(builder.data_path)
  local = epath.Path(_local_dir(builder))
  try:
    info = (remote / _INFO).read_bytes()
  except OSError as error:
    raise DataError(
      f"cannot read {remote / _INFO}: {getattr(error, 'strerror', None) or error}"
    ) from None
  if not ((local / _INFO).exists() and (local / _INFO).read_bytes() == info):
    names = sorted(path.name for path in remote.iterdir() if path.name != _INFO)
    log.info(
      "Copying %s (%d files) from %s to %s", builder.info.full_name, len(names), remote, local
    )
    local.mkdir(parents=True, exist_ok=True)
    (local / _INFO).unlink(missing_ok=True)
    for name in names:  # Each under a temporary name, then renamed: whole, or not there.
      partial = epath.Path(fileio.temporary_name(str(local / name)))
      try:
        _copy(remote / name, partial, "the local copy of data.data_dir")
        partial.replace(local / name)
      finally:
        partial.unlink(missing_ok=True)
    fileio.write_atomically(str(local / _INFO), info)
  return _local_builder(builder)


def get_builder(c: DataConfig):
  """The TFDS builder of `data.name`, with its data prepared (first use only)."""
  data_dir = c.data_dir or None
  if c.name.startswith("embedded"):
    builder = TransformerJaxEmbedded(
      config="tiny" if c.name == "embedded_tiny" else "full",
      data_dir=data_dir,
      file_format="array_record",
    )
    if not _prepare(builder):
      return get_builder(c)
  elif c.name == "text" or c.name in multi30k.NAMES:
    builder = _text_builder(c) if c.name == "text" else multi30k.builder(c)
    if not builder.is_prepared():
      for path_a, path_b in builder.builder_config.files.values():
        parallel_text.check_files(path_a, path_b)
      if not _prepare(builder):
        return get_builder(c)
  else:
    # TFDS registers the WMT builders only when their module is imported.
    importlib.import_module(_WMT_MODULES[c.name.split("/")[0]])
    builder = tfds.builder(c.name, data_dir=data_dir, file_format="array_record")
    if not builder.is_prepared():
      manual_dir = c.manual_dir or str(epath.Path(builder.data_dir_root) / "downloads" / "manual")
      if not _prepare_wmt(builder, manual_dir):
        return get_builder(c)
  return builder


def split_texts(c: DataConfig, split) -> tuple[list[str], list[str]]:
  """`(sources, targets)`: the texts of every pair of `split`, in order."""
  pairs = open_split(c, split).all_pairs()
  return [source for source, _ in pairs], [target for _, target in pairs]


def open_split(c: DataConfig, split):
  """The `split` of dataset `data.name` as a ParallelSource in the configured direction."""
  if c.name in multi30k.NAMES:
    split = multi30k.stored_split(c, split)
  builder = get_builder(c)
  if split not in builder.info.splits:
    if c.name == "text" and split in ("validation", "test"):
      raise FieldError(
        "data",
        f"text_{split}",
        f"={getattr(c, f'text_{split}')!r}: there is "
        f"no {split} split to read; set it to the prefix of the {split} files "
        "(or evaluate another split: data.eval_split, decode.split).",
      )
    raise DataError(
      f"{builder.info.full_name} has no split {split!r}: it has {' | '.join(builder.info.splits)}."
    )
  readable = _local_copy(builder) if fileio.is_url(builder.data_dir_root) else builder
  records = readable.as_data_source(split=split)
  fingerprint = (
    f"{builder.info.full_name}:{builder.data_dir}:{split}:"
    f"{len(records)}:{c.source_lang}->{c.target_lang}"
  )
  return ParallelSource(records, c.source_lang, c.target_lang, fingerprint)
