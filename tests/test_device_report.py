"""The device report: its CPU dry run through every stage, a step that fails or runs out of time
leaving the others, the largest-batch step, and the plan handed to each step's process."""

import dataclasses
import json
import math
import pathlib
import time

import pytest

import helpers
from transformer_jax.tools.device_report import (
  correctness,
  largest,
  markdown,
  op_times,
  speed,
  stage,
)
from transformer_jax.tools.device_report import plan as plan_lib
from transformer_jax.tools.device_report.runner import Runner

STAGE_FILES = [f"{s}.json" for s in plan_lib.STAGES]


def _steps(out: pathlib.Path, stage_name: str) -> dict:
  return json.loads((out / f"{stage_name}.json").read_text())["steps"]


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_stage_and_reports_them(tmp_path):
  out = tmp_path / "out"
  run = helpers.python(
    "-m",
    "transformer_jax.tools.device_report",
    f"--out={out}",
    "--platform=cpu",
    "--tiny",
    timeout=600,
  )
  assert run.returncode == 0, run.stderr
  files = sorted(p.name for p in out.iterdir())
  assert files == sorted(STAGE_FILES + ["log.txt", "report.md"]) and len(files) <= 8
  tiny = plan_lib.TINY
  environment = _steps(out, "environment")["environment"]
  assert environment["status"] == "ok" and environment["backend"] == "cpu"
  assert environment["versions"]["jax"] and environment["device_count"] == 1

  correctness = _steps(out, "correctness")
  assert correctness["attention"]["status"] == correctness["tests"]["status"] == "ok", correctness
  attention = correctness["attention"]["attention"]
  assert attention["ok"] and attention["implementation"] == "xla"
  assert "not applicable on cpu" in attention["cudnn"]
  assert set(attention["cases"]) == {"padding", "causal", "packed", "packed_causal"}
  tests = correctness["tests"]["device_tests"]
  assert tests["status"] == "finished" and tests["exit_status"] == 0
  assert tests["counts"].get("passed", 0) == tests["collected"] > 0 and not tests["failures"]

  speeds = _steps(out, "speed")
  assert set(speeds) == set(tiny.variants)
  for name, record in speeds.items():
    assert record["status"] == "ok", (name, record)
    assert record["timed_steps"] == tiny.timed_steps and (record["rows"], record["length"]) == (
      tiny.rows,
      tiny.length,
    )
    assert record["step_seconds"]["min"] <= record["step_seconds"]["median"]
    assert record["target_tokens_per_second"] == pytest.approx(
      record["target_tokens"] / record["step_seconds"]["median"]
    )
    assert record["mfu_vs_measured_matmul"] == pytest.approx(
      record["model_flops_per_step"]
      / record["step_seconds"]["median"]
      / record["matmul_flops_per_second"]
    )
    assert record["mfu_vs_spec"] is None and record["peak_bytes"] is None  # Not on a CPU.
    assert record["predicted_local"]["total_bytes"] > 0
    assert all(math.isfinite(loss) for loss in record["loss_first_last"])
    ops = record["op_times"]  # On a CPU, the host's events that name an XLA op.
    assert ops["traced_steps"] == tiny.profile_steps and ops["sources"][0].startswith("/host:CPU")
    assert ops["busy_seconds_per_step"] > 0 and ops["ops"] and ops["distinct_ops"] > 0
    assert sum(op["share_of_busy"] for op in ops["ops"]) <= 1 + 1e-9
  assert speeds["base_xla"]["model"]["attention"] == "xla"
  assert speeds["base_remat"]["model"]["remat"] == "full"
  assert speeds["big"]["model"]["d_model"] == speeds["base"]["model"]["d_model"] == 32

  prediction = _steps(out, "prediction")
  if prediction["compile"]["status"] == "not applicable":  # No jax CUDA plugin here.
    assert "CUDA plugin" in prediction["compile"]["not_applicable"]
  else:
    program = prediction["compile"]["programs"]["base"]
    assert program["name"] == f"train {tiny.rows}x{tiny.length}" and program["total_bytes"] > 0
  assert prediction["largest"]["status"] == "not applicable"

  decoding = _steps(out, "decoding")["decoding"]
  for search in ("beam4", "greedy"):
    figures = decoding["searches"][search]
    assert figures["tokens_per_second"] == pytest.approx(
      figures["sentences_per_second"] * tiny.decode_output_length
    )
  end_to_end = _steps(out, "end_to_end")["end_to_end"]
  assert end_to_end["status"] == "ok" and end_to_end["split"] == "test"
  assert end_to_end["steps"] == 6 and 0 <= end_to_end["bleu"] <= 100
  assert end_to_end["averaged_steps"] == [3, 6]

  report = (out / "report.md").read_text()
  for row in (
    "| base | ok | 8x32 |",
    "| big | ok |",
    "| base, attention=xla | ok |",
    "| base, remat=full | ok |",
    "| base at the largest batch | not applicable |",
    "| prediction:largest | not applicable |",
    "| packed_causal |",
  ):
    assert row in report, row
  assert "test BLEU" in report and "Tests marked `device`:" in report
  assert "### Where `base`'s step goes" in report
  assert "===== end_to_end" in (out / "log.txt").read_text()


