"""The NNX front door: every NNX module against its Linen twin (and the Linen one bridged into NNX)
in float64, outputs and gradients to 1e-12, with dropout on; the whole Transformer with padding,
packing and cached decoding; parameters both ways; an NNX user's model trained sharded.

Dropout: the two front doors draw their keys differently (Linen folds the module path into the
"dropout" stream, NNX counts a stream per module), so `same_dropout_keys` replaces the key of the
n-th dropout call of a run by key(n), in both: the masks are then the same wherever the two
call the same sites in the same order, which is what this checks.
"""

import contextlib
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import helpers
from helpers import code_block, init_module
from transformer_jax import sharding
from transformer_jax.decode import search, transformer_search
from transformer_jax.model import attention, decode_cache, dropout, layers, nnx_layers
from transformer_jax.model import embedding as linen_embedding
from transformer_jax.model import nnx_transformer as nt
from transformer_jax.model.transformer import Transformer, TransformerConfig

TOLERANCE = 1e-12
F64 = dict(dtype=jnp.float64, param_dtype=jnp.float64)


@contextlib.contextmanager
def same_dropout_keys(monkeypatch):
  """The n-th `dropout.dropout` call gets key(n); `reset()` starts a new run at n = 0."""
  real, calls = dropout.dropout, [0]

  def counted(x, rate, key):
    calls[0] += 1
    return real(x, rate, jax.random.key(calls[0]))

  monkeypatch.setattr(dropout, "dropout", counted)
  yield lambda: calls.__setitem__(0, 0)
  monkeypatch.setattr(dropout, "dropout", real)


def assert_trees_close(got, want):
  jax.tree.map(
    lambda g, w: np.testing.assert_allclose(g, w, rtol=TOLERANCE, atol=TOLERANCE), got, want
  )


def randn(seed, *shape):
  return jnp.asarray(helpers.randn(seed, *shape), jnp.float64)


def linen_and_nnx(linen_module, nnx_module, args, *, call=None, reset=lambda: None):
  """(Linen, NNX) of (output, gradient of a fixed projection of the output with respect to the
  parameters and the first argument), the NNX module loaded with the Linen one's parameters;
  `reset` before each of the four runs."""
  method = {"method": call} if call else {}
  _, params = init_module(linen_module, *args, **method)
  nt.load_linen_params(nnx_module, params)

  def projected(out):
    return jnp.sum(out * randn(9, *out.shape))

  def linen_out(p, first):
    reset()
    rngs = {"dropout": jax.random.key(1)}
    return linen_module.apply({"params": p}, first, *args[1:], rngs=rngs, **method)

  def nnx_out(module, first):
    reset()
    return (getattr(module, call) if call else module)(first, *args[1:])

  linen = (
    linen_out(params, args[0]),
    *jax.grad(lambda p, x: projected(linen_out(p, x)), argnums=(0, 1))(params, args[0]),
  )
  twin_out = nnx_out(nnx_module, args[0])
  grad_module, grad_x = nnx.grad(lambda m, x: projected(nnx_out(m, x)), argnums=(0, 1))(
    nnx_module, args[0]
  )
  return linen, (twin_out, nnx.to_pure_dict(grad_module), grad_x)


def assert_same(linen, nnx_result):
  for got, want in zip(nnx_result, linen):
    assert_trees_close(got, want)


# --- every layer --------------------------------------------------------------------------------


@pytest.mark.parametrize("bias, scheme", [(False, "xavier"), (True, "fairseq")])
def test_attention_matches_linen_with_a_padding_mask(bias, scheme):
  with jax.enable_x64(True):
    x, kv = randn(0, 2, 5, 16), randn(1, 2, 7, 12)
    mask = attention.padding_mask(jnp.array([[1] * 5, [1, 1, 1, 0, 0]]), jnp.ones((2, 7)))
    kwargs = dict(use_bias=bias, init_scheme=scheme, attention_impl="reference", **F64)
    linen = layers.MultiHeadAttention(4, 3, 5, out_features=10, **kwargs)
    twin = nnx_layers.MultiHeadAttention(
      16, 4, 3, 5, d_kv=12, out_features=10, **kwargs, rngs=nnx.Rngs(0)
    )
    assert_same(*linen_and_nnx(linen, twin, (x, kv, mask)))


