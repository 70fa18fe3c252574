"""Marian (Hugging Face `MarianMTModel`) weights <-> this project's parameters, exactly.

Three fixed relabelings make the two models compute the same function:
  - layout: torch's `Linear` weights are `[out, in]` with heads concatenated;
    ours are `[in, heads, d]` / `[heads, d, out]` (`layers.MultiHeadAttention`);
  - token ids: rows of the embedding and the logits bias follow
    `data.marian.project_order` (pad, eos, unk first; Marian puts pad last);
  - positions: Marian's sinusoid has every sin in the first half of d_model and
    every cos in the second, ours interleaves them (sin at 2i, cos at 2i+1).
    Relabeling the d_model axis of every weight by `d_model_order` maps one
    onto the other; LayerNorm, residuals and dot products do not depend on
    the order of that axis, so the logits are unchanged.
Both directions are plain permutations, transposes and reshapes: converting
back and forth gives the same bits.
"""

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


def d_model_order(d_model: int) -> np.ndarray:
  """Marian's index of each of our d_model features: ours 2i <- i, ours 2i+1 <- d_model/2 + i."""
  half = d_model // 2
  return np.stack([np.arange(half), half + np.arange(half)], axis=1).reshape(-1)


class _Kind(NamedTuple):
  """How one Marian tensor becomes one of our arrays and back: `to_ours(x, heads)` and
  `to_marian(y, heads)` reshape or transpose; `d_axis` and `vocab_axis` are the axes of our
  array indexed by the d_model feature and by the token id (None: none)."""

  to_ours: Callable
  to_marian: Callable
  d_axis: int | None
  vocab_axis: int | None = None


_KINDS = {
  "embedding": _Kind(lambda x, h: x, lambda y, h: y, 1, vocab_axis=0),
  "logits_bias": _Kind(lambda x, h: x[0], lambda y, h: y[None], None, vocab_axis=0),
  "in_proj": _Kind(
    lambda x, h: x.T.reshape(x.shape[1], h, -1), lambda y, h: y.reshape(y.shape[0], -1).T, 0
  ),
  "in_bias": _Kind(lambda x, h: x.reshape(h, -1), lambda y, h: y.reshape(-1), None),
  "out_proj": _Kind(
    lambda x, h: x.T.reshape(h, -1, x.shape[0]), lambda y, h: y.reshape(-1, y.shape[-1]).T, 2
  ),
  "d_vector": _Kind(lambda x, h: x, lambda y, h: y, 0),
  "fc1": _Kind(lambda x, h: x.T, lambda y, h: y.T, 0),
  "ff_vector": _Kind(lambda x, h: x, lambda y, h: y, None),
  "fc2": _Kind(lambda x, h: x.T, lambda y, h: y.T, 1),
}

_ATTENTION = (
  ("query", "q_proj.weight", "in_proj"),
  ("key", "k_proj.weight", "in_proj"),
  ("value", "v_proj.weight", "in_proj"),
  ("out", "out_proj.weight", "out_proj"),
)
_ATTENTION_BIASES = (
  ("query_bias", "q_proj.bias", "in_bias"),
  ("key_bias", "k_proj.bias", "in_bias"),
  ("value_bias", "v_proj.bias", "in_bias"),
  ("out_bias", "out_proj.bias", "d_vector"),
)
_FEED_FORWARD = (
  ("feed_forward", "wi", "fc1.weight", "fc1"),
  ("feed_forward", "bi", "fc1.bias", "ff_vector"),
  ("feed_forward", "wo", "fc2.weight", "fc2"),
  ("feed_forward", "bo", "fc2.bias", "d_vector"),
)
# Our sub-layer name -> Marian's, per stack.
_ATTENTIONS = {
  "encoder": (("self_attention", "self_attn"),),
  "decoder": (("self_attention", "self_attn"), ("cross_attention", "encoder_attn")),
}
_NORMS = {
  "encoder": (
    ("self_attention_norm", "self_attn_layer_norm"),
    ("feed_forward_norm", "final_layer_norm"),
  ),
  "decoder": (
    ("self_attention_norm", "self_attn_layer_norm"),
    ("cross_attention_norm", "encoder_attn_layer_norm"),
    ("feed_forward_norm", "final_layer_norm"),
  ),
}

