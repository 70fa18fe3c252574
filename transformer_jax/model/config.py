"""The model's settings: TransformerConfig, validated on construction, the paper's presets
(Table 3), and the parameter count and the FLOPs of a training step a config implies."""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from transformer_jax import schema
from transformer_jax.errors import FieldError
from transformer_jax.model import attention, functional
from transformer_jax.model.functional import ACTIVATIONS, INITS
from transformer_jax.model.settings import LayerSettings

POSITIONAL_KINDS = ("sinusoidal", "learned")
NORM_KINDS = ("post", "pre")
# float64 (with jax_enable_x64) is for checking the model against float64 references.
DTYPES = {
  "float32": jnp.float32,
  "bfloat16": jnp.bfloat16,
  "float16": jnp.float16,
  "float64": jnp.float64,
}
# What the backward pass keeps of each layer's forward pass; the rest is recomputed.
REMAT_POLICIES = {
  "none": None,  # No rematerialization: keep everything.
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # Keep matmul outputs.
  "full": jax.checkpoint_policies.nothing_saveable,  # Keep only each layer's input.
}


def _rate(default: float, help_: str):
  return schema.setting(default, help_, ge=0, lt=1)


def _positive_or_none(help_: str):
  return schema.setting(None, help_, ge=1, means={None: "d_model / num_heads"})


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Architecture of the model; validated on construction (FieldError naming `model.<field>`).

  The defaults are the paper's base model. `vocab_size` is not a setting of
  an experiment: its vocabulary sets it when the model is placed
  (`Experiment.placement`); None until then, and a model needs it. d_k and d_v
  are settings (None: d_model / num_heads); `key_size` and `value_size` are
  the widths in use; so `num_decoder_layers` (None: num_layers) and
  `decoder_depth`. `scan_layers` runs the layers through `nn.scan` (one compiled
  layer, params stacked on a leading "layers" axis). `attention_bias`,
  `logits_bias`, `activation`, `norm_epsilon` and `init` serve models and
  recipes from elsewhere (Marian, fairseq).
  """

  vocab_size: int | None = None
  num_layers: int = schema.setting(
    6, "layers of the encoder, and of the decoder unless num_decoder_layers says", ge=1
  )
  num_decoder_layers: int | None = schema.setting(
    None, "layers of the decoder", ge=1, means={None: "num_layers"}
  )
  d_model: int = schema.setting(
    512, "width of the residual stream (sin/cos pairs: even)", ge=1, multiple_of=2
  )
  d_ff: int = schema.setting(2048, "inner width of the feed-forward sublayers", ge=1)
  num_heads: int = schema.setting(8, "attention heads", ge=1)
  d_k: int | None = _positive_or_none("width of each head's queries and keys")
  d_v: int | None = _positive_or_none("width of each head's values")
  dropout_rate: float = _rate(0.1, "dropout on sublayer outputs and embedding sums")
  attention_dropout_rate: float = _rate(
    0.0,
    "dropout on the attention weights (fairseq's --attention-dropout); training then runs "
    "the reference attention, whatever attention_impl says (the fused kernels have no dropout)",
  )
  activation_dropout_rate: float = _rate(
    0.0, "dropout on the feed-forward's hidden activations (fairseq's --activation-dropout)"
  )
  max_len: int = schema.setting(
    512, "positions: the size of the positional table, the longest sequence", ge=1
  )
  positional: str = schema.setting(
    "sinusoidal",
    "positional encoding (paper: sinusoidal; Table 3 row E: learned)",
    choices=POSITIONAL_KINDS,
  )
  norm: str = schema.setting(
    "post",
    "post: LayerNorm(x + Dropout(Sublayer(x))) (paper); pre: "
    "x + Sublayer(LayerNorm(x)), with a final LayerNorm per stack",
    choices=NORM_KINDS,
  )
  dtype: str = schema.setting(
    "float32", "computation dtype (parameters are float32)", choices=DTYPES
  )
  attention_impl: str = schema.setting(
    "auto",
    "attention kernel: auto picks by platform (see model.attention)",
    choices=attention.IMPLEMENTATIONS,
  )
  scan_layers: bool = schema.setting(False, "one compiled layer run through nn.scan")
  remat: str = schema.setting(
    "none",
    "what the backward pass recomputes: none, dots (keeps "
    "matmul outputs) or full (keeps each layer's input)",
    choices=REMAT_POLICIES,
  )
  loss_chunk: int = schema.setting(
    0,
    "the output layer and the loss over chunks of this many target positions of every row, "
    "each chunk's logits made again in the backward: no [positions, vocab] array in memory",
    ge=0,
    means={0: "all positions at once"},
  )
  vocab_multiple: int = schema.setting(
    1,
    "the output layer's matmul over the vocabulary padded with zero rows to a multiple of "
    "this (whole GEMM tiles on a GPU: 128), the padded logits sliced off at once: parameters, "
    "checkpoints, the loss and the searches see the real vocabulary",
    ge=1,
    means={1: "no padding"},
  )
  attention_bias: bool = schema.setting(False, "biases on the Q, K, V and output projections")
  logits_bias: bool = schema.setting(False, "a [vocab] bias on the logits")
  activation: str = schema.setting("relu", "feed-forward nonlinearity", choices=ACTIVATIONS)
  norm_epsilon: float = schema.setting(1e-6, "LayerNorm epsilon", gt=0, lt=1)
  init: str = schema.setting(
    "xavier",
    "initial parameters: xavier (Xavier-uniform weights, zero biases) or fairseq "
    "(W^Q, W^K, W^V at Xavier gain 2^-1/2; feed-forward layers and Q, K, V biases "
    "U(+-1/sqrt(fan_in)), torch's nn.Linear default)",
    choices=INITS,
  )

  def __post_init__(self):
    if self.vocab_size is not None and (
      not isinstance(self.vocab_size, int)
      or isinstance(self.vocab_size, bool)
      or self.vocab_size < 1
    ):
      raise _error("vocab_size", f" must be a positive integer or None; got {self.vocab_size!r}")
    schema.check(self, "model")
    if None in (self.d_k, self.d_v) and self.d_model % self.num_heads:
      raise _error(
        "d_k" if self.d_k is None else "d_v",
        f": d_model={self.d_model} is not divisible by num_heads="
        f"{self.num_heads}; set d_k and d_v explicitly or pick num_heads dividing d_model",
      )
    if self.dtype == "float64" and not jax.config.jax_enable_x64:
      raise _error(
        "dtype", "='float64' needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) first"
      )
    problem = attention.implementation_problem(
      self.attention_impl, d_k=self.key_size, d_v=self.value_size
    )
    if problem:
      raise _error("attention_impl", f"={self.attention_impl!r}{problem}")

  def known_vocab_size(self) -> int:
    """`vocab_size`; ValueError while it is None (a model, its size and its FLOPs need it)."""
    if self.vocab_size is None:
      raise ValueError(
        "TransformerConfig.vocab_size is None: give the vocabulary's size "
        "(dataclasses.replace(config, vocab_size=...); an experiment's placement does)"
      )
    return self.vocab_size

  @property
  def encoder_depth(self) -> int:
    """Layers of the encoder: `num_layers`."""
    return self.num_layers

  @property
  def decoder_depth(self) -> int:
    """Layers of the decoder in use: `num_decoder_layers`, or `num_layers`."""
    return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

  @property
  def depths(self) -> tuple[int, int]:
    """(`encoder_depth`, `decoder_depth`)."""
    return self.encoder_depth, self.decoder_depth

  @property
  def key_size(self) -> int:
    """The width of each head's queries and keys in use: `d_k`, or d_model / num_heads."""
    return self.d_model // self.num_heads if self.d_k is None else self.d_k

  @property
  def value_size(self) -> int:
    """The width of each head's values in use: `d_v`, or d_model / num_heads."""
    return self.d_model // self.num_heads if self.d_v is None else self.d_v

  def record(self) -> dict:
    """The settings as a JSON-ready dict, with the head widths in use (`key_size`, `value_size`)
    beside `d_k` and `d_v` and the decoder's depth in use beside `num_decoder_layers`, which may be
    None: what benchmark records keep."""
    return {
      **dataclasses.asdict(self),
      "key_size": self.key_size,
      "value_size": self.value_size,
      "decoder_depth": self.decoder_depth,
    }

  def layer_settings(self) -> LayerSettings:
    """The settings of this model's encoder and decoder layers: its fields of the same name, the
    head widths in use, `pre_norm` for norm="pre", the compute dtype and `init_scheme` for init
    (parameters float32)."""
    same = {name: getattr(self, name) for name in LayerSettings.names() if name in _FIELDS}
    return LayerSettings(
      **same
      | dict(
        d_k=self.key_size,
        d_v=self.value_size,
        pre_norm=self.norm == "pre",
        dtype=self.compute_dtype,
        init_scheme=self.init,
      )
    )

  @property
  def compute_dtype(self):
    """The jnp dtype used for computation."""
    return DTYPES[self.dtype]

  @classmethod
  def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
    """The paper's `base`, `big`, or a Table 3 row (`A1`..`E`), with overrides.

    vocab_size defaults to 37000 (the shared WMT EN-DE vocabulary). Rows D3
    and D4 differ from base only in label smoothing, a training setting, so
    their architecture is base's.
    """
    vocab_size = overrides.pop("vocab_size", 37000)
    return cls(vocab_size=vocab_size, **preset_fields(name, **overrides))