@pytest.mark.parametrize("activation, scheme", [("relu", "xavier"), ("gelu", "fairseq")])
def test_feed_forward_and_layer_norm_match_linen(activation, scheme):
  with jax.enable_x64(True):
    x = randn(0, 2, 5, 16)
    linen = layers.FeedForward(24, activation, init_scheme=scheme, **F64)
    twin = nnx_layers.FeedForward(
      16, 24, activation=activation, init_scheme=scheme, **F64, rngs=nnx.Rngs(0)
    )
    assert_same(*linen_and_nnx(linen, twin, (x,)))
    norm = layers.LayerNorm(1e-5, jnp.float64, jnp.float64)
    assert_same(*linen_and_nnx(norm, nnx_layers.LayerNorm(16, epsilon=1e-5, **F64), (x,)))


def test_embedding_its_logits_and_the_positions_match_linen():
  with jax.enable_x64(True):
    ids = jnp.array([[3, 1, 4, 1, 5], [9, 2, 6, 0, 0]])
    linen = linen_embedding.Embed(11, 8, logits_bias=True, **F64)
    twin = nnx_layers.Embed(11, 8, logits_bias=True, **F64, rngs=nnx.Rngs(0))
    _, params = init_module(linen, ids)
    nt.load_linen_params(twin, params)
    out = linen.apply({"params": params}, ids)
    np.testing.assert_array_equal(twin(ids), out)
    x = randn(2, 2, 5, 8)
    assert_same(*linen_and_nnx(linen, twin, (x,), call="attend"))
    positions = jnp.array([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]])  # Two packed examples in row 0.
    for kind in ("sinusoidal", "learned"):
      linen_pos = linen_embedding.PositionalEncoding(16, kind, param_dtype=jnp.float64)
      twin_pos = nnx_layers.PositionalEncoding(
        16, 8, kind, param_dtype=jnp.float64, rngs=nnx.Rngs(0)
      )
      init = linen_pos.init(jax.random.key(0), x, positions)
      nt.load_linen_params(twin_pos, nn.unbox(init.get("params", {})))
      np.testing.assert_array_equal(twin_pos(x, positions), linen_pos.apply(init, x, positions))


def layer_settings(pre_norm):
  return dict(
    num_heads=2,
    d_k=4,
    d_v=4,
    d_ff=16,
    dropout_rate=0.3,
    attention_dropout_rate=0.2,
    activation_dropout_rate=0.4,
    pre_norm=pre_norm,
    dtype=jnp.float64,
    attention_impl="reference",
    attention_bias=True,
  )


@pytest.mark.parametrize("pre_norm", [False, True])
def test_encoder_and_decoder_layers_match_linen_and_the_bridge_with_dropout_on(
  pre_norm, monkeypatch
):
  with jax.enable_x64(True), same_dropout_keys(monkeypatch) as reset:
    settings = layer_settings(pre_norm)
    x, encoded = randn(0, 2, 6, 8), randn(1, 2, 5, 8)
    segments = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])  # Packed, and padded.
    self_mask = attention.combine_masks(
      attention.causal_mask(6), attention.segment_mask(segments, segments)
    )
    cross_mask = attention.padding_mask(segments, jnp.array([[1, 1, 1, 0, 0], [1] * 5]))

    linen = layers.EncoderLayer(**settings)
    twin = nnx_layers.EncoderLayer(8, **settings, rngs=nnx.Rngs(0))
    args = (x, attention.segment_mask(segments, segments), False)
    assert_same(*linen_and_nnx(linen, twin, args, reset=reset))

    # The bridge shards annotated variables eagerly; without a mesh, switch that off.
    with nnx.use_eager_sharding(False):
      bridged = nnx.bridge.ToNNX(layers.EncoderLayer(**settings), rngs=nnx.Rngs(0))
      nnx.bridge.lazy_init(bridged, *args)
    state = nnx.state(bridged, nnx.Param)
    nnx.replace_by_pure_dict(state, nt.linen_params(twin))
    nnx.update(bridged, state)
    reset()
    via_bridge = bridged(*args, rngs=jax.random.key(1))
    reset()
    np.testing.assert_allclose(via_bridge, twin(*args), rtol=TOLERANCE, atol=TOLERANCE)

    # A decoder-only model's layer: the segments as the mask, causal through `is_causal`.
    causal_args = (*args, True)
    assert_same(*linen_and_nnx(linen, twin, causal_args, reset=reset))

    linen = layers.DecoderLayer(**settings)
    twin = nnx_layers.DecoderLayer(8, **settings, rngs=nnx.Rngs(0))
    args = (x, encoded, self_mask, cross_mask, False)
    assert_same(*linen_and_nnx(linen, twin, args, reset=reset))


