"""What the device report measures, at full size on an accelerator or tiny for a CPU dry run: the
steps of each stage, their time caps and every shape."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Step:
  """One process of a stage: `name` (`stage` or `stage:part`), where it runs ("device": the
  report's platform; "cpu": the CPU backend, for the compile mode) and its time cap."""

  name: str
  runs_on: str
  cap_seconds: float

  @property
  def stage(self) -> str:
    return self.name.split(":")[0]

  @property
  def part(self) -> str:
    return self.name.partition(":")[2]


@dataclasses.dataclass(frozen=True)
class Plan:
  """The shapes and time caps of one report."""

  name: str
  steps: tuple[Step, ...]
  # The train-step variants: name -> (experiment file, --config. overrides).
  variants: dict
  rows: int  # packed rows of the train step's batch
  length: int  # tokens per row
  timed_steps: int
  warmup_steps: int
  chained_steps: int  # dispatched back to back after the timed ones, one wait at the end
  profile_steps: int  # traced after the timed ones, their time summed by XLA op
  profiled: tuple[str, ...]  # the variants traced at `rows` x `length`
  largest_timed_steps: int  # at the largest batch, whose steps are several times longer
  matmul_size: int
  attention_shape: tuple[int, int, int, int]  # batch, length, heads, head size
  device_test_files: tuple[str, ...]  # whose tests marked `device` run (empty: every such file)
  test_timeout_seconds: int
  predicted: tuple[str, ...]  # the variants the prediction step compiles for the target
  fit_search: bool  # whether it then looks for the largest batch of `base`
  decode_sentences: int
  decode_source_length: int
  decode_output_length: int
  decode_runs: int
  end_to_end: tuple[str, dict]  # experiment file and its overrides
  multi30k: tuple[str, dict]  # experiment spec and its overrides (the tiny plan's shrink it)

  def step(self, name: str) -> Step:
    return next(s for s in self.steps if s.name == name)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict) -> "Plan":
    """The plan `to_json` wrote (how the runner hands it to each step's process)."""
    fields = dict(record, steps=tuple(Step(**s) for s in record["steps"]))
    fields["variants"] = {k: tuple(v) for k, v in record["variants"].items()}
    for name in (
      "attention_shape",
      "device_test_files",
      "profiled",
      "predicted",
      "end_to_end",
      "multi30k",
    ):
      fields[name] = tuple(fields[name])
    return cls(**fields)


STAGES = ("environment", "correctness", "speed", "prediction", "decoding", "end_to_end", "multi30k")
WMT14 = "experiments/wmt14.py"
MULTI30K = "experiments/multi30k.py:tiny"

# One window of a GPU machine: its device seconds in all, of which its start takes some; the
# report is run as two calls (docs/gpu.md), the second of the steps the first did not bring back,
# each costing CALL_OVERHEAD_SECONDS beyond its deadline (starting the command and Python,
# installing the bundle, bringing the files back, the pause before the next call: an estimate).
WINDOW_SECONDS = 900.0
MACHINE_START_SECONDS = 120.0
CALL_OVERHEAD_SECONDS = 25.0
FIRST_DEADLINE_SECONDS = 375.0
SECOND_DEADLINE_SECONDS = 355.0
DEADLINE_SECONDS = FIRST_DEADLINE_SECONDS  # the report's default deadline (--deadline)
# What each call is expected to bring back (besides the environment, which every call runs);
# the full plan's other steps, the lowest in value, are left for a later window.
FIRST_CALL = ("speed:base", "speed:big", "multi30k", "correctness:attention")
SECOND_CALL = ("end_to_end", "prediction:largest", "correctness:tests", "decoding")
LATER = ("speed:base_xla", "speed:base_remat")


def _variants(shrink: dict) -> dict:
  return {
    "base": (f"{WMT14}:base", dict(shrink)),
    "big": (f"{WMT14}:big", dict(shrink)),
    "base_xla": (f"{WMT14}:base", {**shrink, "model.attention_impl": "xla"}),
    "base_remat": (f"{WMT14}:base", {**shrink, "model.remat": "full"}),
  }


