"""Compiling for TPU slices and H100s on the CPU: targets, memory against independent counts,
FLOPs against the CPU's compile, the fit check and the command line's report.

The compiles use XLA's own TPU compiler (libtpu) and the jax CUDA plugin with
cuDNN, the `tpu` and `cuda` extras that CI installs; without them these tests
are skipped. The paper's base model compiles with scanned layers; everything
else is a small model.
"""

import importlib.util
import json

import jax
import pytest

from helpers import REPO, python
from transformer_jax import config as config_lib
from transformer_jax.compile import analysis, programs, table, targets
from transformer_jax.errors import FieldError
from transformer_jax.model.config import TransformerConfig, count_params, train_flops

ON_CPU = jax.default_backend() == "cpu"  # Compiling for a target runs on the CPU backend.
needs_tpu = pytest.mark.skipif(
  not targets.installed("libtpu") or not ON_CPU,
  reason="needs the tpu extra (libtpu) and the CPU backend",
)
needs_cuda = pytest.mark.skipif(
  not any(targets.installed(m) for m in targets.CUDA_PLUGINS) or not ON_CPU,
  reason="needs the cuda extra (jax CUDA plugin) and the CPU backend",
)
STATE_BYTES_PER_PARAMETER = 12  # float32 parameters, Adam's two float32 moments.


@pytest.mark.parametrize(
  "name, topology, chips",
  [
    ("v5e-8", "v5e:2x4", 8),
    ("v5litepod-16", "v5e:4x4", 16),
    ("v5e-256", "v5e:16x16", 256),
    ("v6e-8", "v6e:2x4", 8),
    ("v4-8", "v4:2x2x1", 4),
    ("v4-32", "v4:2x2x4", 16),
    ("v5p-8", "v5p:2x2x1", 4),
    ("v5p-128", "v5p:4x4x4", 64),
    ("v5e:2x4", "v5e:2x4", 8),
    ("1xh100", "1x1x1", 1),
    ("8xh100", "1x1x8", 8),
    ("16xH100", "2x1x8", 16),
    ("8xa100", "1x1x8", 8),
  ],
)
def test_target_names_map_to_topologies(name, topology, chips):
  target = targets.parse_target(name)
  assert (target.topology, target.chips) == (topology, chips)


@pytest.mark.parametrize(
  "name, says",
  [
    ("v5e-3", "the slices: v5e-4, v5e-8"),
    ("v5p-6", "2 per chip"),
    ("9xh100", "1 to 8"),
    ("tpu", "is not a target"),
    ("", "is not a target"),
    ("v5e:2x2x1", "a v5e topology has 2 dimensions"),
    ("v4:2x2", "a v4 topology has 3"),
  ],
)
def test_unknown_targets_are_refused_with_the_names_known(name, says):
  with pytest.raises(targets.TargetError, match=says):
    targets.parse_target(name)