EMBEDDING = "model.shared.weight"
LOGITS_BIAS = "final_logits_bias"


def mapping(depths: tuple[int, int], attention_bias: bool, logits_bias: bool):
  """`[(our path, Marian name, kind)]` for every parameter of a post-LN model (layers looped) of
  `depths` (encoder, decoder) layers."""
  entries = [(("embed", "embedding"), EMBEDDING, "embedding")]
  if logits_bias:
    entries.append((("embed", "logits_bias"), LOGITS_BIAS, "logits_bias"))
  for (stack, attentions), depth in zip(_ATTENTIONS.items(), depths, strict=True):
    for i in range(depth):
      ours, theirs = (stack, f"layer_{i}"), f"model.{stack}.layers.{i}"
      for sub, marian_sub in attentions:
        projections = _ATTENTION + (_ATTENTION_BIASES if attention_bias else ())
        entries += [
          ((*ours, sub, name), f"{theirs}.{marian_sub}.{key}", kind)
          for name, key, kind in projections
        ]
      for norm, marian_norm in _NORMS[stack]:
        entries += [
          ((*ours, norm, "scale"), f"{theirs}.{marian_norm}.weight", "d_vector"),
          ((*ours, norm, "bias"), f"{theirs}.{marian_norm}.bias", "d_vector"),
        ]
      entries += [
        ((*ours, sub, name), f"{theirs}.{key}", kind) for sub, name, key, kind in _FEED_FORWARD
      ]
  return entries


def to_params(state: dict, *, depths: tuple[int, int], num_heads: int, token_order) -> dict:
  """Our nested parameter dict (float32 numpy) from a Marian state dict (name -> numpy array);
  `token_order[i]` is the Marian id of our token id i."""
  d_order = d_model_order(state[EMBEDDING].shape[1])
  params = {}
  for path, name, kind_name in mapping(depths, True, True):
    kind = _KINDS[kind_name]
    array = kind.to_ours(np.asarray(state[name], np.float32), num_heads)
    if kind.d_axis is not None:
      array = np.take(array, d_order, axis=kind.d_axis)
    if kind.vocab_axis is not None:
      array = np.take(array, np.asarray(token_order), axis=kind.vocab_axis)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = np.ascontiguousarray(array)
  return params


def to_state(
  params,
  *,
  depths: tuple[int, int],
  num_heads: int,
  token_order,
  attention_bias: bool,
  logits_bias: bool,
) -> dict:
  """The Marian state dict (name -> float32 numpy) of our parameters; the biases a model lacks
  are zeros."""
  d_model = params["embed"]["embedding"].shape[1]
  inverse_d, inverse_tokens = np.argsort(d_model_order(d_model)), np.argsort(token_order)
  state = {}
  present = {name for _, name, _ in mapping(depths, attention_bias, logits_bias)}
  for path, name, kind_name in mapping(depths, True, True):
    kind = _KINDS[kind_name]
    if name not in present:
      state[name] = _zero_bias(params, path, kind_name, d_model)
      continue
    array = np.asarray(_get(params, path), np.float32)
    if kind.vocab_axis is not None:
      array = np.take(array, inverse_tokens, axis=kind.vocab_axis)
    if kind.d_axis is not None:
      array = np.take(array, inverse_d, axis=kind.d_axis)
    state[name] = np.ascontiguousarray(kind.to_marian(array, num_heads))
  return state


def _zero_bias(params, path, kind_name, d_model):
  """Zeros shaped like the Marian tensor of a bias the model lacks."""
  if kind_name == "logits_bias":
    return np.zeros((1, params["embed"]["embedding"].shape[0]), np.float32)
  if kind_name == "in_bias":
    weight = _get(params, (*path[:-1], path[-1].removesuffix("_bias")))
    return np.zeros((weight.shape[1] * weight.shape[2],), np.float32)
  return np.zeros((d_model,), np.float32)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree
