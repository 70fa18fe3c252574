"""The default experiment: the embedded synthetic EN -> SY corpus on a CPU in minutes.

Not a paper result: a small Transformer (3 + 3 layers, d_model 128) with the
paper's recipe (Adam 0.9/0.98/1e-9, inverse-square-root warmup schedule,
label smoothing 0.1, dropout 0.1) on the 100k-pair corpus shipped in
`transformer_jax/data/embedded.py`, sized to train well on 2 CPU cores.
`./launch.sh` with no arguments runs it into ./workdir/default.
"""

from transformer_jax import training


def get_config():
  config = training.default_config()
  config.model = training.model_config(
      "base", num_layers=3, d_model=128, d_ff=512, num_heads=4, max_len=128)
  config.data.name = "embedded"
  config.data.vocab_size = 1000
  config.data.tokens_per_batch = 4096
  config.data.batch_multiple = 8  # Rows split evenly over up to 8 devices.
  config.num_train_steps = 800
  config.warmup_steps = 200
  # Peak rate 0.5 * 128^-0.5 * 200^-0.5 = 3.1e-3; at scale 1.0 training stalls near perplexity 14.
  config.learning_rate = 0.5
  config.log_every_steps = 50
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 5
  config.eval_every_steps = 400
  config.mesh.data = -1
  return config
