"""The kernel reader of GPU programs (compile/hlo.py, kernels.py, thunks.py): bytes, FLOPs, loop
trips, 1x1x1 grids and sources of a hand-written HLO module against counts made by hand, then
programs compiled for an H100 by the jax CUDA plugin on this CPU (skipped without the `cuda`
extra)."""

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.compile import analysis, hlo, kernels, programs, table, targets, thunks

ON_CPU = jax.default_backend() == "cpu"
needs_cuda = pytest.mark.skipif(
  not any(targets.installed(m) for m in targets.CUDA_PLUGINS) or not ON_CPU,
  reason="needs the cuda extra (jax CUDA plugin) and the CPU backend",
)

# A module as XLA's GPU compiler prints it, cut down: a fusion, a GEMM custom call, a Triton GEMM
# fusion with a batch dimension, cuDNN's attention, a copy, a scalar fusion, a while loop of 12
# known trips and one of unknown trips, and instructions that launch nothing.
MODULE = r"""HloModule jit_step, is_scheduled=true

FileNames
1 "/home/me/transformer_jax/model/layers.py"
2 "/venv/lib/python3.12/site-packages/optax/_src/transform.py"
3 "/home/me/transformer_jax/train/step.py"

FunctionNames
1 "project"
2 "update_fn"
3 "train_step"

FileLocations
1 {file_name_id=1 function_name_id=1 line=40 end_line=40 column=1 end_column=9}
2 {file_name_id=2 function_name_id=2 line=300 end_line=300 column=1 end_column=9}
3 {file_name_id=3 function_name_id=3 line=98 end_line=98 column=1 end_column=9}

StackFrames
1 {file_location_id=3 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=1 parent_frame_id=2}

%fused_add (p0: f32[1024,256], p1: f32[1024,256]) -> f32[1024,256] {
  %p0 = f32[1024,256]{1,0} parameter(0)
  %p1 = f32[1024,256]{1,0} parameter(1)
  ROOT %add.1 = f32[1024,256]{1,0} add(%p0, %p1)
}

%gemm_computation (p0.1: bf16[4,64,32], p1.1: bf16[4,32,128]) -> bf16[4,64,128] {
  %p0.1 = bf16[4,64,32]{2,1,0} parameter(0)
  %p1.1 = bf16[4,32,128]{2,1,0} parameter(1)
  ROOT %dot.1 = bf16[4,64,128]{2,1,0} dot(%p0.1, %p1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%fused_sum (p0.2: f32[1024,256]) -> f32[] {
  %p0.2 = f32[1024,256]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %reduce.1 = f32[] reduce(%p0.2, %zero), dimensions={0,1}, to_apply=%add_scalars
}

%add_scalars (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

%fused_increment (p0.3: s32[]) -> s32[] {
  %p0.3 = s32[] parameter(0)
  %one = s32[] constant(1)
  ROOT %add.3 = s32[] add(%p0.3, %one)
}

%body (state: (s32[], f32[1024,256])) -> (s32[], f32[1024,256]) {
  %state = (s32[], f32[1024,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[1024,256]{1,0} get-tuple-element(%state), index=1
  %next = s32[] fusion(%i), kind=kLoop, calls=%fused_increment
  %twice = f32[1024,256]{1,0} fusion(%x, %x), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/while/body/add" stack_frame_id=3}
  ROOT %out = (s32[], f32[1024,256]{1,0}) tuple(%next, %twice)
}

%condition (state.1: (s32[], f32[1024,256])) -> pred[] {
  %state.1 = (s32[], f32[1024,256]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%state.1), index=0
  ROOT %less = pred[] fusion(%i.1), kind=kLoop, calls=%fused_less
}

%fused_less (p0.4: s32[]) -> pred[] {
  %p0.4 = s32[] parameter(0)
  %twelve = s32[] constant(12)
  ROOT %lt = pred[] compare(%p0.4, %twelve), direction=LT
}

ENTRY %main (x: f32[1024,256], y: f32[1024,256], a: bf16[64,32], b: bf16[32,128], q: bf16[2,16,4,8], k: bf16[2,16,4,8], v: bf16[2,16,4,8]) -> (f32[1024,256], bf16[64,128], f32[]) {
  %x = f32[1024,256]{1,0} parameter(0)
  %y = f32[1024,256]{1,0} parameter(1)
  %a = bf16[64,32]{1,0} parameter(2)
  %b = bf16[32,128]{1,0} parameter(3)
  %q = bf16[2,16,4,8]{3,2,1,0} parameter(4)
  %k = bf16[2,16,4,8]{3,2,1,0} parameter(5)
  %v = bf16[2,16,4,8]{3,2,1,0} parameter(6)
  %sum = f32[1024,256]{1,0} fusion(%x, %y), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/add" source_file="/home/me/transformer_jax/model/layers.py" source_line=12}
  %gemm = (bf16[64,128]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/dot_general" stack_frame_id=3}, backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}
  %product = bf16[64,128]{1,0} get-tuple-element(%gemm), index=0
  %a4 = bf16[4,64,32]{2,1,0} bitcast(%a)
  %b4 = bf16[4,32,128]{2,1,0} bitcast(%b)
  %batched = bf16[4,64,128]{2,1,0} fusion(%a4, %b4), kind=kCustom, calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %attention = (bf16[2,4,16,8]{3,1,2,0}, f32[2,4,16]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["2","4","16","16"]}}}
  %total = f32[] fusion(%sum), kind=kInput, calls=%fused_sum, metadata={op_name="jit(step)/reduce_sum" stack_frame_id=2}
  %zero.1 = s32[] constant(0)
  %start = s32[] copy(%zero.1)
  %init = (s32[], f32[1024,256]{1,0}) tuple(%start, %sum)
  %loop = (s32[], f32[1024,256]{1,0}) while(%init), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"12"},"known_init_step":{"init":"0","step":"1"}}
  %again = (s32[], f32[1024,256]{1,0}) while(%init), condition=%condition, body=%body
  %looped = f32[1024,256]{1,0} get-tuple-element(%loop), index=1
  ROOT %result = (f32[1024,256]{1,0}, bf16[64,128]{1,0}, f32[]) tuple(%looped, %product, %total)
}
"""  # noqa: E501 (XLA writes an instruction on one line)
MB = 1024 * 256 * 4  # one f32[1024,256]


