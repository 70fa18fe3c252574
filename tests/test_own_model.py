"""Models other than the Linen Transformer through the trainer: docs/library.md's Linen next-token
model and an NNX one learn on 1 device and on 8 (data parallel and FSDP) alike, evaluate,
checkpoint and resume exactly through `fit`; the NNX Transformer trains as the Linen one does;
the trainer checks the batch keys the model declares."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import helpers
from transformer_jax import sharding
from transformer_jax.checkpoints import recovery, store
from transformer_jax.compile import programs
from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.decode.metrics import TeacherForcedLoss
from transformer_jax.model import nnx_transformer
from transformer_jax.model.config import batch_train_flops
from transformer_jax.model.loss import transformer_loss
from transformer_jax.model.spec import ModelSpec, nnx_spec
from transformer_jax.placement import Placement
from transformer_jax.train.step import Trainer

pytestmark = pytest.mark.slow

VOCAB, WIDTH = 64, 32


@pytest.fixture(scope="module")
def docs_example():
  """The names docs/library.md's block defines, after it ran on all 8 devices."""
  code = helpers.code_block("docs/library.md", "## Your own model through the trainer\n")
  scope = {}
  exec(compile(code, "docs/library.md", "exec"), scope)  # pylint: disable=exec-used
  assert len(scope["placement"].mesh.devices.flat) == 8
  return scope


def _train(spec, loss, mesh_shape, rules, batch, steps=20, devices=None):
  """`(losses per token, final params, trainer)` of `steps` Adam steps on one repeated batch."""
  placement = Placement(
    spec, sharding.make_mesh(mesh_shape, devices), sharding.logical_rules(rules)
  )
  trainer = Trainer(placement, optax.adam(0.02), loss)
  state, losses = trainer.init(), []
  for _ in range(steps):
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["loss"] / metrics["tokens"]))
  return np.array(losses), jax.device_get(state.params), trainer


def _assert_close_trees(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5), a, b)


def test_the_docs_linen_model_learns_alike_on_1_and_8_devices_data_parallel_and_fsdp(docs_example):
  losses = np.array(docs_example["losses"])
  assert losses[-1] < 0.3 * losses[0], losses  # Each next token is the previous one plus 1.
  spec, loss, batch = docs_example["spec"], docs_example["loss"], docs_example["batch"]
  one, one_params, _ = _train(spec, loss, {"data": 1}, "dp", batch, devices=jax.devices()[:1])
  np.testing.assert_allclose(
    losses, one, rtol=1e-4, atol=1e-6
  )  # Dropout draws the same on any mesh.
  _assert_close_trees(jax.device_get(docs_example["state"].params), one_params)
  fsdp, fsdp_params, trainer = _train(spec, loss, {"data": 2, "fsdp": 4}, "fsdp", batch)
  np.testing.assert_allclose(fsdp, one, rtol=1e-4, atol=1e-6)
  _assert_close_trees(fsdp_params, one_params)
  kernel = trainer.abstract_state.params["Dense_0"]["kernel"]  # [embed 32, vocab 64]
  assert kernel.sharding.shard_shape(kernel.shape) == (8, 64)
  metrics = docs_example["metrics"]
  assert float(metrics["flops"]) == 6.0 * WIDTH * VOCAB * batch["tokens"].size
  assert set(metrics) == {"loss", "nll", "tokens", "grad_norm", "flops", "nonfinite"}


def test_the_evaluation_loss_and_the_compile_mode_take_the_model_and_its_loss(docs_example):
  placement, loss = docs_example["placement"], docs_example["loss"]
  params = docs_example["state"].params
  sums = TeacherForcedLoss(placement, loss)(params, [docs_example["batch"]] * 2)
  logits = placement.model.apply(
    {"params": jax.device_get(params)}, docs_example["batch"]["tokens"]
  )
  expected = loss(logits, docs_example["batch"])  # Dropout off: the module's own forward pass.
  assert float(sums["tokens"]) == 2 * float(expected["tokens"]) == 2 * 8 * 15
  np.testing.assert_allclose(float(sums["loss"]), 2 * float(expected["loss"]), rtol=1e-5)
  batch = placement.abstract_batch(8, 16)
  assert set(batch) == {"tokens"} and batch["tokens"].shape == (8, 16)
  assert programs.full_batch_flops(placement.spec, 8, 16) == 6.0 * WIDTH * VOCAB * 8 * 16


class NnxNextToken(nnx.Module):
  """The docs' model in NNX: a partitioned embedding, dropout, a partitioned dense layer."""

  def __init__(self, rngs: nnx.Rngs):
    normal = nnx.with_partitioning(nnx.initializers.normal(1.0), ("vocab", "embed"))
    self.embed = nnx.Embed(VOCAB, WIDTH, embedding_init=normal, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)
    dense = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "vocab"))
    self.dense = nnx.Linear(WIDTH, VOCAB, kernel_init=dense, rngs=rngs)

  def __call__(self, tokens):
    return self.dense(self.dropout(self.embed(tokens)))


