"""Files, local paths and URLs such as gs:// alike: written whole (a reader, another process or
host or a run after a crash, sees the old content or the new one, never a part); lines of UTF-8
text in and out, with one clear error for a file that cannot be read or written; JSON records.
"""

import json
import logging
import os
import re
import socket
import sys
import threading
import uuid

import jax
from etils import epath

from transformer_jax.errors import UserError, first_line


def list_stores_afresh() -> None:
  """Make every gs:// listing of this process ask the store. gcsfs keeps each directory listing
  it made for the life of the process (fsspec's listings cache), blind to what other processes,
  or TensorStore in this one (Orbax's checkpoints), wrote since: a committed step or a heartbeat
  file would go unseen. This sets fsspec's configuration, the process's own (a value set before
  is kept), so the library never calls it: the command line does, once, before it runs, and a
  program of one's own that reads a bucket others write calls it before its first gs:// access
  (docs/library.md)."""
  try:
    import fsspec  # pylint: disable=import-outside-toplevel  # With gcsfs: the `gcs` extra.
  except ImportError:  # Then no gs:// path can be read either.
    return
  fsspec.config.conf.setdefault("gs", {}).setdefault("use_listings_cache", False)


def is_url(path) -> bool:
  """Whether `path` names an object in a store (gs://bucket/x, s3://...), not a local file."""
  return "://" in str(path)


# How long a first request to an object store may take before the store is taken as not
# answering (gcsfs retries a refused connection for about half a minute by itself).
STORE_TIMEOUT_SECONDS = 60.0


def check_store(url: str, timeout: float | None = None) -> None:
  """Write a small object under `url` and remove it, so that a store that cannot be used fails
  here, in one line naming `url` and what to do: no client installed, no bucket, no permission,
  no answer within `timeout` seconds (default STORE_TIMEOUT_SECONDS)."""
  timeout = STORE_TIMEOUT_SECONDS if timeout is None else timeout
  outcome = []

  probe_path = epath.Path(temporary_name(f"{url.rstrip('/')}/probe"))

  def probe():
    try:
      probe_path.write_bytes(b"")
    except Exception as error:  # Handed to the caller's thread below.
      outcome.append(error)
      return
    try:
      probe_path.unlink(missing_ok=True)
      outcome.append(None)
    except Exception as error:
      outcome.append(
        UserError(
          f"{url}: wrote {probe_path.name} there but cannot remove it: {_service_message(error)}"
        )
      )

  worker = threading.Thread(target=probe, daemon=True)  # A hung request must not block exit.
  # gcsfs logs a refused request at ERROR with its traceback; the UserError below says it in one
  # line, and the probe is the only request at this point of a run.
  quiet = _DropErrors()
  logging.getLogger("gcsfs").addFilter(quiet)
  try:
    worker.start()
    worker.join(timeout)
  finally:
    logging.getLogger("gcsfs").removeFilter(quiet)
  if not outcome:
    raise UserError(
      f"{url}: the storage server did not answer within {timeout:.0f} s: check the network, "
      "the credentials, and STORAGE_EMULATOR_HOST if you use a server of your own"
    )
  error = outcome[0]
  if error is None:
    return
  if isinstance(error, ImportError):
    raise UserError(f"{url}: {error} (pip install 'transformer_jax[gcs]')") from None
  if isinstance(error, FileNotFoundError):
    raise UserError(f"{url}: no such bucket, or this account may not see it") from None
  if isinstance(error, UserError):
    raise error
  refusal = _refusal(error)
  if refusal == 401:
    raise UserError(
      f"{url}: the storage service found no credentials it accepts ({_service_message(error)}): "
      "sign in with gcloud auth application-default login, or set "
      "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file"
    ) from None
  if refusal == 403:
    raise UserError(
      f"{url}: no permission to write there ({_service_message(error)}): give this account a "
      "role that may create and delete objects in the bucket (e.g. roles/storage.objectUser), "
      "or use other credentials (GOOGLE_APPLICATION_CREDENTIALS) or another bucket"
    ) from None
  raise UserError(f"{url}: cannot write there: {first_line(error)}") from None


class _DropErrors(logging.Filter):
  """Lets through only the records below ERROR."""

  def filter(self, record):
    return record.levelno < logging.ERROR


def _refusal(error: Exception) -> int | None:
  """401 (no credentials, or none the service accepts) or 403 (the account may not do it) where
  `error` is the storage service refusing the caller, else None. gcsfs raises a 403 as an
  OSError "Forbidden: <request URL>" with the service's message on its next line, a 401 as its
  HttpError with `code` 401."""
  code = getattr(error, "code", None)
  if code in (401, 403):
    return code
  text = str(error)
  if isinstance(error, PermissionError) or text.startswith("Forbidden"):
    return 403
  if re.search(r"\b401\b|Unauthorized", text):
    return 401
  if re.search(r"\b403\b|Forbidden", text):
    return 403
  return None


