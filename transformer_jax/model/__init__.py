"""The model: pure attention functions, Flax layers, dropout, the Transformer and its loss.

  attention.py    dot_product_attention, cached_attention, mask builders (no parameters)
  dropout.py      hashed_bits, dropout, Dropout
  layers.py       MultiHeadAttention, FeedForward, Embed, PositionalEncoding, Encoder/DecoderLayer
  transformer.py  TransformerConfig, the paper's presets, count_params, Transformer
  loss.py         label-smoothed cross entropy and a batch's loss sums
"""