def test_an_nnx_model_learns_alike_on_1_and_8_devices_and_its_dropout_follows_the_step(
  docs_example,
):
  spec = nnx_spec(NnxNextToken, batch_keys=("tokens",))
  loss, batch = docs_example["loss"], docs_example["batch"]
  one, one_params, trainer = _train(spec, loss, {"data": 1}, "dp", batch, devices=jax.devices()[:1])
  assert one[-1] < 0.3 * one[0], one
  fsdp, fsdp_params, fsdp_trainer = _train(spec, loss, {"data": 2, "fsdp": 4}, "fsdp", batch)
  np.testing.assert_allclose(fsdp, one, rtol=1e-4, atol=1e-6)
  _assert_close_trees(fsdp_params, one_params)
  kernel = fsdp_trainer.abstract_state.params["dense"]["kernel"]
  assert kernel.sharding.shard_shape(kernel.shape) == (8, 64)
  assert set(one_params) == {"embed", "dense"}  # Parameters only: the RNG streams are not state.
  # Dropout is on with a key, different for another key, and off without one.
  tokens = {"tokens": jnp.asarray(batch["tokens"])}
  apply = jax.jit(spec.apply)
  a, b = apply(one_params, tokens, jax.random.key(1)), apply(one_params, tokens, jax.random.key(2))
  assert not np.array_equal(a, b)
  np.testing.assert_array_equal(a, apply(one_params, tokens, jax.random.key(1)))
  np.testing.assert_array_equal(apply(one_params, tokens, None), apply(one_params, tokens, None))
  assert not np.array_equal(a, apply(one_params, tokens, None))


def test_an_nnx_model_with_state_other_than_parameters_is_refused():
  class Normalized(nnx.Module):
    def __init__(self, rngs):
      self.norm = nnx.BatchNorm(4, rngs=rngs)

  with pytest.raises(ValueError, match="BatchStat variables; the trainer keeps parameters"):
    nnx_spec(Normalized, batch_keys=("tokens",))


def test_fit_checkpoints_and_resumes_the_docs_model_exactly(docs_example, tmp_path):
  spec, loss = docs_example["spec"], docs_example["loss"]
  rng = np.random.default_rng(0)
  batches = [{"tokens": rng.integers(1, VOCAB, (8, 12), dtype=np.int32)} for _ in range(6)]

  def trainer():
    placement = Placement(
      spec, sharding.make_mesh({"data": 2, "fsdp": 4}), sharding.logical_rules("fsdp")
    )
    return Trainer(placement, optax.adam(0.02), loss, seed=3)

  whole = helpers.fit_batches(
    trainer(), batches, tmp_path / "whole", checkpoint_every_steps=3, log_every_steps=1
  )
  assert helpers.committed_steps(tmp_path / "whole") == [3, 6]
  losses = helpers.scalars(tmp_path / "whole")
  assert sorted(losses) == [1, 2, 3, 4, 5, 6]
  assert helpers.scalars(tmp_path / "whole", "train/perplexity")  # The loss has an nll.
  assert helpers.scalars(tmp_path / "whole", "train/source_tokens_per_s") == {}
  # Stopped after step 3 and resumed from its checkpoint: the same parameters, bit for bit.
  helpers.fit_batches(trainer(), batches[:3], tmp_path / "parts")
  resumed_trainer = trainer()
  manager = store.make_manager(str(tmp_path / "parts" / "checkpoints"))
  state = recovery.resume(manager, resumed_trainer.abstract_state)
  assert int(state.step) == 3
  for batch in batches[3:]:
    state, _ = resumed_trainer.train_step(state, batch)
  jax.tree.map(
    np.testing.assert_array_equal, jax.device_get(state.params), jax.device_get(whole.params)
  )


def test_the_trainer_names_the_batch_arrays_a_model_declares_and_a_batch_lacks(docs_example):
  spec = docs_example["spec"]
  two_keys = ModelSpec(spec.init, spec.apply, ("tokens", "weights"), module=spec.module)
  trainer = Trainer(Placement.data_parallel(two_keys), optax.sgd(0.1), docs_example["loss"])
  with pytest.raises(ValueError, match=r"the batch lacks weights: the model reads tokens, weights"):
    trainer.check_batch({"tokens": np.ones((8, 4), np.int32)})
  with pytest.raises(ValueError, match="name the batch arrays"):
    ModelSpec(spec.init, spec.apply, "tokens")


def test_the_nnx_transformer_trains_through_the_trainer_as_the_linen_one_does():
  config = helpers.tiny_model_config(dropout_rate=0.0)
  spec = nnx_spec(
    lambda rngs: nnx_transformer.Transformer(config, rngs=rngs),
    batch_keys=BATCH_KEYS,
    flops=functools.partial(batch_train_flops, config),
  )
  optimizer, loss = optax.adam(1e-3), transformer_loss(0.1)
  one_device = lambda: sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rules = sharding.logical_rules("dp")
  linen = Trainer(Placement(config, one_device(), rules), optimizer, loss)
  twin = Trainer(Placement(spec, one_device(), rules), optimizer, loss)
  assert jax.tree.structure(twin.abstract_state) == jax.tree.structure(linen.abstract_state)
  state = linen.init()
  start = jax.device_get(
    state
  )  # The Linen model's parameters, which the NNX one loads as they are.
  batches = [helpers.synthetic_batch(seed) for seed in range(3)]
  for batch in batches:
    state, want = linen.train_step(state, batch)
  twin_state = jax.device_put(start)
  for batch in batches:
    twin_state, got = twin.train_step(twin_state, batch)
  for key in ("loss", "nll", "tokens", "source_tokens", "flops"):
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
  _assert_close_trees(jax.device_get(twin_state.params), jax.device_get(state.params))
