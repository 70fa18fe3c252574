"""A trained model from a work directory, and the modes that use one: average, eval, translate.

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
import time

from absl import logging
from etils import epath

from transformer_jax import config as config_lib
from transformer_jax import data
from transformer_jax.checkpoints import average as average_lib
from transformer_jax.checkpoints import store
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.decode import files, metrics
from transformer_jax.decode.translator import DecodeSettings, Translator
from transformer_jax.errors import UserError
from transformer_jax.model.loss import perplexity
from transformer_jax.sharding import Placement
from transformer_jax.workdir import Workdir

# --checkpoint names besides `latest` and a step: each is a directory of `Workdir`, and how a
# user makes it.
NAMED_CHECKPOINTS = {
    "averaged": "run --mode=average first",
    "best": "train with config.eval_every_steps > 0 and config.eval_bleu_sentences > 0",
}


@dataclasses.dataclass
class Loaded:
  """A trained model: placed on the mesh, its parameters, its vocabulary and where they came from."""

  placement: Placement
  params: object
  tokenizer: data.Tokenizer
  workdir: Workdir
  step: int
  name: str  # "step 800", "averaged 600-800 (5 checkpoints)" or "best (step 700)", for people.
  label: str  # "step800", "averaged" or "best", for file names.


def _manager_and_step(workdir: Workdir, checkpoint: str):
  """The Orbax manager holding `checkpoint` and its step; UserError if there is none."""
  if checkpoint not in NAMED_CHECKPOINTS and checkpoint != "latest" and not checkpoint.isdigit():
    raise UserError(f"--checkpoint={checkpoint!r} is not understood; allowed: latest, averaged, "
                    "best or a step number")
  directory = getattr(workdir, checkpoint) if checkpoint in NAMED_CHECKPOINTS else (
      workdir.checkpoints)
  if not epath.Path(directory).is_dir():
    hint = NAMED_CHECKPOINTS.get(checkpoint, "train first, or pass the --workdir of a trained run")
    raise UserError(f"no checkpoint in {directory}: {hint}")
  manager = store.make_manager(directory)
  steps = manager.all_steps()
  step = int(checkpoint) if checkpoint.isdigit() else (max(steps) if steps else None)
  if step is None or step not in steps:
    raise UserError(f"no checkpoint {'' if step is None else step} in {directory}"
                    f"{'; steps there: ' + ', '.join(map(str, steps)) if steps else ''}")
  return manager, step


def _model(config, workdir: Workdir) -> tuple[Placement, data.Tokenizer]:
  """The placed model of `config` with the vocabulary of `workdir`; UserError if it has none."""
  vocab = config.data.vocab_path or tokenizer_lib.default_vocab_path(config.data, workdir.vocab)
  if not epath.Path(vocab).exists():
    raise UserError(f"no vocabulary at {vocab}: pass the --workdir of a trained run and its "
                    "config (or --config.data.vocab_path)")
  with config_lib.section("data"):
    tokenizer = data.get_tokenizer(config.data, workdir.vocab)
  return config_lib.placement(config, vocab_size=tokenizer.vocab_size), tokenizer


def _check(manager, step: int, placement: Placement, tokenizer: data.Tokenizer) -> None:
  """CheckpointMismatchError unless `step`'s parameters have the shapes of `placement`'s."""
  store.check_layout(manager, step, placement.abstract_params, under=store.PARAMS, hint=(
      "Use the config (config.model) and the vocabulary the model was trained with (here: "
      f"{tokenizer.path}, {tokenizer.vocab_size} tokens)"))


def _describe(manager, checkpoint: str, step: int) -> str:
  """The checkpoint for people: 'averaged 600-800 (5 checkpoints)', 'best (step 700)', 'step 800'."""
  if checkpoint == "averaged":
    steps = store.saved_info(manager, step).get("steps")
    if steps:
      return f"averaged {steps[0]}-{steps[-1]} ({len(steps)} checkpoints)"
  if checkpoint in NAMED_CHECKPOINTS:
    return f"{checkpoint} (step {step})"
  return f"step {step}"


def load(config, workdir: str, checkpoint: str = "latest") -> Loaded:
  """The parameters named by `checkpoint` in `workdir`, restored onto the mesh of `config`.

  Raises UserError (ConfigError, CheckpointMismatchError, ...) when the
  config is invalid, the checkpoint or the vocabulary is missing, or the
  checkpoint's shapes disagree with the config and vocabulary.
  """
  config_lib.validate(config)
  workdir = Workdir(workdir)
  manager, step = _manager_and_step(workdir, checkpoint)
  placement, tokenizer = _model(config, workdir)
  _check(manager, step, placement, tokenizer)
  params = store.restore_params(manager, placement.abstract_params, step=step)
  name = _describe(manager, checkpoint, step)
  logging.info("restored the parameters of %s from %s", name, manager.directory)
  manager.close()
  label = checkpoint if checkpoint in NAMED_CHECKPOINTS else f"step{step}"
  return Loaded(placement, params, tokenizer, workdir, step, name, label)


def average(config, workdir: str) -> dict:
  """Average the last `config.average_last` checkpoints of `workdir` into `<workdir>/averaged`.

  Returns `{"steps": [...], "directory": ...}`. A checkpoint that does not read
  back intact is skipped with a warning and the one before it used; fewer
  checkpoints than asked for are averaged with a warning; none is a UserError.
  """
  config_lib.validate(config)
  workdir = Workdir(workdir)
  manager, _ = _manager_and_step(workdir, "latest")
  placement, tokenizer = _model(config, workdir)
  for step in reversed(manager.all_steps()):  # The newest whose metadata reads.
    try:
      _check(manager, step, placement, tokenizer)
      break
    except store.CorruptCheckpointError:
      continue  # Averaging skips it, naming it.
  start = time.perf_counter()
  params, steps = average_lib.average_params(manager, manager.all_steps(),
                                             placement.abstract_params, count=config.average_last)
  manager.close()
  if len(steps) < config.average_last:
    logging.warning("averaged %d checkpoints, not config.average_last=%d: only %d in %s read back "
                    "intact", len(steps), config.average_last, len(steps), manager.directory)
  out = store.make_params_manager(workdir.averaged)
  store.save_params(out, steps[-1], params, steps=steps)
  out.close()
  logging.info("averaged steps %s into %s in %.1f s", steps, out.directory,
               time.perf_counter() - start)
  return {"steps": steps, "directory": str(out.directory / str(steps[-1]))}


def evaluate_split(config, workdir: str, checkpoint: str = "latest") -> dict:
  """Decode `config.decode.split` with the paper's search, score it, write the files.

  Writes `<workdir>/eval/<split>-<checkpoint>-<search>.txt` (one hypothesis
  per line; e.g. `test-averaged-beam4.txt`, `validation-step800-greedy.txt`)
  and `.json` (BLEU, perplexity, settings, speed) and returns the JSON record.
  """
  loaded = load(config, workdir, checkpoint)
  split, settings = config.decode.split, DecodeSettings.from_config(config)
  shard_index, shard_count = loaded.placement.data_shard
  try:
    with config_lib.section("data"):
      sources, references = data.split_texts(config.data, split)
      batches = data.make_eval_batches(config.data, loaded.tokenizer, split,
                                       shard_index=shard_index, shard_count=shard_count)
  except (data.DataError, data.DataUnavailableError) as error:
    raise UserError(f"config.decode.split={split!r}: {error}") from None
  loss = metrics.TeacherForcedLoss(loaded.placement, label_smoothing=config.label_smoothing)
  sums = loss(loaded.params, batches)

  start = time.perf_counter()
  hypotheses = Translator(loaded.placement, loaded.tokenizer, settings).translate(
      loaded.params, sources)
  seconds = time.perf_counter() - start
  record = {
      "split": split, "checkpoint": loaded.name, "step": loaded.step,
      "sentences": len(sources),
      "bleu": metrics.bleu(hypotheses, references),
      "perplexity": perplexity(float(sums["nll"]), int(sums["tokens"])),
      "search": settings.search, "beam_size": settings.beam_size, "alpha": settings.alpha,
      "length_normalization": settings.length_normalization,
      "max_extra": settings.max_extra, "max_length": settings.max_length,
      "force_eos": settings.force_eos, "renormalize": settings.renormalize,
      "early_stopping": settings.early_stopping,
      "decode_seconds": round(seconds, 2),
      "sentences_per_second": round(len(sources) / seconds, 2),
  }
  if config.decode.tokenized_bleu:
    record["bleu_tokenized"] = metrics.bleu(hypotheses, references, tokenized=True)
  stem = loaded.workdir.eval_file(f"{split}-{loaded.label}-{settings.search}")
  record["hypotheses"] = stem + ".txt"
  files.write_lines(stem + ".txt", hypotheses)
  files.write_json(stem + ".json", record)
  return record


def translate_file(config, workdir: str, checkpoint: str, input_path: str | None,
                   output_path: str | None) -> dict:
  """Translate the lines of `input_path` (stdin for None or '-') into `output_path` (stdout).

  One line out per line in, in order (written by process 0). Returns
  `{"lines": n, "seconds": decoding time}`.
  """
  lines = files.read_lines(input_path)  # Fails on bad input before loading anything.
  loaded = load(config, workdir, checkpoint)
  start = time.perf_counter()
  translator = Translator(loaded.placement, loaded.tokenizer, DecodeSettings.from_config(config))
  translations = translator.translate(loaded.params, lines)
  seconds = time.perf_counter() - start
  files.write_lines(output_path, translations)
  return {"lines": len(lines), "seconds": seconds}