def test_the_linen_decoder_layer_through_the_bridge_keeps_its_cache_as_the_nnx_one_does():
  """Linen's cache collections are NNX's cache types (model/decode_cache.py): bridged into NNX,
  the Linen layer's decode cache splits into per-sentence and per-row state as the NNX layer's
  does, entry for entry."""
  settings = dict(num_heads=2, d_k=4, d_v=4, d_ff=16, dropout_rate=0.0)
  rows, max_len = 6, 5  # 3 hypotheses of each of 2 sentences.
  x, encoded = jnp.ones((rows, max_len, 8)), jnp.ones((2, 3, 8))
  with nnx.use_eager_sharding(False):
    bridged = nnx.bridge.ToNNX(layers.DecoderLayer(**settings), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(bridged, x, encoded, None, None, True, True)  # Sizes the cache.
  twin = nnx_layers.DecoderLayer(8, **settings, rngs=nnx.Rngs(0))
  twin.self_attention.init_cache(rows, max_len)
  twin.cross_attention.set_static_kv(encoded)

  def kinds(module):
    _, sentence, per_row, _ = decode_cache.split_cache(module)
    return [jax.tree.map(jnp.shape, nnx.to_pure_dict(state)) for state in (sentence, per_row)]

  sentence, per_row = kinds(twin)
  assert sentence and per_row
  assert kinds(bridged) == [sentence, per_row]


# --- the whole model ----------------------------------------------------------------------------


def tiny_config(**overrides):
  settings = dict(
    vocab_size=23,
    num_layers=2,
    d_model=16,
    d_ff=32,
    num_heads=2,
    max_len=16,
    dropout_rate=0.2,
    dtype="float64",
    attention_impl="reference",
  )
  return TransformerConfig(**(settings | overrides))


def linen_and_twin(config, batch):
  linen = Transformer(config)
  _, params = init_module(linen, *batch)
  twin = nt.Transformer(config, rngs=nnx.Rngs(0))
  nt.load_linen_params(twin, params)
  return linen, params, twin


PACKED = dict(
  inputs=jnp.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]]),
  targets=jnp.array([[14, 15, 16, 17, 0], [18, 19, 20, 21, 22]]),
  inputs_segmentation=jnp.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 0, 0, 0]]),
  targets_segmentation=jnp.array([[1, 1, 2, 2, 0], [1, 1, 1, 1, 1]]),
  inputs_position=jnp.array([[0, 1, 0, 1, 2, 0], [0, 1, 2, 0, 0, 0]]),
  targets_position=jnp.array([[0, 1, 0, 1, 0], [0, 1, 2, 3, 4]]),
)


@pytest.mark.parametrize(
  "overrides, packed",
  [
    ({}, False),
    ({"norm": "pre", "positional": "learned", "logits_bias": True, "vocab_multiple": 16}, True),
    ({"attention_bias": True, "init": "fairseq", "norm_epsilon": 1e-5}, True),
    ({"attention_dropout_rate": 0.1, "activation_dropout_rate": 0.3}, True),
    ({"num_layers": 3, "num_decoder_layers": 1}, True),
  ],
)
def test_the_transformer_matches_linen_in_training_with_dropout(overrides, packed, monkeypatch):
  with jax.enable_x64(True), same_dropout_keys(monkeypatch) as reset:
    batch = PACKED if packed else {k: PACKED[k] for k in ("inputs", "targets")}
    linen, params, twin = linen_and_twin(tiny_config(**overrides), tuple(batch.values())[:2])
    weights = randn(3, 2, 5, 23)

    def linen_loss(p):
      reset()
      logits = linen.apply({"params": p}, **batch, train=True, rngs={"dropout": jax.random.key(1)})
      return jnp.sum(logits * weights), logits

    def nnx_loss(model):
      reset()
      logits = model(**batch, train=True)
      return jnp.sum(logits * weights), logits

    (_, want), want_grads = jax.value_and_grad(linen_loss, has_aux=True)(params)
    (_, got), got_grads = nnx.value_and_grad(nnx_loss, has_aux=True)(twin)
    assert_trees_close(got, want)
    assert_trees_close(nnx.to_pure_dict(got_grads), want_grads)
    reset()
    no_dropout = linen.apply({"params": params}, **batch)
    assert float(jnp.abs(no_dropout - want).max()) > 1e-3  # Dropout was on.


