"""WMT 2014 translation with the paper's models (Vaswani et al. 2017, Table 2).

Variants (`--config=experiments/wmt14.py:<variant>`), with the BLEU the paper reports on
newstest2014: a target, not a result of this project, which has not run them yet.
  base      Transformer base, EN-DE: the paper's 27.3 BLEU (100k steps).
  big       Transformer big, EN-DE: the paper's 28.4 BLEU (300k steps, dropout 0.3).
  big_enfr  Transformer big, EN-FR: the paper's 41.8 BLEU (300k steps, dropout 0.1).

The paper's recipe: Adam (0.9, 0.98, 1e-9), `d_model^-0.5 * min(step^-0.5,
step * 4000^-1.5)`, label smoothing 0.1, a shared BPE vocabulary (37k EN-DE,
32k word pieces EN-FR), batches of about 25k source and 25k target tokens,
here 104 packed rows of 256 tokens (26624 slots a side, about 25k of them
filled). The paper batched pairs of similar length; packing them into rows
of one shape (tensor2tensor's packed problems) keeps every pair apart through
its segment ids, wastes few slots on padding and compiles one train step
instead of 13 (docs/compile.md). The paper's batching, 32768 tokens a side
counting padding (4096 per GPU on 8 GPUs, as in tensor2tensor, which the
paper used): `--config.data.batch.mode=tokens`. Meshes are for 8 accelerators and take
the rest of whatever devices there are (-1): base is data parallel, the big
models are FSDP-sharded. Computation is in bfloat16, parameters in float32.
The paper evaluates the average of the last 5 (base) or 20 (big) checkpoints
(`--mode=average`), so 20 are kept, with beam search (beam 4, alpha 0.6, up
to input length + 50 tokens) on newstest2014 (the test split); `--mode=eval`
reports sacrebleu and the paper's tokenized BLEU. Every 5000 steps training
scores greedy BLEU on 1000 sentences of newstest2013 and keeps the best.
"""

from transformer_jax import config as config_lib

VARIANTS = ("base", "big", "big_enfr")


def get_config(variant: str = "base"):
  if variant not in VARIANTS:
    raise ValueError(
      f"experiments/wmt14.py: unknown variant {variant!r}; variants: {', '.join(VARIANTS)}"
    )
  config = config_lib.default_config()
  big = variant.startswith("big")
  # EN-FR big keeps P_drop = 0.1 (paper, section 6.1).
  config.model = config_lib.model_fields(
    "big" if big else "base",
    dtype="bfloat16",
    max_len=256,
    **({"dropout_rate": 0.1} if variant == "big_enfr" else {}),
  )
  if variant == "big_enfr":
    config.data.source.name = "wmt14_translate/fr-en"
    config.data.source.target_lang = "fr"
    config.data.vocab.size = 32000
  else:
    config.data.source.name = "wmt14_translate/de-en"
    config.data.source.target_lang = "de"
    config.data.vocab.size = 37000
  config.data.source.source_lang = "en"
  config.data.vocab.sample_size = 1_000_000
  config.data.batch.mode = "packed"
  config.data.batch.size = 104
  config.data.batch.max_length = 256
  config.data.batch.tokens = 32768  # With batch_mode=tokens.
  config.data.batch.max_source_length = 256
  config.data.batch.max_target_length = 256
  config.data.batch.multiple = 8
  config.num_train_steps = 300_000 if big else 100_000
  config.warmup_steps = 4000
  config.label_smoothing = 0.1
  # The paper checkpoints every 10 minutes: about 1500 base steps, 600 big steps.
  config.checkpoint_every_steps = 600 if big else 1500
  config.keep_checkpoints = 20
  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.eval_bleu_sentences = 1000
  config.average_last = 20 if big else 5
  config.decode.tokenized_bleu = True
  if big:
    config.mesh.data, config.mesh.fsdp = 1, -1
    config.sharding_rules = "fsdp"
  else:
    config.mesh.data = -1
    config.sharding_rules = "dp"
  return config
