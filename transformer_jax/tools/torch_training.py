"""This project's model and train step written again in PyTorch, to hold our training to it.

An independent implementation of the same computation: the parameters have
our names and shapes (`encoder/layer_0/self_attention/query` ...), the
forward pass is plain tensor algebra, the loss is fairseq's label-smoothed
cross entropy (`(1 - eps - eps / (V - 1)) * nll + eps / (V - 1) * sum(-log p)`),
and `torch.optim.Adam` follows the paper's schedule. `Reference.train_step`
takes the batches our pipeline makes (keys `BATCH_KEYS`, segments and
positions included). It starts either from our initial parameters (copied:
with dropout 0 both sides must then produce the same losses) or from
fairseq's initialisation (a second, independent training run on the same
batches); its dropout masks come from torch's generator, seeded. The
sinusoidal table is the one function it shares with the model. It runs on
the CPU or a CUDA device (`device="cuda"`); the initial parameters are
drawn on the CPU, so a seed gives the same start on every device.

Needs PyTorch (the `hf` or `bench` extra).
"""

import math

import flax
import jax
import numpy as np

from transformer_jax.conventions import PAD_ID
from transformer_jax.errors import UserError
from transformer_jax.model.functional import sinusoidal_table
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.train.objective import OptimizerSettings

INITS = ("copied", "fairseq")
ATTENTIONS = ("self_attention", "cross_attention")


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("the PyTorch reference needs torch: pip install -e '.[hf]'") from e
  return torch


def flat_params(params) -> dict[str, np.ndarray]:
  """Our parameter tree (on any device) as `{path: array}`, the paths of `parameter_shapes`."""
  return flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")


def parameter_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
  """Every parameter's name (our flattened path) and shape, for a post-LN or pre-LN model."""
  d, h, dk, dv, ff = (
    config.d_model,
    config.num_heads,
    config.key_size,
    config.value_size,
    config.d_ff,
  )
  shapes = {"embed/embedding": (config.vocab_size, d)}
  if config.logits_bias:
    shapes["embed/logits_bias"] = (config.vocab_size,)

  def attention(prefix):
    shapes.update(
      {
        f"{prefix}/query": (d, h, dk),
        f"{prefix}/key": (d, h, dk),
        f"{prefix}/value": (d, h, dv),
        f"{prefix}/out": (h, dv, d),
      }
    )
    if config.attention_bias:
      shapes.update(
        {
          f"{prefix}/query_bias": (h, dk),
          f"{prefix}/key_bias": (h, dk),
          f"{prefix}/value_bias": (h, dv),
          f"{prefix}/out_bias": (d,),
        }
      )

  def norm(prefix):
    shapes.update({f"{prefix}/scale": (d,), f"{prefix}/bias": (d,)})

  for stack, sublayers in (("encoder", ATTENTIONS[:1]), ("decoder", ATTENTIONS)):
    for i in range(config.num_layers):
      layer = f"{stack}/layer_{i}"
      for name in sublayers:
        attention(f"{layer}/{name}")
        norm(f"{layer}/{name}_norm")
      shapes.update(
        {
          f"{layer}/feed_forward/wi": (d, ff),
          f"{layer}/feed_forward/bi": (ff,),
          f"{layer}/feed_forward/wo": (ff, d),
          f"{layer}/feed_forward/bo": (d,),
        }
      )
      norm(f"{layer}/feed_forward_norm")
    if config.norm == "pre":
      norm(f"{stack}/final_norm")
  return shapes


