"""The device report: its CPU dry run through every stage, a step that fails or runs out of time
leaving the others, the largest-batch step, and the plan handed to each step's process."""

import dataclasses
import json
import math
import pathlib
import time

import pytest

import helpers
from test_data_multi30k import write_repo
from tools.device_report import (
  bundle_data,
  correctness,
  largest,
  markdown,
  markdown_time,
  multi30k,
  op_times,
  speed,
  stage,
)
from tools.device_report import plan as plan_lib
from tools.device_report.runner import RESERVE_SECONDS, Runner
from transformer_jax.compile import targets
from transformer_jax.data import multi30k as multi30k_data

STAGE_FILES = [f"{s}.json" for s in plan_lib.STAGES]


def _steps(out: pathlib.Path, stage_name: str) -> dict:
  return json.loads((out / f"{stage_name}.json").read_text())["steps"]


def _check_back_to_back_matmul_and_floor(record: dict, plan) -> None:
  """A dry run's train step: its steps back to back, the matmul before and after its timing, and
  its executable's kernels and roofline floor (at the target's chip: a CPU has no datasheet)."""
  chained = record["back_to_back"]
  assert chained["steps"] == plan.chained_steps and chained["seconds"] > 0
  assert chained["step_seconds"] == pytest.approx(chained["seconds"] / chained["steps"])
  assert chained["target_tokens_per_second"] == pytest.approx(
    record["target_tokens"] / chained["step_seconds"]
  )
  assert record["matmul_size"] == plan.matmul_size
  assert record["matmul_flops_per_second"] > 0 and record["matmul_after_flops_per_second"] > 0
  kernels = record["predicted_kernels"]
  assert kernels["chip"] == targets.CHIPS["h100"].name and "1xh100" in kernels["chip_basis"]
  assert kernels["program"] == "the executable that ran (cpu)"
  assert "not a measurement" in kernels["basis"]
  assert kernels["kernels"] > 0 and kernels["bytes"] > 0 and kernels["floor_seconds"] > 0
  assert kernels["flops"] >= 0 and kernels["gemms"] > 0
  median = record["step_seconds"]["median"]
  assert record["measured_over_floor"] == pytest.approx(median / kernels["floor_seconds"])
  assert record["back_to_back_over_floor"] == pytest.approx(
    chained["step_seconds"] / kernels["floor_seconds"]
  )


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_stage_and_reports_them(tmp_path):
  out, data = tmp_path / "out", tmp_path / "multi30k"
  write_repo(data)
  run = helpers.python(
    "-m",
    "tools.device_report",
    f"--out={out}",
    "--platform=cpu",
    "--tiny",
    f"--multi30k={data}",
    f"--compilation_cache={tmp_path / 'cache'}",
    timeout=600,
  )
  assert run.returncode == 0, run.stderr
  assert "a second call" not in run.stdout  # Everything ran.
  files = sorted(p.name for p in out.iterdir())
  assert files == sorted(STAGE_FILES + ["log.txt", "report.md"]) and len(files) <= 9
  tiny = plan_lib.TINY
  environment = _steps(out, "environment")["environment"]
  assert environment["status"] == "ok" and environment["backend"] == "cpu"
  assert environment["versions"]["jax"] and environment["device_count"] == 1

  correctness = _steps(out, "correctness")
  assert correctness["attention"]["status"] == correctness["tests"]["status"] == "ok", correctness
  attention = correctness["attention"]["attention"]
  assert attention["ok"] and attention["implementation"] == "xla"
  assert "not applicable on cpu" in attention["cudnn"]
  assert set(attention["cases"]) == {
    "padding",
    "causal",
    "packed",
    "packed_causal",
    "padding_is_causal",
    "packed_is_causal",
  }
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
    _check_back_to_back_matmul_and_floor(record, tiny)
    if name not in tiny.profiled:
      assert "op_times" not in record
      continue
    ops = record["op_times"]  # On a CPU, the host's events that name an XLA op.
    assert ops["traced_steps"] == tiny.profile_steps and ops["sources"][0].startswith("/host:CPU")
    assert ops["busy_seconds_per_step"] > 0 and ops["ops"] and ops["distinct_ops"] > 0
    assert sum(op["share_of_busy"] for op in ops["ops"]) <= 1 + 1e-9
    # Nearly all of the busy time is in kernels of the program that ran, each beside its floor.
    assert 0.5 < ops["matched_share"] <= 1 + 1e-9
    assert sum(g["seconds_per_step"] for g in ops["groups"]) == pytest.approx(
      ops["busy_seconds_per_step"]
    )
    matched = [op for op in ops["ops"] if op["predicted"]]
    assert matched and all(op["predicted"]["floor_seconds"] > 0 for op in matched)
    assert all(
      op["over_floor"] == pytest.approx(op["seconds_per_step"] / op["predicted"]["floor_seconds"])
      for op in matched
    )
    assert ops["by_source"] and any(".py:" in s["source"] for s in ops["by_source"])
  assert set(tiny.profiled) < set(speeds)
  assert speeds["base_xla"]["model"]["attention"] == "xla"
  assert speeds["base_remat"]["model"]["remat"] == "full"
  assert speeds["big"]["model"]["d_model"] == speeds["base"]["model"]["d_model"] == 32

  prediction = _steps(out, "prediction")
  if prediction["compile"]["status"] == "not applicable":  # No jax CUDA plugin here.
    assert "CUDA plugin" in prediction["compile"]["not_applicable"]
  else:
    program = prediction["compile"]["programs"]["base"]
    assert program["name"] == f"train {tiny.rows}x{tiny.length}" and program["total_bytes"] > 0
    assert program["kernels"]["floor_seconds"] > 0  # The compile mode's floor, beside the run's.
  assert prediction["largest"]["status"] == "not applicable"

  decoding = _steps(out, "decoding")["decoding"]
  for search in ("beam4", "greedy"):
    figures = decoding["searches"][search]
    assert figures["tokens_per_second"] == pytest.approx(
      figures["sentences_per_second"] * tiny.decode_output_length
    )
  end_to_end = _steps(out, "end_to_end")["end_to_end"]
  assert end_to_end["status"] == "ok" and set(end_to_end["splits"]) == {"test"}
  assert end_to_end["steps"] == 6 and 0 <= end_to_end["splits"]["test"]["bleu"] <= 100
  assert end_to_end["averaged_steps"] == [3, 6]
  _check_experiment_run(end_to_end, ("test",))
  run = _steps(out, "multi30k")["multi30k"]
  assert run["status"] == "ok" and run["experiment"] == plan_lib.MULTI30K
  _check_experiment_run(run, multi30k.SPLITS)
  assert run["averaged_steps"] == [3, 6] and run["overrides"]["data.source.manual_dir"] == str(data)
  for split in run["splits"].values():
    assert 0 <= split["bleu"] <= 100 and 0 <= split["bleu_as_is"] <= 100
  assert run["splits"]["validation"]["sentences"] == 7  # write_repo's val
  goal = run["goal"]
  assert goal["met"] is None and goal["verdict"] == "not applicable on the tiny plan"
  assert goal["seconds"] == pytest.approx(
    run["splits"]["test_2016_flickr"]["known_after_seconds"], abs=0.1
  )
  # The cache the report named (kept for a second call on the same machine).
  assert run["compilation_cache"]["path"] == str(tmp_path / "cache")

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
  assert "### Where `base`'s step goes" in report and "### Where `big`'s step goes" in report
  assert "| group | ops | ms per step |" in report and "| source line | ops |" in report
  assert "## Train steps beside their predicted kernels and roofline floor" in report
  (floor,) = [line for line in report.splitlines() if line.startswith("| base | 8x32 |")]
  median = speeds["base"]["step_seconds"]["median"] * 1e3
  assert floor.startswith(f"| base | 8x32 | {median:.1f} |")  # Beside its floor's row (est.).
  if prediction["compile"]["status"] == "ok":  # The compile mode's floor, and the ratio to it.
    assert floor.split("|")[-2].strip() != "-"
  assert "===== end_to_end" in (out / "log.txt").read_text()
  assert (
    "Multi30k test_2016_flickr BLEU as is >= 41.0" in report and "Not brought back" not in report
  )


