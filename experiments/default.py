"""The default experiment: the embedded synthetic EN -> SY corpus on a CPU in minutes.

Not a paper result: a small Transformer (3 + 3 layers, d_model 128) on the
100k-pair corpus shipped in `transformer_jax/data/embedded.py`, sized to reach
a test BLEU above 90 on 2 CPU cores in five to seven minutes. From the paper:
Adam 0.9/0.98/1e-9, the inverse-square-root warmup schedule, label smoothing
0.1, beam 4 with alpha 0.6. Changed for speed on this corpus, where every
sentence has exactly one translation: no dropout (it only slowed learning) and
pre-LN, which trains at twice the learning rate that stalls the paper's post-LN
here (step 300: loss 1.71 pre-LN at scale 1.0; post-LN 2.25 at scale 0.5 and
3.64 at 1.0). Checkpoints every 50 steps, so that the last 5 (what
`--mode=average` averages) are the last 200 steps. `./launch.sh` with no
arguments trains it into ./workdir/default, averages the last 5 checkpoints
and evaluates the average on the test split.
"""

from transformer_jax import config as config_lib


def get_config():
  config = config_lib.default_config()
  config.model = config_lib.model_fields(
      "base", num_layers=3, d_model=128, d_ff=512, num_heads=4, max_len=128, norm="pre",
      dropout_rate=0.0)
  config.data.name = "embedded"
  config.data.vocab_size = 1000
  config.data.tokens_per_batch = 4096
  config.data.batch_multiple = 8  # Rows split evenly over up to 8 devices.
  config.num_train_steps = 1000
  config.warmup_steps = 200
  # Peak rate 128^-0.5 * 200^-0.5 = 6.25e-3 (at step 200), then the paper's inverse square root.
  config.learning_rate = 1.0
  config.log_every_steps = 50
  config.checkpoint_every_steps = 50
  config.keep_checkpoints = 5
  config.average_last = 5
  config.eval_every_steps = 500
  config.eval_bleu_sentences = 500
  # On 2 CPU cores beam search is fastest with small batches (2000 test sentences, beam 4:
  # 90 sentences/s at 8, 70 at 16, 38 at 128), where the key/value cache stays in the caches.
  config.decode.batch_size = 8
  config.mesh.data = -1
  return config
