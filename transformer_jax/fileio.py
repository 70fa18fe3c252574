"""Writing a file whole: a reader (another process or host, or a run after a crash) sees the old
content or the new one, never a part. Local paths and URLs such as gs:// alike."""

import os
import socket
import uuid

from etils import epath


def temporary_name(path: str) -> str:
  """A name beside `path` that no other process, on any host, writes."""
  head, tail = os.path.split(str(path))
  return os.path.join(head, f".{tail}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex}")


def write_atomically(path: str, content: bytes | str) -> None:
  """Write `content` (text as UTF-8) to `path`, making its directory if needed: written beside
  it under a temporary name, then renamed over it."""
  target = epath.Path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  temporary = epath.Path(temporary_name(str(target)))
  try:
    if isinstance(content, str):
      temporary.write_text(content, encoding="utf-8")
    else:
      temporary.write_bytes(content)
    temporary.replace(target)
  except BaseException:  # The write or the rename failed: leave nothing beside the file.
    temporary.unlink(missing_ok=True)
    raise