def _check_experiment_run(run: dict, splits) -> None:
  """An experiment's run through train, average and eval: its wall time by part, its speed and
  what the compilation cache did."""
  assert set(run["splits"]) == set(splits)
  parts = run["wall_seconds_by_part"]
  assert all(parts[f"decoding_{s}"] > 0 for s in splits) and parts["averaging"] > 0
  assert sum(parts.values()) == pytest.approx(run["wall_seconds"] + parts["before"], rel=0.05)
  assert run["updates_per_second"] > 0 and run["target_tokens_per_second"] > 0
  cache = run["compilation_cache"]
  assert cache["requests"] > 0 and 0 <= cache["loaded"] <= cache["requests"]
  times = run["run_times"]  # The library's split of the training run (train/run_times.py RunTimes).
  assert times["first_step"] > 0 and times["programs"] and parts["compiling"] > 0
  assert parts["training"] > 0 and parts["preparing_data"] > 0
  assert all(p["seconds"] > 0 for p in times["programs"])
  phases = times["phases"]  # Unrounded (the parts are rounded to milliseconds).
  seconds = phases["training"] + phases["waiting_for_data"]  # Steps waiting for batches count.
  assert run["updates_per_second"] == pytest.approx(times["steps"] / seconds, rel=1e-9)
  assert parts["waiting_for_data"] == pytest.approx(phases["waiting_for_data"], abs=1e-3)


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
  assert record["skipped"].startswith("neither prediction:compile nor speed:base ran")


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
  page = "\n".join(markdown_time.op_times({"speed": {"steps": steps}}))
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
  found = {"field": "data.batch.size", "value": 16, "rows": 16, "length": 32}
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
  assert settings.data.vocab.size == 37000
  assert plan_lib.FULL.length <= model.max_len
  assert model.attention_impl == ("xla" if name == "base_xla" else "auto")
  assert model.remat == ("full" if name == "base_remat" else "none")