def _by_name(found):
  return {k.name: k for k in found}


def test_shapes_are_counted_in_bytes_of_their_element_types():
  assert hlo.shape_bytes("f32[1024,256]{1,0}") == MB
  assert hlo.shape_bytes("(bf16[64,128]{1,0}, s8[4194304]{0})") == 64 * 128 * 2 + 4194304
  assert hlo.shape_bytes("pred[10]") == 10 and hlo.shape_bytes("s4[3]") == 2
  assert hlo.shape_bytes("f32[]") == 4 and hlo.shape_bytes("f32[<=8,2]") == 64
  assert hlo.shape_bytes("f8e4m3fn[16]") == 16 and hlo.shape_bytes("token[]") == 0


def test_the_kernels_of_a_hand_written_module_and_their_bytes_and_flops():
  found, loops = kernels.read_kernels(MODULE)
  names = [k.name for k in found]
  # The ENTRY's launches in order, then the known loop's body (12 trips), then the unknown one
  # (its body and its condition once each); nothing for parameters, get-tuple-element, bitcast,
  # tuple, constant or while.
  assert names == [
    "sum",
    "gemm",
    "batched",
    "attention",
    "total",
    "start",
    "next",
    "twice",
    "next",
    "twice",
    "less",
  ]
  assert loops == [{"instruction": "loop", "trips": 12}, {"instruction": "again", "trips": None}]
  k = _by_name(found)
  assert k["sum"].bytes == 3 * MB and k["sum"].flops == 0 and k["sum"].category == "fusion"
  # cuBLAS: operands and the product; the s8 workspace left out. 2·M·N·K.
  assert k["gemm"].bytes == (64 * 32 + 32 * 128 + 64 * 128) * 2
  assert k["gemm"].flops == 2 * 64 * 128 * 32 and k["gemm"].category == "gemm"
  # A Triton GEMM fusion, batch 4: 2·B·M·N·K from the dot in its computation.
  assert k["batched"].flops == 2 * 4 * 64 * 128 * 32 and k["batched"].category == "gemm"
  assert k["batched"].bytes == (4 * 64 * 32 + 4 * 32 * 128 + 4 * 64 * 128) * 2
  # cuDNN's forward attention: 4·|Q|·Lk; outputs and stats, the u8[0] workspace nothing.
  assert k["attention"].flops == 4 * (2 * 16 * 4 * 8) * 16 and k["attention"].category == "cudnn"
  assert k["attention"].bytes == 3 * (2 * 16 * 4 * 8 * 2) + 2 * 4 * 16 * 8 * 2 + 2 * 4 * 16 * 4
  assert k["total"].bytes == MB + 4 and k["start"].category == "copy" and k["start"].bytes == 8
  # The read x counts once, though the fusion names it twice.
  assert k["twice"].bytes == 2 * MB and k["twice"].where == "again"
  assert [x.launches for x in found if x.name == "twice"] == [12, 1]


