"""The embedding and positional encodings against the paper's formulas (numpy float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_reference as ref
from helpers import init_module as init
from helpers import randn
from transformer_jax.model import embedding, functional

pytestmark = pytest.mark.device


def test_sinusoidal_table_is_the_papers_formula():
  d_model = 16
  table = functional.sinusoidal_table(100, d_model)
  for pos in (0, 1, 7, 99):
    for j in range(d_model):
      assert table[pos, j] == pytest.approx(ref.sinusoid(pos, j, d_model), abs=1e-6)


def test_positional_encoding_adds_table_rows_at_given_positions():
  x = randn(1, 2, 4, 8)
  positions = np.array([[0, 1, 0, 1], [3, 2, 1, 0]])
  pe = embedding.PositionalEncoding(max_len=10)
  variables, _ = init(pe, x)
  assert "params" not in variables  # The sinusoid has nothing to learn.
  got = pe.apply(variables, x, positions)
  want = x + np.array(
    [[[ref.sinusoid(p, j, 8) for j in range(8)] for p in row] for row in positions]
  )
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_learned_positions_are_a_trained_table():
  x = randn(2, 2, 3, 8)
  pe = embedding.PositionalEncoding(max_len=5, kind="learned")
  _, params = init(pe, x)
  assert params["table"].shape == (5, 8)
  np.testing.assert_allclose(
    pe.apply({"params": params}, x), x + params["table"][None, :3], atol=1e-6
  )


def test_positions_beyond_max_len_raise():
  pe = embedding.PositionalEncoding(max_len=3)
  with pytest.raises(ValueError, match="max_len=3"):
    pe.init(jax.random.key(0), jnp.zeros((1, 4, 8)))


def test_embedding_is_shared_and_scaled():
  embed = embedding.Embed(vocab_size=11, d_model=8)
  ids = np.array([[1, 5, 0], [10, 2, 2]])
  variables, params = init(embed, ids)
  assert list(params) == ["embedding"]
  table = np.asarray(params["embedding"], np.float64)
  np.testing.assert_allclose(embed.apply(variables, ids), table[ids] * np.sqrt(8), rtol=1e-6)
  x = randn(3, 2, 3, 8)
  logits = embed.apply(variables, x, method=embed.attend)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, x @ table.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_a_padded_vocabulary_gives_the_same_logits_and_gradients_in_float64(bias):
  """The output matmul over a table padded to 16 rows (11 -> 16) gives the unpadded logits and
  gradients (to float64 rounding); the parameters keep the real vocabulary; the matmul sees the
  padded one."""
  ids = np.array([[1, 5, 0], [10, 2, 2]])
  with jax.enable_x64(True):
    plain = embedding.Embed(vocab_size=11, d_model=8, logits_bias=bias, dtype=jnp.float64)
    padded = embedding.Embed(
      vocab_size=11, d_model=8, logits_bias=bias, dtype=jnp.float64, vocab_multiple=16
    )
    variables, params = init(plain, ids)
    assert jax.tree.map(jnp.shape, init(padded, ids)[1]) == jax.tree.map(jnp.shape, params)
    params = jax.tree.map(lambda p: p + 0.5 if p.ndim == 1 else p, params)  # A nonzero bias.
    x = jnp.asarray(randn(4, 2, 3, 8), jnp.float64)

    def attend(module, p):
      return module.apply({"params": p}, x, method=module.attend)

    def loss(module, p):
      return jnp.sum(jnp.sin(attend(module, p)))

    assert attend(padded, params).shape == (2, 3, 11)
    np.testing.assert_allclose(attend(padded, params), attend(plain, params), rtol=1e-13)
    for g, w in zip(
      jax.tree.leaves(jax.grad(lambda p: loss(padded, p))(params)),
      jax.tree.leaves(jax.grad(lambda p: loss(plain, p))(params)),
    ):
      np.testing.assert_allclose(g, w, rtol=1e-13)
    jaxpr = jax.make_jaxpr(lambda p: attend(padded, p))(params)
  dot = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general")
  assert dot.outvars[0].aval.shape == (2, 3, 16)
