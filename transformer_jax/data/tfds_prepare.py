"""Preparing a source's TFDS builder as ArrayRecord, and data dirs in a bucket.

Several processes may prepare the same dataset at once (hosts sharing a data dir): one wins
TFDS's final rename, the others read what it wrote. A dataset whose data dir is in a bucket (a
URL such as gs://) is read from a copy on each machine (`local_copy_root`), made on first use:
ArrayRecord would read a bucket's file one example at a time, a request each, and it writes
local files only, so a dataset not yet in the bucket is prepared in that copy and then uploaded.
"""

import logging
import os
import shutil

from etils import epath

from transformer_jax import fileio
from transformer_jax.data.errors import DataError

log = logging.getLogger(__name__)

_INFO = "dataset_info.json"  # TFDS writes it last; a dataset is prepared once it is there.


def prepare(builder, **kwargs) -> bool:
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
      f"cannot prepare {builder.info.full_name} in {builder.data_dir_root} "
      f"(data.source.data_dir): {error}"
    ) from None
  return True


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
  prepare(local, **kwargs)
  prepared = epath.Path(local.data_path)
  names = sorted((path.name for path in prepared.iterdir()), key=lambda name: (name == _INFO, name))
  target = epath.Path(builder.data_path)
  log.info("Uploading %s (%d files) to %s", builder.info.full_name, len(names), target)
  for name in names:
    _copy(prepared / name, target / name, "data.source.data_dir")


def readable(builder):
  """`builder`, prepared, or where its data dir is in a bucket a builder reading this machine's
  copy of its dataset, copied first unless the copy's dataset_info.json is the bucket's."""
  if not fileio.is_url(builder.data_dir_root):
    return builder
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
        _copy(remote / name, partial, "the local copy of data.source.data_dir")
        partial.replace(local / name)
      finally:
        partial.unlink(missing_ok=True)
    fileio.write_atomically(str(local / _INFO), info)
  return _local_builder(builder)