def test_one_block_kernels_by_rule_and_by_the_thunk_sequence():
  found, _ = kernels.read_kernels(MODULE)
  # The rule: XLA's own fusions with every output at most 128 elements (scalars here).
  assert {k.name for k in found if k.one_block} == {"total", "next", "less"}
  sequence = (
    "001: kCustomKernel [source | next=002 (1)] sum grid: [256, 1, 1] threads: [1024, 1, 1]\n"
    "002: kCustomKernel [prev=001 (1) | sink] fused_sum grid: [1, 1, 1] threads: [32, 1, 1]\n"
    "003: kCustomKernel [source | sink] batched grid: [1, 1, 1] threads: [64, 1, 1]\n"
    "004: kCopy         [source | sink] kCopy\n"
  )
  metadata = "".join(
    f'thunk_metadata {{\n  thunk_info {{\n    profile_annotation: "{name}"\n'
    f"    thunk_id: {i}\n  }}\n}}\n"
    for i, name in enumerate(["sum", "total", "batched", "start"], 1)
  )
  grids = thunks.launch_grids(sequence, metadata)
  assert grids == {"sum": (256, 1, 1), "total": (1, 1, 1), "batched": (1, 1, 1)}
  found, _ = kernels.read_kernels(MODULE, thunks.Thunks(grids, thunks.host_launches(sequence)))
  assert {k.name for k in found if k.one_block} == {"total", "batched"}
  assert _by_name(found)["sum"].grid == (256, 1, 1) and _by_name(found)["start"].grid is None


# After the thunk passes: two command buffers (graphs) around a cuDNN call, a copy on its own,
# and a while loop (as XLA prints one: its condition and body beneath it) whose condition is a
# kernel and whose body holds a kernel and a third command buffer.
AFTER_PASSES = """000: kCommandBuffer [source | next=001 (1)]
    000: kCustomKernel [source | next=001 (1)] a grid: [1, 1, 1] threads: [1, 1, 1]
    001: kCustomKernel [prev=000 (1) | sink] b grid: [8, 1, 1] threads: [128, 1, 1]
001: kCuDnn [prev=000 (1) | next=002 (1)] fmha
002: kCommandBuffer [prev=001 (1) | next=003 (1)]
    000: kCustomKernel [source | sink] c grid: [4, 1, 1] threads: [64, 1, 1]
003: kCopy [prev=002 (1) | next=004 (1)] kCopy
004: kWhile [prev=003 (1) | sink]

condition:
    000: kCustomKernel [source | sink] less grid: [1, 1, 1] threads: [1, 1, 1]
body:
    000: kCustomKernel [source | next=001 (1)] d grid: [1, 1, 1] threads: [1, 1, 1]
    001: kCommandBuffer [prev=000 (1) | sink]
        000: kCustomKernel [source | sink] e grid: [2, 1, 1] threads: [32, 1, 1]
"""


def test_host_launches_count_each_command_buffer_once_and_each_thunk_outside_one():
  counts = thunks.host_launches(AFTER_PASSES)
  assert counts == {"launches": 7, "graphs": 3, "graph_commands": 4}
  assert thunks.launches_cell(counts) == "7 (3)" and thunks.launches_cell(None) == "-"
  assert thunks.host_launches("") == {"launches": 0, "graphs": 0, "graph_commands": 0}
  found, loops = kernels.read_kernels(MODULE)
  read = thunks.Thunks(grids={}, host_launches=counts)
  assert kernels.summary(found, loops, 1e12, 1e9, read)["host_launches"] == counts
  assert kernels.summary(found, loops, 1e12, 1e9)["host_launches"] is None


