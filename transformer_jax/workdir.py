"""Every path under a work directory, in one object."""

import os

from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import UserError


class Workdir:
  """The files of one experiment run: a local path or a URL such as `gs://bucket/run`.

  checkpoints/<step>/   Orbax train checkpoints (train state, data position, fingerprints)
  averaged/<step>/      the mean of the last checkpoints' parameters (`--mode=average`)
  best/<step>/          the parameters of the best validation BLEU; best.json says which
  eval/                 hypotheses and scores of `--mode=eval`
  tensorboard/          event files
  vocab/                the SentencePiece vocabulary and its length tables
  vocab/marian/         an imported Marian model's tokenizer files (`transformer_jax.pretrained`)
  config.py             the experiment an import wrote (`--config=<workdir>/config.py`)
  config.txt            the config of the latest training run
  lock.json             the training run that holds the directory (`hosts.workdir_lock.WorkdirLock`)
  hosts/                each process's heartbeat while it runs (`hosts.liveness.Heartbeat`)
  """

  __slots__ = ("root",)

  def __init__(self, path: str):
    self.root = fileio.absolute(path)  # Made absolute once, against the directory of the moment.

  def __repr__(self) -> str:
    return f"Workdir({self.root!r})"

  def __eq__(self, other) -> bool:
    return isinstance(other, Workdir) and other.root == self.root

  def __hash__(self) -> int:
    return hash(self.root)

  def _path(self, *parts: str) -> str:
    return os.path.join(self.root, *parts)

  @property
  def checkpoints(self) -> str:
    return self._path("checkpoints")

  @property
  def averaged(self) -> str:
    return self._path("averaged")

  @property
  def best(self) -> str:
    return self._path("best")

  @property
  def best_json(self) -> str:
    return self._path("best.json")

  @property
  def tensorboard(self) -> str:
    return self._path("tensorboard")

  @property
  def vocab(self) -> str:
    return self._path("vocab")

  @property
  def marian_vocab(self) -> str:
    return self._path("vocab", "marian")

  @property
  def imported_config(self) -> str:
    return self._path("config.py")

  @property
  def config_file(self) -> str:
    return self._path("config.txt")

  @property
  def lock_file(self) -> str:
    return self._path("lock.json")

  @property
  def hosts(self) -> str:
    return self._path("hosts")

  def heartbeat_file(self, process: int) -> str:
    """`hosts/process_<process>.json`."""
    return os.path.join(self.hosts, f"process_{process}.json")

  def eval_file(self, name: str) -> str:
    """`eval/<name>`: e.g. `test-averaged-beam4.txt`."""
    return self._path("eval", name)

  def compile_report(self, target: str) -> str:
    """The JSON report of `--mode=compile --target=<target>`."""
    return self._path("compile", f"{target.replace(':', '_')}.json")

  def create(self) -> None:
    """Make the directory if needed; UserError if it cannot be made, is not a directory or is
    not writable (in a bucket: written to and checked once, `fileio.check_store`)."""
    if fileio.is_url(self.root):
      try:
        fileio.check_store(self.root)
      except UserError as error:
        raise UserError(f"--workdir={error}") from None
    if fileio.is_file(self.root):
      raise UserError(f"--workdir={self.root} is a file, not a directory")
    try:
      epath.Path(self.root).mkdir(parents=True, exist_ok=True)
    except OSError as error:
      raise UserError(
        f"--workdir={self.root}: cannot make the directory: {error.strerror or error}"
      ) from None
    if not fileio.is_url(self.root) and not os.access(self.root, os.W_OK):
      raise UserError(f"--workdir={self.root} is not writable")
