"""BLEU on the validation split during training, and the best parameters so far.

`ValidationBleu` translates the first sentences of a split with the current
parameters and scores them (sacrebleu, detokenized). The best parameters are
kept in `<workdir>/best` (one params-only checkpoint: `--checkpoint=best`)
and described in `<workdir>/best.json`, which a resumed run reads back.
"""

import logging

from transformer_jax import data, fileio
from transformer_jax.checkpoints import store
from transformer_jax.decode import metrics
from transformer_jax.decode.translator import Translator
from transformer_jax.errors import UserError
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)


def read_best(workdir: Workdir) -> dict | None:
  """The record of `<workdir>/best.json` (step, bleu, split, sentences, search, alpha), or None."""
  try:
    return fileio.read_json(workdir.best_json, missing=None)
  except UserError as error:
    raise UserError(
      f"{error}; remove it (and {workdir.best}) to keep the best validation BLEU anew"
    ) from None


class ValidationBleu:
  """`(step, params) -> BLEU` of the first `sentences` pairs of `split`; keeps the best parameters.

  The split is read at the first call. Every process calls it with the same
  step and (sharded) parameters.
  """

  def __init__(
    self, translator: Translator, data_config, workdir: Workdir, *, split: str, sentences: int
  ):
    self.translator, self.data_config, self.workdir = translator, data_config, workdir
    self.split, self.sentences = split, sentences
    self.sources, self.references = None, None
    self.best = read_best(workdir)  # Read once: every process then agrees on what is best.

  def __call__(self, step: int, params) -> float:
    if self.sources is None:
      sources, references = data.split_texts(self.data_config, self.split)
      self.sources, self.references = sources[: self.sentences], references[: self.sentences]
    hypotheses = self.translator.translate(params, self.sources)
    bleu = metrics.bleu(hypotheses, self.references)
    if self.best is None or bleu > self.best["bleu"]:
      manager = store.make_params_manager(self.workdir.best)
      store.save_params(manager, step, params, bleu=bleu, split=self.split)
      manager.close()
      self.best = {
        "step": step,
        "bleu": bleu,
        "split": self.split,
        "sentences": len(self.sources),
        "search": self.translator.settings.search,
        "alpha": self.translator.settings.alpha,
        "checkpoint": str(manager.directory / str(step)),
      }
      fileio.write_json(self.workdir.best_json, self.best)
      log.info(
        "step %d: best %s BLEU so far (%.2f), parameters saved in %s",
        step,
        self.split,
        bleu,
        manager.directory,
      )
    return bleu
