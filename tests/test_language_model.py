"""The decoder-only language model (model/language_model.py, `config.model_kind="language_model"`):
its mask is causal and keeps packed examples apart, its loss and FLOPs are the formulas'; it
learns alike on 1 and 8 devices, trains from Python and from the command line
(experiments/lm.py), reports a held-out perplexity well below the unigram model's, resumes bit for
bit after a SIGKILL, and the modes that need a translation model refuse it in one line."""

import dataclasses
import math
import re
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import helpers
import numpy_reference as ref
from transformer_jax import config as config_lib
from transformer_jax import data, sharding
from transformer_jax import experiment as experiment_lib
from transformer_jax.compile import programs, targets
from transformer_jax.errors import FieldError
from transformer_jax.model import language_model
from transformer_jax.model.loss import cross_entropy
from transformer_jax.model.transformer import TransformerConfig
from transformer_jax.placement import Placement
from transformer_jax.pretrained import convert
from transformer_jax.train.step import Trainer
from transformer_jax.workdir import Workdir

VOCAB = 40
CONFIG = TransformerConfig(
  num_layers=2,
  d_model=32,
  d_ff=64,
  num_heads=4,
  max_len=32,
  norm="pre",
  dropout_rate=0.1,
  vocab_size=VOCAB,
)
LM = {"model_kind": "language_model", "eval_bleu_sentences": 0}  # Config overrides.


def _batch(seed: int, rows: int = 8, length: int = 12) -> dict:
  """Random tokens in two packed examples per row (the second may be cut), padding at the end."""
  rng = np.random.default_rng(seed)
  targets = rng.integers(3, VOCAB, (rows, length), dtype=np.int32)
  split = rng.integers(2, length - 3, rows)
  end = rng.integers(length - 2, length + 1, rows)
  column = np.arange(length)
  segmentation = np.where(column < split[:, None], 1, 2).astype(np.int32)
  segmentation[column >= end[:, None]] = 0
  targets[segmentation == 0] = 0
  position = np.where(segmentation == 1, column, column - split[:, None]).astype(np.int32)
  position[segmentation == 0] = 0
  return {"targets": targets, "targets_segmentation": segmentation, "targets_position": position}


@pytest.fixture(scope="module")
def params():
  return jax.device_get(
    nn.unbox(language_model.language_model_spec(CONFIG).init(jax.random.key(0)))
  )


def test_a_later_token_changes_no_earlier_logits_nor_another_packed_example(params):
  spec = language_model.language_model_spec(CONFIG)
  batch = _batch(0)
  logits = np.asarray(spec.apply(params, batch, None))
  for row in range(4):
    first_end = int(np.sum(batch["targets_segmentation"][row] == 1))
    for t in (0, first_end - 2):
      changed = {k: v.copy() for k, v in batch.items()}
      changed["targets"][row, t] = 3 + (changed["targets"][row, t] - 2) % (VOCAB - 3)
      other = np.asarray(spec.apply(params, changed, None))
      # Position t predicts token t from the tokens before it: t and earlier stay the same.
      np.testing.assert_array_equal(other[row, : t + 1], logits[row, : t + 1])
      assert not np.allclose(other[row, t + 1 : first_end], logits[row, t + 1 : first_end])
      # The second example of the row sees nothing of the first.
      np.testing.assert_array_equal(other[row, first_end:], logits[row, first_end:])
      np.testing.assert_array_equal(np.delete(other, row, 0), np.delete(logits, row, 0))


def _numpy_losses(logits, targets, label_smoothing):
  """Per-token (label-smoothed cross entropy, -log p(target)) of `logits`, in numpy float64."""
  logits = np.asarray(logits, np.float64)
  top = logits.max(-1, keepdims=True)
  log_p = logits - top - np.log(np.sum(np.exp(logits - top), -1))[..., None]
  picked = np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  other = label_smoothing / (logits.shape[-1] - 1)
  return -((1 - label_smoothing) * picked + other * (log_p.sum(-1) - picked)), -picked