@pytest.mark.parametrize("decoder_depth", [None, 3])
def test_parameters_go_both_ways_the_scanned_layout_included(decoder_depth):
  with jax.enable_x64(True):
    batch = (PACKED["inputs"], PACKED["targets"])
    config = tiny_config(dropout_rate=0.0, num_decoder_layers=decoder_depth)
    linen, params, twin = linen_and_twin(config, batch)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, nt.linen_params(twin), params))
    scanned_linen = Transformer(dataclasses.replace(config, scan_layers=True))
    scanned = nt.linen_params(twin, scanned=True)
    want = scanned_linen.apply({"params": scanned}, *batch)
    fresh = nt.Transformer(config, rngs=nnx.Rngs(7))
    nt.load_linen_params(fresh, scanned)
    np.testing.assert_allclose(fresh(*batch), want, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(linen.apply({"params": params}, *batch), want, rtol=TOLERANCE)


@pytest.mark.parametrize("decoder_depth", [None, 1])
def test_each_cached_step_equals_the_full_forward_and_the_searches_match_linen(decoder_depth):
  config = tiny_config(dropout_rate=0.0, dtype="float32", num_decoder_layers=decoder_depth)
  inputs = PACKED["inputs"]
  linen, params, twin = linen_and_twin(config, (inputs, PACKED["targets"]))
  # Bias EOS so that hypotheses end at different lengths.
  params["embed"]["embedding"] = params["embed"]["embedding"].at[1].multiply(3.0)
  nt.load_linen_params(twin, params)
  targets = jnp.array([[4, 9, 3, 12, 5], [7, 7, 2, 8, 6]])
  with jax.enable_x64(True):  # Each cached step against the full forward pass, in float64.
    config64 = dataclasses.replace(config, dtype="float64")
    twin64, linen64 = nt.Transformer(config64, rngs=nnx.Rngs(0)), Transformer(config64)
    params64 = jax.tree.map(lambda x: x.astype(jnp.float64), params)
    nt.load_linen_params(twin64, params64)
    full = jax.nn.log_softmax(twin64(inputs, targets))
    models = (
      transformer_search.searchable(twin64),
      transformer_search.searchable(linen64, {"params": params64}),
    )
    for model in models:
      cache = model.encode(inputs, 2, 8)
      assert {x.shape[0] for x in jax.tree.leaves(cache.rows)} == {2}
      previous = jnp.zeros(2, jnp.int32)
      for step in range(5):
        log_probs, cache = model.step(previous, jnp.int32(step), cache)
        np.testing.assert_allclose(log_probs, full[:, step], rtol=TOLERANCE, atol=TOLERANCE)
        previous = targets[:, step]

  options = dict(max_len=12, max_extra=5)
  for name, extra in (("greedy_search", {}), ("beam_search", {"beam_size": 3, "alpha": 0.6})):
    run = nnx.jit(
      lambda m, x, name=name, extra=extra: getattr(search, name)(
        transformer_search.searchable(m), x, **options, **extra
      )
    )
    got = run(twin, inputs)
    want = getattr(transformer_search, name)(linen, {"params": params}, inputs, **options, **extra)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-6)
    assert len({len(h) for h in search.trim(got.tokens)}) > 1


# --- an NNX user's own model -------------------------------------------------------------------