def _steps(caps: dict) -> tuple[Step, ...]:
  """The steps, in the order they run, with their caps in seconds."""
  cpu = {"prediction:compile"}
  return tuple(Step(name, "cpu" if name in cpu else "device", cap) for name, cap in caps.items())


# Caps in seconds. They add up to more than a call's deadline: each step gets at most what is
# left of it, so a step that ends early leaves its time to the next. The order is that of value
# (docs/gpu.md): the train steps of the paper's models with their profile, the trained Multi30k
# model, the attention check, the default run end to end, the largest batch, the tests marked
# `device` (a run of them stopped early still counts what ended), decoding, and the two other
# train-step variants last. On an H100 (2026-11-26) base took 48 s and big 52 (20 s of compiling
# each), decoding 42, and the end to end run 120 s to the end of its training, before decoding.
# The speed steps of `base` and `big` then trace a few steps more, when
# speed.MIN_PROFILE_SECONDS of the cap are left: base's cap leaves that after the matmul twice,
# the steps back to back and reading the executable. Multi30k's cap leaves 20 s beyond its goal
# (multi30k.GOAL_SECONDS).
FULL = Plan(
  name="full",
  steps=_steps(
    {
      "environment": 40,
      "speed:base": 85,
      "speed:big": 90,
      "multi30k": 200,
      "correctness:attention": 40,
      "end_to_end": 200,
      "prediction:compile": 300,
      "prediction:largest": 75,
      "correctness:tests": 120,
      "decoding": 60,
      "speed:base_xla": 80,
      "speed:base_remat": 80,
    }
  ),
  variants=_variants({}),
  rows=104,
  length=256,
  timed_steps=20,
  warmup_steps=3,
  chained_steps=20,
  profile_steps=3,
  profiled=("base", "big"),
  largest_timed_steps=5,
  matmul_size=8192,
  attention_shape=(4, 512, 8, 64),
  device_test_files=(),
  test_timeout_seconds=60,
  predicted=("base", "big", "base_xla", "base_remat"),
  fit_search=True,
  decode_sentences=128,
  decode_source_length=32,
  decode_output_length=48,
  decode_runs=5,
  # Decoding batches of 128 (the CPU's 8 would decode the test split in 250 batches).
  end_to_end=("experiments/default.py", {"model.dtype": "bfloat16", "decode.batch_size": 128}),
  multi30k=(MULTI30K, {}),  # The recipe as it is: only its data's directories are the report's.
)