@pytest.mark.parametrize("passes_changed_it", [True, False])
def test_the_launches_are_read_after_the_thunk_passes_where_the_compiler_wrote_them(
  tmp_path, passes_changed_it
):
  before = (
    "001: kCustomKernel [source | next=002 (1)] a grid: [1, 1, 1] threads: [1, 1, 1]\n"
    "002: kCustomKernel [prev=001 (1) | sink] b grid: [8, 1, 1] threads: [128, 1, 1]\n"
  )
  metadata = (
    'thunk_metadata {\n  thunk_info {\n    profile_annotation: "a"\n    thunk_id: 1\n  }\n}\n'
  )
  (tmp_path / "module_0001.jit_step.thunk_sequence.txt").write_text(before)
  (tmp_path / "module_0001.jit_step.thunk_metadata.txt").write_text(metadata)
  if passes_changed_it:
    name = "module_0001.jit_step.thunk_sequence_after_thunk_passes.txt"
    (tmp_path / name).write_text(AFTER_PASSES)
  read = thunks.read_thunks(str(tmp_path))
  assert read.grids == {"a": (1, 1, 1)}
  expected = (7, 3, 4) if passes_changed_it else (2, 0, 0)
  assert tuple(read.host_launches.values()) == expected
  assert thunks.read_thunks(str(tmp_path / "nothing")) is None


def test_sources_come_from_the_metadata_or_the_stack_frames():
  k = _by_name(kernels.read_kernels(MODULE)[0])
  assert k["sum"].source == "transformer_jax/model/layers.py:12"
  # Frame 3 (layers.py:40) was called from frame 1 (step.py:98): its parent is written as 2.
  assert k["gemm"].source == "transformer_jax/model/layers.py:40 (project)"
  # An installed package's frame names the project's frame that called it.
  assert k["total"].source == (
    "optax/_src/transform.py:300 (update_fn) via transformer_jax/train/step.py:98 (train_step)"
  )
  assert k["batched"].source == "" and k["sum"].op_name == "jit(step)/add"


# XLA's joined Q/K/V GEMM and the fusions that copy its parts out, cut down: a slice of a
# third, a dynamic slice through a bitcast (its start an operand read whole), three slices of
# one operand in one fusion, and an operand read both by a slice and by an add.
SLICES = r"""HloModule jit_slices, is_scheduled=true

%third (p0: bf16[64,96]) -> bf16[64,32] {
  %p0 = bf16[64,96]{1,0} parameter(0)
  ROOT %s = bf16[64,32]{1,0} slice(%p0), slice={[0:64], [32:64]}
}

%row (p0.1: s32[], p1.1: bf16[64,96]) -> bf16[1,3,32] {
  %p1.1 = bf16[64,96]{1,0} parameter(1)
  %p0.1 = s32[] parameter(0)
  %b = bf16[64,3,32]{2,1,0} bitcast(%p1.1)
  %zero = s32[] constant(0)
  ROOT %d = bf16[1,3,32]{2,1,0} dynamic-slice(%b, %p0.1, %zero, %zero), dynamic_slice_sizes={1,3,32}
}

%split (p0.2: bf16[64,96]) -> (bf16[64,32], bf16[64,32], bf16[64,32]) {
  %p0.2 = bf16[64,96]{1,0} parameter(0)
  %q = bf16[64,32]{1,0} slice(%p0.2), slice={[0:64], [0:32]}
  %k = bf16[64,32]{1,0} slice(%p0.2), slice={[0:64], [32:64]}
  %v = bf16[64,32]{1,0} slice(%p0.2), slice={[0:64], [64:96]}
  ROOT %t = (bf16[64,32]{1,0}, bf16[64,32]{1,0}, bf16[64,32]{1,0}) tuple(%q, %k, %v)
}

%mixed (p0.3: bf16[64,96], p1.3: bf16[64,96]) -> bf16[64,96] {
  %p0.3 = bf16[64,96]{1,0} parameter(0)
  %p1.3 = bf16[64,96]{1,0} parameter(1)
  %left = bf16[64,32]{1,0} slice(%p0.3), slice={[0:64], [0:32]}
  %sum = bf16[64,96]{1,0} add(%p0.3, %p1.3)
  ROOT %out = bf16[64,96]{1,0} multiply(%sum, %sum)
}

ENTRY %main (qkv: bf16[64,96], i: s32[], other: bf16[64,96]) -> bf16[64,32] {
  %qkv = bf16[64,96]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %other = bf16[64,96]{1,0} parameter(2)
  %key = bf16[64,32]{1,0} fusion(%qkv), kind=kLoop, calls=%third
  %one = bf16[1,3,32]{2,1,0} fusion(%i, %qkv), kind=kLoop, calls=%row
  %parts = (bf16[64,32]{1,0}, bf16[64,32]{1,0}, bf16[64,32]{1,0}) fusion(%qkv), kind=kLoop, calls=%split
  %both = bf16[64,96]{1,0} fusion(%qkv, %other), kind=kLoop, calls=%mixed
  %twice = bf16[64,96]{1,0} fusion(%qkv, %qkv), kind=kLoop, calls=%mixed
  ROOT %copied = bf16[64,32]{1,0} copy(%key)
}
"""  # noqa: E501


