"""An experiment end to end, from Python: its settings, training, and what uses a trained model.

    from transformer_jax import experiment
    from transformer_jax.workdir import Workdir
    settings = experiment.Experiment()                 # The paper's base model and training.
    experiment.train(settings, Workdir("/tmp/run"))
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

__all__ = [
  "Checkpoint",
  "Experiment",
  "Loaded",
  "average",
  "evaluate_split",
  "language_model_perplexity",
  "load",
  "make_trainer",
  "train",
  "translate_file",
]
