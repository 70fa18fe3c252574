"""The device report's time by XLA op: which lines of a trace count, and how they are summed."""

import types

import jax
import jax.numpy as jnp
import pytest

from tools.device_report import op_times, roofline
from transformer_jax.compile import targets


def _event(name, ms, **stats):
  return types.SimpleNamespace(name=name, duration_ns=ms * 1e6, stats=list(stats.items()))


def _plane(name, **lines):
  return types.SimpleNamespace(
    name=name, lines=[types.SimpleNamespace(name=k, events=v) for k, v in lines.items()]
  )


def test_a_device_planes_xla_ops_line_alone_counts_where_it_has_one():
  gpu = _plane(
    "/device:GPU:0",
    **{
      "XLA Ops": [_event("a", 3.0, hlo_op="fusion.1"), _event("b", 1.0, hlo_op="fusion.1")],
      "XLA Modules": [_event("jit_step", 4.0)],
      "Stream #7": [_event("kernel", 4.0)],
    },
  )
  host = _plane("/host:CPU", python=[_event("thunk", 9.0, hlo_op="host_op")])
  summary = op_times.summarize([host, gpu], steps=2)
  assert summary["sources"] == ["/device:GPU:0 XLA Ops"]
  assert summary["ops"] == [
    {"op": "fusion.1", "what": "", "seconds_per_step": pytest.approx(2e-3),
     "calls_per_step": 1.0, "share_of_busy": 1.0}
  ]  # fmt: skip
  assert summary["busy_seconds_per_step"] == pytest.approx(2e-3)


def test_a_gpus_streams_count_by_op_else_by_kernel_name_most_first():
  gpu = _plane(
    "/device:GPU:0",
    **{
      "Stream #7": [_event("loop_fusion", 1.0), _event("nvjet_gemm", 6.0, hlo_op="dot.3")],
      "Stream #9": [_event("loop_fusion", 1.0), _event("empty", 0.0)],
    },
  )
  summary = op_times.summarize([gpu], steps=1, top=1)
  assert summary["sources"] == ["/device:GPU:0 Stream #7", "/device:GPU:0 Stream #9"]
  assert summary["distinct_ops"] == 2 and summary["busy_seconds_per_step"] == pytest.approx(8e-3)
  assert [(op["op"], op["calls_per_step"]) for op in summary["ops"]] == [("dot.3", 1.0)]
  assert summary["ops"][0]["share_of_busy"] == pytest.approx(0.75)
  assert summary["device_event_stats"] == ["hlo_op"]


def test_without_a_device_plane_the_hosts_events_that_name_an_op_count():
  host = _plane(
    "/host:CPU",
    python=[_event("trace", 5.0)],
    worker=[_event("ynn_fusion", 2.0, hlo_op="ynn_fusion"), _event("wait", 1.0)],
  )
  summary = op_times.summarize([host, _plane("/host:metadata")], steps=1)
  assert summary["sources"] == ["/host:CPU worker"]
  assert [op["op"] for op in summary["ops"]] == ["ynn_fusion"]


def test_a_real_trace_on_the_cpu_names_the_programs_ops():
  matmul = jax.jit(lambda a, b: jnp.tanh(a @ b))
  x = jnp.ones((64, 64))
  matmul(x, x).block_until_ready()
  summary = op_times.summarize(op_times.trace(lambda: matmul(x, x), steps=3).planes, steps=3)
  assert summary["traced_steps"] == 3 and summary["busy_seconds_per_step"] > 0
  assert summary["ops"] and all(op["calls_per_step"] >= 1 for op in summary["ops"])


