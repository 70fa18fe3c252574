"""Table 3 of the paper: variations on Transformer base, WMT 2014 EN-DE.

One variant per row (`--config=experiments/table3.py:C2`): base, A1-A4
(heads with d_k = d_v = d_model / h), B1-B2 (d_k only), C1-C7 (layers,
d_model, d_ff), D1-D2 (dropout), D3-D4 (label smoothing 0.0 and 0.2), E
(learned positional embeddings) and big. Everything else is the base
recipe of `experiments/wmt14.py:base` (big: `wmt14.py:big`'s 300k steps and
FSDP mesh). The paper reports perplexity per word piece and BLEU on
newstest2013 (TFDS's validation split, evaluated every 5000 steps and at
the end) without checkpoint averaging.
"""

import importlib.util
import os

from transformer_jax import config as config_lib
from transformer_jax.model.transformer import PRESETS

ROWS = tuple(PRESETS)  # base, A1..A4, B1, B2, C1..C7, D1..D4, E, big.
LABEL_SMOOTHING = {"D3": 0.0, "D4": 0.2}


def _wmt14():
  """experiments/wmt14.py, loaded from beside this file."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wmt14.py")
  spec = importlib.util.spec_from_file_location("experiments_wmt14", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(row: str = "base"):
  if row not in ROWS:
    raise ValueError(f"experiments/table3.py: unknown row {row!r}; rows: {', '.join(ROWS)}")
  config = _wmt14().get_config("big" if row == "big" else "base")
  config.model = config_lib.model_fields(row, dtype="bfloat16", max_len=256)
  config.label_smoothing = LABEL_SMOOTHING.get(row, 0.1)
  return config