_FIELDS = frozenset(field.name for field in dataclasses.fields(TransformerConfig))


def preset_fields(name: str, **overrides: Any) -> dict[str, Any]:
  """Every field of preset `name` but `vocab_size`, with `overrides`.

  ValueError for an unknown preset; FieldError for an override that is not a
  field (`vocab_size` included: the vocabulary sets it).
  """
  if name not in PRESETS:
    raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
  fields = {
    f.name: f.default for f in dataclasses.fields(TransformerConfig) if f.name != "vocab_size"
  }
  for field in overrides:
    if field not in fields:
      raise _error(field, f" is not a model field; fields: {', '.join(sorted(fields))}")
  return {**fields, **PRESETS[name], **overrides}


def _error(field: str, detail: str) -> FieldError:
  return FieldError("model", field, detail)


# Table 3 of the paper; unlisted fields are base's.
PRESETS: dict[str, dict[str, Any]] = {
  "base": {},
  "A1": {"num_heads": 1, "d_k": 512, "d_v": 512},
  "A2": {"num_heads": 4, "d_k": 128, "d_v": 128},
  "A3": {"num_heads": 16, "d_k": 32, "d_v": 32},
  "A4": {"num_heads": 32, "d_k": 16, "d_v": 16},
  "B1": {"d_k": 16},
  "B2": {"d_k": 32},
  "C1": {"num_layers": 2},
  "C2": {"num_layers": 4},
  "C3": {"num_layers": 8},
  "C4": {"d_model": 256, "d_k": 32, "d_v": 32},
  "C5": {"d_model": 1024, "d_k": 128, "d_v": 128},
  "C6": {"d_ff": 1024},
  "C7": {"d_ff": 4096},
  "D1": {"dropout_rate": 0.0},
  "D2": {"dropout_rate": 0.2},
  "D3": {},
  "D4": {},
  "E": {"positional": "learned"},
  "big": {"d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout_rate": 0.3},
}


