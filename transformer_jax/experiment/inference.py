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
import logging
import time

import jax

from transformer_jax import data, fileio
from transformer_jax.checkpoints import average as average_lib
from transformer_jax.checkpoints import integrity, store
from transformer_jax.decode import metrics
from transformer_jax.decode.translator import Translator
from transformer_jax.errors import UserError
from transformer_jax.experiment.settings import Experiment
from transformer_jax.model.loss import perplexity
from transformer_jax.placement import Placement
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)

# Checkpoints besides `latest` and a step: each is a directory of `Workdir`, and how a user
# makes it.
NAMED_CHECKPOINTS = {
  "averaged": "run --mode=average first",
  "best": "train with config.eval_every_steps > 0 and config.eval_bleu_sentences > 0",
}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Which parameters of a work directory: `latest`, a `step`, `averaged` or `best`."""

  name: str = "latest"  # "latest", "step" or one of NAMED_CHECKPOINTS.
  step: int | None = None  # For "step".

  def __post_init__(self):
    if (self.name == "step") != isinstance(self.step, int) or self.name not in (
      "latest",
      "step",
      *NAMED_CHECKPOINTS,
    ):
      raise ValueError(
        f"{self} is not a checkpoint: latest, averaged, best, or step with a step number"
      )

  @classmethod
  def parse(cls, text: str) -> "Checkpoint":
    """The checkpoint `--checkpoint=text` names; UserError for anything else."""
    if text.isdigit():
      return cls("step", int(text))
    if text == "latest" or text in NAMED_CHECKPOINTS:
      return cls(text)
    raise UserError(
      f"--checkpoint={text!r} is not understood; allowed: latest, averaged, best or a step number"
    )

  def directory(self, workdir: Workdir) -> str:
    return getattr(workdir, self.name) if self.name in NAMED_CHECKPOINTS else workdir.checkpoints


@dataclasses.dataclass
class Loaded:
  """A trained model placed on the mesh: its parameters, vocabulary and where they came from."""

  placement: Placement
  params: object
  tokenizer: data.Tokenizer
  workdir: Workdir
  step: int
  name: str  # "step 800", "averaged 600-800 (5 checkpoints)" or "best (step 700)", for people.
  label: str  # "step800", "averaged" or "best", for file names.


def _manager_and_step(workdir: Workdir, checkpoint: Checkpoint):
  """The Orbax manager holding `checkpoint` and its step, chosen from process 0's listing on every
  process; UserError if there is none."""
  directory = checkpoint.directory(workdir)
  steps = integrity.process_zero_steps(store.committed_steps(directory))
  if not steps:
    hint = NAMED_CHECKPOINTS.get(
      checkpoint.name, "train first, or pass the --workdir of a trained run"
    )
    raise UserError(f"no checkpoint in {directory}: {hint}")
  step = max(steps) if checkpoint.step is None else checkpoint.step
  if step not in steps:
    raise UserError(
      f"no checkpoint {step} in {directory}; steps there: {', '.join(map(str, steps))}"
    )
  return store.make_manager(directory), step, steps


def _model(experiment: Experiment, workdir: Workdir) -> tuple[Placement, data.Tokenizer]:
  """The placed model of `experiment` with the vocabulary of `workdir`; UserError if it has none."""
  try:
    tokenizer = data.load_tokenizer(experiment.data, workdir.vocab)
  except data.DataError as error:
    raise UserError(
      f"{error}: pass the --workdir of a trained run and its config (or --config.data.vocab.path)"
    ) from None
  return experiment.placement(vocab_size=tokenizer.vocab_size), tokenizer


def _hint(tokenizer: data.Tokenizer) -> str:
  """What to check when a checkpoint does not fit the model."""
  return (
    "Use the config (config.model) and the vocabulary the model was trained with (here: "
    f"{tokenizer.path}, {tokenizer.vocab_size} tokens)"
  )


def _describe(manager, checkpoint: Checkpoint, step: int) -> str:
  """The checkpoint in words: 'averaged 600-800 (5 checkpoints)', 'best (step 700)', 'step 800'."""
  if checkpoint.name == "averaged":
    steps = store.saved_info(manager, step).get("steps")
    if steps:
      return f"averaged {steps[0]}-{steps[-1]} ({len(steps)} checkpoints)"
  if checkpoint.name in NAMED_CHECKPOINTS:
    return f"{checkpoint.name} (step {step})"
  return f"step {step}"


def load(experiment: Experiment, workdir: Workdir, checkpoint: Checkpoint = Checkpoint()) -> Loaded:
  """The parameters named by `checkpoint` in `workdir`, restored onto the mesh of `experiment`.

  Raises UserError (FieldError, CheckpointMismatchError, ...) when the
  experiment does not fit the devices, the checkpoint or the vocabulary is
  missing, or the checkpoint's shapes disagree with the experiment and
  vocabulary.
  """
  experiment.check_devices(jax.device_count())
  manager, step, _ = _manager_and_step(workdir, checkpoint)
  placement, tokenizer = _model(experiment, workdir)
  params = store.restore_params(
    manager, placement.abstract_params, step=step, hint=_hint(tokenizer)
  )
  name = _describe(manager, checkpoint, step)
  log.info("restored the parameters of %s from %s", name, manager.directory)
  manager.close()
  label = checkpoint.name if checkpoint.name in NAMED_CHECKPOINTS else f"step{step}"
  return Loaded(placement, params, tokenizer, workdir, step, name, label)


def average(experiment: Experiment, workdir: Workdir) -> dict:
  """Average the last `experiment.average_last` checkpoints of `workdir` into `<workdir>/averaged`.

  Returns `{"steps": [...], "directory": ...}`. A checkpoint that does not read
  back intact is skipped with a warning and the one before it used; fewer
  checkpoints than asked for are averaged with a warning; none is a UserError.
  """
  experiment.check_devices(jax.device_count())
  manager, _, steps = _manager_and_step(workdir, Checkpoint())
  placement, tokenizer = _model(experiment, workdir)
  start = time.perf_counter()
  params, steps = average_lib.average_params(
    manager, steps, placement.abstract_params, count=experiment.average_last, hint=_hint(tokenizer)
  )
  manager.close()
  if len(steps) < experiment.average_last:
    log.warning(
      "averaged %d checkpoints, not config.average_last=%d: only %d in %s read back intact",
      len(steps),
      experiment.average_last,
      len(steps),
      manager.directory,
    )
  out = store.make_params_manager(workdir.averaged)
  store.save_params(out, steps[-1], params, steps=steps)
  out.close()
  log.info("averaged steps %s into %s in %.1f s", steps, out.directory, time.perf_counter() - start)
  return {"steps": steps, "directory": str(out.directory / str(steps[-1]))}


def evaluate_split(
  experiment: Experiment, workdir: Workdir, checkpoint: Checkpoint = Checkpoint()
) -> dict:
  """Decode `decode.split` with the paper's search, score it, write the files.

  Writes `<workdir>/eval/<split>-<checkpoint>-<search>.txt` (one hypothesis
  per line; e.g. `test-averaged-beam4.txt`, `validation-step800-greedy.txt`)
  and `.json` (BLEU, perplexity, settings, speed) and returns the JSON record.
  A language model (`model_kind`) is scored by its perplexity alone: `language_model_perplexity`.
  """
  if experiment.is_language_model:
    return language_model_perplexity(experiment, workdir, checkpoint)
  loaded = load(experiment, workdir, checkpoint)
  settings = experiment.decode
  split = settings.split
  sums = _split_sums(experiment, loaded, split)
  try:
    sources, references = data.split_texts(experiment.data, split)
  except (data.DataError, data.DataUnavailableError) as error:
    raise UserError(f"config.decode.split={split!r}: {error}") from None

  start = time.perf_counter()
  hypotheses = Translator(loaded.placement, loaded.tokenizer, settings).translate(
    loaded.params, sources
  )
  seconds = time.perf_counter() - start
  record = {
    "split": split,
    "checkpoint": loaded.name,
    "step": loaded.step,
    "sentences": len(sources),
    "bleu": metrics.bleu(hypotheses, references),
    "perplexity": perplexity(float(sums["nll"]), int(sums["tokens"])),
    "search": settings.search,
    "beam_size": settings.beam_size,
    "alpha": settings.alpha,
    "length_normalization": settings.length_normalization,
    "max_extra": settings.max_extra,
    "max_length": settings.max_length,
    "force_eos": settings.force_eos,
    "renormalize": settings.renormalize,
    "early_stopping": settings.early_stopping,
    "decode_seconds": round(seconds, 2),
    "sentences_per_second": round(len(sources) / seconds, 2),
  }
  if experiment.decode.tokenized_bleu:
    record["bleu_tokenized"] = metrics.bleu(hypotheses, references, tokenized=True)
  if experiment.decode.as_is_bleu:
    record["bleu_as_is"] = metrics.bleu_as_is(hypotheses, references)
  record["bleu_methods"] = {k: v for k, v in metrics.BLEU_METHODS.items() if k in record}
  stem = loaded.workdir.eval_file(f"{split}-{loaded.label}-{settings.search}")
  record["hypotheses"] = stem + ".txt"
  fileio.write_lines(stem + ".txt", hypotheses)
  fileio.write_json(stem + ".json", record)
  return record


def _split_sums(experiment: Experiment, loaded: Loaded, split: str) -> dict:
  """The loss sums (`experiment.loss()`, teacher-forced, no dropout) of `split`."""
  shard_index, shard_count = loaded.placement.data_shard
  try:
    batches = data.make_eval_batches(
      experiment.data,
      loaded.tokenizer,
      split,
      shard_index=shard_index,
      shard_count=shard_count,
      max_length=loaded.placement.model.config.max_len,
    )
  except (data.DataError, data.DataUnavailableError) as error:
    raise UserError(f"config.decode.split={split!r}: {error}") from None
  loss = metrics.TeacherForcedLoss(loaded.placement, experiment.loss())
  return loss(loaded.params, batches)


def language_model_perplexity(
  experiment: Experiment, workdir: Workdir, checkpoint: Checkpoint = Checkpoint()
) -> dict:
  """The perplexity of a language model (`model_kind`) on the target side of `decode.split`.

  Writes `<workdir>/eval/<split>-<checkpoint>-perplexity.json` and returns its record: split,
  checkpoint, step, tokens, perplexity and the mean loss (`label_smoothing`'s) per token.
  """
  loaded = load(experiment, workdir, checkpoint)
  split = experiment.decode.split
  sums = _split_sums(experiment, loaded, split)
  tokens = int(sums["tokens"])
  record = {
    "split": split,
    "checkpoint": loaded.name,
    "step": loaded.step,
    "tokens": tokens,
    "perplexity": perplexity(float(sums["nll"]), tokens),
    "loss": float(sums["loss"]) / max(tokens, 1),
  }
  path = loaded.workdir.eval_file(f"{split}-{loaded.label}-perplexity") + ".json"
  fileio.write_json(path, record)
  return {**record, "record": path}


def translate_file(
  experiment: Experiment,
  workdir: Workdir,
  checkpoint: Checkpoint,
  input_path: str | None,
  output_path: str | None,
) -> dict:
  """Translate the lines of `input_path` (stdin for None or '-') into `output_path` (stdout).

  One line out per line in, in order (written by process 0). Returns
  `{"lines": n, "seconds": decoding time}`. FieldError for a language model (`model_kind`).
  """
  experiment.refuse_for_language_model("--mode=translate")
  lines = fileio.read_lines(input_path)  # Fails on bad input before loading anything.
  loaded = load(experiment, workdir, checkpoint)
  start = time.perf_counter()
  translator = Translator(loaded.placement, loaded.tokenizer, experiment.decode)
  translations = translator.translate(loaded.params, lines)
  seconds = time.perf_counter() - start
  fileio.write_lines(output_path, translations)
  return {"lines": len(lines), "seconds": seconds}