def test_an_operand_read_only_through_slices_counts_the_sliced_bytes():
  k = _by_name(kernels.read_kernels(SLICES)[0])
  part, whole = 64 * 32 * 2, 64 * 96 * 2
  assert k["key"].bytes == part + part  # the third it reads, the third it writes
  assert k["one"].bytes == 4 + 96 * 2 + 96 * 2  # the start whole, one row through the bitcast
  assert k["parts"].bytes == 3 * part + 3 * part  # three thirds: the whole operand, once
  assert k["both"].bytes == whole + whole + whole  # the add reads all of it
  assert k["twice"].bytes == whole + whole  # one operand, sliced and added: whole, once
  assert k["copied"].bytes == 2 * part


def test_the_summary_adds_up_launches_and_takes_the_roofline_floor_per_kernel():
  found, loops = kernels.read_kernels(MODULE)
  peak, bandwidth = 1e12, 1e9  # FLOP/s, bytes/s: every kernel here is bound by its bytes
  s = kernels.summary(found, loops, peak, bandwidth)
  assert s["kernels"] == 5 + 1 + 2 * 12 + 3  # ENTRY, the copy, 12 trips, the unknown loop once
  assert s["one_block_kernels"] == 1 + 12 + 2 and s["gemms"] == 2 and s["cudnn_calls"] == 1
  assert s["bytes"] == sum(x.bytes * x.launches for x in found)
  # sum, total, the copy; next and twice 13 times; less once; then the GEMMs and attention.
  assert s["bytes"] == 3 * MB + (MB + 4) + 8 + 13 * (8 + 2 * MB) + 5 + sum(
    _by_name(found)[n].bytes for n in ("gemm", "batched", "attention")
  )
  assert s["flops"] == 2 * 64 * 128 * 32 * 5 + 4 * 1024 * 16
  assert s["floor_seconds"] == pytest.approx(s["bytes"] / bandwidth)
  assert s["largest_by_bytes"][0]["name"] == "twice" and s["largest_by_bytes"][0]["launches"] == 12
  assert s["largest_by_flops"][0]["name"] == "batched"
  assert "not a measurement" in s["basis"] and s["one_block_basis"].startswith("rule")


def _compile_for_h100(function, *shapes):
  device = targets.compile_devices(targets.parse_target("1xh100"))[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=sharding) for s in shapes]
  return analysis.compile_and_measure(jax.jit(function).lower(*args), chip=targets.CHIPS["h100"])


@needs_cuda
def test_a_matmul_compiled_for_an_h100_counts_2mnk_flops():
  m, k, n = 256, 512, 384
  cost = _compile_for_h100(lambda a, b: jnp.tanh(a @ b), (m, k), (k, n))
  s = cost.kernels
  assert s["flops"] == 2 * m * n * k and s["gemms"] >= 1 and s["kernels"] >= s["gemms"]
  assert s["one_block_basis"].startswith("the compiler's thunk sequence")
  # A GEMM and its tanh, two kernels: too few for a command buffer, each run on its own.
  assert s["host_launches"] == {"launches": 2, "graphs": 0, "graph_commands": 0}
  assert s["bytes"] >= (m * k + k * n + m * n) * 2  # at least the operands and the product
  assert s["floor_seconds"] >= s["bytes"] / targets.CHIPS["h100"].memory_bandwidth
  assert s["largest_by_flops"][0]["category"] == "gemm"
  assert "test_kernels.py" in s["largest_by_flops"][0]["source"]


