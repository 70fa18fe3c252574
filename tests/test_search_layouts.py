"""Greedy and beam search in other layouts: a batch sharded over 8 devices, scanned layers,
64-bit JAX. The reference is the same search on one device, looped layers, 32 bits."""

import dataclasses
import re

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from helpers import SOURCES_16, stack_layers
from helpers import eos_biased_model as tiny_model
from transformer_jax.decode import transformer_search as search_lib
from transformer_jax.model.transformer import Transformer


@pytest.mark.slow
@pytest.mark.parametrize("with_rules", [False, True])
def test_batch_sharded_over_eight_devices_equals_one_device(with_rules):
  assert jax.device_count() == 8
  model, variables = tiny_model(eos_bias=2.0, seed=3, vocab=16)
  inputs = np.concatenate([SOURCES_16, SOURCES_16[::-1, ::-1]])  # 8 sentences
  kwargs = dict(max_len=16, max_extra=6)

  one = jax.devices()[0]
  local_vars, local_inputs = jax.device_put((variables, inputs), one)
  expected = [
    search_lib.greedy_search(model, local_vars, local_inputs, **kwargs),
    search_lib.beam_search(model, local_vars, local_inputs, **kwargs),
  ]

  mesh = Mesh(np.array(jax.devices()), ("data",))
  by_sentence = NamedSharding(mesh, P("data"))
  sharded = jax.device_put(inputs, by_sentence)
  replicated = jax.device_put(variables, NamedSharding(mesh, P()))
  rules = [("batch", "data")] if with_rules else []
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    got = [
      search_lib.greedy_search(model, replicated, sharded, **kwargs),
      search_lib.beam_search(model, replicated, sharded, **kwargs),
    ]
  for g, e in zip(got, expected):
    np.testing.assert_array_equal(g.tokens, e.tokens)
    np.testing.assert_allclose(g.scores, e.scores, atol=1e-5)
    assert g.tokens.sharding.is_equivalent_to(by_sentence, 2)


def test_sharded_beam_search_keeps_every_sentence_on_its_device():
  """The only collective is the loop condition's all-reduce ("is every sentence done?")."""
  model, variables = tiny_model(vocab=16)
  mesh = Mesh(np.array(jax.devices()), ("data",))
  inputs = jax.device_put(np.tile(SOURCES_16, (2, 1)), NamedSharding(mesh, P("data")))
  variables = jax.device_put(variables, NamedSharding(mesh, P()))
  hlo = (
    search_lib.beam_search.lower(model, variables, inputs, max_len=16, max_extra=6)
    .compile()
    .as_text()
  )
  collectives = re.findall(
    r"\b(all-gather|all-to-all|collective-permute|reduce-scatter|all-reduce)"
    r"(?:-start)?\(",
    hlo,
  )
  assert collectives == ["all-reduce"]


def test_beam_search_over_scanned_layers_equals_looped_layers():
  model, variables = tiny_model(eos_bias=2.0, seed=3, vocab=16)
  scanned = Transformer(dataclasses.replace(model.config, scan_layers=True))
  params = stack_layers(nn.meta.unbox(variables["params"]))
  want = search_lib.beam_search(model, variables, SOURCES_16, beam_size=4, max_len=24, max_extra=12)
  got = search_lib.beam_search(
    scanned, {"params": params}, SOURCES_16, beam_size=4, max_len=24, max_extra=12
  )
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)


@pytest.mark.slow
def test_searches_work_with_64_bit_jax():
  model, variables = tiny_model(eos_bias=2.0, seed=3, vocab=16)
  kwargs = dict(max_len=16, max_extra=6)
  want = [
    search_lib.greedy_search(model, variables, SOURCES_16, **kwargs),
    search_lib.beam_search(model, variables, SOURCES_16, **kwargs),
  ]
  with jax.enable_x64(True):
    got = [
      search_lib.greedy_search(model, variables, SOURCES_16, **kwargs),
      search_lib.beam_search(model, variables, SOURCES_16, **kwargs),
    ]
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g.tokens, w.tokens)
    np.testing.assert_allclose(g.scores, w.scores, rtol=1e-6)