def test_the_loss_is_the_next_token_cross_entropy_of_numpy_and_the_flops_the_formula(params):
  spec = language_model.language_model_spec(CONFIG)
  batch = _batch(1)
  logits = np.asarray(spec.apply(params, batch, None), np.float64)
  sums = language_model.language_model_loss(0.1)(jnp.asarray(logits, jnp.float32), batch)
  real = batch["targets_segmentation"] > 0
  smoothed, nll = _numpy_losses(logits, batch["targets"], 0.1)
  assert float(sums["tokens"]) == real.sum()
  np.testing.assert_allclose(float(sums["nll"]), nll[real].sum(), rtol=1e-5)
  np.testing.assert_allclose(float(sums["loss"]), smoothed[real].sum(), rtol=1e-5)
  # Per token and layer: q, k, v, out (4 d^2), feed-forward (2 d d_ff), attention over the
  # 12 keys of the row (2 d per key); the output layer (vocab d); x 2 FLOPs x 3 (backward).
  d, per_layer = 32, 4 * 32 * 32 + 2 * 32 * 64 + 2 * 32 * 12
  expected = 6.0 * real.sum() * (2 * per_layer + VOCAB * d)
  assert float(spec.flops(batch)) == expected


@pytest.mark.parametrize("scan_layers, remat", [(False, "none"), (True, "full")])
def test_float64_logits_and_losses_of_packed_and_padded_rows_are_the_numpy_formulas(
  scan_layers, remat
):
  """Against the float64 formula, whose dense mask is causal AND the token's own example: the
  model's (the examples apart in its mask, the causal mask its layers' `is_causal`) to 1e-12, for
  rows packed with up to three examples and padding, and for padded rows with no segmentation;
  the per-token losses to 1e-12, the loss function's float32 sums the formula's rounded. Scanned
  and rematerialized layers (`is_causal` one of their static arguments) alike."""
  targets = np.array(
    [[5, 9, 4, 7, 3, 8, 6, 11, 2, 0, 0, 0], [12, 4, 4, 9, 30, 3, 7, 5, 21, 8, 6, 39]], np.int32
  )
  segmentation = np.array(
    [[1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0, 0], [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]], np.int32
  )
  position = np.array(
    [[0, 1, 2, 0, 1, 2, 3, 0, 1, 0, 0, 0], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]], np.int32
  )
  padded = np.where(np.arange(12) < np.array([[7], [12]]), targets, 0).astype(np.int32)
  batch = {"targets": targets, "targets_segmentation": segmentation}
  with jax.enable_x64(True):
    cfg = dataclasses.replace(CONFIG, dtype="float64")
    init = nn.unbox(language_model.LanguageModel(cfg).init(jax.random.key(0), targets))["params"]
    leaves, tree = jax.tree.flatten(init)
    keys = jax.random.split(jax.random.key(3), len(leaves))  # Norms too: away from 1 and 0.
    params = jax.tree.unflatten(
      tree, [0.3 * jax.random.normal(k, x.shape, jnp.float64) for k, x in zip(keys, leaves)]
    )
    model = language_model.LanguageModel(
      dataclasses.replace(cfg, scan_layers=scan_layers, remat=remat)
    )
    variables = {"params": params}
    if scan_layers:  # The same layers, stacked.
      stacked = jax.tree.map(lambda *a: jnp.stack(a), *ref.layers(params))
      variables = {"params": {"embed": params["embed"], "final_norm": params["final_norm"]}}
      variables["params"]["layers"] = {"layer": stacked}
    logits = np.asarray(model.apply(variables, targets, segmentation, position))
    unpacked = np.asarray(model.apply(variables, padded))
    smoothed, nll = (np.asarray(a) for a in cross_entropy(logits, targets, 0.1))
    sums = language_model.language_model_loss(0.1)(logits, batch)
  params = jax.tree.map(np.asarray, params)
  assert logits.dtype == np.float64 and len(ref.layers(params)) == 2
  real = segmentation > 0
  want = ref.language_model_logits(params, targets, segmentation, position)
  np.testing.assert_allclose(logits[real], want[real], rtol=1e-12, atol=1e-12)
  want_smoothed, want_nll = _numpy_losses(want, targets, 0.1)
  np.testing.assert_allclose(smoothed[real], want_smoothed[real], rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(nll[real], want_nll[real], rtol=1e-12, atol=1e-12)
  assert sums["loss"].dtype == jnp.float32 and float(sums["tokens"]) == real.sum()
  np.testing.assert_allclose(float(sums["loss"]), want_smoothed[real].sum(), rtol=1e-7)
  np.testing.assert_allclose(float(sums["nll"]), want_nll[real].sum(), rtol=1e-7)

  is_real = (padded > 0).astype(np.int32)  # One example a row: padding_mask's path.
  want = ref.language_model_logits(params, padded, is_real, np.broadcast_to(np.arange(12), (2, 12)))
  np.testing.assert_allclose(unpacked[is_real > 0], want[is_real > 0], rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(
  not any(targets.installed(m) for m in targets.CUDA_PLUGINS) or jax.default_backend() != "cpu",
  reason="needs the cuda extra (jax CUDA plugin) and the CPU backend",
)
def test_its_h100_train_step_takes_cudnns_causal_mask_type_in_every_layer():
  """Compiled for an H100 on this CPU, in bfloat16 with cuDNN's attention: each layer's
  self-attention, forward and backward, is cuDNN's CAUSAL mask type (the packed segments its
  bias), as the translation decoder's self-attention (tests/test_attention.py)."""
  config = dataclasses.replace(
    CONFIG, num_layers=3, d_model=128, d_ff=256, num_heads=2, max_len=128, dtype="bfloat16"
  )
  spec = language_model.language_model_spec(dataclasses.replace(config, attention_impl="cudnn"))
  devices = targets.compile_devices(targets.parse_target("1xh100"))
  placement = Placement(
    spec, sharding.make_mesh({"data": 1}, devices), sharding.logical_rules("dp")
  )
  trainer = Trainer(placement, optax.adam(1e-3), language_model.language_model_loss(0.1))
  batch = placement.abstract_batch(4, 128)
  lowered = placement.run(lambda: trainer.jitted_step.lower(trainer.abstract_state, batch))
  found = [
    (call[1], re.search(r"mask_type[^A-Z]*([A-Z_]+)", call[0])[1])
    for call in re.finditer(
      r'custom_call_target="(__cudnn\$fmha[^"]*)".*', lowered.compile().as_text()
    )
  ]
  assert (
    sorted(found)
    == [("__cudnn$fmhaScaleBiasSoftmax", "CAUSAL")] * 3
    + [("__cudnn$fmhaScaleBiasSoftmaxBackward", "CAUSAL")] * 3
  ), found


def _train(mesh_shape, rules, devices=None, steps=8):
  spec = language_model.language_model_spec(CONFIG)
  placement = Placement(
    spec, sharding.make_mesh(mesh_shape, devices), sharding.logical_rules(rules)
  )
  trainer = Trainer(placement, optax.adam(3e-3), language_model.language_model_loss(0.1), seed=1)
  state, losses = trainer.init(), []
  for step in range(steps):
    state, metrics = trainer.train_step(state, _batch(step % 3))
    losses.append(float(metrics["loss"] / metrics["tokens"]))
  return np.array(losses), jax.device_get(state.params), trainer


@pytest.mark.slow
def test_it_learns_alike_on_1_device_and_on_8_data_parallel_and_fsdp():
  one, one_params, _ = _train({"data": 1}, "dp", devices=jax.devices()[:1])
  assert one[-1] < one[0], one
  for mesh, rules in (({"data": 8}, "dp"), ({"data": 2, "fsdp": 4}, "fsdp")):
    losses, params, trainer = _train(mesh, rules)
    np.testing.assert_allclose(losses, one, rtol=1e-4, atol=1e-6)  # Dropout alike on any mesh.
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), params, one_params
    )
  embedding = trainer.abstract_state.params["embed"]["embedding"]  # [vocab 40, embed 32]
  assert embedding.sharding.shard_shape(embedding.shape) == (40, 8)  # embed over fsdp.


