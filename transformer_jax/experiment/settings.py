"""`Experiment`: every setting of a run in one frozen, typed tree, checked once on construction.

Its sections are the libraries' own settings: `model` (`TransformerConfig`),
`data` (`DataConfig`), `decode` (`DecodeSettings`), `mesh` (`MeshConfig`);
`optimizer` (`OptimizerSettings`) and `fit` (`FitSettings`) are groups, whose
fields a config file holds at its top level beside the experiment's own.
`model_kind` picks the model that `model` sizes: the paper's translation model
or a decoder-only language model (`model.language_model`), each with its loss
(`loss`). A command line builds one from a config file
(`transformer_jax.config.parse`);
Python code constructs it directly, or with `dataclasses.replace`.
"""

import dataclasses
import math

import jax

from transformer_jax import schema, sharding
from transformer_jax.data import DataConfig
from transformer_jax.decode.translator import DecodeSettings
from transformer_jax.errors import FieldError
from transformer_jax.model.config import count_params
from transformer_jax.model.language_model import language_model_loss, language_model_spec
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.spec import LossFn
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement, for_platform
from transformer_jax.train.loop import FitSettings
from transformer_jax.train.objective import OptimizerSettings, cooldown_problem

MODEL_KINDS = ("translation", "language_model")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """An experiment: the paper's base model and training settings unless given.

  The model's vocabulary size comes from the vocabulary alone: a run places
  the model with its tokenizer's size (`placement`); `data.vocab.size` is the
  size asked of a vocabulary trained here. FieldError (naming the field's path) for an
  invalid value.
  """

  model_kind: str = schema.setting(
    "translation",
    "the model: translation (the paper's encoder-decoder of config.model) or language_model "
    "(a decoder-only model of config.model's num_layers, trained on the target side of "
    "config.data; scored by perplexity, no BLEU; model/language_model.py)",
    choices=MODEL_KINDS,
  )
  seed: int = schema.setting(
    0, "parameter initialization, dropout (fold_in(key, step)) and data order", ge=0
  )
  optimizer: OptimizerSettings = schema.group(OptimizerSettings)
  label_smoothing: float = schema.setting(
    0.1, "1 - eps on the target, eps / (vocab - 1) on each other token", ge=0, lt=1
  )
  grad_accum_steps: int = schema.setting(1, "micro-batches per batch, run one after another", ge=1)
  fit: FitSettings = schema.group(FitSettings)
  eval_bleu_sentences: int = schema.setting(
    1000, "validation BLEU on this many sentences at each evaluation", ge=0, means={0: "no BLEU"}
  )
  eval_bleu_beam_size: int = schema.setting(1, "the search of that BLEU", ge=1, means={1: "greedy"})
  average_last: int = schema.setting(
    5, "--mode=average: the mean of the last K checkpoints (paper: 5 base, 20 big)", ge=1
  )
  sharding_rules: str = schema.setting(
    "dp",
    "logical axis names -> mesh axes: a preset (dp, fsdp, tp) or pairs such as "
    "'batch=data+fsdp,embed=fsdp'",
  )
  peak_flops_per_device: float = schema.setting(
    0.0, "the peak for MFU", ge=0, means={0: "measure a square matmul at start-up"}
  )
  on_bad_checkpoints: str = schema.setting(
    "stop",
    "when no checkpoint restores: stop, or move them aside and train from step 0",
    choices=("stop", "start_over"),
  )
  preemption_grace_seconds: float = schema.setting(
    120.0, "after SIGTERM, exit this long later at the latest", ge=0, means={0: "no limit"}
  )
  compilation_cache_dir: str = schema.setting(
    "auto",
    "compiled programs kept between runs (the CLI's modes share them); auto: "
    "$XDG_CACHE_HOME/transformer_jax/xla, default ~/.cache/transformer_jax/xla",
    means={"": "off"},
  )
  host_timeout_seconds: int = schema.setting(
    60,
    "a process of a multi-process run not heard from for this long is lost: the others "
    "stop naming it; a work directory lock not refreshed for this long is stale",
    ge=5,
  )
  model: TransformerConfig = schema.section(TransformerConfig)
  data: DataConfig = schema.section(DataConfig)
  decode: DecodeSettings = schema.section(DecodeSettings)
  mesh: sharding.MeshConfig = schema.section(sharding.MeshConfig)

  def __post_init__(self):
    schema.check(self, "")
    sharding.logical_rules(self.sharding_rules)
    if self.is_language_model and self.eval_bleu_sentences:
      raise FieldError(
        "",
        "eval_bleu_sentences",
        f"={self.eval_bleu_sentences}: a language model has no BLEU (it is scored by "
        "perplexity); set it to 0 with config.model_kind='language_model'",
      )
    if self.is_language_model and self.model.num_decoder_layers is not None:
      raise FieldError(
        "model",
        "num_decoder_layers",
        f"={self.model.num_decoder_layers}: the language model is one stack of "
        "config.model.num_layers layers; leave num_decoder_layers unset",
      )
    if self.is_language_model and self.model.loss_chunk:
      raise FieldError(
        "model",
        "loss_chunk",
        f"={self.model.loss_chunk}: the language model makes its logits whole; set it to 0 with "
        "config.model_kind='language_model'",
      )
    problem = cooldown_problem(self.optimizer.cooldown_steps, self.fit.num_train_steps)
    if problem:
      raise FieldError("", "cooldown_steps", f"={self.optimizer.cooldown_steps}{problem}")
    fields = (
      ("max_length",)
      if self.data.batch.mode == "packed"
      else ("max_source_length", "max_target_length")
    )
    for field in fields:
      if getattr(self.data.batch, field) > self.model.max_len:
        raise FieldError(
          "data.batch",
          field,
          f"={getattr(self.data.batch, field)} is longer than "
          f"config.model.max_len={self.model.max_len}, the positions the model "
          "has; lower it or raise config.model.max_len",
        )

  @property
  def is_language_model(self) -> bool:
    """Whether the run trains the decoder-only language model (`model_kind`)."""
    return self.model_kind == "language_model"

  def refuse_for_language_model(self, what: str) -> None:
    """UserError saying that `what` (a mode, for people) needs a translation model, when the
    experiment's model is the language model."""
    if self.is_language_model:
      raise FieldError(
        "",
        "model_kind",
        f"='language_model': {what} needs a translation model; a language model has no "
        "source to translate (--mode=eval reports its perplexity)",
      )

  @property
  def rules(self) -> sharding.Rules:
    """The logical-axis rules of `sharding_rules`."""
    return sharding.logical_rules(self.sharding_rules)

  def check_devices(self, num_devices: int) -> None:
    """FieldError unless the mesh covers `num_devices` devices and every batch splits evenly over
    its batch shards and the micro-batches."""
    sizes = sharding.resolve_mesh_shape(self.mesh.shape, num_devices)
    shards = sharding.num_batch_shards(dict(zip(sharding.MESH_AXES, sizes)), self.rules)
    if self.data.batch.multiple % (shards * self.grad_accum_steps):
      raise FieldError(
        "data.batch",
        "multiple",
        f"={self.data.batch.multiple} must be a multiple of {shards * self.grad_accum_steps} = "
        f"{shards} batch shards (config.mesh with config.sharding_rules) x "
        f"config.grad_accum_steps={self.grad_accum_steps}, so that every batch splits evenly",
      )

  def placement(self, *, vocab_size: int, devices=None) -> Placement:
    """The model for a vocabulary of `vocab_size` tokens placed on a mesh of `devices` (default:
    every device) as `mesh` and `sharding_rules` say; FieldError when a parameter does not split
    over it or the platform cannot run the model's attention."""
    mesh = sharding.make_mesh(self.mesh.shape, devices)
    model = dataclasses.replace(self.model, vocab_size=vocab_size)
    if self.is_language_model:
      spec = language_model_spec(for_platform(model, mesh.devices.flat[0].platform))
      return Placement(spec, mesh, self.rules)
    return Placement(model, mesh, self.rules)  # Placement resolves the attention for the platform.

  def count_params(self, placement: Placement) -> int:
    """The number of parameters of the placed model: from the config for the translation model
    (`model.config.count_params`), from the parameters' shapes for the language model."""
    if not self.is_language_model:
      return count_params(placement.model.config)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(placement.abstract_params))

  def loss(self) -> LossFn:
    """The model's loss function: label-smoothed cross entropy (`label_smoothing`) of the
    translation model (`transformer_loss`) or the language model (`language_model_loss`)."""
    if self.is_language_model:
      return language_model_loss(self.label_smoothing)
    return transformer_loss(self.label_smoothing)
