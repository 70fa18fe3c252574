"""The WMT sources: TFDS's builders 'wmt14_translate/de-en', 'wmt14_translate/fr-en' and
'wmt17_translate/de-en', downloaded (or taken from TFDS's manual dir, `data.source.manual_dir`) and
prepared once. Without a network connection, one error lists the files to download by hand."""

import importlib
import logging
import socket
import urllib.parse

import tensorflow_datasets as tfds
from etils import epath

from transformer_jax.data import tfds_prepare
from transformer_jax.data.errors import DataUnavailableError
from transformer_jax.data.source import Source

log = logging.getLogger(__name__)

# TFDS registers the WMT builders only when their module is imported.
_MODULES = {
  "wmt14_translate": "tensorflow_datasets.translate.wmt14",
  "wmt17_translate": "tensorflow_datasets.translate.wmt17",
}


def builder(c):
  """`Source.builder` of the WMT dataset `c.name`."""
  importlib.import_module(_MODULES[c.name.split("/")[0]])
  return tfds.builder(c.name, data_dir=c.data_dir or None, file_format="array_record")


def prepare(builder, c) -> bool:
  """`Source.prepare`: download (or take from the manual dir) and prepare, unless prepared."""
  if builder.is_prepared():
    return True
  manual_dir = c.manual_dir or str(epath.Path(builder.data_dir_root) / "downloads" / "manual")
  return _prepare(builder, manual_dir)


def downloads(builder):
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


def reachable(host, port):
  """Whether a TCP connection to host:port opens within a few seconds."""
  try:
    socket.create_connection((host, port), timeout=5).close()
    return True
  except OSError:
    return False


def _prepare(builder, manual_dir):
  """Download and prepare a WMT builder (as `tfds_prepare.prepare`), or raise one clear
  DataUnavailableError."""
  files = downloads(builder)
  missing = [d for d in files if not (epath.Path(manual_dir) / d[1]).exists()]
  hosts = sorted(
    {
      (u.hostname, u.port or (443 if u.scheme == "https" else 80))
      for u in (urllib.parse.urlparse(url) for url, _, _ in missing)
    }
  )
  unreachable = [h for h, p in hosts if not reachable(h, p)]
  if unreachable:
    sizes = [size for _, _, size in missing]
    size = (
      "about " if None not in sizes else "more than "
    ) + f"{sum(s or 0 for s in sizes) / 1e9:.1f} GB"
    listing = "\n".join(f"  {name}  <-  {url}" for url, name, _ in missing)
    raise DataUnavailableError(
      f"{builder.info.full_name} is not prepared in {builder.data_dir_root} and "
      f"cannot be downloaded: no network connection to {', '.join(unreachable)}. "
      f"Either run once with network access (it downloads {len(missing)} files, "
      f"{size}, then writes ArrayRecord files there), or download these files "
      f"elsewhere and put them in {manual_dir} (set by data.source.manual_dir):\n{listing}"
    )
  # TFDS takes a file from the manual dir only if it knows the file's checksum;
  # some WMT files have none registered (wmt14's giga-fren, UN): add them.
  infos = builder.url_infos
  for url, name, _ in files:
    path = epath.Path(manual_dir) / name
    if infos is not None and url not in infos and path.exists():
      infos[url] = tfds.core.download.checksums.compute_url_info(path)
  log.info("Preparing %s (downloading %d files)", builder.info.full_name, len(missing))
  return tfds_prepare.prepare(
    builder, download_config=tfds.download.DownloadConfig(manual_dir=manual_dir)
  )


SOURCES = tuple(
  Source(name, languages, builder, prepare)
  for name, languages in (
    ("wmt14_translate/de-en", ("de", "en")),
    ("wmt14_translate/fr-en", ("fr", "en")),
    ("wmt17_translate/de-en", ("de", "en")),
  )
)
