"""Float64 numpy renderings of the paper's formulas, independent of the package."""

import math

import numpy as np


def softmax_weights(q, k, mask=None):
  """softmax(Q K^T / sqrt(d_k)), [b, heads, q_len, k_len]; masked logits -inf, empty rows 0."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(np.broadcast_to(np.asarray(mask), logits.shape), logits, -np.inf)
  top = np.max(logits, axis=-1, keepdims=True)
  e = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
  total = e.sum(-1, keepdims=True)
  return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def softmax_attention(q, k, v, mask=None, weights=None):
  """softmax(Q K^T / sqrt(d_k)) V over [b, len, heads, d]; `weights` [b, heads, q_len, k_len]
  (attention weights after dropout) in place of the softmax."""
  weights = softmax_weights(q, k, mask) if weights is None else weights
  return np.einsum("bhqk,bkhd->bqhd", weights, np.asarray(v, np.float64))


def multi_head(params, x_q, x_kv, mask=None, weights=None):
  """Concat(head_1..head_h) W^O with head_i = Attention(x_q W^Q_i, x_kv W^K_i, x_kv W^V_i);
  with biases (`query_bias`, ... in `params`) each projection adds its own; `weights` as in
  `softmax_attention`."""
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  bias = lambda name: p.get(f"{name}_bias", 0.0)
  q = np.einsum("bld,dhk->blhk", x_q, p["query"]) + bias("query")
  k = np.einsum("bld,dhk->blhk", x_kv, p["key"]) + bias("key")
  v = np.einsum("bld,dhk->blhk", x_kv, p["value"]) + bias("value")
  heads = softmax_attention(q, k, v, mask, weights)
  b, length = heads.shape[:2]
  concat = heads.reshape(b, length, -1)
  w_o = p["out"].reshape(-1, p["out"].shape[-1])
  return concat @ w_o + bias("out")


ACTIVATIONS = {
  "relu": lambda x: np.maximum(0.0, x),
  "swish": lambda x: x / (1.0 + np.exp(-x)),
  "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
}


def feed_forward(params, x, activation="relu"):
  """max(0, x W1 + b1) W2 + b2 (another `activation` in place of max(0, .))."""
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  return ACTIVATIONS[activation](x @ p["wi"] + p["bi"]) @ p["wo"] + p["bo"]


def layer_norm(params, x, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(params["scale"], np.float64) + np.asarray(
    params["bias"], np.float64
  )


def sinusoid(pos, j, d_model):
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
  angle = pos / 10000 ** ((j - j % 2) / d_model)
  return math.sin(angle) if j % 2 == 0 else math.cos(angle)


def encoder_layer(params, x, mask, pre_norm=False, activation="relu", eps=1e-6):
  """Self-attention then feed-forward, each `LayerNorm(x + sublayer(x))` (pre-LN:
  `x + sublayer(LayerNorm(x))`); no dropout."""
  attend = lambda y: multi_head(params["self_attention"], y, y, mask)
  ffn = lambda y: feed_forward(params["feed_forward"], y, activation)
  ln1 = lambda y: layer_norm(params["self_attention_norm"], y, eps)
  ln2 = lambda y: layer_norm(params["feed_forward_norm"], y, eps)
  if pre_norm:
    x = x + attend(ln1(x))
    return x + ffn(ln2(x))
  x = ln1(x + attend(x))
  return ln2(x + ffn(x))


def decoder_layer(params, y, encoded, self_mask, cross_mask, activation="relu", eps=1e-6):
  """Post-LN masked self-attention, attention over the encoder output, feed-forward."""
  y = layer_norm(
    params["self_attention_norm"], y + multi_head(params["self_attention"], y, y, self_mask), eps
  )
  y = layer_norm(
    params["cross_attention_norm"],
    y + multi_head(params["cross_attention"], y, encoded, cross_mask),
    eps,
  )
  return layer_norm(
    params["feed_forward_norm"], y + feed_forward(params["feed_forward"], y, activation), eps
  )


def layers(stack_params):
  """A stack's `layer_0`, `layer_1`, ... parameters, in order (as many as there are)."""
  return [
    stack_params[f"layer_{i}"] for i in range(sum(k.startswith("layer_") for k in stack_params))
  ]


def transformer_logits(params, inputs, targets, activation="relu", eps=1e-6):
  """Logits [b, t, vocab] of the paper's post-LN model with a shared embedding, through every layer
  `params` has: 0 is padding and the decoder's start token; targets are shifted right inside. A
  `logits_bias` in `params["embed"]` is added to the logits."""
  embedding = np.asarray(params["embed"]["embedding"], np.float64)
  d_model = embedding.shape[1]

  def embed(ids):
    positions = np.array(
      [[sinusoid(p, j, d_model) for j in range(d_model)] for p in range(ids.shape[1])]
    )
    return embedding[ids] * math.sqrt(d_model) + positions

  real_in, real_out = inputs != 0, targets != 0
  causal = np.tril(np.ones((targets.shape[1],) * 2, bool))
  x = embed(inputs)
  for layer in layers(params["encoder"]):
    x = encoder_layer(
      layer,
      x,
      real_in[:, None, :, None] & real_in[:, None, None, :],
      activation=activation,
      eps=eps,
    )
  y = embed(np.pad(targets, ((0, 0), (1, 0)))[:, :-1])
  for layer in layers(params["decoder"]):
    y = decoder_layer(
      layer,
      y,
      x,
      causal & real_out[:, None, :, None] & real_out[:, None, None, :],
      real_out[:, None, :, None] & real_in[:, None, None, :],
      activation,
      eps,
    )
  return y @ embedding.T + np.asarray(params["embed"].get("logits_bias", 0.0), np.float64)


