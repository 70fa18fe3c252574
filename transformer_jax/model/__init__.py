"""The model: pure attention functions, Flax layers, dropout, the Transformer and its loss.

attention.py    dot_product_attention, cached_attention, mask builders (no parameters)
dropout.py      hashed_bits, dropout, Dropout
layers.py       MultiHeadAttention, FeedForward, LayerNorm, EncoderLayer, DecoderLayer
embedding.py    Embed (shared, with the tied output projection), PositionalEncoding
config.py       TransformerConfig, the paper's presets, count_params
transformer.py  Encoder, Decoder, Transformer
loss.py         label-smoothed cross entropy and a batch's loss sums
"""
