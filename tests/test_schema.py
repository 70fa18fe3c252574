"""Typed settings: each field's check and the words of its help come from one declaration."""

import dataclasses

import pytest

from transformer_jax import schema
from transformer_jax.errors import FieldError


@dataclasses.dataclass(frozen=True)
class Example:
  steps: int = schema.setting(10, "steps", ge=1)
  seed: int = schema.setting(0, "seed", ge=0)
  width: int = schema.setting(8, "width", ge=1, multiple_of=2)
  rate: float = schema.setting(0.1, "rate", ge=0, lt=1)
  growth: float = schema.setting(1.5, "growth", gt=1, le=4)
  clip: float = schema.setting(0.0, "clip", ge=0, means={0: "off"})
  axis: int = schema.setting(-1, "axis", ge=1, also=(-1,), means={-1: "the rest"})
  cap: int = schema.setting(0, "cap", ge=2, also=(0,), means={0: "no cap"})
  head: int | None = schema.setting(None, "head", ge=1, means={None: "derived"})
  mode: str = schema.setting("a", "mode", choices=("a", "b"))
  split: str = schema.setting("test", "split", nonempty=True)
  name: str = schema.setting("", "name")
  on: bool = schema.setting(False, "on")

  def __post_init__(self):
    schema.check(self, "example")


WORDS = {
  "steps": "a positive integer",
  "seed": "an integer >= 0",
  "width": "an even positive integer",
  "rate": "a number in [0, 1)",
  "growth": "a number in (1, 4]",
  "clip": "a number >= 0 (0 = off)",
  "axis": "a positive integer or -1 (-1 = the rest)",
  "cap": "an integer >= 2 or 0 (0 = no cap)",
  "head": "a positive integer or None (None = derived)",
  "mode": "'a' or 'b'",
  "split": "a non-empty string",
  "name": "a string",
  "on": "True or False",
}


def test_the_words_are_made_from_the_type_and_the_bounds():
  assert {path: allowed for path, _, allowed, _ in schema.describe(Example)} == WORDS


# (field, values it allows, values it refuses): the check agrees with the words above.
CASES = [
  ("steps", [1, 10**9], [0, -1, 1.0, True, "1", None]),
  ("seed", [0, 5], [-1, 0.5, False]),
  ("width", [2, 512], [0, 3, 511, 2.0]),
  ("rate", [0, 0.0, 0.5, 0.999], [1, 1.0, -0.1, True, "0.1"]),
  ("growth", [1.01, 4, 4.0], [1, 1.0, 4.01]),
  ("clip", [0, 0.0, 3.5], [-1e-9]),
  ("axis", [-1, 1, 8], [0, -2, True]),
  ("cap", [0, 2, 100], [1, -1]),
  ("head", [None, 1, 64], [0, 1.5]),
  ("mode", ["a", "b"], ["c", "", None]),
  ("split", ["test", "x"], ["", 1]),
  ("name", ["", "anything"], [None, 3]),
  ("on", [True, False], [0, 1, "True", None]),
]


@pytest.mark.parametrize("field, good, bad", CASES)
def test_a_value_is_allowed_exactly_when_its_type_and_bounds_hold(field, good, bad):
  for value in good:
    assert getattr(Example(**{field: value}), field) == value
  for value in bad:
    with pytest.raises(FieldError) as error:
      Example(**{field: value})
    assert str(error.value) == (
      f"example.{field} must be {WORDS[field]}; got {value!r} ({field})"
    ), value


def test_build_refuses_unknown_and_missing_names_and_names_the_section():
  values = schema.defaults(Example)
  assert schema.build(Example, values) == Example()
  with pytest.raises(FieldError, match="^cfg.stepz is not a known field; known fields: steps, "):
    schema.build(Example, {**values, "stepz": 1}, "cfg")
  with pytest.raises(FieldError, match="^cfg.seed is missing"):
    schema.build(Example, {k: v for k, v in values.items() if k != "seed"}, "cfg")
