"""An experiment end to end, from Python: its settings, training, and what uses a trained model.

    from transformer_jax import experiment
    settings = experiment.Experiment()            # the paper's base model
    experiment.train(settings, "/tmp/run")
    loaded = experiment.load(settings, "/tmp/run")
"""

from transformer_jax.experiment.settings import Experiment
from transformer_jax.experiment.trained import Loaded, average, evaluate_split, load
from transformer_jax.experiment.trained import translate_file
from transformer_jax.experiment.training import make_trainer, train

__all__ = ["Experiment", "Loaded", "average", "evaluate_split", "load", "make_trainer", "train",
           "translate_file"]
