"""BLEU on the validation split during training, and the best parameters so far.

`ValidationBleu` translates the first sentences of a split with the current
parameters and scores them (sacrebleu, detokenized). The best parameters are
kept in `<workdir>/best` (one params-only checkpoint: `--checkpoint=best`)
and described in `<workdir>/best.json`, which a resumed run reads back.
"""

import json
import os

from absl import logging
from etils import epath
import jax

from transformer_jax import checkpointing, data, evaluation

BEST_DIR = "best"
BEST_JSON = "best.json"


def write_json(path: str, record) -> None:
  """Write `record` as indented JSON to `path` (a local path or a URL such as gs://); process 0 only."""
  if jax.process_index() == 0:
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def read_best(workdir: str) -> dict | None:
  """The record of `<workdir>/best.json` (step, bleu, split, sentences, search), or None."""
  path = epath.Path(workdir) / BEST_JSON
  return json.loads(path.read_text()) if path.exists() else None


class ValidationBleu:
  """`(step, params) -> BLEU` of the first `sentences` pairs of `split`; keeps the best parameters.

  The split is read at the first call. Every process calls it with the same
  step and (sharded) parameters.
  """

  def __init__(self, translator, data_config, workdir: str, *, split: str, sentences: int):
    self.translator, self.data_config, self.workdir = translator, data_config, workdir
    self.split, self.sentences = split, sentences
    self.sources, self.references = None, None
    self.best = read_best(workdir)  # Read once: every process then agrees on what is best.

  def _read(self):
    tokenizer = self.translator.tokenizer
    sources, references = [], []
    for _, source_texts, target_texts in data.make_eval_batches(self.data_config, tokenizer,
                                                                self.split):
      sources += source_texts
      references += target_texts
    self.sources = sources[:self.sentences]
    self.references = references[:self.sentences]

  def __call__(self, step: int, params) -> float:
    if self.sources is None:
      self._read()
    hypotheses = self.translator.translate(params, self.sources)
    bleu = evaluation.bleu(hypotheses, self.references)
    if self.best is None or bleu > self.best["bleu"]:
      manager = checkpointing.make_params_manager(os.path.join(self.workdir, BEST_DIR))
      checkpointing.save_params(manager, step, params, bleu=bleu, split=self.split)
      manager.close()
      beam = self.translator.beam_size
      self.best = {
          "step": step, "bleu": bleu, "split": self.split, "sentences": len(self.sources),
          "search": "greedy" if beam == 1 else f"beam {beam}, alpha {self.translator.alpha}",
          "checkpoint": os.path.join(self.workdir, BEST_DIR, str(step))}
      write_json(os.path.join(self.workdir, BEST_JSON), self.best)
      logging.info("step %d: best %s BLEU so far (%.2f), parameters saved in %s", step,
                   self.split, bleu, manager.directory)
    return bleu
