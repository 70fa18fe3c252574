"""`Experiment`: every setting of a run in one frozen, typed tree, checked once on construction.

Its sections are the libraries' own settings: `model` (`TransformerConfig`),
`data` (`DataConfig`), `decode` (`DecodeSettings`), `mesh` (`MeshConfig`);
`optimizer` (`OptimizerSettings`) and `fit` (`FitSettings`) are groups, whose
fields a config file holds at its top level beside the experiment's own. A
command line builds one from a config file (`transformer_jax.config.parse`);
Python code constructs it directly, or with `dataclasses.replace`.
"""

import dataclasses

from transformer_jax import schema, sharding
from transformer_jax.data import DataConfig
from transformer_jax.decode.translator import DecodeSettings
from transformer_jax.errors import FieldError
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement
from transformer_jax.train.loop import FitSettings
from transformer_jax.train.objective import OptimizerSettings


@dataclasses.dataclass(frozen=True)
class Experiment:
  """An experiment: the paper's base model and training settings unless given.

  `model.vocab_size` is always `data.vocab_size` (the size asked of the
  vocabulary); a run places the model with its tokenizer's size
  (`placement`). FieldError (naming the field's path) for an invalid value.
  """

  seed: int = schema.count(
    0, "parameter initialization, dropout (fold_in(key, step)) and data order", minimum=0
  )
  optimizer: OptimizerSettings = schema.group(OptimizerSettings)
  label_smoothing: float = schema.number(
    0.1,
    "1 - eps on the target, eps / (vocab - 1) on each other token",
    "a number in [0, 1)",
    lambda v: 0 <= v < 1,
  )
  grad_accum_steps: int = schema.count(1, "micro-batches per batch, run one after another")
  fit: FitSettings = schema.group(FitSettings)
  eval_bleu_sentences: int = schema.count(
    1000, "validation BLEU on this many sentences at each evaluation", minimum=0, zero="no BLEU"
  )
  eval_bleu_beam_size: int = schema.setting(
    1,
    "a positive integer (1 = greedy)",
    lambda v: schema.is_int(v) and v > 0,
    "the search of that BLEU",
  )
  average_last: int = schema.count(
    5, "--mode=average: the mean of the last K checkpoints (paper: 5 base, 20 big)"
  )
  sharding_rules: str = schema.text(
    "dp",
    "logical axis names -> mesh axes: dp, fsdp, tp or explicit pairs",
    "a string (a preset such as 'dp', or pairs like 'batch=data+fsdp,embed=fsdp')",
  )
  peak_flops_per_device: float = schema.number(
    0.0,
    "the peak for MFU",
    "a number >= 0 (0 = measure a square matmul at start-up)",
    lambda v: v >= 0,
  )
  on_bad_checkpoints: str = schema.choice(
    "stop",
    "when no checkpoint restores: stop, or move them aside and train from step 0",
    "stop",
    "start_over",
  )
  preemption_grace_seconds: float = schema.number(
    120.0,
    "after SIGTERM, exit this long later at the latest",
    "a number >= 0 (0 = no limit)",
    lambda v: v >= 0,
  )
  compilation_cache_dir: str = schema.text(
    "auto",
    "compiled programs kept between runs (the CLI's modes share them); auto: "
    "$XDG_CACHE_HOME/transformer_jax/xla, default ~/.cache/transformer_jax/xla",
    "a directory, 'auto' or '' (off)",
  )
  host_timeout_seconds: int = schema.count(
    60,
    "a process of a multi-process run not heard from for this long is lost: the others "
    "stop naming it; a work directory lock not refreshed for this long is stale",
    minimum=5,
  )
  model: TransformerConfig = schema.section(TransformerConfig)
  data: DataConfig = schema.section(DataConfig)
  decode: DecodeSettings = schema.section(DecodeSettings)
  mesh: sharding.MeshConfig = schema.section(sharding.MeshConfig)

  def __post_init__(self):
    schema.check(self, "")
    if self.model.vocab_size != self.data.vocab_size:
      object.__setattr__(
        self, "model", dataclasses.replace(self.model, vocab_size=self.data.vocab_size)
      )
    sharding.logical_rules(self.sharding_rules)
    fields = (
      ("max_length",)
      if self.data.batch_mode == "packed"
      else ("max_source_length", "max_target_length")
    )
    for field in fields:
      if getattr(self.data, field) > self.model.max_len:
        raise FieldError(
          "data",
          field,
          f"={getattr(self.data, field)} is longer than "
          f"config.model.max_len={self.model.max_len}, the positions the model "
          "has; lower it or raise config.model.max_len",
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
    if self.data.batch_multiple % (shards * self.grad_accum_steps):
      raise FieldError(
        "data",
        "batch_multiple",
        f"={self.data.batch_multiple} must be a multiple of {shards * self.grad_accum_steps} = "
        f"{shards} batch shards (config.mesh with config.sharding_rules) x "
        f"config.grad_accum_steps={self.grad_accum_steps}, so that every batch splits evenly",
      )

  def placement(self, *, vocab_size: int, devices=None) -> Placement:
    """The model for a vocabulary of `vocab_size` tokens placed on a mesh of `devices` (default:
    every device) as `mesh` and `sharding_rules` say; FieldError when a parameter does not split
    over it or the platform cannot run the model's attention."""
    mesh = sharding.make_mesh(self.mesh.shape, devices)
    return Placement(
      dataclasses.replace(self.model, vocab_size=vocab_size), mesh, self.rules
    )  # Placement resolves the attention for the platform.
