"""Evaluation metrics: corpus BLEU (sacrebleu) and per-token perplexity.

`bleu` scores detokenized text with sacrebleu's defaults (13a tokenization,
mixed case, exponential smoothing), which is what papers since 2018 report
and what `sacrebleu REF < HYP` prints. `bleu(..., tokenized=True)` is the
paper-era tokenized BLEU of the EN-DE literature (tokenize, split hyphenated
compounds as `a ##AT##-##AT## b`, then multi-bleu.perl, no smoothing). The
Moses tokenizer is not a dependency, so sacrebleu's 13a tokenizer, which like
Moses leaves hyphens inside words alone, stands in for it: scores are close
to, not byte-identical with, multi-bleu.perl on Moses-tokenized text.
"""

import math
import re
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

_COMPOUND = re.compile(r"(\S)-(\S)")
_TOKENIZE_13A = Tokenizer13a()


def split_compounds(line: str) -> str:
  """Split hyphenated compounds as the EN-DE literature does: `a-b` -> `a ##AT##-##AT## b`.

  Same matches as the usual `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`.
  """
  return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def paper_tokenize(line: str) -> str:
  """Tokenize a detokenized line for paper-style BLEU: 13a tokenization, then compound splitting."""
  return split_compounds(_TOKENIZE_13A(line))


def bleu(hypotheses: Sequence[str], references: Sequence[str], *, tokenized: bool = False) -> float:
  """Corpus BLEU (0-100) of one hypothesis per reference line.

  Default: sacrebleu on detokenized text. `tokenized=True`: both sides through
  `paper_tokenize`, then BLEU on whitespace tokens without smoothing
  (multi-bleu.perl's definition).
  """
  if len(hypotheses) != len(references):
    raise ValueError(
        f"bleu needs one hypothesis per reference; got {len(hypotheses)} hypotheses "
        f"and {len(references)} references")
  if not tokenized:
    return BLEU().corpus_score(list(hypotheses), [list(references)]).score
  hypotheses = [paper_tokenize(h) for h in hypotheses]
  references = [paper_tokenize(r) for r in references]
  metric = BLEU(tokenize="none", smooth_method="none")
  return metric.corpus_score(hypotheses, [references]).score


def token_nll(logits, targets, pad_id: int = 0):
  """Summed negative log-likelihood of non-pad `targets` `[b, t]` under `logits` `[b, t, vocab]`.

  Returns `(nll_sum, num_tokens)`: float32 and int32 scalars. No label smoothing.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  real = targets != pad_id
  return jnp.sum(jnp.where(real, nll, 0.0)), jnp.sum(real, dtype=jnp.int32)


def perplexity(nll_sum: float, num_tokens: int) -> float:
  """Per-token perplexity `exp(nll_sum / num_tokens)`."""
  if num_tokens <= 0:
    raise ValueError(f"perplexity needs at least one token; got num_tokens={num_tokens}")
  return math.exp(nll_sum / num_tokens)


_token_nll = jax.jit(token_nll, static_argnames="pad_id")


def corpus_perplexity(logits_fn: Callable, batches: Iterable[dict], pad_id: int = 0) -> float:
  """Per-token perplexity over a split.

  `logits_fn(batch)` returns `[b, t, vocab]` logits for `batch["targets"]`
  `[b, t]` (e.g. a jitted teacher-forced model apply); sums are accumulated
  on the host in float64.
  """
  nll_sum, num_tokens = 0.0, 0
  for batch in batches:
    nll, count = _token_nll(logits_fn(batch), batch["targets"], pad_id=pad_id)
    nll_sum += float(nll)
    num_tokens += int(count)
  return perplexity(nll_sum, num_tokens)