def language_model_logits(params, targets, segmentation, positions, eps=1e-6):
  """Logits [b, t, vocab] of the pre-LN decoder-only model through every layer `params` has: in a
  row of packed examples (`segmentation` 1, 2, ...; 0 padding) token t is predicted from the
  tokens before it in its own example, the start token 0 first; `positions` index the sinusoid."""
  embedding = np.asarray(params["embed"]["embedding"], np.float64)
  d_model = embedding.shape[1]
  previous = np.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
  inputs = np.where(segmentation == previous, np.pad(targets, ((0, 0), (1, 0)))[:, :-1], 0)
  table = np.array(
    [[sinusoid(p, j, d_model) for j in range(d_model)] for p in range(positions.max() + 1)]
  )
  x = embedding[inputs] * math.sqrt(d_model) + table[positions]
  q, k = segmentation[:, None, :, None], segmentation[:, None, None, :]
  sees = np.tril(np.ones((targets.shape[1],) * 2, bool)) & (q == k) & (q != 0) & (k != 0)
  for layer in layers(params):
    x = encoder_layer(layer, x, sees, pre_norm=True, eps=eps)
  return layer_norm(params["final_norm"], x, eps) @ embedding.T


def step_log_probs(
  logits, *, last: bool, eos: int, pad: int = 0, force_eos: bool = False, renormalize: bool = False
):
  """Next-token log-probabilities from float64 `logits` [vocab]: pad excluded (after the
  log-softmax, or before it with `renormalize`); only EOS, at 0, on the `last` step with
  `force_eos` (Hugging Face's bad_words_ids=[[pad]], renormalize_logits, forced_eos_token_id)."""
  logits = np.asarray(logits, np.float64).copy()
  if renormalize:
    logits[pad] = -np.inf
  top = logits.max()
  log_probs = logits - top - np.log(np.exp(logits - top).sum())
  log_probs[pad] = -np.inf
  if force_eos and last:
    log_probs = np.full_like(log_probs, -np.inf)
    log_probs[eos] = 0.0
  return log_probs


def beam_search(log_probs_of, limit, beam_size, penalty, early_stopping="exact"):
  """fairseq's and Hugging Face's beam search, one sentence, in float64: (best hypothesis, score,
  steps run, times an alive beam came from beyond the first `beam_size` ranks).

  `log_probs_of(prefix)` gives the next-token log-probabilities [vocab] after the token tuple
  `prefix`; a hypothesis ends with EOS (id 1) or at `limit` tokens; `penalty(length)` divides
  a finished hypothesis' summed log-probability. Each step ranks the `2 * beam_size` best
  extensions; the ended ones among the first `beam_size` are finished (the best `beam_size`
  of them kept), the best `beam_size` that did not end are the next alive beams. It stops
  ("exact") when no alive beam can beat the best finished hypothesis at any length it may
  still reach; ("heuristic", Hugging Face's early_stopping=False) when `beam_size` have
  finished and the best alive beam, scored at its present length, does not beat the worst of
  them; ("first_k", early_stopping=True) when `beam_size` have finished.
  """
  alive, finished, beyond = [((), 0.0)], [], 0
  for step in range(limit):
    best_alive = max(score for _, score in alive)
    full = len(finished) == beam_size
    if early_stopping == "exact":
      stop = bool(finished) and finished[0][0] >= best_alive / max(
        penalty(step + 1), penalty(limit)
      )
    elif early_stopping == "heuristic":
      stop = full and best_alive / penalty(step) <= finished[-1][0]
    else:
      stop = full
    if stop:
      return finished[0][1], finished[0][0], step, beyond
    candidates = sorted(
      (
        (score + lp, prefix + (token,))
        for prefix, score in alive
        for token, lp in enumerate(log_probs_of(prefix))
        if lp > -np.inf
      ),
      key=lambda c: -c[0],
    )[: 2 * beam_size]
    alive = []
    for rank, (score, hyp) in enumerate(candidates):
      ends = hyp[-1] == 1 or len(hyp) == limit
      if ends and rank < beam_size:
        finished.append((score / penalty(len(hyp)), list(hyp)))
      if not ends and len(alive) < beam_size:
        alive.append((hyp, score))
        beyond += rank >= beam_size
    finished = sorted(finished, key=lambda f: -f[0])[:beam_size]
    if not alive:
      return finished[0][1], finished[0][0], step + 1, beyond
  return finished[0][1], finished[0][0], limit, beyond
