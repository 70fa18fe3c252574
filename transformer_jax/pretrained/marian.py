"""Marian (OPUS-MT) model directories: read and write their files, map their config to ours.

A Marian directory (what `MarianMTModel.save_pretrained` and
`MarianTokenizer.save_pretrained` write, or a download of an OPUS-MT model)
holds `config.json`, `model.safetensors` (or the older `pytorch_model.bin`),
`generation_config.json` (optional), and the tokenizer: `source.spm`,
`target.spm`, `vocab.json`. Reading safetensors needs neither torch nor
transformers (`safetensors` reads the file into numpy).
"""

import io
import os

import numpy as np
import safetensors.numpy
from etils import epath

from transformer_jax import fileio
from transformer_jax.data import marian as marian_vocab
from transformer_jax.errors import FieldError, UserError

SAFETENSORS = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's, which Marian uses.


class MarianError(UserError):
  """A Marian directory that cannot be read, or a model that cannot be written as one."""


def _error(field: str, detail: str) -> MarianError:
  return MarianError(f"config.json.{field}{detail}")


def read_json(path: str, default=None):
  """The JSON at `path`; `default` when absent (None: MarianError)."""
  try:
    return fileio.read_json(path) if default is None else fileio.read_json(path, missing=default)
  except UserError as error:
    raise MarianError(str(error)) from None


# The config.json fields that model_fields reads without a default.
_REQUIRED = (
  "d_model",
  "encoder_layers",
  "decoder_layers",
  "encoder_ffn_dim",
  "encoder_attention_heads",
  "max_position_embeddings",
)


def model_fields(config: dict, vocab: dict) -> dict:
  """The `TransformerConfig` fields (all but vocab_size) of a Marian `config.json`; MarianError
  naming the first field this model cannot represent."""
  for field in _REQUIRED:
    if field not in config:
      raise _error(field, " is missing")
  for a, b in (
    ("encoder_ffn_dim", "decoder_ffn_dim"),
    ("encoder_attention_heads", "decoder_attention_heads"),
  ):
    if config.get(a) != config.get(b):
      raise _error(
        b,
        f"={config.get(b)} differs from {a}={config.get(a)}; this model has one "
        "value for both stacks",
      )
  for field in ("scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings"):
    if config.get(field, True) is not True:
      raise _error(
        field,
        f"={config.get(field)}: only models with embeddings shared by both "
        "stacks and the output, scaled by sqrt(d_model), are supported",
      )
  activation = config.get("activation_function")
  if activation not in ACTIVATIONS:
    raise _error("activation_function", f"={activation!r} is not one of: {', '.join(ACTIVATIONS)}")
  size = config.get("vocab_size")
  if size != len(vocab) or config.get("decoder_vocab_size", size) != size:
    raise _error(
      "vocab_size",
      f"={size} (decoder_vocab_size={config.get('decoder_vocab_size')}) "
      f"differs from the {len(vocab)} tokens of vocab.json",
    )
  pad, eos = vocab["<pad>"], vocab["</s>"]
  for field, want in (
    ("pad_token_id", pad),
    ("decoder_start_token_id", pad),
    ("eos_token_id", eos),
  ):
    if config.get(field) != want:
      raise _error(field, f"={config.get(field)}; vocab.json says {want}")
  return dict(
    num_layers=config["encoder_layers"],
    num_decoder_layers=(
      None if config["decoder_layers"] == config["encoder_layers"] else config["decoder_layers"]
    ),
    d_model=config["d_model"],
    d_ff=config["encoder_ffn_dim"],
    num_heads=config["encoder_attention_heads"],
    d_k=None,
    d_v=None,
    dropout_rate=float(config.get("dropout", 0.1)),
    attention_dropout_rate=float(config.get("attention_dropout", 0.0)),
    activation_dropout_rate=float(config.get("activation_dropout", 0.0)),
    max_len=config["max_position_embeddings"],
    positional="sinusoidal",
    norm="post",
    attention_bias=True,
    logits_bias=True,
    activation=ACTIVATIONS[activation],
    norm_epsilon=LAYER_NORM_EPSILON,
  )


