"""The model: pure functions, Flax Linen and NNX layers, dropout, the Transformer and its loss.

attention.py    dot_product_attention, cached_attention, mask builders (no parameters)
functional.py   the layers' math as pure functions of their parameters; their axes and inits
dropout.py      hashed_bits, dropout, Dropout
layers.py       MultiHeadAttention, FeedForward, LayerNorm, EncoderLayer, DecoderLayer
decode_cache.py the decoding cache's per-row and per-sentence entries, in both front doors
embedding.py    Embed (shared, with the tied output projection), PositionalEncoding
config.py       TransformerConfig, the paper's presets, count_params, train_flops
transformer.py  Encoder, Decoder, Transformer, transformer_spec (the Transformer for the trainer)
nnx_layers.py   the same layers as Flax NNX modules, over functional.py
nnx_transformer.py  the NNX Transformer; its parameters to and from the Linen model's
loss.py         label-smoothed cross entropy; the Transformer's forward pass and loss function
spec.py         ModelSpec, LossFn: any model and loss as the trainer takes them (Linen, NNX)
"""
