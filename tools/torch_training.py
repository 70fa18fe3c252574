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
sinusoidal table is the one function it shares with the model; the parameters' names, shapes
and fairseq's initial values are tools/reference_parameters.py's. It runs on
the CPU or a CUDA device (`device="cuda"`); the initial parameters are
drawn on the CPU, so a seed gives the same start on every device.

Needs PyTorch (the `hf` or `bench` extra).
"""

import math

import numpy as np

from tools.reference_parameters import fairseq_init, parameter_shapes
from transformer_jax.conventions import PAD_ID
from transformer_jax.errors import UserError
from transformer_jax.model.functional import sinusoidal_table
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.train.objective import OptimizerSettings

INITS = ("copied", "fairseq")


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("the PyTorch reference needs torch: pip install -e '.[hf]'") from e
  return torch


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
  for field in ("grad_clip_norm", "cooldown_steps"):
    if getattr(optimizer, field):
      found.append(f"{field}={getattr(optimizer, field)}")
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

  def _dropout(self, x, train, rate=None):
    """Inverted dropout at `rate` (default `dropout_rate`), its mask drawn from the reference's
    own seeded generator."""
    rate = self.config.dropout_rate if rate is None else rate
    if not train or rate == 0:
      return x
    keep = self.torch.rand(x.shape, generator=self.generator, device=self.device) >= rate
    return x * keep / (1 - rate)

  def _attention(self, prefix, x, memory, allowed, train):
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
    weights = self._dropout(weights, train, cfg.attention_dropout_rate)
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

  def _feed_forward(self, prefix, train):
    p, f = self.params, f"{prefix}/feed_forward"

    def feed_forward(x):
      hidden = self.torch.relu(x @ p[f"{f}/wi"] + p[f"{f}/bi"])
      hidden = self._dropout(hidden, train, self.config.activation_dropout_rate)
      return hidden @ p[f"{f}/wo"] + p[f"{f}/bo"]

    return feed_forward

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
    for i in range(cfg.encoder_depth):
      layer = f"encoder/layer_{i}"
      x = self._sublayer(
        x,
        layer,
        "self_attention_norm",
        lambda y, name=layer: self._attention(f"{name}/self_attention", y, y, encoder_mask, train),
        train,
      )
      x = self._sublayer(x, layer, "feed_forward_norm", self._feed_forward(layer, train), train)
    memory = self._final_norm("encoder", x)
    length = tgt_seg.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=self.device).tril()
    self_mask, cross_mask = allowed(tgt_seg, tgt_seg) & causal, allowed(tgt_seg, src_seg)
    y = embed(decoder_inputs, batch["targets_position"])
    for i in range(cfg.decoder_depth):
      layer = f"decoder/layer_{i}"
      y = self._sublayer(
        y,
        layer,
        "self_attention_norm",
        lambda z, name=layer: self._attention(f"{name}/self_attention", z, z, self_mask, train),
        train,
      )
      y = self._sublayer(
        y,
        layer,
        "cross_attention_norm",
        lambda z, name=layer: self._attention(
          f"{name}/cross_attention", z, memory, cross_mask, train
        ),
        train,
      )
      y = self._sublayer(y, layer, "feed_forward_norm", self._feed_forward(layer, train), train)
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