def test_the_full_plans_end_to_end_run_is_the_default_experiment_in_bfloat16():
  spec, overrides = plan_lib.FULL.end_to_end
  settings = speed.experiment_of(spec, overrides)
  default = speed.experiment_of(spec, {})
  assert settings.model.dtype == "bfloat16" and default.model.dtype == "float32"
  assert settings.fit == default.fit and settings.data == default.data


@pytest.mark.parametrize(
  "rows, total, temp, limit, expected",
  [
    # 104 rows: 13 GiB of which 12 grow with the rows; 59 GiB: 0.9 * 104 * 58 / 12 = 452.4.
    (104, 13 * 2**30, 12 * 2**30, 59 * 2**30, 448),
    (104, 13 * 2**30, 12 * 2**30, 13 * 2**30, 88),  # 0.9 * 104 = 93.6 rows: below 104.
    (104, 13 * 2**30, 12 * 2**30, 2**30, 0),  # Not even the state fits.
    (8, 100, 0, 1000, 0),  # Nothing grows with the rows: nothing to extrapolate.
  ],
)
def test_the_largest_batch_extrapolated_from_a_step_on_the_device(
  rows, total, temp, limit, expected
):
  assert largest.extrapolated_rows(rows, total, temp, limit) == expected


def _largest_without_the_fit_search(tmp_path, monkeypatch, speed_base: dict | None) -> dict:
  """The largest-batch step's record with no fit search in the report, the device's memory limit
  1 GiB, `speed_base` the record of speed:base (None: it did not run), speed.measure stubbed."""
  measured = []
  monkeypatch.setattr(speed, "measure", lambda *args, **kwargs: measured.append((args, kwargs)))
  (tmp_path / "environment.json").write_text(json.dumps({"memory_bytes_limit": 2**30}))
  if speed_base is not None:
    (tmp_path / "speed_base.json").write_text(json.dumps(speed_base))
  plan = dataclasses.replace(plan_lib.TINY, fit_search=True)
  result = stage.Result(tmp_path / "largest.json", time.monotonic() + 60)
  largest.run(plan, plan.step("prediction:largest"), result, stage.Context(tmp_path, "1xh100"))
  return {"record": json.loads((tmp_path / "largest.json").read_text()), "measured": measured}


