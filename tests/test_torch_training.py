"""The PyTorch reference (tools/torch_training.py) against our train step: the same parameters
and batches must give the same losses and updates."""

import flax.linen as nn
import jax
import numpy as np
import pytest

import helpers
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.transformer import Transformer
from transformer_jax.placement import Placement
from transformer_jax.train.objective import OptimizerSettings
from transformer_jax.train.step import Trainer

torch = pytest.importorskip("torch", reason="the PyTorch reference needs torch (the hf extra)")
from tools import torch_training  # noqa: E402 (after the torch check)
from tools.reference_parameters import flat_params  # noqa: E402

SCHEDULE = OptimizerSettings(learning_rate=2.0, warmup_steps=4, adam_eps=1e-8)


def _our_start(config):
  """Our trainer for `config` and its initial state."""
  optimizer, _ = SCHEDULE.make(config.d_model)
  trainer = Trainer(Placement.data_parallel(config), optimizer, transformer_loss(0.1))
  return trainer, trainer.init()


def _run_both(config, *, updates=8, reference_smoothing=0.1):
  """Per-update losses of our step and the reference's from the same start, and both final
  parameter trees (flattened)."""
  trainer, state = _our_start(config)
  start = flat_params(state.params)
  reference = torch_training.Reference(
    config, SCHEDULE, label_smoothing=reference_smoothing, params=start
  )
  ours, theirs = [], []
  for seed in range(updates):
    batch = helpers.synthetic_batch(seed)
    state, metrics = trainer.train_step(state, batch)
    ours.append(float(metrics["loss"]) / float(metrics["tokens"]))
    theirs.append(reference.train_step(batch)["loss"])
  final = flat_params(state.params)
  return np.array(ours), np.array(theirs), final, reference.numpy_params()


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("biases", [False, True])
def test_same_start_and_batches_give_the_same_training(norm, biases):
  config = helpers.tiny_model_config(
    dropout_rate=0.0, norm=norm, attention_bias=biases, logits_bias=biases
  )
  ours, theirs, final, reference = _run_both(config)
  assert ours[-1] < ours[0] - 0.1  # It trained.
  # Adam turns the rounding noise of the key bias's (zero) gradient into steps of the full rate.
  np.testing.assert_allclose(ours, theirs, rtol=2e-4 if biases else 2e-5)
  for name, value in reference.items():
    if not name.endswith("key_bias"):  # Softmax ignores it; its gradient is rounding noise.
      # Through the attention, that noise moves a few other parameters (by 0.03 here).
      np.testing.assert_allclose(final[name], value, atol=5e-2 if biases else 2e-3, err_msg=name)


def test_each_stack_trains_at_its_own_depth():
  config = helpers.tiny_model_config(
    dropout_rate=0.0, norm="pre", num_layers=3, num_decoder_layers=1
  )
  ours, theirs, final, reference = _run_both(config, updates=4)
  assert {name.split("/")[1] for name in final if name.startswith("decoder/layer_")} == {"layer_0"}
  np.testing.assert_allclose(ours, theirs, rtol=2e-5)
  for name, value in reference.items():
    np.testing.assert_allclose(final[name], value, atol=2e-3, err_msg=name)


def test_the_comparison_sees_a_different_label_smoothing():
  config = helpers.tiny_model_config(dropout_rate=0.0)
  ours, theirs, _, _ = _run_both(config, updates=3, reference_smoothing=0.2)
  assert np.max(np.abs(ours - theirs) / theirs) > 1e-2


def test_fairseq_init_has_fairseq_scales():
  config = helpers.tiny_model_config(d_model=64, d_ff=256, vocab_size=4000, attention_bias=True)
  reference = torch_training.Reference(config, SCHEDULE, label_smoothing=0.1, init="fairseq")
  p = reference.numpy_params()
  assert p["embed/embedding"].std() == pytest.approx(64**-0.5, rel=0.02)
  # U(-b, b): Xavier for attention (gain 2^-1/2 for Q, K, V; fan_in + fan_out = 128), torch's
  # nn.Linear default 1/sqrt(fan_in) for the feed-forward layers and the Q, K, V biases.
  layer = "encoder/layer_0"
  for name, bound in (
    ("self_attention/query", 2**-0.5 * (6 / 128) ** 0.5),
    ("self_attention/out", (6 / 128) ** 0.5),
    ("self_attention/value_bias", 64**-0.5),
    ("feed_forward/wi", 64**-0.5),
    ("feed_forward/bi", 64**-0.5),
    ("feed_forward/wo", 256**-0.5),
  ):
    leaf = p[f"{layer}/{name}"]
    assert np.abs(leaf).max() <= bound, name
    assert leaf.std() == pytest.approx(bound / 3**0.5, rel=0.25 if leaf.size < 100 else 0.1), name
  assert not p[f"{layer}/self_attention/out_bias"].any()
  assert not p[f"{layer}/feed_forward_norm/bias"].any()
  assert (p["decoder/layer_1/feed_forward_norm/scale"] == 1).all()