@pytest.mark.slow
def test_a_step_that_fails_or_runs_out_of_time_leaves_the_others(tmp_path):
  tiny = plan_lib.TINY
  spec, overrides = tiny.variants["base"]
  steps = (
    plan_lib.Step("environment", "device", 30),
    plan_lib.Step("speed:base", "device", 60),
    plan_lib.Step("speed:broken", "device", 30),
    plan_lib.Step("speed:slow", "device", 2),
    plan_lib.Step("speed:base_xla", "device", 60),
  )
  plan = dataclasses.replace(
    tiny,
    steps=steps,
    variants={
      "base": (spec, overrides),
      "base_xla": tiny.variants["base_xla"],
      "broken": (spec, {**overrides, "model.num_heads": 5}),  # 32 is not a multiple of 5.
      "slow": (spec, overrides),
    },
  )
  env = helpers.environment()
  with pytest.MonkeyPatch.context() as patch:
    for key in ("PYTHONPATH", "XLA_FLAGS", "JAX_PLATFORMS"):
      patch.setenv(key, env[key])
    runner = Runner(
      plan,
      str(tmp_path),
      deadline=time.monotonic() + 300,
      platform="cpu",
      stages=("environment", "speed"),
    )
    records = runner.run()
  speeds = records["speed"]["steps"]
  assert [speeds[n]["status"] for n in ("base", "broken", "slow", "base_xla")] == [
    "ok",
    "failed (exit status 1)",
    "timed out",
    "ok",
  ]
  assert "not divisible by num_heads=5" in speeds["broken"]["error"]
  assert "ran past its limit of 2 s" in speeds["slow"]["reason"]
  assert speeds["slow"]["seconds"] < 15
  on_disk = _steps(tmp_path, "speed")
  assert on_disk["base"]["target_tokens_per_second"] > 0 and on_disk["base_xla"]["status"] == "ok"
  assert records["speed"]["status"] == "incomplete"
  report = (tmp_path / "report.md").read_text()
  assert (
    "| speed:slow | timed out |" in report and "| speed:broken | failed (exit status 1) |" in report
  )


def _run_out_of_time(tmp_path, stages) -> dict:
  """The records of a tiny report of `stages` with 2 s to go: every step skipped."""
  runner = Runner(
    plan_lib.TINY, str(tmp_path), deadline=time.monotonic() + 2, platform="cpu", stages=stages
  )
  return runner.run()


def test_a_step_past_the_deadline_is_skipped(tmp_path):
  record = _run_out_of_time(tmp_path, ("decoding",))["decoding"]["steps"]["decoding"]
  assert record["status"] == "skipped" and "no time left under the deadline" in record["reason"]


def test_the_largest_batch_alone_says_that_it_needs_the_prediction_step(tmp_path):
  plan = dataclasses.replace(plan_lib.TINY, fit_search=True)
  result = stage.Result(tmp_path / "largest.json", time.monotonic() + 60)
  largest.run(plan, plan.step("prediction:largest"), result, stage.Context(tmp_path, "1xh100"))
  record = json.loads((tmp_path / "largest.json").read_text())
  assert record["skipped"].startswith("prediction:compile did not run in this report")


def test_single_steps_can_be_chosen_beside_whole_stages(tmp_path):
  records = _run_out_of_time(tmp_path, ("speed:base_xla", "decoding"))
  assert {stage: set(r["steps"]) for stage, r in records.items()} == {
    "environment": {"environment"},
    "speed": {"base_xla"},
    "decoding": {"decoding"},
  }