def fairseq_init(torch, config: TransformerConfig, name: str, shape, generator):
  """fairseq's initial value of parameter `name` (float64).

  Embeddings N(0, d^-1/2); attention weights Xavier-uniform, gain 2^-1/2 for
  W^Q, W^K, W^V and 1 for W^O; the feed-forward layers and the Q, K, V biases
  keep torch's `nn.Linear` default, U(+-1/sqrt(fan_in)); the attention
  output bias, LayerNorm offsets and (ours only) a logits bias start at 0,
  LayerNorm scales at 1. fairseq also zeroes the padding row of the
  embedding; here PAD is the decoder's start token, so it is drawn like the
  others.
  """
  d, h, leaf = config.d_model, config.num_heads, name.rsplit("/", 1)[-1]
  if leaf == "embedding":
    return torch.randn(shape, generator=generator, dtype=torch.float64) * d**-0.5
  if leaf == "scale":
    return torch.ones(shape, dtype=torch.float64)
  xavier = lambda fan_in, fan_out: math.sqrt(6.0 / (fan_in + fan_out))
  qk, v = 2**-0.5 * xavier(d, h * config.key_size), 2**-0.5 * xavier(d, h * config.value_size)
  bounds = {
    "query": qk,
    "key": qk,
    "value": v,
    "out": xavier(h * config.value_size, d),
    "wi": d**-0.5,
    "bi": d**-0.5,
    "wo": config.d_ff**-0.5,
    "bo": config.d_ff**-0.5,
    "query_bias": d**-0.5,
    "key_bias": d**-0.5,
    "value_bias": d**-0.5,
  }
  if leaf not in bounds:  # out_bias, LayerNorm offsets, logits_bias.
    return torch.zeros(shape, dtype=torch.float64)
  return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bounds[leaf]


class TorchReferenceError(UserError, ValueError):
  """Settings the PyTorch reference cannot train: one line naming them."""


def _device(torch, name: str):
  """`torch.device(name)`, or TorchReferenceError when torch cannot name or reach it."""
  try:
    device = torch.device(name)
  except RuntimeError as error:
    raise TorchReferenceError(f"device={name!r}: {error}") from None
  if device.type not in ("cpu", "cuda"):
    raise TorchReferenceError(f"device={name!r}: the reference runs on cpu or cuda")
  if device.type == "cuda":
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0 or (device.index or 0) >= count:
      raise TorchReferenceError(
        f"device={name!r}: this torch ({torch.__version__}) sees {count} CUDA device(s)"
      )
  return device


def _unsupported(config: TransformerConfig, optimizer: OptimizerSettings) -> list[str]:
  """The settings of `config` and `optimizer` the reference does not implement, as `field=value`."""
  defaults = {
    "activation": "relu",
    "positional": "sinusoidal",
    "dtype": "float32",
    "scan_layers": False,
  }
  found = [
    f"model.{k}={getattr(config, k)!r}" for k, v in defaults.items() if getattr(config, k) != v
  ]
  if optimizer.grad_clip_norm:
    found.append(f"grad_clip_norm={optimizer.grad_clip_norm}")
  return found


def shift_right(targets: np.ndarray, segmentation: np.ndarray) -> np.ndarray:
  """Decoder inputs: each example's targets one step right, PAD_ID (the start token) first."""
  shifted = np.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  previous = np.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
  return np.where(segmentation == previous, shifted, PAD_ID)


