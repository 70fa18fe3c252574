"""A decoder-only language model (model/language_model.py) from the Transformer's layers,
trained by the same loop: the embedded corpus's target side, on a CPU in a few minutes.

`config.model_kind = "language_model"` picks the model; `config.model` sizes it (`num_layers`
layers of the paper's encoder layer under a causal mask). It learns the text of the
`targets` side of the data source: swap `data.source.source_lang` and `target_lang` to learn
the other language, or point `data.source.name = "text"` at any text files
(`data.source.text_train` and friends, `<prefix>.<lang>`). Training, checkpoints, exact resume,
`--mode=average` and `--mode=compile` work as for the translation model; `--mode=eval` reports
the perplexity of `decode.split`'s target side; translation and BLEU are refused.

    ./launch.sh train --config=experiments/lm.py
"""

import os

from transformer_jax import config as config_lib


def get_config():
  # The default experiment's model, data and batches (experiments/default.py), decoder-only.
  config = config_lib.load_file(os.path.join(os.path.dirname(__file__), "default.py"))
  config.model_kind = "language_model"
  config.model.num_layers = 2
  config.label_smoothing = 0.0  # Perplexity is what it is scored by.
  config.num_train_steps = 300
  config.warmup_steps = 60
  config.checkpoint_every_steps = 50
  config.eval_every_steps = 100  # Validation perplexity.
  config.eval_bleu_sentences = 0  # A language model has no BLEU.
  config.decode.split = "test"  # --mode=eval: the test split's perplexity.
  return config
