"""An experiment end to end, from Python: its settings, training, and what uses a trained model.

    from transformer_jax import experiment
    from transformer_jax.workdir import Workdir
    settings = experiment.Experiment()                 # The paper's base model and training.
    times = experiment.RunTimes()
    experiment.train(settings, Workdir("/tmp/run"), times=times)  # times: where the time went.
    loaded = experiment.load(settings, Workdir("/tmp/run"))  # The latest checkpoint.

The "From Python" section of docs/library.md has a whole example.
"""

from transformer_jax.experiment.inference import (
  Checkpoint,
  Loaded,
  average,
  evaluate_split,
  language_model_perplexity,
  load,
  translate_file,
)
from transformer_jax.experiment.settings import Experiment
from transformer_jax.experiment.training import make_trainer, train
from transformer_jax.train.run_times import RunTimes

__all__ = [
  "Checkpoint",
  "Experiment",
  "Loaded",
  "RunTimes",
  "average",
  "evaluate_split",
  "language_model_perplexity",
  "load",
  "make_trainer",
  "train",
  "translate_file",
]