def test_bad_language_model_settings_are_named(shared):
  with pytest.raises(FieldError, match=r"^eval_bleu_sentences=1000: a language model has no BLEU"):
    helpers.tiny_experiment(shared, model_kind="language_model")
  with pytest.raises(FieldError, match=r"^model.num_decoder_layers=1: the language model is one"):
    helpers.tiny_experiment(shared, **LM, model__num_decoder_layers=1)
  with pytest.raises(FieldError, match=r"^model.loss_chunk=16: the language model makes"):
    helpers.tiny_experiment(shared, **LM, model__loss_chunk=16)
  with pytest.raises(
    FieldError, match=r"^model_kind must be 'translation' or 'language_model'; got 'gpt'"
  ):
    helpers.tiny_experiment(shared, model_kind="gpt")


def _unigram_perplexity(experiment, tokenizer) -> float:
  """The held-out (test) perplexity of the add-one unigram model of the training split's target
  tokens, in numpy."""
  counts = np.ones(tokenizer.vocab_size)
  for batch in data.make_eval_batches(experiment.data, tokenizer, "train"):
    real = batch["targets_segmentation"] > 0
    counts += np.bincount(batch["targets"][real], minlength=tokenizer.vocab_size)
  log_p = np.log(counts / counts.sum())
  nll, tokens = 0.0, 0
  for batch in data.make_eval_batches(experiment.data, tokenizer, "test"):
    real = batch["targets_segmentation"] > 0
    nll -= log_p[batch["targets"][real]].sum()
    tokens += int(real.sum())
  return math.exp(nll / tokens)


