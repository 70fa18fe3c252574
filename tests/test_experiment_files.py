"""The experiment files' recipes against the numbers their sources give."""

import dataclasses

import flax
import pytest

import helpers
from transformer_jax import config as config_lib
from transformer_jax.model.config import count_params
from transformer_jax.train import objective


def test_multi30k_tiny_is_the_literatures_transformer_tiny():
  settings = config_lib.parse(config_lib.load_file(f"{helpers.REPO}/experiments/multi30k.py:tiny"))
  model = settings.model
  assert (model.num_layers, model.d_model, model.num_heads, model.d_ff) == (4, 128, 4, 256)
  assert model.dropout_rate == 0.3 and model.norm == "post"
  # fairseq's layers: attention biases, LayerNorm epsilon 1e-5, its initial parameters.
  assert model.attention_bias and model.norm_epsilon == 1e-5 and model.init == "fairseq"
  data = settings.data
  assert (data.source.name, data.source.source_lang, data.source.target_lang) == (
    "multi30k_tok",
    "en",
    "de",
  )
  # About 2.6M parameters with a 10k vocabulary, as reported for Transformer-Tiny.
  assert 2.5e6 < count_params(model.__class__(**{**model.__dict__, "vocab_size": 10_000})) < 2.7e6
  rate = lambda step: float(
    objective.paper_learning_rate(
      step,
      d_model=model.d_model,
      warmup_steps=settings.optimizer.warmup_steps,
      scale=settings.optimizer.learning_rate,
    )
  )
  assert rate(2000) == pytest.approx(0.005)  # fairseq's inverse_sqrt peak at update 2,000,
  assert rate(1000) == pytest.approx(0.0025)  # reached linearly,
  assert rate(8000) == pytest.approx(0.005 * (2000 / 8000) ** 0.5)  # then 1/sqrt(step).
  assert settings.optimizer.adam_eps == 1e-8 and settings.label_smoothing == 0.1
  assert settings.fit.num_train_steps == 8000 and settings.average_last == 10
  # The 10 checkpoints averaged are those of one every 60 updates, in 25 saves instead of 134.
  every_60 = dataclasses.replace(
    settings.fit, checkpoint_every_steps=60, final_checkpoint_every_steps=0
  )
  saves = lambda fit: [step for step in range(1, 8001) if fit.saves_at(step)]
  assert saves(settings.fit)[-10:] == saves(every_60)[-10:] == [*range(7500, 7981, 60), 8000]
  assert len(saves(settings.fit)) == 25
  decode = settings.decode
  assert (decode.beam_size, decode.alpha, decode.length_normalization) == (5, 1.0, "length")
  assert decode.as_is_bleu and decode.split == "test"


def test_multi30k_tiny_fast_is_tiny_in_pre_ln_on_a_quarter_of_the_batch_for_twice_the_updates():
  def flat(variant):
    config = config_lib.load_file(f"{helpers.REPO}/experiments/multi30k.py:{variant}")
    return flax.traverse_util.flatten_dict(config.to_dict(), sep=".")

  tiny, fast = flat("tiny"), flat("tiny_fast")
  assert {key: (tiny[key], fast[key]) for key in tiny if tiny[key] != fast[key]} == {
    "model.norm": ("post", "pre"),
    "data.batch.tokens": (8192, 2048),
    "num_train_steps": (8000, 16_000),
    "keep_checkpoints": (10, 20),
    "average_last": (10, 20),
  }


def test_multi30k_names_its_variants():
  with pytest.raises(
    config_lib.ConfigError, match="unknown variant 'huge'; variants: tiny, tiny_fast$"
  ):
    config_lib.load_file(f"{helpers.REPO}/experiments/multi30k.py:huge")