@needs_cuda
def test_a_scanned_matmul_counts_once_per_trip():
  m, k = 128, 256

  def scanned(a, b):
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ b), None), a, None, length=5)[0]

  s = _compile_for_h100(scanned, (m, k), (k, k)).kernels
  assert [loop["trips"] for loop in s["loops"]] == [5]
  assert s["flops"] == 5 * 2 * m * k * k
  assert s["gemms"] % 5 == 0 and s["gemms"] >= 5


@pytest.mark.slow
@needs_cuda
def test_the_compile_report_of_a_gpu_target_has_the_kernels():
  from transformer_jax import config as config_lib

  config = config_lib.default_config()
  config.model = config_lib.model_fields(
    "base", num_layers=1, d_model=64, d_ff=128, num_heads=4, max_len=64, dtype="bfloat16"
  )
  config.data.vocab.size = 256
  config.data.batch.update(
    {"mode": "packed", "size": 8, "max_length": 32}
    | {"max_source_length": 32, "max_target_length": 32}
  )
  experiment = config_lib.parse(config)
  target = targets.parse_target("1xh100")
  record = programs.Compiler(experiment, target).train(8, 32).record(target)
  s = record["kernels"]
  assert s["kernels"] > s["one_block_kernels"] > 0 and s["gemms"] > 0
  assert s["cudnn_calls"] == record["cudnn_attention_calls"] > 0  # no loops: one launch each
  assert 0 < s["floor_seconds"] < 1e-3 and s["flops"] > 0
  report = {
    "target": {"platform": "gpu", "usable_bytes": target.chip.usable_bytes},
    "programs": [record],
  }
  assert "est. floor ms" in table.columns(report)
  cells = dict(zip(table.columns(report), table.rows(report)[0]))
  assert cells["kernels"] == f"{s['kernels']:,}" and cells["HBM GB"] == f"{s['bytes'] / 1e9:.1f}"


def test_the_report_table_shows_the_kernels_and_names_loops_of_unknown_trips():
  found, loops = kernels.read_kernels(MODULE)
  summary = kernels.summary(found, loops, 989e12, 3.35e12)
  chip = targets.CHIPS["h100"]
  program = {
    "name": "train 8x32",
    "kind": "train",
    "compile_seconds": 1.0,
    **dict.fromkeys(("argument_bytes", "temp_bytes", "code_bytes", "total_bytes"), 0),
    "refused": "",
    "fits": True,
    "flops": None,
    "model_flops_per_device": None,
    "compiler_estimate": None,
    "estimate_basis": "the compiler gives no cost estimate for this target",
    "kernels": summary,
  }
  record = {
    "target": {
      "name": "1xh100",
      "topology": "1x1x1",
      "chips": 1,
      "chip": chip.name,
      "hosts": 1,
      "platform": "gpu",
      "usable_bytes": chip.usable_bytes,
      "memory_bytes": chip.memory_bytes,
      "peak_flops": chip.peak_flops,
      "source": chip.source,
    },
    "parameters": {"count": 1, "state_bytes_total": 12, "state_bytes_per_device": 12},
    **{"mesh": {}, "sharding_rules": "dp", "attention": "cudnn", "data_shards": 1},
    **{"programs": [program], "compile_seconds": 1.0, "largest_batch": None},
  }
  text = table.format_report(record)
  assert "est. floor ms" in text and "estimates, not measurements" in text
  assert "train 8x32: 1 loop(s) of unknown trip count, each body counted once" in text
  cells = dict(zip(table.columns(record), table.rows(record)[0]))
  assert cells["kernels"] == "33" and cells["1x1x1 grid"] == "15"
  assert cells["est. floor ms"] == f"{summary['floor_seconds'] * 1e3:.1f}"


def test_the_done_half_of_an_asynchronous_collective_launches_nothing():
  module = """HloModule m, is_scheduled=true

ENTRY %main (x: f32[256]) -> f32[2048] {
  %x = f32[256]{0} parameter(0)
  %gather = (f32[256]{0}, f32[2048]{0}) all-gather-start(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, use_global_device_ids=true
  %gathered = f32[2048]{0} all-gather-done(%gather)
  %sum = (f32[2048]{0}, f32[2048]{0}) all-reduce-start(%gathered), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add_scalars
  ROOT %summed = f32[2048]{0} all-reduce-done(%sum)
}
"""  # noqa: E501
  found, _ = kernels.read_kernels(module)
  assert [(k.name, k.category) for k in found] == [("gather", "collective"), ("sum", "collective")]