def test_a_missing_compiler_names_the_extra(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(targets.TargetError, match=r"pip install -e '\.\[tpu\]'"):
    targets.compile_devices(targets.parse_target("v5e-8"))
  with pytest.raises(targets.TargetError, match=r"pip install -e '\.\[cuda\]'"):
    targets.compile_devices(targets.parse_target("8xh100"))


@needs_tpu
@pytest.mark.parametrize(
  "name, devices, hosts, kind",
  [
    ("v5e-8", 8, 1, "TPU v5 lite"),
    ("v5e-16", 16, 4, "TPU v5 lite"),
    ("v4-8", 4, 1, "TPU v4"),
    ("v5p-128", 64, 16, "TPU v5"),
  ],
)
def test_tpu_targets_give_one_compile_only_device_per_chip(name, devices, hosts, kind):
  found = targets.compile_devices(targets.parse_target(name))
  assert len(found) == devices and targets.hosts(found) == hosts
  assert {d.platform for d in found} == {"tpu"} and found[0].device_kind == kind


def _paper_config(variant: str, rules: str, **data):
  """wmt14.py's `variant` on all 8 chips with `rules`, layers scanned (a fast compile)."""
  config = config_lib.load_file(f"{REPO}/experiments/wmt14.py:{variant}")
  config.model.scan_layers = True
  config.mesh = (
    {"data": -1, "fsdp": 1, "tensor": 1} if rules == "dp" else {"data": 1, "fsdp": -1, "tensor": 1}
  )
  config.sharding_rules = rules
  config.data.update(data)
  return config_lib.parse(config)


def _batch_bytes_per_device(rows: int, length: int, shards: int) -> int:
  return 6 * rows * length * 4 // shards  # Six int32 [rows, length] arrays.


@pytest.mark.slow
@needs_tpu
@pytest.mark.parametrize("rules", ["dp", "fsdp"])
def test_the_base_train_step_compiles_for_v5e_8_with_12_bytes_a_parameter(rules):
  config = _paper_config("base", rules)
  compiler = programs.Compiler(config, targets.parse_target("v5e-8"))
  program = compiler.train(8, 32)
  model = compiler.model_config
  parameters = count_params(model)
  state = program.cost.argument_bytes - _batch_bytes_per_device(8, 32, 8) - 12  # 3 counters
  if rules == "dp":  # Replicated: 12 bytes a parameter (and 0.04% of TPU layout padding).
    expected = STATE_BYTES_PER_PARAMETER * parameters
  else:
    # FSDP splits every weight along `embed` (512) over the 8 chips. The TPU lays float32 out in
    # 128-wide lanes, so the embedding table's 64-wide shards take twice their bytes; the
    # feed-forward biases (no `embed` axis, 0.02% of the parameters) stay whole.
    embedding = model.vocab_size * model.d_model
    expected = STATE_BYTES_PER_PARAMETER * (parameters + embedding) / 8
  assert state == pytest.approx(expected, rel=0.01)
  assert program.cost.alias_bytes >= 0.999 * state  # The donated state is updated in place.
  assert program.cost.temp_bytes > 0 and program.cost.flops > 0


@pytest.mark.slow
@needs_tpu
def test_the_beam_search_compiles_for_v5e_8():
  config = _paper_config("base", "dp")
  compiler = programs.Compiler(config, targets.parse_target("v5e-8"))
  settings = config.decode
  program = compiler.search(settings, 16, 32)
  assert (program.name, program.kind) == ("beam4 16x32", "beam")
  assert 0 < program.cost.total_bytes < targets.CHIPS["v5e"].usable_bytes
  seconds, why = program.cost.estimated_seconds(targets.CHIPS["v5e"].peak_flops, program.loop)
  assert seconds is None and "loop" in why


@pytest.mark.slow
@needs_cuda
def test_the_base_train_step_compiles_for_8_h100_with_cudnn_attention():
  config = _paper_config("base", "dp")
  compiler = programs.Compiler(config, targets.parse_target("8xh100"))
  assert compiler.model_config.attention_impl == "cudnn"  # What a bfloat16 run on a GPU takes.
  program = compiler.train(8, 32)
  assert program.cost.cudnn_attention_calls > 0
  state = program.cost.argument_bytes - _batch_bytes_per_device(8, 32, 8) - 12  # 3 counters
  assert state == STATE_BYTES_PER_PARAMETER * count_params(compiler.model_config)
  assert program.cost.optimal_seconds is None  # No cost analysis for a GPU without a device.


def _small_config(*, mesh=None, eval_every_steps=0, **batch):
  config = config_lib.default_config()
  config.model = config_lib.model_fields(
    "base", num_layers=1, d_model=64, d_ff=128, num_heads=4, max_len=64, dtype="bfloat16"
  )
  config.data.vocab.size = 256
  config.data.batch.update({"max_source_length": 32, "max_target_length": 32, **batch})
  config.mesh.update(mesh or {})
  config.eval_every_steps = eval_every_steps
  return config_lib.parse(config)


def _report_config():
  """The small model trained on 4 batch shapes and evaluated during training."""
  return _small_config(tokens=2048, eval_every_steps=100)


@pytest.fixture(scope="module")
def small_report():
  """The record of every program of `_report_config()` compiled for v5e-8."""
  if importlib.util.find_spec("libtpu") is None or not ON_CPU:
    pytest.skip("needs the tpu extra (libtpu) and the CPU backend")
  return programs.compile_experiment(
    _report_config(), targets.parse_target("v5e-8"), find_largest_batch=False
  ).record()


@pytest.mark.slow
@needs_tpu
def test_the_tpu_compile_counts_the_flops_of_the_cpu_compile(small_report):
  (tpu,) = [p["flops"] for p in small_report["programs"] if p["name"] == "train 64x32"]
  # The same step on the 8 simulated CPU devices.
  trainer, _ = programs.make_trainer(_report_config(), vocab_size=256)
  batch = trainer.placement.abstract_batch(64, 32)
  cpu = (
    trainer.placement.run(lambda: trainer.jitted_step.lower(trainer.abstract_state, batch))
    .compile()
    .cost_analysis()["flops"]
  )
  # Both are XLA's HLO cost analysis of the same step, per device, after each backend's own
  # rewrites (the TPU's fusions and layouts): the same matmuls, within 5%.
  assert cpu == pytest.approx(tpu, rel=0.05)
  model = (
    train_flops(
      trainer.placement.model.config,
      source_tokens=64 * 32,
      target_tokens=64 * 32,
      source_length=32,
      target_length=32,
    )
    / 8
  )
  # The model's count leaves out softmaxes, norms and the loss: a few percent less.
  assert 0.85 * tpu <= model <= tpu


@needs_tpu
def test_a_mesh_that_does_not_divide_the_chips_is_refused():
  config = _small_config(mesh={"data": 3, "tensor": 1})
  with pytest.raises(FieldError, match=r"^mesh=.*8 are present"):
    programs.compile_experiment(config, targets.parse_target("v5e-8"))


def test_the_estimate_adds_back_a_second_per_prefetch_and_respects_the_roofline():
  cost = analysis.ProgramCost(
    compile_seconds=1.0,
    argument_bytes=10,
    output_bytes=10,
    alias_bytes=10,
    temp_bytes=5,
    code_bytes=1,
    flops=2e12,
    bytes_accessed=1e9,
    optimal_seconds=-608.963,
    prefetch_calls=609,
    cudnn_attention_calls=0,
  )
  assert cost.total_bytes == 16
  seconds, _ = cost.estimated_seconds(197e12)
  assert seconds == pytest.approx(0.037)
  assert cost.estimated_seconds(197e12, loop="the layers")[0] is None
  below_roofline = analysis.ProgramCost(**{**cost.__dict__, "optimal_seconds": -608.999})
  assert below_roofline.estimated_seconds(197e12)[0] is None  # 1 ms < 2e12 / 197e12 = 10 ms
  assert (
    analysis.ProgramCost(**{**cost.__dict__, "optimal_seconds": None}).estimated_seconds(197e12)[0]
    is None
  )


@pytest.mark.slow
def test_the_report_has_every_program_and_the_documented_fields(small_report):
  record = small_report
  names = [p["name"] for p in record["programs"]]
  # Validation BLEU (greedy, config.eval_bleu_beam_size) only where training evaluates.
  assert names == [
    "train 256x8",
    "train 128x16",
    "train 80x24",
    "train 64x32",
    "eval 64x32",
    "beam4 128x32",
    "greedy 128x32",
  ]
  assert set(record) == {
    "target",
    "mesh",
    "sharding_rules",
    "attention",
    "parameters",
    "data_shards",
    "programs",
    "compile_seconds",
    "fits",
    "largest_batch",
  }
  assert record["target"]["hosts"] == record["data_shards"] == 1  # v5e-8: one host of 8 chips
  documented = {
    "name",
    "kind",
    "rows",
    "length",
    "compile_seconds",
    "argument_bytes",
    "output_bytes",
    "alias_bytes",
    "temp_bytes",
    "code_bytes",
    "total_bytes",
    "fits",
    "flops",
    "bytes_accessed",
    "optimal_seconds",
    "prefetch_calls",
    "cudnn_attention_calls",
    "refused",
    "kernels",
    "model_flops_per_device",
    "compiler_estimate",
    "estimate_basis",
    "note",
  }
  for program in record["programs"]:
    assert set(program) == documented
    assert program["kernels"] is None  # Read for GPU programs only (tests/test_kernels.py).
  train = record["programs"][0]
  assert train["fits"] and train["compiler_estimate"]["step_seconds"] > 0
  assert 0 < train["compiler_estimate"]["mfu"] < 1
  text = table.format_report(record)
  assert "train 256x8" in text and "compiled 7 programs" in text
  assert table.does_not_fit(record) is None
  json.dumps(record)


# The default experiment with 4M-token batches of 8 and 32 tokens, and one layer of d_model 16
# with a vocabulary of 3.7M words: its logits (15 MB a token) make about 1024 rows of 8 the
# largest batch that fits on a v5e, so that the search compiles only small programs.
_TOO_LARGE = {
  "data.vocab.size": 3_700_000,
  "data.batch.tokens": 4194304,
  "data.batch.max_source_length": 32,
  "data.batch.max_target_length": 32,
  "data.batch.bucket_growth": 4,
  "model.dtype": "bfloat16",
  "model.num_layers": 1,
  "model.d_model": 16,
  "model.d_ff": 32,
}


@pytest.mark.slow
@needs_tpu
def test_a_batch_that_cannot_fit_ends_the_command_naming_the_largest_batch_that_does(tmp_path):
  """The command compiles every program, finds the train step too large, then searches the
  largest batch that fits by compiling: within 1/16, so a batch 1/8 larger does not fit."""
  result = python(
    "-m",
    "transformer_jax.main",
    "--mode=compile",
    "--target=v5e-8",
    f"--config={REPO}/experiments/default.py",
    f"--workdir={tmp_path}",
    *(f"--config.{field}={value}" for field, value in _TOO_LARGE.items()),
    timeout=900,
  )
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: train ") and "GiB per device" in last
  record = json.loads((tmp_path / "compile" / "v5e-8.json").read_text())
  assert [p["name"] for p in record["programs"] if p["kind"] == "train"] == [
    "train 524288x8",
    "train 131072x32",
  ]
  largest = record["largest_batch"]
  assert not record["fits"] and largest["field"] == "data.batch.tokens"
  assert 0 < largest["value"] < 4194304 and largest["program"]["fits"]
  assert largest["program"]["total_bytes"] <= targets.CHIPS["v5e"].usable_bytes
  assert last.endswith(f"the largest data.batch.tokens that fits is {largest['value']}")
  config = config_lib.load_file(f"{REPO}/experiments/default.py")
  config.update_from_flattened_dict(_TOO_LARGE)
  compiler = programs.Compiler(config_lib.parse(config), targets.parse_target("v5e-8"))
  rows = largest["rows"]
  bigger = compiler.train(rows + max(8, rows // 8 // 8 * 8), largest["length"])
  assert not bigger.cost.fits(targets.CHIPS["v5e"].usable_bytes)


def test_compile_runs_alone_and_needs_a_target():
  from absl import flags  # pylint: disable=import-outside-toplevel

  from transformer_jax import main  # pylint: disable=import-outside-toplevel
  from transformer_jax.cli import modes  # pylint: disable=import-outside-toplevel

  with pytest.raises(flags.ValidationError, match="runs alone"):
    main._known_modes(["train", "compile"])
  with pytest.raises(modes.UserError, match="needs --target"):
    modes.compile_for_target(None, "/tmp/unused", "", False)


def test_a_chunked_output_layer_is_a_loop_whose_body_the_cost_analysis_counts_once():
  chunked = TransformerConfig(loss_chunk=64)
  layers = ("the layers (model.scan_layers)", "")
  assert programs.program_loops(chunked, layers, 256) == (
    "the layers (model.scan_layers) and the output layer's chunks (model.loss_chunk)"
  )
  assert programs.program_loops(chunked, ("",), 64) == ""  # One chunk: no loop.
  assert programs.program_loops(TransformerConfig(), ("",), 256) == ""