def marian_config(model, *, vocab_size: int, pad_id: int, eos_id: int) -> dict:
  """The `config.json` of our `TransformerConfig` `model`; FieldError (owner model)
  naming the first field Marian cannot represent."""
  checks = (
    ("norm", model.norm == "post", "post-LN"),
    ("positional", model.positional == "sinusoidal", "sinusoidal positions"),
    ("d_k", model.key_size == model.d_model // model.num_heads, "d_k = d_model / num_heads"),
    ("d_v", model.value_size == model.d_model // model.num_heads, "d_v = d_model / num_heads"),
    (
      "norm_epsilon",
      model.norm_epsilon == LAYER_NORM_EPSILON,
      f"norm_epsilon = {LAYER_NORM_EPSILON}",
    ),
    ("scan_layers", not model.scan_layers, "layers looped (scan_layers=False)"),
  )
  for field, ok, needed in checks:
    if not ok:
      raise FieldError("model", field, f"={getattr(model, field)!r}: a Marian model needs {needed}")
  return {
    "architectures": ["MarianMTModel"],
    "model_type": "marian",
    "vocab_size": vocab_size,
    "decoder_vocab_size": vocab_size,
    "d_model": model.d_model,
    "encoder_layers": model.encoder_depth,
    "decoder_layers": model.decoder_depth,
    "encoder_ffn_dim": model.d_ff,
    "decoder_ffn_dim": model.d_ff,
    "encoder_attention_heads": model.num_heads,
    "decoder_attention_heads": model.num_heads,
    "max_position_embeddings": model.max_len,
    "activation_function": model.activation,
    "dropout": model.dropout_rate,
    "attention_dropout": model.attention_dropout_rate,
    "activation_dropout": model.activation_dropout_rate,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "scale_embedding": True,
    "pad_token_id": pad_id,
    "decoder_start_token_id": pad_id,
    "eos_token_id": eos_id,
    "forced_eos_token_id": eos_id,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "is_encoder_decoder": True,
    "dtype": "float32",
  }


def read_state(directory: str) -> dict:
  """The weights of a Marian directory (a local path or a URL) as numpy arrays:
  model.safetensors, else pytorch_model.bin (which needs torch)."""
  path = os.path.join(directory, SAFETENSORS)
  if epath.Path(path).exists():
    try:
      return safetensors.numpy.load(epath.Path(path).read_bytes())
    except Exception as error:  # safetensors raises its own error types for a bad file.
      raise MarianError(f"cannot read {path}: {error}") from None
  path = os.path.join(directory, TORCH_FILE)
  if not epath.Path(path).exists():
    raise MarianError(f"{directory} has neither {SAFETENSORS} nor {TORCH_FILE}")
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise MarianError(
      f"{path} is a PyTorch file and PyTorch is not installed: pip install torch, or get the "
      f"{SAFETENSORS} of the model (on the Hugging Face Hub most OPUS-MT models have one; "
      "`MarianMTModel.from_pretrained(dir).save_pretrained(dir)` writes it)"
    ) from None
  content = io.BytesIO(epath.Path(path).read_bytes())
  state = torch.load(content, map_location="cpu", weights_only=True)
  return {name: tensor.float().numpy() for name, tensor in state.items()}


def shared_embedding(state: dict) -> np.ndarray:
  """The embedding shared by both stacks and the output, whichever name the file gives it."""
  for name in ("model.shared.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
    if name in state:
      return state[name]
  raise MarianError("the weights have no token embedding (model.shared.weight)")


def read_tokenizer(directory: str) -> dict:
  """`vocab.json` of a Marian directory (a local path or a URL), after checking that every
  tokenizer file is there."""
  missing = [name for name in marian_vocab.FILES if not epath.Path(directory, name).is_file()]
  if missing:
    raise MarianError(f"{directory} lacks the tokenizer files {', '.join(missing)}")
  return read_json(os.path.join(directory, "vocab.json"))