def test_without_the_fit_search_the_largest_batch_is_extrapolated_from_speed_base(
  tmp_path, monkeypatch
):
  base = {"rows": 8, "length": 32, "predicted_local": {"total_bytes": 2**28, "temp_bytes": 2**27}}
  found = _largest_without_the_fit_search(tmp_path, monkeypatch, base)
  record, ((args, kwargs),) = found["record"], found["measured"]
  rows = largest.extrapolated_rows(8, 2**28, 2**27, 2**30)
  assert rows == 48 and args[1:4] == ("base", rows, 32)  # 0.9 * 8 * 7/8 GiB / 1/8 GiB = 50.4
  assert record["extrapolated"] == {"rows": rows, "length": 32, "limit_bytes": 2**30}
  assert record["batch_from"].startswith("extrapolated from speed:base") and record["ran"]
  assert (
    kwargs["target"] == "1xh100" and kwargs["chained_steps"] == plan_lib.TINY.largest_timed_steps
  )


def test_the_largest_batch_with_nothing_to_go_by_is_skipped(tmp_path, monkeypatch):
  found = _largest_without_the_fit_search(tmp_path, monkeypatch, None)
  assert found["record"]["skipped"].startswith("neither prediction:compile nor speed:base ran")
  assert not found["measured"]


def test_the_floor_is_taken_at_this_devices_chip_else_at_the_targets():
  chip, basis = speed.floor_chip("NVIDIA H200", "1xh100")
  assert chip == targets.CHIPS["h200"] and basis == "this device's (NVIDIA H200)"
  chip, basis = speed.floor_chip("NVIDIA H100 PCIe", "1xh100")
  assert chip == targets.CHIPS["h100"] and "no datasheet here for NVIDIA H100 PCIe" in basis


def test_the_full_plan_fits_one_window_in_two_calls_in_order_of_value():
  full = plan_lib.FULL
  assert set(plan_lib.EXPECTED_SECONDS) == {s.name for s in full.steps}
  assert all(plan_lib.EXPECTED_SECONDS[s.name] <= s.cap_seconds for s in full.steps)
  names = [s.name for s in full.steps]
  device = [n for n in names if n != "prediction:compile"]  # Beside the others, on the CPU.
  assert device == ["environment", *plan_lib.FIRST_CALL, *plan_lib.SECOND_CALL, *plan_lib.LATER]
  assert names.index("prediction:compile") == names.index("prediction:largest") - 1
  first = plan_lib.expected_call(plan_lib.FIRST_CALL)
  second = plan_lib.expected_call(plan_lib.SECOND_CALL)
  assert first == plan_lib.expected_until(full, plan_lib.FIRST_CALL[-1])
  assert first + RESERVE_SECONDS <= plan_lib.FIRST_DEADLINE_SECONDS
  assert second + RESERVE_SECONDS <= plan_lib.SECOND_DEADLINE_SECONDS
  assert plan_lib.DEADLINE_SECONDS == plan_lib.FIRST_DEADLINE_SECONDS
  assert (
    plan_lib.MACHINE_START_SECONDS
    + plan_lib.FIRST_DEADLINE_SECONDS
    + plan_lib.SECOND_DEADLINE_SECONDS
    + 2 * plan_lib.CALL_OVERHEAD_SECONDS
    <= plan_lib.WINDOW_SECONDS
  )
  # The lowest in value are left for a later window: neither call has the time for them.
  later = plan_lib.expected_call(plan_lib.SECOND_CALL + plan_lib.LATER[:1])
  assert later + RESERVE_SECONDS > plan_lib.SECOND_DEADLINE_SECONDS
  # Traced: the steps of the paper's models, at the report's batch, after their timed figures.
  assert full.profiled == ("base", "big") and full.chained_steps == full.timed_steps