_TINY_MODEL = {
  "model.num_layers": 1,
  "model.d_model": 32,
  "model.d_ff": 64,
  "model.num_heads": 4,
  "model.max_len": 64,
  "data.vocab.size": 128,
  "data.batch.max_length": 32,
  "data.batch.max_source_length": 32,
  "data.batch.max_target_length": 32,
}
# The tiny plan's experiment runs: 6 updates, a checkpoint every 3, the last 2 averaged, beam 2.
_TINY_RUN = {
  "num_train_steps": 6,
  "warmup_steps": 2,
  "checkpoint_every_steps": 3,
  "final_checkpoint_every_steps": 0,
  "keep_checkpoints": 2,
  "average_last": 2,
  "log_every_steps": 3,
  "decode.beam_size": 2,
}
TINY = Plan(
  name="tiny",
  # Caps with room for a loaded machine (CI runs two test processes at once; beside a training
  # run on 2 cores the tests' step, 11 s alone, took 57 s: its own pytest starts jax afresh).
  steps=_steps(
    {
      "environment": 30,
      "speed:base": 60,  # Traced: speed.MIN_PROFILE_SECONDS left after the steps (docs/gpu.md).
      "speed:big": 60,
      "multi30k": 90,
      "correctness:attention": 30,
      "end_to_end": 90,
      "prediction:compile": 90,
      "prediction:largest": 30,
      "correctness:tests": 180,
      "decoding": 45,
      "speed:base_xla": 45,
      "speed:base_remat": 45,
    }
  ),
  variants=_variants(_TINY_MODEL),
  rows=8,
  length=32,
  timed_steps=3,
  warmup_steps=1,
  chained_steps=3,
  profile_steps=2,
  profiled=("base", "big"),
  largest_timed_steps=2,
  matmul_size=256,
  attention_shape=(2, 16, 2, 8),
  device_test_files=("tests/test_mask_properties.py",),
  test_timeout_seconds=60,
  predicted=("base",),
  fit_search=False,
  decode_sentences=8,
  decode_source_length=8,
  decode_output_length=8,
  decode_runs=2,
  end_to_end=(
    "experiments/default.py",
    {
      "model.dtype": "bfloat16",
      "model.num_layers": 1,
      "model.d_model": 32,
      "model.d_ff": 64,
      "model.num_heads": 4,
      "model.max_len": 256,
      "data.source.name": "embedded_tiny",
      "data.vocab.size": 128,
      "data.batch.mode": "packed",
      "data.batch.size": 8,
      "data.batch.max_length": 128,
      **_TINY_RUN,
      "decode.max_length": 12,
      "decode.batch_size": 64,
    },
  ),
  # The recipe shrunk to the tiny copy of the layout that tests/helpers.py writes (about 40
  # pairs of 12 words a language): a small model and vocabulary, 6 updates, 2 checkpoints.
  multi30k=(
    MULTI30K,
    {
      "model.num_layers": 1,
      "model.d_model": 32,
      "model.d_ff": 64,
      "model.num_heads": 4,
      "model.max_len": 64,
      "data.vocab.size": 96,
      "data.batch.tokens": 256,
      "data.batch.max_source_length": 32,
      "data.batch.max_target_length": 32,
      # Grain's shuffle of 16,384 positions over 40 pairs takes seconds (performance.md).
      "data.batch.window": 256,
      **_TINY_RUN,
      "decode.max_length": 16,
    },
  ),
)
PLANS = {"full": FULL, "tiny": TINY}

# What each step of the full plan is expected to hold the report on one H100, in seconds:
# estimates, not measurements. From the H100 run of 2026-11-26 (base 48 s and big 52 with 20 s of
# compiling each, decoding 42, the end to end run 120 s to the end of its training) and what was
# added since (3 steps traced with their export and reading, about 10 s; the matmul twice, the
# steps back to back and the executable's kernels read, about 7 s). Multi30k's is its goal
# (multi30k.GOAL_SECONDS), never yet measured on a GPU. The end to end run's 140: its 120 s of
# training, then averaging and decoding the small test split in batches of 128. The device tests
# run in parallel processes: about 90 s (not measured). `prediction:compile` runs beside the
# others from the environment's end, under a cap of 300 s: it has ended before its turn comes
# (after the end to end run), so it holds the sequence for nothing.
EXPECTED_SECONDS = {
  "environment": 15,
  "speed:base": 65,
  "speed:big": 70,
  "multi30k": 180,
  "correctness:attention": 25,
  "end_to_end": 140,
  "prediction:compile": 0,
  "prediction:largest": 50,
  "correctness:tests": 90,
  "decoding": 45,
  "speed:base_xla": 55,
  "speed:base_remat": 55,
}


def expected_until(plan: Plan, last: str) -> float:
  """Seconds the full plan's steps up to and including `last` are expected to take
  (EXPECTED_SECONDS, estimates)."""
  names = [s.name for s in plan.steps]
  return sum(EXPECTED_SECONDS[n] for n in names[: names.index(last) + 1])


def expected_call(steps: tuple[str, ...]) -> float:
  """Seconds a call of `steps` is expected to take, its environment step included (estimates)."""
  return sum(EXPECTED_SECONDS[n] for n in ("environment", *steps))
