"""A trained model from a work directory, and the modes that use one: eval, translate, average.

Which parameters (`--checkpoint`):
  latest    the newest step of <workdir>/checkpoints (the default)
  <step>    that step of <workdir>/checkpoints
  averaged  <workdir>/averaged: the mean of the last `config.average_last`
            checkpoints, written by `average`
  best      <workdir>/best: the best validation BLEU seen during training
Only the parameters are read (no optimizer state), each process its shards,
onto the mesh and sharding rules of the config.
"""

import dataclasses
import os
import time

from absl import logging
from etils import epath
import jax

from transformer_jax import checkpointing, data, evaluation, training, translate, validation
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.errors import UserError

CHECKPOINTS_DIR = "checkpoints"
AVERAGED_DIR = "averaged"
EVAL_DIR = "eval"
NAMED_CHECKPOINTS = {"averaged": AVERAGED_DIR, "best": validation.BEST_DIR}


@dataclasses.dataclass
class Loaded:
  """A trained model: the trainer (model, mesh, shardings), its parameters and where they came from."""

  trainer: training.Trainer
  params: object
  tokenizer: data.Tokenizer
  step: int
  name: str  # "step 800", "averaged 600-800" or "best (step 700)", for people.
  label: str  # "step800", "averaged" or "best", for file names.

  def translator(self, decode) -> translate.Translator:
    """A Translator for this model with the settings of `config.decode`."""
    return translate.Translator(
        self.trainer.model, self.tokenizer, self.trainer.mesh, self.trainer.rules,
        beam_size=decode.beam_size, alpha=decode.alpha, max_extra=decode.max_extra,
        batch_size=decode.batch_size)


def _manager_and_step(workdir: str, checkpoint: str):
  """The Orbax manager holding `checkpoint` and its step; UserError if there is none."""
  if checkpoint not in NAMED_CHECKPOINTS and checkpoint != "latest" and not checkpoint.isdigit():
    raise UserError(f"--checkpoint={checkpoint!r} is not understood; allowed: latest, averaged, "
                    "best or a step number")
  directory = os.path.join(workdir, NAMED_CHECKPOINTS.get(checkpoint, CHECKPOINTS_DIR))
  if not epath.Path(directory).is_dir():
    hint = {"averaged": "run --mode=average first",
            "best": "train with config.eval_every_steps > 0 and config.eval_bleu_sentences > 0"}
    raise UserError(f"no checkpoint in {directory}: "
                    f"{hint.get(checkpoint, 'train first, or pass the --workdir of a trained run')}")
  manager = checkpointing.make_manager(directory)
  steps = manager.all_steps()
  step = int(checkpoint) if checkpoint.isdigit() else (max(steps) if steps else None)
  if step is None or step not in steps:
    raise UserError(f"no checkpoint {'' if step is None else step} in {directory}"
                    f"{'; steps there: ' + ', '.join(map(str, steps)) if steps else ''}")
  return manager, step


def _check_shapes(manager, step: int, abstract_params, tokenizer) -> None:
  """UserError unless the saved parameters have the shapes that the config and vocabulary give."""
  saved = jax.tree_util.tree_flatten_with_path(checkpointing.params_metadata(manager, step))[0]
  saved = {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in saved}
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
    name = jax.tree_util.keystr(path)
    if saved.get(name) != tuple(leaf.shape):
      found = f"has shape {saved[name]}" if name in saved else "lacks it"
      raise UserError(
          f"checkpoint {manager.directory}/{step} does not fit this model: params{name} should "
          f"have shape {tuple(leaf.shape)} (config.model and the vocabulary {tokenizer.path} of "
          f"{tokenizer.vocab_size} tokens) but the checkpoint {found}; use the config and "
          "vocabulary the model was trained with")


def _model(config, workdir: str):
  """`(trainer, tokenizer)` of `config` with the vocabulary of `workdir`; UserError if it has none."""
  training.validate_config(config)
  vocab = config.data.vocab_path or tokenizer_lib.default_vocab_path(config.data, workdir)
  if not os.path.exists(vocab):
    raise UserError(f"no vocabulary at {vocab}: pass the --workdir of a trained run and its "
                    "config (or --config.data.vocab_path)")
  tokenizer = data.get_tokenizer(config.data, workdir)
  trainer, _ = training.make_trainer(config, vocab_size=tokenizer.vocab_size)
  return trainer, tokenizer