def test_the_full_plans_multi30k_run_is_the_recipe_as_it_is():
  spec, overrides = plan_lib.FULL.multi30k
  assert spec == "experiments/multi30k.py:tiny" and overrides == {}
  # The tok files the bundle carries (and the stage looks for) are those the data source reads.
  read = {
    multi30k_data.relative_path("multi30k_tok", multi30k_data.SPLITS[split][0], lang)
    for split in ("train", *multi30k.SPLITS)
    for lang in ("en", "de")
  }
  assert set(bundle_data.MULTI30K_FILES) == read and len(bundle_data.MULTI30K_FILES) == 6


def test_a_report_that_missed_steps_ends_with_the_second_call_that_runs_them(tmp_path):
  flags = ("--bundle=.device-bundle", "--tiny")
  runner = Runner(
    plan_lib.TINY,
    str(tmp_path),
    deadline=time.monotonic() + 2,
    platform="cpu",
    stages=("multi30k", "prediction", "decoding"),
    repeat_flags=flags,
  )
  runner.run()
  assert runner.missed() == [
    "environment",
    "multi30k",
    "prediction:compile",
    "prediction:largest",
    "decoding",
  ]
  command = (
    "./launch.sh device-report --bundle=.device-bundle --tiny --out=<another dir> "
    f"--stages=multi30k,prediction:largest,decoding --deadline=355 --earlier={tmp_path}"
  )
  assert runner.second_call() == command
  report = (tmp_path / "report.md").read_text()
  assert "## Not brought back" in report and f"    {command}" in report
  # Stopped at its cap after its test BLEU was in: missed, but not for a second call to repeat.
  runner.records["multi30k"]["steps"]["multi30k"].update(status="timed out", brought_back=True)
  assert "multi30k" in runner.missed() and "--stages=prediction:largest,decoding " in (
    runner.second_call()
  )
  runner.records = {
    "environment": {"steps": {"environment": {"status": "ok"}}},
    "multi30k": {"steps": {"multi30k": {"status": "not applicable"}}},
  }
  assert runner.missed() == [] and runner.second_call() == ""
  runner.repeat_flags = ("--bundle=/a b",)
  runner.records["decoding"] = {"steps": {"decoding": {"status": "timed out"}}}
  assert runner.second_call().startswith("./launch.sh device-report '--bundle=/a b' --out=")


def test_a_second_call_reads_what_the_earlier_one_measured(tmp_path):
  earlier = tmp_path / "first"
  earlier.mkdir()
  found = {"field": "data.batch.size", "value": 16, "rows": 16, "length": 32}
  steps = {"compile": {"status": "ok", "largest_batch": found}, "largest": {"status": "skipped"}}
  (earlier / "prediction.json").write_text(json.dumps({"stage": "prediction", "steps": steps}))
  (earlier / "speed.json").write_text(
    json.dumps({"stage": "speed", "steps": {"base": {"status": "ok", "rows": 8}}})
  )
  (earlier / "decoding.json").write_text(
    json.dumps({"stage": "decoding", "steps": {"decoding": {"status": "skipped"}}})
  )
  runner = Runner(
    plan_lib.TINY,
    str(tmp_path / "second"),
    deadline=time.monotonic() + 60,
    platform="cpu",
    stages=("prediction:largest",),
    earlier=str(earlier),
  )
  context = stage.Context(runner.work, "1xh100")
  assert context.earlier("prediction:compile")["largest_batch"] == found
  assert context.earlier("speed:base")["rows"] == 8
  assert context.earlier("prediction:largest") == {}  # This call's to run.
  assert context.earlier("decoding") == {}  # Skipped there: nothing measured to stand in.


