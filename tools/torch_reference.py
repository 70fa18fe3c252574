"""The same model in PyTorch (torch.nn.Transformer), for side-by-side benchmarks.

Needs the optional `[bench]` extra. Built to match ours: post-LN layers, one
embedding shared by source, target and the output projection, scaled by
sqrt(d_model), the paper's sinusoids, label-smoothed cross entropy over
non-padding targets, and Adam(0.9, 0.98, 1e-9) on the paper's schedule.
torch.nn.Transformer also puts a LayerNorm after each stack, which the
paper's post-LN model does not have (2 x 2 x d_model extra parameters), and
drops attention weights and feed-forward activations at its one rate; here
they take the config's `attention_dropout_rate` and `activation_dropout_rate`.
"""

import math

import numpy as np

from transformer_jax.conventions import PAD_ID
from transformer_jax.model.functional import sinusoidal_table
from transformer_jax.model.transformer import TransformerConfig


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      "--vs torch needs PyTorch: pip install -e '.[bench]' "
      "(on a CPU-only machine, pip install torch==2.13.0)"
    ) from e
  return torch


def build(
  config: TransformerConfig,
  *,
  label_smoothing: float,
  warmup_steps: int = 4000,
  threads: int | None = None,
):
  """A torch train step for `config`: returns `step(batch) -> loss` over numpy batches."""
  torch = _torch()
  if config.key_size != config.value_size or config.key_size * config.num_heads != config.d_model:
    raise ValueError("torch.nn.Transformer needs d_k = d_v = d_model / num_heads")
  if threads:
    torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = _TorchTransformer(torch, config)
  optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
  schedule = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: config.d_model**-0.5 * min((s + 1) ** -0.5, (s + 1) * warmup_steps**-1.5)
  )

  def step(batch):
    inputs = torch.from_numpy(np.asarray(batch["inputs"], np.int64))
    targets = torch.from_numpy(np.asarray(batch["targets"], np.int64))
    logits = model(inputs, targets)
    loss = torch.nn.functional.cross_entropy(
      logits.reshape(-1, logits.shape[-1]),
      targets.reshape(-1),
      ignore_index=PAD_ID,
      label_smoothing=label_smoothing,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return float(loss.detach())

  return step


def _TorchTransformer(torch, config: TransformerConfig):
  """torch.nn.Module with the shared, scaled embedding and sinusoidal positions."""
  nn = torch.nn

  class TorchTransformer(nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn.Embedding(config.vocab_size, config.d_model)
      nn.init.normal_(self.embed.weight, std=config.d_model**-0.5)
      self.register_buffer(
        "positions", torch.from_numpy(sinusoidal_table(config.max_len, config.d_model))
      )
      self.core = nn.Transformer(
        d_model=config.d_model,
        nhead=config.num_heads,
        num_encoder_layers=config.encoder_depth,
        num_decoder_layers=config.decoder_depth,
        dim_feedforward=config.d_ff,
        dropout=config.dropout_rate,
        batch_first=True,
        norm_first=config.norm == "pre",
      )
      for layer in (*self.core.encoder.layers, *self.core.decoder.layers):
        layer.self_attn.dropout = config.attention_dropout_rate
        if hasattr(layer, "multihead_attn"):  # A decoder layer's attention over the source.
          layer.multihead_attn.dropout = config.attention_dropout_rate
        layer.dropout.p = config.activation_dropout_rate
      self.dropout = nn.Dropout(config.dropout_rate)

    def _embed(self, ids):
      x = self.embed(ids) * math.sqrt(config.d_model) + self.positions[: ids.shape[1]]
      return self.dropout(x)

    def forward(self, inputs, targets):
      decoder_inputs = torch.nn.functional.pad(targets, (1, 0), value=PAD_ID)[:, :-1]
      length = targets.shape[1]
      causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
      out = self.core(
        self._embed(inputs),
        self._embed(decoder_inputs),
        tgt_mask=causal,
        src_key_padding_mask=inputs == PAD_ID,
        tgt_key_padding_mask=targets == PAD_ID,
        memory_key_padding_mask=inputs == PAD_ID,
      )
      return out @ self.embed.weight.T

  return TorchTransformer()
