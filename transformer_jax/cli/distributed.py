"""Whether a run connects several processes, and connecting them (`jax.distributed`)."""

import dataclasses
import os

import jax
from absl import logging


def launched_on_several_processes(environ=os.environ) -> bool:
  """Whether the environment says several processes were started (coordinator or SLURM tasks)."""
  return bool(environ.get("JAX_COORDINATOR_ADDRESS")) or int(environ.get("SLURM_NTASKS", "1")) > 1


@dataclasses.dataclass(frozen=True)
class Coordination:
  """The flags --distributed (`mode`: auto, on or off), --coordinator_address, --num_processes
  and --process_id; None leaves a value to `jax.distributed`'s detection."""

  mode: str = "auto"
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None

  def wanted(self, environ=os.environ) -> bool:
    """Whether this run connects several processes."""
    explicit = self.coordinator_address is not None or self.num_processes is not None
    return self.mode == "on" or (
      self.mode == "auto" and (explicit or launched_on_several_processes(environ))
    )

  def initialize(self, timeout_seconds: int) -> None:
    """Connect the processes; one silent for `timeout_seconds` is lost."""
    jax.distributed.initialize(
      coordinator_address=self.coordinator_address,
      num_processes=self.num_processes,
      process_id=self.process_id,
      heartbeat_timeout_seconds=timeout_seconds,
    )
    logging.info(
      "process %d of %d; %d local and %d global devices",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
    )
