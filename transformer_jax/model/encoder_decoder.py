"""What both Transformers (Linen: model/transformer.py; NNX: model/nnx_transformer.py) share
around their stacks, written once: the token checks, the decoder's shifted inputs, the masks,
and the model's methods (`encode`, `decode`, `logits`, `__call__`) as `TransformerAPI`."""

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.conventions import PAD_ID
from transformer_jax.model import attention


def shift_right(targets, segmentation=None):
  """Decoder inputs: targets moved one step right, PAD_ID (the start token) first.

  With packed `segmentation`, every example's first position gets the start
  token instead of the previous example's last token. `[batch, length]`.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  if segmentation is None:
    return shifted
  previous = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(segmentation == previous, shifted, PAD_ID)


def encoder_mask(inputs, segmentation=None):
  """The encoder's self-attention mask: padding, or packed segments."""
  if segmentation is None:
    return attention.padding_mask(inputs, inputs)
  return attention.segment_mask(segmentation, segmentation)


def decoder_masks(
  inputs, targets, inputs_segmentation, targets_segmentation, positions, *, decode: bool
):
  """The decoder's (self-attention, cross-attention) masks: padding (or packed segments), the
  causal mask left to the self-attention's `is_causal` (the decoder layer's); with `decode` (one
  step, the cache masks unseen positions) no self-attention mask, and `positions` are required."""
  if decode:
    if positions is None:
      raise ValueError("decode=True needs the position of the step being decoded, [b, 1]")
    key_real = (inputs != PAD_ID) if inputs_segmentation is None else (inputs_segmentation != 0)
    return None, key_real[:, None, None, :]
  if targets_segmentation is None:
    return attention.padding_mask(targets, targets), attention.padding_mask(targets, inputs)
  return (
    attention.segment_mask(targets_segmentation, targets_segmentation),
    attention.segment_mask(targets_segmentation, inputs_segmentation),
  )


def decoder_inputs_and_masks(
  inputs, targets, inputs_segmentation, targets_segmentation, positions, *, decode: bool
):
  """(the decoder's input ids, its self-attention mask, its cross-attention mask): the targets
  shifted right (with `decode`, the step's previous tokens as they are) and `decoder_masks`."""
  shifted = targets if decode else shift_right(targets, targets_segmentation)
  masks = decoder_masks(
    inputs, targets, inputs_segmentation, targets_segmentation, positions, decode=decode
  )
  return shifted, *masks


def check_tokens(name, tokens, max_len):
  """Raise ValueError unless `tokens` is `[batch, length]` integer ids with length <= max_len."""
  if tokens.ndim != 2:
    raise ValueError(f"{name} must be [batch, length] token ids; got shape {tokens.shape}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{name} must hold integer token ids; got dtype {tokens.dtype}")
  if tokens.shape[1] > max_len:
    raise ValueError(f"{name} has length {tokens.shape[1]} > TransformerConfig.max_len={max_len}")


class TransformerAPI:
  """The Transformer's methods, for both front doors, over what each model has: `config`, `embed`
  (an `Embed`), `_stack(name)` ("encoder" or "decoder": the stack as a function of the Linen
  stack's arguments) and `_deterministic(train)` (`train` None: the front door's default; Linen's
  is off, NNX's what `model.train()` / `model.eval()` last set)."""

  def encode(self, inputs, inputs_segmentation=None, inputs_position=None, *, train=None):
    """Source ids `[b, s]` -> encoder output `[b, s, d_model]`."""
    check_tokens("inputs", inputs, self.config.max_len)
    deterministic = self._deterministic(train)
    encoder = self._stack("encoder")
    return encoder(inputs, inputs_segmentation, inputs_position, deterministic=deterministic)

  def decode(
    self,
    encoded,
    inputs,
    targets,
    targets_segmentation=None,
    targets_position=None,
    inputs_segmentation=None,
    *,
    train=None,
    decode=False,
    features=False,
  ):
    """Encoder output and targets `[b, t]` -> logits `[b, t, vocab]` (targets shifted inside;
    with `decode`, one step of previous tokens at `targets_position`, once the cache is made:
    Linen, applied with the `CACHE_COLLECTIONS` mutable after a call with the full target shape
    has sized them; NNX, after `init_cache`); with `features`, the decoder's output before the
    output layer, `[b, t, d_model]`."""
    check_tokens("targets", targets, self.config.max_len)
    out = self._stack("decoder")(
      encoded,
      inputs,
      targets,
      inputs_segmentation=inputs_segmentation,
      targets_segmentation=targets_segmentation,
      positions=targets_position,
      deterministic=self._deterministic(train),
      decode=decode,
    )
    return out if features else self.logits(out, wide=decode)

  def logits(self, features, wide: bool = False):
    """The output layer: the decoder's features `[b, t, d_model]` -> logits `[b, t, vocab]` in
    the compute dtype (`wide`, as in `decode=True`: float32 or wider), through the shared
    embedding."""
    logits = self.embed.attend(features, wide)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))

  def __call__(
    self,
    inputs,
    targets,
    inputs_segmentation=None,
    targets_segmentation=None,
    inputs_position=None,
    targets_position=None,
    *,
    train=None,
    features=False,
  ):
    """Teacher-forced forward pass: logits `[b, t, vocab]` for predicting `targets` (with
    `features`, the decoder's output before the output layer)."""
    encoded = self.encode(inputs, inputs_segmentation, inputs_position, train=train)
    return self.decode(
      encoded,
      inputs,
      targets,
      targets_segmentation,
      targets_position,
      inputs_segmentation,
      train=train,
      features=features,
    )