class Classifier(nnx.Module):
  """A user's model: embedding, two of the project's NNX encoder layers, mean pooling, a head."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx_layers.Embed(8, 32, rngs=rngs)
    self.layers = nnx.List(
      [nnx_layers.EncoderLayer(32, 4, 8, 8, 64, dropout_rate=0.1, rngs=rngs) for _ in range(2)]
    )
    self.head = nnx.Linear(32, 4, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    mask = attention.padding_mask(tokens, tokens)
    for layer in self.layers:
      x = layer(x, mask)
    return self.head(x.mean(axis=1))


@pytest.mark.slow
def test_an_nnx_model_of_the_encoder_layers_trains_sharded_by_the_fsdp_rules():
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 8, (16, 6)))
  labels = (tokens == 3).sum(axis=1).clip(max=3)  # How many 3s: needs every position.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  rules = sharding.logical_rules("fsdp")
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    model = Classifier(nnx.Rngs(0))
    shardings = sharding.nnx_shardings(nnx.state(model), mesh, rules)
    nnx.update(model, jax.device_put(nnx.state(model), shardings))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, tokens, labels):
      def loss_fn(model):
        logits = model(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

      loss, grads = nnx.value_and_grad(loss_fn)(model)
      optimizer.update(model, grads)
      return loss

    batch = jax.device_put(tokens, jax.NamedSharding(mesh, jax.P(("data", "fsdp"))))
    losses = [float(step(model, optimizer, batch, labels)) for _ in range(60)]
  assert losses[-1] < 0.5 * losses[0], losses[::10]
  wi = model.layers[0].feed_forward.wi[...]  # [embed 32, mlp 64]: embed over fsdp's 4.
  assert wi.sharding.shard_shape(wi.shape) == (8, 64)
  embedding = model.embed.embedding[...]  # [vocab 8, embed 32]
  assert embedding.sharding.shard_shape(embedding.shape) == (8, 8)


# --- the docs' examples --------------------------------------------------------------------------


def test_the_readme_example_builds_a_model_that_tags_every_position():
  code = code_block("README.md", "built from layers you can lift into your own Flax models:")
  assert len(code.strip().splitlines()) <= 10
  scope = {}
  exec(compile(code, "README.md", "exec"), scope)  # pylint: disable=exec-used
  model = scope["Tagger"](nnx.Rngs(0))
  model.eval()
  tokens = jnp.array([[5, 6, 7, 0], [8, 9, 0, 0]])
  logits = model(tokens)
  assert logits.shape == (2, 4, 1000)
  np.testing.assert_array_equal(model(tokens), logits)  # eval(): dropout off.
  # Each position's logits come through the shared embedding: the encoder's output times E^T.
  hidden = model.encoder(model.embed(tokens), attention.padding_mask(tokens, tokens))
  np.testing.assert_allclose(logits, hidden @ model.embed.embedding[...].T, rtol=1e-5, atol=1e-5)


def test_the_library_docs_nnx_example_trains_a_sharded_step():
  code = code_block("docs/library.md", "### The layers from NNX\n")
  assert len(code.strip().splitlines()) <= 20
  scope = {}
  exec(compile(code, "docs/library.md", "exec"), scope)  # pylint: disable=exec-used
  assert np.isfinite(float(scope["loss"]))
  wi = scope["model"].encoder.feed_forward.wi[...]  # [embed 64, mlp 256]: embed over 8 devices.
  assert len(jax.devices()) == 8 and wi.sharding.shard_shape(wi.shape) == (8, 256)


def test_nnx_dropout_draws_a_new_mask_at_every_site_and_call_and_across_jitted_steps():
  rates = dict(dropout_rate=0.5, attention_dropout_rate=0.5, activation_dropout_rate=0.5)
  layer = nnx_layers.EncoderLayer(8, 2, 4, 4, 16, **rates, rngs=nnx.Rngs(0))
  x = jnp.ones((1, 64, 8))
  dropped = lambda y: np.asarray(y == 0)
  masks = []
  original = dropout.dropout
  try:  # Each site's mask: attention weights, activations, both sub-layers' outputs.
    dropout.dropout = lambda y, rate, key: (
      masks.append(dropped(original(y, rate, key))) or (original(y, rate, key))
    )
    layer(x, None, False)
    layer(x, None, False)
  finally:
    dropout.dropout = original
  assert len(masks) == 8 and all(m.mean() > 0.3 for m in masks)
  assert len({m.tobytes() for m in masks}) == 8  # Four sites, two calls: eight masks.
  step = nnx.jit(lambda layer, x: layer(x))  # Dropout as the module is set: on after making it.
  first, second = step(layer, x), step(layer, x)
  assert not np.array_equal(first, second)  # The stream advanced across the jitted calls.
  layer.eval()
  np.testing.assert_array_equal(step(layer, x), step(layer, x))
  training = nnx.view(layer, deterministic=False)  # NNX's view switches it back on.
  assert not np.array_equal(training(x), training(x))


def test_the_jitted_searches_of_the_linen_model_refuse_an_nnx_model():
  twin = nt.Transformer(tiny_config(dtype="float32"), rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=r"runs the searches inside nnx.jit: nnx.jit\(lambda"):
    transformer_search.beam_search(twin, None, PACKED["inputs"], beam_size=2, max_len=8)
