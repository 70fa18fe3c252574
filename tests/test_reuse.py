"""The layers lifted into models written elsewhere: plain Linen, and NNX through flax.nnx.bridge."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from helpers import code_block
from transformer_jax.model import attention
from transformer_jax.model.layers import CACHE_COLLECTIONS, EncoderLayer, MultiHeadAttention


def toy_task(seed=0, batch=16, length=6, vocab=8):
  """Label each position with the number of tokens in its sequence equal to it (needs attention)."""
  x = np.random.default_rng(seed).integers(1, vocab, (batch, length))
  counts = (x[:, :, None] == x[:, None, :]).sum(-1)
  return jnp.asarray(x), jnp.asarray(np.minimum(counts, 3))


class CountingClassifier(nn.Module):
  """A user's own model: embedding, one of our encoder layers, our attention pooling, a head."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(8, 32)(tokens)
    mask = attention.padding_mask(tokens, tokens)
    x = EncoderLayer(num_heads=4, d_k=8, d_v=8, d_ff=64, dropout_rate=0.0)(x, mask)
    x = x + MultiHeadAttention(num_heads=2, d_k=16, d_v=16)(x, x, mask)
    return nn.Dense(4)(x)


def cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@pytest.mark.slow
def test_layers_train_inside_a_user_linen_model():
  tokens, labels = toy_task()
  model = CountingClassifier()
  params = model.init(jax.random.key(0), tokens)["params"]
  tx = optax.adam(3e-3)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(
      lambda p: cross_entropy(model.apply({"params": p}, tokens), labels)
    )(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  losses = []
  for _ in range(40):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  assert losses[-1] < 0.5 * losses[0]


class NnxClassifier(nnx.Module):
  """An NNX model that holds our Linen layers through the bridge."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(8, 32, rngs=rngs)
    self.encoder = nnx.bridge.ToNNX(
      EncoderLayer(num_heads=4, d_k=8, d_v=8, d_ff=64, dropout_rate=0.0), rngs=rngs
    )
    self.pool = nnx.bridge.ToNNX(MultiHeadAttention(num_heads=2, d_k=16, d_v=16), rngs=rngs)
    self.head = nnx.Linear(32, 4, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    x = self.encoder(x)
    x = x + self.pool(x, x)
    return self.head(x)


def train_nnx_model(tokens, labels):
  model = NnxClassifier(nnx.Rngs(0))
  nnx.bridge.lazy_init(model, tokens)
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(tokens), labels))(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(40)]
  return model, losses


def test_layers_train_inside_an_nnx_model_through_the_bridge():
  tokens, labels = toy_task(seed=1)
  # NNX shards annotated variables eagerly; without a mesh, switch that off.
  with nnx.use_eager_sharding(False):
    _, losses = train_nnx_model(tokens, labels)
  assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow
def test_nnx_bridge_shards_the_layers_by_their_logical_axis_names():
  tokens, labels = toy_task(seed=2)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("tensor",))
  rules = (
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("batch", None),
    ("length", None),
    ("embed", None),
    ("kv", None),
    ("vocab", None),
  )
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    model, losses = train_nnx_model(tokens, labels)
  assert losses[-1] < 0.5 * losses[0]
  wi = model.encoder.feed_forward["wi"][...]  # [embed 32, mlp 64]
  query = model.encoder.self_attention["query"][...]  # [embed 32, heads 4, kv 8]
  assert wi.sharding.shard_shape(wi.shape) == (32, 32)
  assert query.sharding.shard_shape(query.shape) == (32, 2, 8)


def test_the_library_docs_decoding_example_keeps_each_kind_of_entry_in_its_collection():
  """docs/library.md's block: rows per hypothesis in "cache", one copy per sentence in
  "sentence_cache", and the cached steps equal the layer run over the whole prefix."""
  scope = {}
  exec(code_block("docs/library.md", "### Decoding with the layers\n"), scope)
  cache, shape = scope["cache"], lambda tree: jax.tree.map(jnp.shape, tree)
  assert set(cache) == set(CACHE_COLLECTIONS)
  assert shape(cache["cache"]) == {
    "self_attention": {"cached_key": (6, 4, 10, 16), "cached_value": (6, 4, 10, 16)}
  }
  assert shape(cache["sentence_cache"]) == {
    "cross_attention": {"static_key": (2, 4, 7, 16), "static_value": (2, 4, 7, 16)},
    "self_attention": {"cache_index": ()},
  }
  assert int(cache["sentence_cache"]["self_attention"]["cache_index"]) == 3
  layer, params, x, encoded = (scope[name] for name in ("layer", "params", "x", "encoded"))
  full = layer.apply({"params": params}, x[:, :3], jnp.repeat(encoded, 3, axis=0))
  np.testing.assert_allclose(scope["out"][:, 0], full[:, 2], atol=1e-5)
