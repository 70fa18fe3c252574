"""A trained model from a work directory, and what uses one: average, eval, translate.

Which parameters (`--checkpoint`):
  latest    the newest step of <workdir>/checkpoints (the default)
  <step>    that step of <workdir>/checkpoints
  averaged  <workdir>/averaged: the mean of the last `experiment.average_last`
            checkpoints, written by `average`
  best      <workdir>/best: the best validation BLEU seen during training
Only the parameters are read (no optimizer state), each process its shards,
onto the mesh and sharding rules of the experiment.
"""

import dataclasses
import time

from absl import logging
from etils import epath
import jax

from transformer_jax import data
from transformer_jax.checkpoints import average as average_lib
from transformer_jax.checkpoints import store
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.decode import files, metrics
from transformer_jax.decode.translator import Translator
from transformer_jax.errors import UserError
from transformer_jax.experiment.settings import Experiment
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


def _model(experiment: Experiment, workdir: Workdir) -> tuple[Placement, data.Tokenizer]:
  """The placed model of `experiment` with the vocabulary of `workdir`; UserError if it has none."""
  vocab = experiment.data.vocab_path or tokenizer_lib.default_vocab_path(experiment.data, workdir.vocab)
  if not epath.Path(vocab).exists():
    raise UserError(f"no vocabulary at {vocab}: pass the --workdir of a trained run and its "
                    "config (or --config.data.vocab_path)")
  tokenizer = data.get_tokenizer(experiment.data, workdir.vocab)
  return experiment.placement(vocab_size=tokenizer.vocab_size), tokenizer


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


def load(experiment: Experiment, workdir: Workdir, checkpoint: str = "latest") -> Loaded:
  """The parameters named by `checkpoint` in `workdir`, restored onto the mesh of `experiment`.

  Raises UserError (FieldError, CheckpointMismatchError, ...) when the
  experiment does not fit the devices, the checkpoint or the vocabulary is
  missing, or the checkpoint's shapes disagree with the experiment and
  vocabulary.
  """
  experiment.check_devices(jax.device_count())
  manager, step = _manager_and_step(workdir, checkpoint)
  placement, tokenizer = _model(experiment, workdir)
  _check(manager, step, placement, tokenizer)
  params = store.restore_params(manager, placement.abstract_params, step=step)
  name = _describe(manager, checkpoint, step)
  logging.info("restored the parameters of %s from %s", name, manager.directory)
  manager.close()
  label = checkpoint if checkpoint in NAMED_CHECKPOINTS else f"step{step}"
  return Loaded(placement, params, tokenizer, workdir, step, name, label)


def average(experiment: Experiment, workdir: Workdir) -> dict:
  """Average the last `experiment.average_last` checkpoints of `workdir` into `<workdir>/averaged`.

  Returns `{"steps": [...], "directory": ...}`. A checkpoint that does not read
  back intact is skipped with a warning and the one before it used; fewer
  checkpoints than asked for are averaged with a warning; none is a UserError.
  """
  experiment.check_devices(jax.device_count())
  manager, _ = _manager_and_step(workdir, "latest")
  placement, tokenizer = _model(experiment, workdir)
  for step in reversed(manager.all_steps()):  # The newest whose metadata reads.
    try:
      _check(manager, step, placement, tokenizer)
      break
    except store.CorruptCheckpointError:
      continue  # Averaging skips it, naming it.
  start = time.perf_counter()
  params, steps = average_lib.average_params(manager, manager.all_steps(),
                                             placement.abstract_params,
                                             count=experiment.average_last)
  manager.close()
  if len(steps) < experiment.average_last:
    logging.warning("averaged %d checkpoints, not config.average_last=%d: only %d in %s read "
                    "back intact", len(steps), experiment.average_last, len(steps), manager.directory)
  out = store.make_params_manager(workdir.averaged)
  store.save_params(out, steps[-1], params, steps=steps)
  out.close()
  logging.info("averaged steps %s into %s in %.1f s", steps, out.directory,
               time.perf_counter() - start)
  return {"steps": steps, "directory": str(out.directory / str(steps[-1]))}


def evaluate_split(experiment: Experiment, workdir: Workdir, checkpoint: str = "latest") -> dict:
  """Decode `decode.split` with the paper's search, score it, write the files.

  Writes `<workdir>/eval/<split>-<checkpoint>-<search>.txt` (one hypothesis
  per line; e.g. `test-averaged-beam4.txt`, `validation-step800-greedy.txt`)
  and `.json` (BLEU, perplexity, settings, speed) and returns the JSON record.
  """
  loaded = load(experiment, workdir, checkpoint)
  settings = experiment.decode
  split = settings.split
  shard_index, shard_count = loaded.placement.data_shard
  try:
    sources, references = data.split_texts(experiment.data, split)
    batches = data.make_eval_batches(experiment.data, loaded.tokenizer, split,
                                     shard_index=shard_index, shard_count=shard_count)
  except (data.DataError, data.DataUnavailableError) as error:
    raise UserError(f"config.decode.split={split!r}: {error}") from None
  loss = metrics.TeacherForcedLoss(loaded.placement, label_smoothing=experiment.label_smoothing)
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
  if experiment.decode.tokenized_bleu:
    record["bleu_tokenized"] = metrics.bleu(hypotheses, references, tokenized=True)
  stem = loaded.workdir.eval_file(f"{split}-{loaded.label}-{settings.search}")
  record["hypotheses"] = stem + ".txt"
  files.write_lines(stem + ".txt", hypotheses)
  files.write_json(stem + ".json", record)
  return record


def translate_file(experiment: Experiment, workdir: Workdir, checkpoint: str, input_path: str | None,
                   output_path: str | None) -> dict:
  """Translate the lines of `input_path` (stdin for None or '-') into `output_path` (stdout).

  One line out per line in, in order (written by process 0). Returns
  `{"lines": n, "seconds": decoding time}`.
  """
  lines = files.read_lines(input_path)  # Fails on bad input before loading anything.
  loaded = load(experiment, workdir, checkpoint)
  start = time.perf_counter()
  translator = Translator(loaded.placement, loaded.tokenizer, experiment.decode)
  translations = translator.translate(loaded.params, lines)
  seconds = time.perf_counter() - start
  files.write_lines(output_path, translations)
  return {"lines": len(lines), "seconds": seconds}