def test_multi30k_without_its_files_says_how_to_carry_them(tmp_path):
  for given in ("", str(tmp_path)):
    result = stage.Result(tmp_path / "multi30k.json", time.monotonic() + 60)
    context = stage.Context(tmp_path, "1xh100", multi30k=given)
    multi30k.run(plan_lib.TINY, plan_lib.TINY.step("multi30k"), result, context)
    reason = json.loads((tmp_path / "multi30k.json").read_text())["not_applicable"]
    assert "./launch.sh device-bundle DIR --multi30k=<clone of" in reason
    assert ("lacks data/task1/tok/train.lc.norm.tok.en" in reason) == bool(given)


@pytest.mark.parametrize(
  "plan, bleu, seconds, verdict",
  [
    ("full", 41.2, 170.0, "met"),
    ("full", 41.2, 181.0, "not met"),
    ("full", 40.9, 100.0, "not met"),
    ("full", None, 100.0, "not met"),
    ("tiny", 50.0, 10.0, "not applicable on the tiny plan"),
  ],
)
def test_the_multi30k_goal(plan, bleu, seconds, verdict):
  record = multi30k.goal(plan, bleu, seconds)
  assert record["verdict"] == verdict and record["met"] == {"met": True, "not met": False}.get(
    verdict
  )


def test_the_floor_table_sets_each_measured_step_beside_both_predictions():
  step = {
    "status": "ok",
    "rows": 104,
    "length": 256,
    "step_seconds": {"median": 0.0586, "min": 0.0578, "max": 0.0599},
    "back_to_back": {"steps": 20, "step_seconds": 0.055, "target_tokens_per_second": 431_090},
    "matmul_flops_per_second": 6.72e14,
    "matmul_after_flops_per_second": 5.52e14,
    "predicted_kernels": {
      "chip": "NVIDIA H100 SXM 80GB",
      "chip_basis": "this device's",
      "kernels": 1367,
      "bytes": 79.3e9,
      "flops": 10.94e12,
      "floor_seconds": 0.0263,
      "host_launches": {"launches": 73, "graphs": 37, "graph_commands": 1208},
    },
    "measured_over_floor": 0.0586 / 0.0263,
  }
  records = {
    "speed": {"steps": {"base": step}},
    "prediction": {
      "steps": {"compile": {"programs": {"base": {"kernels": {"floor_seconds": 0.0293}}}}}
    },
  }
  lines = markdown_time.floor_rows(records)
  assert lines[1] == "## Train steps beside their predicted kernels and roofline floor"
  assert (
    "floor ms (est., the executable that ran)" in lines[3] and "(est., compile mode)" in lines[3]
  )
  assert lines[5] == (
    "| base | 104x256 | 58.6 | 55.0 (20) | 431,090 | 672.0, 552.0 | 1,367 | 73 (37) | 79.3 | "
    "10.94 | "
    "26.3 | 2.23 | 29.3 | 2.00 |"
  )
  assert "NVIDIA H100 SXM 80GB (this device's)" in lines[-1] and "not measured" in lines[-1]
  assert markdown_time.floor_rows({"speed": {"steps": {"base": {"status": "timed out"}}}}) == []


def test_the_report_names_programs_compiled_ahead_and_those_compiled_at_a_step():
  run = {
    "status": "ok",
    "experiment": "experiments/multi30k.py:tiny",
    "steps": 2,
    "updates_per_second": 10.0,
    "target_tokens_per_second": 1000.0,
    "splits": {"test": {"bleu": 40.0, "perplexity": 4.0, "sentences": 10}},
    "run_times": {
      "first_step": 9.0,
      "programs": [
        {"step": None, "shape": "(8, 16)", "seconds": 7.0},
        {"step": 3, "shape": "(8, 24)", "seconds": 2.0},
      ],
    },
  }
  (line,) = [x for x in markdown._experiment_run("multi30k", run) if "programs" in x]
  assert line.endswith("compiled: ahead (8, 16) 7.0 s, step 3 (8, 24) 2.0 s.")