@pytest.mark.slow
def test_trained_from_python_its_test_perplexity_is_well_below_the_unigram_models(shared, tmp_path):
  experiment = helpers.tiny_experiment(
    shared, **LM, num_train_steps=150, checkpoint_every_steps=150, learning_rate=2.0
  )
  experiment = dataclasses.replace(
    experiment, decode=dataclasses.replace(experiment.decode, split="test")
  )
  workdir = Workdir(str(tmp_path))
  state = experiment_lib.train(experiment, workdir)
  assert int(state.step) == 150
  record = experiment_lib.evaluate_split(experiment, workdir)
  assert "bleu" not in record and record["split"] == "test" and record["step"] == 150
  tokenizer = data.load_tokenizer(experiment.data, workdir.vocab)
  unigram = _unigram_perplexity(experiment, tokenizer)
  print(f"test perplexity {record['perplexity']:.2f}, unigram {unigram:.2f}")
  assert record["perplexity"] < 0.5 * unigram, (record, unigram)
  losses = helpers.scalars(tmp_path)
  assert losses[150] < 0.7 * losses[1], losses


@pytest.mark.slow
def test_experiments_lm_trains_averages_and_reports_perplexity_from_the_command_line(
  shared, tmp_path
):
  overrides = helpers.flags(shared, num_train_steps=4, eval_every_steps=2)[1:]
  result = helpers.python(
    "-m",
    "transformer_jax.main",
    "--mode=train,average,eval",
    "--config=experiments/lm.py",
    f"--workdir={tmp_path}",
    *overrides,
    "--config.average_last=2",
    "--checkpoint=averaged",
    shared=shared,
  )
  assert result.returncode == 0, result.stderr[-4000:]
  assert "eval (validation) at step 4" in result.stderr, result.stderr[-4000:]
  assert re.search(
    r"^test perplexity [\d.]+ \| averaged 2-4 \(2 checkpoints\)", result.stdout, re.M
  )
  refused = helpers.python(
    "-m",
    "transformer_jax.main",
    "--mode=translate",
    "--config=experiments/lm.py",
    f"--workdir={tmp_path}",
    *overrides,
    shared=shared,
    input="a b\n",
  )
  assert refused.returncode == 1
  errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
  assert errors == [
    "error: config.model_kind='language_model': --mode=translate needs a translation model; a "
    "language model has no source to translate (--mode=eval reports its perplexity)"
  ], refused.stderr[-3000:]