def test_each_instruction_of_the_hlo_text_says_what_it_is():
  text = (
    """HloModule step
fused_computation {
  p0 = bf16[8,16]{1,0} parameter(0)
  ROOT tanh.2 = bf16[8,16]{1,0} tanh(p0)
}
ENTRY main {
  %arg = bf16[8,16]{1,0} parameter(0)
  fusion.7 = bf16[8,16]{1,0} fusion(%arg), kind=kLoop, calls=fused_computation
  custom-call.3 = (bf16[8,16]{1,0}, u8[0]{0}) custom-call(fusion.7), """
    + ('custom_call_target="__cudnn$fmhaSoftmax"')
    + """
  ROOT tuple = (bf16[8,16]{1,0}) tuple(fusion.7)
}
"""
  )
  described = op_times.describe(text)
  assert described["fusion.7"] == "fusion kLoop bf16[8,16]{1,0}"
  assert described["custom-call.3"] == "custom-call __cudnn$fmhaSoftmax (bf16[8,16]{1,0}, u8[0]{0})"
  assert described["tanh.2"] == "tanh bf16[8,16]{1,0}" and described["tuple"].startswith("tuple (")
  gpu = _plane("/device:GPU:0", **{"Stream #7": [_event("k", 1.0, hlo_op="fusion.7")]})
  ops = op_times.summarize([gpu], 1, described=described)["ops"]
  assert ops[0]["what"] == described["fusion.7"]


# The kernels of a program as `roofline.by_name` gives them, and an op of the profile.
def _kernel(category, floor_ms, source="model/loss.py:36 (cross_entropy)", launches=1):
  return {
    "category": category,
    "launches": launches,
    "bytes": 1000,
    "flops": 0.0,
    "floor_seconds": floor_ms * 1e-3,
    "source": source,
  }


def _op(name, ms, what=""):
  return {"op": name, "what": what, "seconds_per_step": ms * 1e-3, "calls_per_step": 1.0}


def test_each_op_is_set_beside_its_kernels_floor_and_grouped_by_kind_and_source():
  kernels = {
    "gemm.1": _kernel("gemm", 1.0, "model/functional.py:182 (logits)"),
    "loop_fusion.2": _kernel("fusion", 0.5),
    "input_fusion.3": _kernel("fusion", 0.25, ""),
  }
  ops = [
    _op("loop_fusion.2", 2.0, "fusion kLoop bf16[26624,37000]{1,0}"),
    _op("gemm.1", 3.0, "custom-call __cublas$lt$matmul (bf16[8,16]{1,0}, s8[64]{0})"),
    _op("input_fusion.3", 1.0, "fusion kInput f32[26624]{0}"),
    _op("sm90_xmma_gemm_kernel", 4.0),  # An event the runtime named by its kernel alone.
  ]
  found = roofline.attribute(ops, busy=10e-3, kernels=kernels)
  assert [op["op"] for op in found["ops"]] == [
    "sm90_xmma_gemm_kernel",
    "gemm.1",
    "loop_fusion.2",
    "input_fusion.3",
  ]
  unmatched, gemm = found["ops"][:2]
  assert unmatched["predicted"] is None and unmatched["over_floor"] is None
  assert unmatched["group"] == roofline.UNMATCHED
  assert gemm["group"] == "gemm __cublas$lt$matmul" and gemm["over_floor"] == pytest.approx(3.0)
  assert gemm["predicted"]["source"] == "model/functional.py:182 (logits)"
  groups = {g["group"]: g for g in found["groups"]}
  assert list(groups) == [roofline.UNMATCHED, "gemm __cublas$lt$matmul", "fusion kLoop",
                          "fusion kInput"]  # fmt: skip
  assert groups["fusion kLoop"]["over_floor"] == pytest.approx(4.0)
  assert groups["fusion kLoop"]["share_of_busy"] == pytest.approx(0.2)
  assert groups[roofline.UNMATCHED]["predicted_floor_seconds"] is None
  assert sum(g["seconds_per_step"] for g in found["groups"]) == pytest.approx(10e-3)
  sources = {s["source"]: s for s in found["by_source"]}
  assert sources["model/loss.py:36 (cross_entropy)"]["ops"] == 1
  assert sources[roofline.NO_SOURCE]["seconds_per_step"] == pytest.approx(1e-3)
  assert found["matched_share"] == pytest.approx(0.6)


