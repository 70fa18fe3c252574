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

from transformer_jax import config as config_lib


def get_config():
  config = config_lib.default_config()
  config.model_kind = "language_model"
  config.model = config_lib.model_fields(
    "base",
    num_layers=2,
    d_model=128,
    d_ff=512,
    num_heads=4,
    max_len=128,
    norm="pre",
    dropout_rate=0.0,
  )
  config.data.source.name = "embedded"
  config.data.vocab.size = 1000
  config.data.batch.tokens = 4096
  config.data.batch.multiple = 8  # Rows split evenly over up to 8 devices.
  config.label_smoothing = 0.0  # Perplexity is what it is scored by.
  config.num_train_steps = 300
  config.warmup_steps = 60
  config.learning_rate = 0.75
  config.log_every_steps = 50
  config.checkpoint_every_steps = 50
  config.keep_checkpoints = 5
  config.average_last = 5
  config.eval_every_steps = 100  # Validation perplexity.
  config.eval_bleu_sentences = 0  # A language model has no BLEU.
  config.decode.split = "test"  # --mode=eval: the test split's perplexity.
  config.mesh.data = -1
  return config