class Reference:
  """The model of `config` in PyTorch (float32) with Adam on the paper's schedule.

  `init="copied"` starts from `params` (our flattened tree, `{path: array}`);
  `init="fairseq"` from `fairseq_init` drawn with `seed`. Dropout is torch's.
  """

  @staticmethod
  def check(
    config: TransformerConfig, optimizer: OptimizerSettings, init: str, device: str = "cpu"
  ):
    """The torch device named `device`; TorchReferenceError (a UserError) unless the reference
    can train `config` with `optimizer` from `init` (one of INITS) there: what a caller checks
    before any expensive set-up."""
    torch_device = _device(_torch(), device)
    if init not in INITS:
      raise TorchReferenceError(f"init={init!r}; allowed: {', '.join(INITS)}")
    unsupported = _unsupported(config, optimizer)
    if unsupported:
      raise TorchReferenceError(
        f"the PyTorch reference does not implement {', '.join(unsupported)}"
      )
    return torch_device

  def __init__(
    self,
    config: TransformerConfig,
    optimizer: OptimizerSettings,
    *,
    label_smoothing: float,
    init: str = "copied",
    params=None,
    seed: int = 0,
    device: str = "cpu",
  ):
    self.device = self.check(config, optimizer, init, device)
    if init == "copied" and params is None:
      raise ValueError("init='copied' needs the params to copy")
    torch = self.torch = _torch()
    self.config, self.label_smoothing = config, label_smoothing
    init_generator = torch.Generator().manual_seed(seed)
    shapes = parameter_shapes(config)
    if init == "copied":
      missing, unexpected = set(shapes) - set(params), set(params) - set(shapes)
      if missing or unexpected:
        raise ValueError(
          f"params do not match the config: missing {sorted(missing)[:3]}, "
          f"unexpected {sorted(unexpected)[:3]}"
        )
      values = {name: torch.tensor(np.asarray(params[name], np.float32)) for name in shapes}
    else:
      values = {
        name: fairseq_init(torch, config, name, shape, init_generator).float()
        for name, shape in shapes.items()
      }
    self.params = {name: value.to(self.device).requires_grad_() for name, value in values.items()}
    # Dropout's generator lives on the device, seeded from where the initial draws ended.
    dropout_seed = int(torch.randint(2**62, (1,), generator=init_generator))
    self.generator = torch.Generator(device=self.device).manual_seed(dropout_seed)
    self.positions = torch.tensor(
      sinusoidal_table(config.max_len, config.d_model), device=self.device
    )
    self.adam = torch.optim.Adam(
      self.params.values(),
      lr=0.0,
      betas=(optimizer.adam_b1, optimizer.adam_b2),
      eps=optimizer.adam_eps,
    )
    self.optimizer, self.updates = optimizer, 0

  def learning_rate(self, update: int) -> float:
    """The paper's rate at 1-based step `update + 1`."""
    step = update + 1
    return (
      self.optimizer.learning_rate
      * self.config.d_model**-0.5
      * min(step**-0.5, step * self.optimizer.warmup_steps**-1.5)
    )

  def _dropout(self, x, train):
    """Inverted dropout, its mask drawn from the reference's own seeded generator."""
    rate = self.config.dropout_rate
    if not train or rate == 0:
      return x
    keep = self.torch.rand(x.shape, generator=self.generator, device=self.device) >= rate
    return x * keep / (1 - rate)

  def _attention(self, prefix, x, memory, allowed):
    torch, p, cfg = self.torch, self.params, self.config

    def project(y, name):
      out = torch.einsum("bld,dhk->bhlk", y, p[f"{prefix}/{name}"])
      if cfg.attention_bias:
        out = out + p[f"{prefix}/{name}_bias"][None, :, None, :]
      return out

    q, k, v = project(x, "query"), project(memory, "key"), project(memory, "value")
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.key_size)
    # A padding query with no key to attend gets a uniform average: finite, and never read.
    weights = torch.softmax(scores.masked_fill(~allowed, -1e9), dim=-1)
    out = torch.einsum("bhlk,hkd->bld", weights @ v, p[f"{prefix}/out"])
    return out + p[f"{prefix}/out_bias"] if cfg.attention_bias else out

  def _sublayer(self, x, prefix, norm_name, fn, train):
    p, cfg = self.params, self.config
    norm = lambda y: self.torch.nn.functional.layer_norm(
      y,
      (cfg.d_model,),
      p[f"{prefix}/{norm_name}/scale"],
      p[f"{prefix}/{norm_name}/bias"],
      cfg.norm_epsilon,
    )
    if cfg.norm == "pre":
      return x + self._dropout(fn(norm(x)), train)
    return norm(x + self._dropout(fn(x), train))

  def _feed_forward(self, prefix):
    p, relu = self.params, self.torch.relu
    f = f"{prefix}/feed_forward"
    return lambda x: relu(x @ p[f"{f}/wi"] + p[f"{f}/bi"]) @ p[f"{f}/wo"] + p[f"{f}/bo"]

  def logits(self, batch, train: bool):
    """`[batch, target_length, vocab]` logits of a batch of numpy arrays (keys `BATCH_KEYS`)."""
    torch, p, cfg = self.torch, self.params, self.config
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.long, device=self.device)
    src_seg, tgt_seg = t(batch["inputs_segmentation"]), t(batch["targets_segmentation"])
    decoder_inputs = shift_right(
      np.asarray(batch["targets"]), np.asarray(batch["targets_segmentation"])
    )

    def embed(ids, positions):
      x = p["embed/embedding"][t(ids)] * math.sqrt(cfg.d_model) + self.positions[t(positions)]
      return self._dropout(x, train)

    def allowed(q_seg, k_seg):
      return ((q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] > 0))[:, None]

    x = embed(batch["inputs"], batch["inputs_position"])
    encoder_mask = allowed(src_seg, src_seg)
    for i in range(cfg.num_layers):
      layer = f"encoder/layer_{i}"
      x = self._sublayer(
        x,
        layer,
        "self_attention_norm",
        lambda y, name=layer: self._attention(f"{name}/self_attention", y, y, encoder_mask),
        train,
      )
      x = self._sublayer(x, layer, "feed_forward_norm", self._feed_forward(layer), train)
    memory = self._final_norm("encoder", x)
    length = tgt_seg.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
    self_mask, cross_mask = allowed(tgt_seg, tgt_seg) & causal, allowed(tgt_seg, src_seg)
    y = embed(decoder_inputs, batch["targets_position"])
    for i in range(cfg.num_layers):
      layer = f"decoder/layer_{i}"
      y = self._sublayer(
        y,
        layer,
        "self_attention_norm",
        lambda z, name=layer: self._attention(f"{name}/self_attention", z, z, self_mask),
        train,
      )
      y = self._sublayer(
        y,
        layer,
        "cross_attention_norm",
        lambda z, name=layer: self._attention(f"{name}/cross_attention", z, memory, cross_mask),
        train,
      )
      y = self._sublayer(y, layer, "feed_forward_norm", self._feed_forward(layer), train)
    logits = self._final_norm("decoder", y) @ p["embed/embedding"].T
    return logits + p["embed/logits_bias"] if cfg.logits_bias else logits

  def _final_norm(self, stack, x):
    if self.config.norm != "pre":
      return x
    p = self.params
    return self.torch.nn.functional.layer_norm(
      x,
      (self.config.d_model,),
      p[f"{stack}/final_norm/scale"],
      p[f"{stack}/final_norm/bias"],
      self.config.norm_epsilon,
    )

  def loss_sums(self, batch, train: bool):
    """`(smoothed loss sum, nll sum, target tokens)` over the batch's real target tokens, as
    fairseq's label_smoothed_cross_entropy computes them."""
    torch = self.torch
    log_p = torch.log_softmax(self.logits(batch, train), dim=-1)
    targets = torch.tensor(np.asarray(batch["targets"]), dtype=torch.long, device=self.device)
    real = torch.tensor(np.asarray(batch["targets_segmentation"]) > 0, device=self.device)
    nll = -log_p.gather(-1, targets[..., None])[..., 0]
    eps = self.label_smoothing
    eps_i = eps / (log_p.shape[-1] - 1)
    smoothed = (1 - eps - eps_i) * nll + eps_i * -log_p.sum(-1)
    return (smoothed * real).sum(), (nll * real).sum(), real.sum()

  def train_step(self, batch) -> dict[str, float]:
    """One Adam update on `batch` (dropout on); returns its per-token `loss`, `nll` and
    `tokens`, measured before the update."""
    loss, nll, tokens = self.loss_sums(batch, train=True)
    for group in self.adam.param_groups:
      group["lr"] = self.learning_rate(self.updates)
    self.adam.zero_grad(set_to_none=True)
    (loss / tokens.clamp(min=1)).backward()
    self.adam.step()
    self.updates += 1
    # One transfer from the device, not three.
    loss, nll, tokens = self.torch.stack([loss.detach(), nll.detach(), tokens.float()]).tolist()
    count = max(tokens, 1)
    return {"loss": loss / count, "nll": nll / count, "tokens": int(tokens)}

  def numpy_params(self) -> dict[str, np.ndarray]:
    """The current parameters, `{path: float32 array}`."""
    return {name: value.detach().cpu().numpy().copy() for name, value in self.params.items()}