@pytest.mark.parametrize(
  "status, exit_status, failures, verdict",
  [
    ("finished", 0, [], "ok"),
    ("finished", 1, [{"test": "t"}], "problems found"),
    ("finished", 2, [], "problems found"),  # pytest itself failed: nothing collected, say.
    ("stopped after 116 s", None, [], "incomplete"),
    ("stopped after 116 s", None, [{"test": "t"}], "problems found"),
  ],
)
def test_the_device_tests_verdict(status, exit_status, failures, verdict):
  tests = {"status": status, "exit_status": exit_status, "failures": failures}
  assert correctness._tests_status(tests) == verdict


def test_a_failing_trace_costs_only_its_own_record(monkeypatch):
  def no_profiler(step, steps):
    raise RuntimeError("no CUPTI")

  monkeypatch.setattr(op_times, "trace", no_profiler)
  record = speed._op_times(lambda: None, 3, compiled=None)
  assert record == {"error": "RuntimeError: no CUPTI"}
  steps = {"base": {"op_times": record, "step_seconds": {"median": 0.05}}}
  page = "\n".join(markdown._op_times({"speed": {"steps": steps}}))
  assert "`base`: the trace failed: RuntimeError: no CUPTI" in page


@pytest.mark.slow
def test_a_trace_without_the_time_for_it_is_skipped_and_the_figures_kept(tmp_path, monkeypatch):
  monkeypatch.setattr(speed, "MIN_PROFILE_SECONDS", 1e9)
  result = stage.Result(tmp_path / "speed.json", time.monotonic() + 300)
  speed.measure(plan_lib.TINY, "base", 8, 32, 2, result, profile_steps=2)
  record = json.loads((tmp_path / "speed.json").read_text())
  assert record["op_times"]["skipped"].endswith("s left of the step's limit")
  assert record["target_tokens_per_second"] > 0 and record["mfu_vs_measured_matmul"] > 0


@pytest.mark.slow
def test_the_largest_step_trains_at_the_batch_the_compile_mode_found(tmp_path):
  plan = dataclasses.replace(plan_lib.TINY, fit_search=True)
  found = {"field": "data.batch_size", "value": 16, "rows": 16, "length": 32}
  (tmp_path / "prediction_compile.json").write_text(json.dumps({"largest_batch": found}))
  result = stage.Result(tmp_path / "largest.json", time.monotonic() + 300)
  largest.run(plan, plan.step("prediction:largest"), result, stage.Context(tmp_path, "1xh100"))
  record = json.loads((tmp_path / "largest.json").read_text())
  assert record["compile_mode_says"] == found and record["ran"]
  assert (record["rows"], record["length"]) == (16, 32) and record["variant"] == "base"
  assert record["target_tokens"] <= 16 * 32


def test_the_plan_reaches_each_step_whole():
  for plan in plan_lib.PLANS.values():
    assert plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert plan.steps[0].name == "environment"
    assert {s.stage for s in plan.steps} == set(plan_lib.STAGES)
    assert len({s.name for s in plan.steps}) == len(plan.steps)
    assert plan.predicted[0] == "base" and set(plan.predicted) <= set(plan.variants)


@pytest.mark.parametrize("name", sorted(plan_lib.FULL.variants))
def test_the_full_plans_models_are_the_papers_in_bfloat16(name):
  spec, overrides = plan_lib.FULL.variants[name]
  settings = speed.experiment_of(spec, overrides)
  model = settings.model
  assert (model.d_model, model.num_layers, model.dtype) == (
    (1024 if name == "big" else 512),
    6,
    "bfloat16",
  )
  assert settings.data.vocab_size == 37000
  assert plan_lib.FULL.length <= model.max_len
  assert model.attention_impl == ("xla" if name == "base_xla" else "auto")
  assert model.remat == ("full" if name == "base_remat" else "none")


def test_the_full_plans_end_to_end_run_is_the_default_experiment_in_bfloat16():
  spec, overrides = plan_lib.FULL.end_to_end
  settings = speed.experiment_of(spec, overrides)
  default = speed.experiment_of(spec, {})
  assert settings.model.dtype == "bfloat16" and default.model.dtype == "float32"
  assert settings.fit == default.fit and settings.data == default.data