def param_shapes(config: TransformerConfig) -> dict:
  """The Transformer's parameter shapes, as its (looped, Linen or NNX) `params` tree, from the
  tables of model/functional.py: what `count_params` sums and a test holds against the real
  initialisation."""
  d, layer = config.d_model, config.layer_settings()
  stacks = {}
  for stack, depth, attentions in (
    ("encoder", config.encoder_depth, ("self_attention",)),
    ("decoder", config.decoder_depth, ("self_attention", "cross_attention")),
  ):
    tree = {f"layer_{i}": functional.layer_params(d, layer, attentions) for i in range(depth)}
    if config.positional == "learned":
      tree["positions"] = functional.positional_params(config.max_len, d, config.positional)
    if config.norm == "pre":
      tree["final_norm"] = functional.norm_params(d)
    stacks[stack] = tree
  embed = functional.embed_params(config.known_vocab_size(), d, config.logits_bias)
  return jax.tree.map(
    lambda spec: spec.shape,
    {"embed": embed, **stacks},
    is_leaf=lambda x: isinstance(x, functional.ParamSpec),
  )


def _size(shape) -> int:
  return math.prod(shape)


def weight_counts(config: TransformerConfig) -> dict[str, int]:
  """Weights (biases left out) of one attention's projections (`query`, `key`, `value`, `out`)
  and of one feed-forward network (`feed_forward`)."""
  layer = functional.layer_params(config.d_model, config.layer_settings())
  counts = {name: _size(spec.shape) for name, spec in layer["self_attention"].items()}
  feed_forward = layer["feed_forward"]
  counts = {name: counts[name] for name in ("query", "key", "value", "out")}
  return counts | {
    "feed_forward": _size(feed_forward["wi"].shape) + _size(feed_forward["wo"].shape)
  }