def load(config, workdir: str, checkpoint: str = "latest") -> Loaded:
  """The parameters named by `checkpoint` in `workdir`, restored onto the mesh of `config`.

  Raises UserError when the checkpoint or the vocabulary is missing, or when
  the checkpoint's shapes disagree with the config and vocabulary.
  """
  workdir = checkpointing.absolute(workdir)
  manager, step = _manager_and_step(workdir, checkpoint)
  trainer, tokenizer = _model(config, workdir)
  abstract = trainer.abstract_state.params
  _check_shapes(manager, step, abstract, tokenizer)
  params = checkpointing.restore_params(manager, abstract, step=step)
  if checkpoint == "averaged":
    steps = manager.metadata(step).custom_metadata["steps"]
    name = f"averaged {steps[0]}-{steps[-1]} ({len(steps)} checkpoints)"
  elif checkpoint == "best":
    name = f"best (step {step})"
  else:
    name = f"step {step}"
  logging.info("restored the parameters of %s from %s", name, manager.directory)
  manager.close()
  label = checkpoint if checkpoint in NAMED_CHECKPOINTS else f"step{step}"
  return Loaded(trainer, params, tokenizer, step, name, label)


def average(config, workdir: str) -> dict:
  """Average the last `config.average_last` checkpoints of `workdir` into `<workdir>/averaged`.

  Returns `{"steps": [...], "directory": ...}`. Fewer checkpoints than asked
  for are averaged with a warning; none is a UserError.
  """
  workdir = checkpointing.absolute(workdir)
  manager, _ = _manager_and_step(workdir, "latest")
  trainer, tokenizer = _model(config, workdir)
  abstract = trainer.abstract_state.params
  steps = manager.all_steps()[-config.average_last:]
  for step in steps:
    _check_shapes(manager, step, abstract, tokenizer)
  if len(steps) < config.average_last:
    logging.warning("averaging %d checkpoints, not config.average_last=%d: only %d are in %s",
                    len(steps), config.average_last, len(steps), manager.directory)
  start = time.perf_counter()
  params = checkpointing.average_params(manager, steps, abstract)
  manager.close()
  out = checkpointing.make_params_manager(os.path.join(workdir, AVERAGED_DIR))
  checkpointing.save_params(out, steps[-1], params, steps=steps)
  out.close()
  logging.info("averaged steps %s into %s in %.1f s", steps, out.directory,
               time.perf_counter() - start)
  return {"steps": steps, "directory": str(out.directory / str(steps[-1]))}


def evaluate(config, workdir: str, checkpoint: str = "latest") -> dict:
  """Decode `config.decode.split` with the paper's search, score it, write the files.

  Writes `<workdir>/eval/<split>-<checkpoint>-<search>.txt` (one hypothesis
  per line; e.g. `test-averaged-beam4.txt`, `validation-step800-greedy.txt`)
  and `.json` (BLEU, perplexity, settings, speed) and returns the JSON record.
  """
  loaded = load(config, workdir, checkpoint)
  split, decode = config.decode.split, config.decode
  try:
    everything = data.make_eval_batches(config.data, loaded.tokenizer, split)
  except (ValueError, data.DataUnavailableError) as error:
    raise UserError(f"config.decode.split={split!r}: {error}") from None
  sources = [s for _, texts, _ in everything for s in texts]
  references = [t for _, _, texts in everything for t in texts]
  shard_index, shard_count = loaded.trainer.data_shard
  batches = everything if shard_count == 1 else data.make_eval_batches(
      config.data, loaded.tokenizer, split, shard_index=shard_index, shard_count=shard_count)
  sums = training.evaluate(loaded.trainer, loaded.params, batches)

  start = time.perf_counter()
  hypotheses = loaded.translator(decode).translate(loaded.params, sources)
  seconds = time.perf_counter() - start
  search = "greedy" if decode.beam_size == 1 else f"beam{decode.beam_size}"
  record = {
      "split": split, "checkpoint": loaded.name, "step": loaded.step,
      "sentences": len(sources),
      "bleu": evaluation.bleu(hypotheses, references),
      "perplexity": evaluation.perplexity(float(sums["nll"]), int(sums["tokens"])),
      "search": search, "beam_size": decode.beam_size, "alpha": decode.alpha,
      "max_extra": decode.max_extra,
      "decode_seconds": round(seconds, 2),
      "sentences_per_second": round(len(sources) / seconds, 2),
  }
  if decode.tokenized_bleu:
    record["bleu_tokenized"] = evaluation.bleu(hypotheses, references, tokenized=True)
  stem = os.path.join(checkpointing.absolute(workdir), EVAL_DIR,
                      f"{split}-{loaded.label}-{search}")
  record["hypotheses"] = stem + ".txt"
  translate.write_lines(stem + ".txt", hypotheses)
  validation.write_json(stem + ".json", record)
  return record


def translate_file(config, workdir: str, checkpoint: str, input_path: str | None,
                   output_path: str | None) -> dict:
  """Translate the lines of `input_path` (stdin for None or '-') into `output_path` (stdout).

  One line out per line in, in order (written by process 0). Returns
  `{"lines": n, "seconds": decoding time}`.
  """
  lines = translate.read_lines(input_path)  # Fails on bad input before loading anything.
  loaded = load(config, workdir, checkpoint)
  start = time.perf_counter()
  translations = loaded.translator(config.decode).translate(loaded.params, lines)
  seconds = time.perf_counter() - start
  translate.write_lines(output_path, translations)
  return {"lines": len(lines), "seconds": seconds}
