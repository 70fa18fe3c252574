"""Evaluation metrics: corpus BLEU (sacrebleu), and the teacher-forced loss sums of a split.

`bleu` scores detokenized text with sacrebleu's defaults (13a tokenization,
mixed case, exponential smoothing), which is what papers since 2018 report
and what `sacrebleu REF < HYP` prints. `bleu(..., tokenized=True)` is the
paper-era tokenized BLEU of the EN-DE literature (tokenize, split hyphenated
compounds as `a ##AT##-##AT## b`, then multi-bleu.perl, no smoothing). The
Moses tokenizer is not a dependency, so sacrebleu's 13a tokenizer, which like
Moses leaves hyphens inside words alone, stands in for it: scores are close
to, not byte-identical with, multi-bleu.perl on Moses-tokenized text.
"""

import re
from collections.abc import Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec
from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from transformer_jax.model.loss import add_sums
from transformer_jax.model.spec import LossFn
from transformer_jax.placement import Placement

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


def _check_one_per_reference(hypotheses: Sequence[str], references: Sequence[str]) -> None:
  if len(hypotheses) != len(references):
    raise ValueError(
      f"bleu needs one hypothesis per reference; got {len(hypotheses)} hypotheses "
      f"and {len(references)} references"
    )


def bleu(hypotheses: Sequence[str], references: Sequence[str], *, tokenized: bool = False) -> float:
  """Corpus BLEU (0-100) of one hypothesis per reference line.

  Default: sacrebleu on detokenized text. `tokenized=True`: both sides through
  `paper_tokenize`, then BLEU on whitespace tokens without smoothing
  (multi-bleu.perl's definition).
  """
  _check_one_per_reference(hypotheses, references)
  if not tokenized:
    return BLEU().corpus_score(list(hypotheses), [list(references)]).score
  hypotheses = [paper_tokenize(h) for h in hypotheses]
  references = [paper_tokenize(r) for r in references]
  metric = BLEU(tokenize="none", smooth_method="none")
  return metric.corpus_score(hypotheses, [references]).score


def bleu_as_is(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Corpus BLEU (0-100) on the text as it is, split at spaces, without smoothing: what
  multi-bleu.perl and fairseq report on text that is already tokenized (Multi30k's
  lc.norm.tok files)."""
  _check_one_per_reference(hypotheses, references)
  metric = BLEU(tokenize="none", smooth_method="none")
  return metric.corpus_score(list(hypotheses), [list(references)]).score


# What each BLEU of an eval record is (`--mode=eval`'s JSON says it beside the figures).
BLEU_METHODS = {
  "bleu": "sacreBLEU, 13a tokenization, mixed case, on the decoded text",
  "bleu_tokenized": "the paper's: 13a tokenization and compound splitting, then BLEU on "
  "tokens without smoothing (decode.tokenized_bleu)",
  "bleu_as_is": "BLEU on the decoded text split at spaces, without smoothing, as "
  "multi-bleu.perl and fairseq score tokenized text (decode.as_is_bleu)",
}


class TeacherForcedLoss:
  """`(params, batches) -> loss sums`: a placed model's loss function `loss` (`model.spec.LossFn`;
  the Transformer's: `loss.transformer_loss`) of its outputs without dropout, summed over a
  split's batches on the devices and fetched to the host.

  Batches are those of `data.make_eval_batches`: every process passes its
  rows of the same global batches, in the same order. The step is compiled
  once per batch shape.
  """

  def __init__(self, placement: Placement, loss: LossFn):
    self.placement = placement
    spec = placement.spec
    self.jitted_sums = jax.jit(
      lambda params, batch: loss(spec.apply(params, batch, None), batch),
      in_shardings=(placement.param_shardings, placement.batch_sharding),
      out_shardings=NamedSharding(placement.mesh, PartitionSpec()),
    )

  def __call__(self, params, batches) -> dict:
    total = None
    for batch in batches:
      sums = self.placement.run(self.jitted_sums, params, self.placement.global_batch(batch))
      total = sums if total is None else add_sums(total, sums)
    if total is None:
      raise ValueError("the evaluation split has no batches")
    return jax.device_get(total)