def count_params(config: TransformerConfig) -> int:
  """Number of parameters, from the config alone (no initialization): `param_shapes` summed."""
  shapes = jax.tree.leaves(param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
  return sum(_size(shape) for shape in shapes)


def train_flops(
  cfg: TransformerConfig,
  *,
  source_tokens: float,
  target_tokens: float,
  source_length: int,
  target_length: int,
) -> float:
  """Model FLOPs of one training step: 3 x the forward pass (backward = 2 x forward).

  Forward, 2 FLOPs per multiply-add:
  - weights: each non-padding source token meets every encoder layer's
    attention projections and feed-forward and every decoder layer's
    cross-attention key/value projections; each non-padding target token
    meets every decoder layer's self-attention projections, cross-attention
    query/output projections and feed-forward, and the output projection
    (vocab x d_model);
  - attention: `Q K^T` and `weights V` cost `2 * heads * (d_k + d_v)` per
    (query, key) pair; each non-padding query is charged the padded row
    length of keys (`source_length` or `target_length`), the full square,
    as computed (the causal half is not subtracted).
  Embedding lookups, layer norms, softmaxes and the loss are left out (under
  1% at the paper's sizes).
  """
  d, h = cfg.d_model, cfg.num_heads
  n_enc, n_dec = cfg.depths
  w = weight_counts(cfg)
  self_attention = w["query"] + w["key"] + w["value"] + w["out"]
  feed_forward = w["feed_forward"]
  cross_query_out = w["query"] + w["out"]
  cross_key_value = w["key"] + w["value"]
  per_source_token = n_enc * (self_attention + feed_forward) + n_dec * cross_key_value
  per_target_token = (
    n_dec * (self_attention + cross_query_out + feed_forward) + cfg.known_vocab_size() * d
  )
  weights = 2.0 * (per_source_token * source_tokens + per_target_token * target_tokens)
  per_pair = 2.0 * h * (cfg.key_size + cfg.value_size)
  attention = per_pair * (
    n_enc * source_tokens * source_length + n_dec * target_tokens * (target_length + source_length)
  )
  return 3.0 * (weights + attention)


def batch_train_flops(cfg: TransformerConfig, batch) -> float:
  """`train_flops` of one step on `batch` (the Transformer's `ModelSpec.flops`): its non-padding
  source and target tokens (`*_segmentation > 0`) at its padded lengths; traced, or numpy."""
  return train_flops(
    cfg,
    source_tokens=(batch["inputs_segmentation"] > 0).sum(dtype=jnp.float32),
    target_tokens=(batch["targets_segmentation"] > 0).sum(dtype=jnp.float32),
    source_length=batch["inputs"].shape[1],
    target_length=batch["targets"].shape[1],
  )
