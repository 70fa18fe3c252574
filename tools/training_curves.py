"""Our training against the PyTorch reference (`torch_training`), update by update, on the same
batches of an experiment's own data (the command line: `compare_training`).

Each update trains both models on the batch our pipeline yields; the JSON
(rewritten every `log_every` updates, so a stopped run keeps its curves)
holds both per-token training losses and the setting. With
`reference_init="copied"` the reference starts from our initial parameters;
with "fairseq" (default) from fairseq's initialisation; its dropout is
torch's either way.
"""

import json
import logging
import math
import time

import jax
import numpy as np

from tools.reference_parameters import flat_params
from tools.torch_training import Reference
from transformer_jax import data, fileio
from transformer_jax.experiment import Experiment, make_trainer
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)


def compare(
  experiment: Experiment,
  workdir: Workdir,
  *,
  updates: int,
  reference_init: str = "fairseq",
  reference_device: str = "cpu",
  log_every: int = 50,
  out: str | None = None,
) -> dict:
  """Train our model and the reference for `updates` updates on the same batches.

  Returns (and writes to `out` every `log_every` updates) `{"ours": {"loss",
  "nll"}, "reference": {...}, "tokens": [...], "seconds": {...}, ...}`,
  one entry per update (NaN for an update of ours skipped as non-finite);
  the reference's dropout and initial parameters are drawn from the
  experiment's seed. `seconds["ours"]` includes compiling the train step.
  """
  experiment.refuse_for_language_model("the comparison with the PyTorch translation model")
  Reference.check(experiment.model, experiment.optimizer, reference_init, reference_device)
  if updates < 1 or log_every < 1:
    raise ValueError(f"updates={updates}, log_every={log_every}: both must be >= 1")
  tokenizer = data.get_tokenizer(experiment.data, workdir.vocab)
  trainer, _ = make_trainer(experiment, vocab_size=tokenizer.vocab_size, devices=jax.devices()[:1])
  state = trainer.init()
  params = flat_params(state.params)
  model_config = trainer.placement.model.config
  reference = Reference(
    model_config,
    experiment.optimizer,
    label_smoothing=experiment.label_smoothing,
    init=reference_init,
    params=params,
    seed=experiment.seed,
    device=reference_device,
  )
  batches = iter(
    data.make_train_loader(
      experiment.data, tokenizer, seed=experiment.seed, shard_index=0, shard_count=1
    )
  )
  result = {
    "model": str(model_config),
    "optimizer": str(experiment.optimizer),
    "label_smoothing": experiment.label_smoothing,
    "reference_init": reference_init,
    "devices": {
      "ours": str(trainer.placement.mesh.devices.flat[0]),
      "reference": str(reference.device),
    },
    "tokens_per_batch": experiment.data.batch.tokens,
    "updates": 0,
    "ours": {"loss": [], "nll": []},
    "reference": {"loss": [], "nll": []},
    "tokens": [],
    "seconds": {"ours": 0.0, "reference": 0.0},
  }
  start = time.perf_counter()
  for update in range(updates):
    batch = jax.tree.map(np.asarray, next(batches))
    tick = time.perf_counter()
    state, metrics = trainer.train_step(state, batch)
    metrics = jax.device_get(metrics)
    tock = time.perf_counter()
    theirs = reference.train_step(batch)
    result["seconds"]["ours"] += tock - tick
    result["seconds"]["reference"] += time.perf_counter() - tock
    tokens = float(metrics["tokens"])  # 0 when the update was skipped as non-finite.
    result["ours"]["loss"].append(float(metrics["loss"]) / tokens if tokens else math.nan)
    result["ours"]["nll"].append(float(metrics["nll"]) / tokens if tokens else math.nan)
    result["reference"]["loss"].append(theirs["loss"])
    result["reference"]["nll"].append(theirs["nll"])
    result["tokens"].append(tokens)
    result["updates"] = update + 1
    if (update + 1) % log_every == 0 or update + 1 == updates:
      window = slice(-log_every, None)
      elapsed = time.perf_counter() - start
      log.info(
        "update %d/%d: train loss ours %.4f, reference %.4f (mean of the last %d); ETA %.0f s",
        update + 1,
        updates,
        np.mean(result["ours"]["loss"][window]),
        np.mean(result["reference"]["loss"][window]),
        log_every,
        elapsed / (update + 1) * (updates - update - 1),
      )
      if out:
        fileio.write_atomically(out, json.dumps(result))
  return result


def plot(curves: dict[str, list[float]], path: str, *, smooth: int = 25, title: str = "") -> None:
  """Training-loss curves `{label: per-update losses}` (running means over `smooth` updates)
  drawn to the PNG `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7, 4))
  for label, loss in curves.items():
    width = min(smooth, len(loss))
    mean = np.convolve(loss, np.ones(width) / width, "valid")
    ax.plot(np.arange(len(mean)) + width, mean, label=label)
  ax.set_xlabel("update")
  ax.set_ylabel(f"training loss (mean of {smooth} updates)")
  ax.set_title(title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