def test_the_op_list_keeps_the_costliest_and_the_groups_count_them_all(monkeypatch):
  monkeypatch.setattr(roofline, "TOP_OPS", 2)
  kernels = {f"f.{i}": _kernel("fusion", 1.0) for i in range(5)}
  ops = [_op(f"f.{i}", float(i + 1), "fusion kLoop f32[8]{0}") for i in range(5)]
  found = roofline.attribute(ops, busy=15e-3, kernels=kernels)
  assert [op["op"] for op in found["ops"]] == ["f.4", "f.3"]
  assert found["groups"] == [
    {"group": "fusion kLoop", "ops": 5, "seconds_per_step": pytest.approx(15e-3),
     "share_of_busy": pytest.approx(1.0), "predicted_floor_seconds": pytest.approx(5e-3),
     "over_floor": pytest.approx(3.0)}
  ]  # fmt: skip


@pytest.mark.parametrize(
  "measured, floor, ratio",
  [(0.06, 0.03, 2.0), (None, 0.03, None), (0.06, None, None), (0.06, 0.0, None)],
)
def test_measured_over_floor(measured, floor, ratio):
  assert roofline.over(measured, floor) == (pytest.approx(ratio) if ratio else None)


MODULE = r"""HloModule jit_step

%fused_add (p0: f32[1024,256], p1: f32[1024,256]) -> f32[1024,256] {
  %p0 = f32[1024,256]{1,0} parameter(0)
  %p1 = f32[1024,256]{1,0} parameter(1)
  ROOT %add.1 = f32[1024,256]{1,0} add(%p0, %p1)
}

%body (state: f32[1024,256]) -> f32[1024,256] {
  %state = f32[1024,256]{1,0} parameter(0)
  ROOT %twice = f32[1024,256]{1,0} fusion(%state, %state), kind=kLoop, calls=%fused_add
}

%condition (state.1: f32[1024,256]) -> pred[] {
  %state.1 = f32[1024,256]{1,0} parameter(0)
  ROOT %false = pred[] constant(false)
}

ENTRY %main (x: f32[1024,256], a: bf16[64,32], b: bf16[32,128]) -> (f32[1024,256], bf16[64,128]) {
  %x = f32[1024,256]{1,0} parameter(0)
  %a = bf16[64,32]{1,0} parameter(1)
  %b = bf16[32,128]{1,0} parameter(2)
  %gemm = (bf16[64,128]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %product = bf16[64,128]{1,0} get-tuple-element(%gemm), index=0
  %loop = f32[1024,256]{1,0} while(%x), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"12"}}
  %again = f32[1024,256]{1,0} while(%loop), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %result = (f32[1024,256]{1,0}, bf16[64,128]{1,0}) tuple(%again, %product)
}
"""  # noqa: E501 (XLA writes an instruction on one line)


def test_the_program_read_for_its_floor_names_its_chip_and_sums_a_body_two_loops_run():
  chip = targets.CHIPS["h100"]
  record, named = roofline.program_kernels(MODULE, chip, "this device's", "the executable")
  assert record["program"] == "the executable" and record["chip"] == chip.name
  assert record["chip_basis"] == "this device's" and "not a measurement" in record["basis"]
  assert record["kernels"] == 1 + 12 + 3 and record["gemms"] == 1
  twice_bytes = 2 * 1024 * 256 * 4  # Its operand once (named twice) and its output.
  assert named["twice"]["launches"] == 15 and named["twice"]["bytes"] == 15 * twice_bytes
  assert named["twice"]["floor_seconds"] == pytest.approx(15 * twice_bytes / chip.memory_bandwidth)
  assert named["gemm"]["flops"] == 2 * 64 * 128 * 32 and named["gemm"]["category"] == "gemm"
  assert record["floor_seconds"] == pytest.approx(sum(k["floor_seconds"] for k in named.values()))