@pytest.mark.slow
def test_a_sigkilled_language_model_run_resumes_bit_for_bit(shared, tmp_path):
  steps = 8
  reference = tmp_path / "reference"
  helpers.Run(
    shared, reference, **LM, num_train_steps=steps, checkpoint_every_steps=steps
  ).succeed()
  (expected,) = helpers.scalars_per_run(reference)
  killed = tmp_path / "killed"
  run = helpers.Run(shared, killed, **LM, num_train_steps=steps)
  deadline = time.monotonic() + 300
  while max(helpers.committed_steps(killed), default=0) < 4 and run.process.poll() is None:
    assert time.monotonic() < deadline, run.output[-3000:]
    time.sleep(0.001)
  assert run.process.poll() is None, run.output[-3000:]  # Killed before its end.
  run.process.kill()
  run.finish()
  committed = max(helpers.committed_steps(killed))
  assert 4 <= committed < steps, committed
  output = helpers.Run(shared, killed, **LM, num_train_steps=steps).succeed()
  assert f"at step {committed}" in output, output[-3000:]
  for losses in helpers.scalars_per_run(killed):
    for step, loss in losses.items():
      assert loss == expected[step], (step, loss, expected[step])
  ours, theirs = (helpers.restore_state(d, steps) for d in (killed, reference))
  for a, b in zip(helpers.leaves(ours), helpers.leaves(theirs), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_the_compile_mode_compiles_its_train_and_eval_steps_for_v5e_8_and_no_search():
  if not targets.installed("libtpu") or jax.default_backend() != "cpu":
    pytest.skip("needs the tpu extra (libtpu) and the CPU backend")
  config = config_lib.load_file(str(helpers.REPO / "experiments" / "lm.py"))
  config.model.update(num_layers=1, d_model=64, d_ff=128, max_len=64)
  config.data.vocab.size = 256
  config.data.batch.update(
    mode="packed", size=64, max_length=32, max_source_length=32, max_target_length=32
  )
  report = programs.compile_experiment(config_lib.parse(config), targets.parse_target("v5e-8"))
  record = report.record()
  assert [p["name"] for p in record["programs"]] == ["train 64x32", "eval 64x32"], record
  # Parameters: the embedding, one layer (4 attention matrices, feed-forward with biases, 2
  # norms) and the final norm.
  assert (
    record["parameters"]["count"]
    == 256 * 64 + 4 * 64 * 64 + 2 * 64 * 128 + 128 + 64 + 2 * 128 + 128
  )
  (train,) = [p for p in record["programs"] if p["kind"] == "train"]
  # The model's FLOPs leave out softmaxes, norms and the loss: a few percent under XLA's count.
  assert 0.85 * train["flops"] <= train["model_flops_per_device"] <= train["flops"]


def test_translating_and_the_marian_export_refuse_a_language_model_before_reading_anything(
  shared, tmp_path
):
  experiment = helpers.tiny_experiment(shared, **LM)
  says = r"^model_kind='language_model': {} needs a translation model; a language model has no"
  with pytest.raises(FieldError, match=says.format("--mode=translate")):
    experiment_lib.translate_file(
      experiment, Workdir(str(tmp_path)), experiment_lib.Checkpoint(), "/no/such/file", None
    )
  with pytest.raises(FieldError, match=says.format("export to Marian")):
    convert.export_marian(experiment, Workdir(str(tmp_path)), str(tmp_path / "out"))
