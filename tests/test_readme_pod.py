"""The README's pod example, run on this machine: its command line as the README gives it, on two
processes whose environment says what a cluster's would (SLURM's variables: what
`--distributed=on` reads through `jax.distributed`'s detection, as a TPU VM's metadata), with the
bucket of the tests' GCS server for `$BUCKET` and a tiny run's overrides after it (the WMT data
and the big model are not here; the data directory is in the bucket too)."""

import hashlib
import os
import pathlib
import random
import re
import shlex
import socket
import subprocess
import sys

import pytest
from etils import epath

import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS = 4


def pod_command() -> str:
  """The command each host of the README's pod example runs, on one line."""
  readme = (helpers.REPO / "README.md").read_text()
  block = re.search(r"On a TPU VM pod slice:\n\n```bash\n(.*?)```", readme, re.DOTALL)[1]
  command = re.search(r'--command="\s*cd transformer_jax && (.*?)"', block, re.DOTALL)[1]
  return " ".join(command.replace("\\\n", " ").split())


def _slurm_job() -> int:
  """A SLURM job id whose coordinator port (`jax`'s choice from the id) is free."""
  while True:
    job = random.randrange(1, 1 << 20)
    with socket.socket() as s:
      try:
        s.bind(("localhost", job % 2**12 + 65535 - 2**12 + 1))
      except OSError:
        continue
    return job


def _launch_sh_is_set_up() -> bool:
  """Whether this Python's environment is one `./launch.sh` set up for this pyproject.toml (the
  command would otherwise install one)."""
  stamp = pathlib.Path(sys.prefix, ".transformer_jax-installed")
  pyproject = hashlib.sha256((helpers.REPO / "pyproject.toml").read_bytes()).hexdigest()
  return stamp.exists() and stamp.read_text().strip() == pyproject


@pytest.mark.skipif(not _launch_sh_is_set_up(), reason="needs the tests run by ./launch.sh test")
def test_the_readme_pod_example_trains_two_processes_into_a_bucket(shared, bucket_dir):
  command = pod_command()
  assert command.startswith("./launch.sh train --distributed=on ") and "gs://$BUCKET/" in command
  overrides = [
    flag
    for flag in helpers.flags(
      shared,
      num_train_steps=STEPS,
      checkpoint_every_steps=2,
      data__source__source_lang="en",
      data__source__target_lang="sy",
      data__source__data_dir=f"{bucket_dir}/tfds",
    )
    if not flag.startswith("--config=")  # The README's experiment stays, shrunk by the rest.
  ]
  bucket, prefix = bucket_dir.removeprefix("gs://").split("/", 1)
  job = _slurm_job()
  processes = [
    subprocess.Popen(
      ["bash", "-c", f"{command} {shlex.join(overrides)}"],
      cwd=helpers.REPO,
      env={
        **helpers.environment(shared, devices=4),
        "BUCKET": f"{bucket}/{prefix}",
        "TJ_VENV": sys.prefix,
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_PROCID": str(i),
        "SLURM_LOCALID": str(i),
      },
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = [process.communicate(timeout=600)[0] for process in processes]
  for process, output in zip(processes, outputs):
    assert process.returncode == 0, output[-4000:]
  workdir = f"{bucket_dir}/wmt14_big"
  assert "process 1 of 2; 4 local and 8 global devices" in outputs[1], outputs[1][-3000:]
  assert helpers.committed_steps(workdir) == [2, 4]
  (losses,) = helpers.scalars_per_run(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  beats = sorted(p.name for p in epath.Path(workdir, "hosts").glob("process_*"))
  assert beats == ["process_0.json", "process_1.json"]
  assert not epath.Path(workdir, "lock.json").exists()
  assert not (helpers.REPO / "gs:").exists() and not os.path.exists("gs:")