def _service_message(error: Exception) -> str:
  """What the service said in refusing, on one line: without the request's URL that gcsfs puts
  before a 403's message, nor the ", <status>" it puts after a 401's."""
  text = str(error).strip()
  if text.startswith("Forbidden: ") and "\n" in text:
    text = text.split("\n", 1)[1]
  text = re.sub(r",\s*40[13]$", "", text.strip())
  return " ".join(text.split())[:400] or type(error).__name__


def is_file(path) -> bool:
  """Whether `path` is a file; in a store, an object of exactly that name, in one lookup (one
  `info`), False where the store cannot say. Not etils' `is_file`, which is `exists() and not
  is_dir()`: in a bucket, another process's object under a directory can vanish between those
  two lookups, and the directory then reads as a file."""
  if not is_url(path):
    return os.path.isfile(path)
  import fsspec  # pylint: disable=import-outside-toplevel  # With gcsfs: the `gcs` extra.

  store, name = fsspec.url_to_fs(str(path))
  return store.isfile(name)


def absolute(path) -> str:
  """`path` made absolute against the working directory, unless it is a URL (Orbax needs absolute
  paths, and `os.path.abspath` would make `gs://b/x` a local `<cwd>/gs:/b/x`)."""
  return str(path) if is_url(path) else os.path.abspath(path)


def temporary_name(path: str) -> str:
  """A name beside `path` that no other process, on any host, writes."""
  head, tail = os.path.split(str(path))
  return os.path.join(head, f".{tail}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}")


def write_atomically(path: str, content: bytes | str) -> None:
  """Write `content` (text as UTF-8) to `path`, making its directory if needed: on a file system,
  written beside it under a temporary name, then renamed over it; in an object store (a URL),
  uploaded in one request, since an object appears whole when its upload ends (and a store's
  rename is a copy and a delete, not atomic)."""
  data = content.encode("utf-8") if isinstance(content, str) else content
  target = epath.Path(path)
  if is_url(path):
    target.write_bytes(data)
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  temporary = epath.Path(temporary_name(str(target)))
  try:
    temporary.write_bytes(data)
    temporary.replace(target)
  except BaseException:  # The write or the rename failed: leave nothing beside the file.
    temporary.unlink(missing_ok=True)
    raise


def read_lines(path: str | None) -> list[str]:
  """The lines of the file at `path` (stdin for None or '-'), split at '\\n', as UTF-8 text.

  A final '\\n' ends the last line rather than starting an empty one. Raises
  UserError for an unreadable file, or naming the first line (1-based) that
  is not valid UTF-8.
  """
  name = "stdin" if path in (None, "-") else path
  try:
    raw = sys.stdin.buffer.read() if name == "stdin" else epath.Path(path).read_bytes()
  except OSError as error:
    raise UserError(f"cannot read the input {name}: {error.strerror}") from None
  pieces = raw.split(b"\n")
  if pieces[-1] == b"":
    pieces.pop()
  lines = []
  for number, piece in enumerate(pieces, 1):
    try:
      lines.append(piece.decode("utf-8"))
    except UnicodeDecodeError as error:
      raise UserError(
        f"{name}, line {number}: not valid UTF-8 (byte 0x{piece[error.start]:02x} at byte "
        f"{error.start + 1} of the line); the input must be UTF-8 text"
      ) from None
  return lines


def write_lines(path: str | None, lines) -> None:
  """Write `lines`, each ending in '\\n', as UTF-8 to the file at `path` (stdout for None or '-').

  Process 0 only. The file's directory is made if needed; `path` may be a URL
  such as gs://. Written in place, so that a device or a pipe (/dev/stdout,
  /dev/fd/N) or a symbolic link can be the output.
  """
  if jax.process_index() != 0:
    return
  data = "".join(line + "\n" for line in lines).encode("utf-8")
  if path in (None, "-"):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return
  try:
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
  except OSError as error:
    raise UserError(f"cannot write the output {path}: {error.strerror}") from None


_REQUIRED = object()


def read_json(path, missing=_REQUIRED):
  """The JSON value of the file at `path` (a local path or a URL such as gs://); `missing` when
  there is no file there, if given (a file holding `null` reads as None too). Raises UserError
  naming the path for a file that is absent (without `missing`), unreadable or not JSON."""
  try:
    text = epath.Path(path).read_text(encoding="utf-8")
  except FileNotFoundError:
    if missing is _REQUIRED:
      raise UserError(f"cannot read {path}: no such file") from None
    return missing
  except (OSError, UnicodeDecodeError) as error:
    raise UserError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
  try:
    return json.loads(text)
  except ValueError as error:
    raise UserError(f"{path} is not valid JSON: {error}") from None


def write_json(path, record, *, every_process: bool = False) -> None:
  """Write `record` as indented UTF-8 JSON to `path` (a local path or a URL) whole
  (`write_atomically`); by process 0 alone unless `every_process`. Raises UserError naming the
  path when it cannot be written."""
  if not every_process and jax.process_index() != 0:
    return
  try:
    write_atomically(str(path), json.dumps(record, indent=2, ensure_ascii=False) + "\n")
  except OSError as error:
    raise UserError(f"cannot write {path}: {error.strerror or error}") from None
