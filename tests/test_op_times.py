"""The device report's time by XLA op: which lines of a trace count, and how they are summed."""

import types

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.tools.device_report import op_times


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