def test_our_fairseq_init_draws_from_the_references_distributions():
  config = helpers.tiny_model_config(
    d_model=64, d_ff=256, vocab_size=4000, attention_bias=True, init="fairseq"
  )
  ours = flat_params(
    nn.unbox(
      Transformer(config).init(
        jax.random.key(0), np.ones((1, 4), np.int32), np.ones((1, 4), np.int32)
      )["params"]
    )
  )
  theirs = torch_training.Reference(
    config, SCHEDULE, label_smoothing=0.1, init="fairseq"
  ).numpy_params()
  assert set(ours) == set(theirs)
  for name, value in ours.items():
    mine, reference = np.abs(value).max(), np.abs(theirs[name]).max()
    assert (mine == 0) == (reference == 0), name
    if value.size >= 256 and name != "embed/embedding":  # Uniform draws: same bound, same std.
      assert mine == pytest.approx(reference, rel=0.05), name
      assert value.std() == pytest.approx(theirs[name].std(), rel=0.1), name


def test_dropout_follows_the_seed():
  config = helpers.tiny_model_config(dropout_rate=0.3)
  losses = []
  for seed in (0, 0, 1):
    reference = torch_training.Reference(
      config, SCHEDULE, label_smoothing=0.1, init="fairseq", seed=seed
    )
    losses.append([reference.train_step(helpers.synthetic_batch(i))["loss"] for i in range(3)])
  assert losses[0] == losses[1] and losses[0] != losses[2]


@pytest.mark.parametrize("rates", [(0.5, 0.0), (0.0, 0.5)])
def test_the_reference_drops_attention_weights_and_activations_as_ours_does(rates):
  """From the same parameters, the logits' mean and spread over many dropout masks are ours."""
  config = helpers.tiny_model_config(
    dropout_rate=0.0, attention_dropout_rate=rates[0], activation_dropout_rate=rates[1]
  )
  params = _our_start(config)[1].params
  reference = torch_training.Reference(
    config, SCHEDULE, label_smoothing=0.1, params=flat_params(params)
  )
  batch = helpers.synthetic_batch(0)
  arrays = [batch[k] for k in BATCH_KEYS]
  model = Transformer(config)
  logits = jax.jit(
    lambda key: model.apply({"params": params}, *arrays, train=True, rngs={"dropout": key})
  )
  real = batch["targets_segmentation"] > 0
  ours = np.stack([np.asarray(logits(jax.random.key(i)))[real] for i in range(100)])
  with torch.no_grad():
    theirs = np.stack([reference.logits(batch, True).numpy()[real] for _ in range(100)])
    quiet = reference.logits(batch, False).numpy()[real]
  np.testing.assert_allclose(
    np.asarray(model.apply({"params": params}, *arrays))[real], quiet, atol=1e-5
  )
  spread = ours.std(0).mean()
  assert spread > 0.1  # Dropout moves the logits.
  assert theirs.std(0).mean() == pytest.approx(spread, rel=0.05)
  shift = np.abs(ours.mean(0) - quiet).mean()
  assert np.abs(theirs.mean(0) - quiet).mean() == pytest.approx(shift, rel=0.1)


def test_settings_it_does_not_implement_are_named():
  config = helpers.tiny_model_config(activation="gelu", positional="learned")
  with pytest.raises(
    ValueError,
    match="does not implement model.activation='gelu', "
    "model.positional='learned', grad_clip_norm=1.0",
  ):
    torch_training.Reference(
      config, OptimizerSettings(grad_clip_norm=1.0), label_smoothing=0.1, init="fairseq"
    )


def test_reference_needs_params_to_copy():
  with pytest.raises(ValueError, match="needs the params"):
    torch_training.Reference(helpers.tiny_model_config(), SCHEDULE, label_smoothing=0.1)
  with pytest.raises(ValueError, match="do not match the config: missing .*, unexpected"):
    torch_training.Reference(
      helpers.tiny_model_config(),
      SCHEDULE,
      label_smoothing=0.1,
      params={"embed/embedding": np.zeros((40, 32)), "extra": 0},
    )
  with pytest.raises(ValueError, match="init='xavier'; allowed: copied, fairseq"):
    torch_training.Reference(
      helpers.tiny_model_config(), SCHEDULE, label_smoothing=0.1, init="xavier"
    )


def test_a_device_torch_cannot_name_or_reach_is_one_line_naming_it():
  config = helpers.tiny_model_config()
  with pytest.raises(torch_training.TorchReferenceError, match=r"^device='gpu7': .*gpu7"):
    torch_training.Reference(config, SCHEDULE, label_smoothing=0.1, init="fairseq", device="gpu7")
  with pytest.raises(torch_training.TorchReferenceError, match=r"^device='meta': .* cpu or cuda"):
    torch_training.Reference.check(config, SCHEDULE, "fairseq", "meta")
  count = torch.cuda.device_count() if torch.cuda.is_available() else 0
  with pytest.raises(
    torch_training.TorchReferenceError,
    match=rf"^device='cuda:{count}': this torch .* sees {count} CUDA device\(s\)",
  ):
    torch_training.Reference.check(config, SCHEDULE, "fairseq", f"cuda:{count}")


@pytest.mark.device
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_reference_trains_as_on_the_cpu():
  config = helpers.tiny_model_config()
  start = flat_params(_our_start(config)[1].params)
  losses = {}
  for device in ("cpu", "cuda"):
    reference = torch_training.Reference(
      config, SCHEDULE, label_smoothing=0.1, params=start, device=device
    )
    losses[device] = [reference.train_step(helpers.synthetic_batch(i))["loss"] for i in range(4)]
  np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-5)
