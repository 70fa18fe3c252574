"""Typed settings: frozen dataclasses whose fields each declare a default, what they allow, a help.

A settings class declares its fields with `setting` (or the shorthands
`count`, `number`, `choice`, `flag`, `text`) and calls `check(self, owner)`
in `__post_init__`, so that an instance exists only with valid values; an
invalid one raises FieldError naming `owner.field`. `build` makes an instance
from a mapping of plain values (a config file's section), refusing unknown
and missing names; a field declared with `group` is a settings class whose
fields sit beside its owner's in that mapping, and one declared with
`section` a settings class of its own sub-mapping. `defaults` and
`describe` list what a class declares, for a config file's defaults and the
reference of every setting.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from transformer_jax.errors import FieldError

_META = "schema"


@dataclasses.dataclass(frozen=True)
class Declared:
  """What one field allows (`check`, described by `allowed`) and what it is for (`help`)."""

  allowed: str
  check: Callable[[Any], bool]
  help: str


def setting(default: Any, allowed: str, check: Callable[[Any], bool], help_: str):
  """A settings field: its default, the values it allows and its help."""
  return dataclasses.field(default=default, metadata={_META: Declared(allowed, check, help_)})


def is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def count(default: int, help_: str, *, minimum: int = 1, zero: str = ""):
  """An integer field >= `minimum` (1 unless given; `zero` says what 0 means when it is allowed)."""
  if minimum == 1:
    allowed = "a positive integer"
  elif minimum == 0 and zero:
    allowed = f"an integer >= 0 (0 = {zero})"
  else:
    allowed = f"an integer >= {minimum}"
  return setting(default, allowed, lambda v: is_int(v) and v >= minimum, help_)


def number(default: float, help_: str, allowed: str, check: Callable[[float], bool]):
  """A real-number field allowed where `check` holds (`allowed` says where in words)."""
  return setting(default, allowed, lambda v: is_number(v) and check(v), help_)


def choice(default: str, help_: str, *choices: str):
  """A field that is one of `choices`."""
  return setting(default, " or ".join(repr(c) for c in choices), lambda v: v in choices, help_)


def flag(default: bool, help_: str):
  """A True-or-False field."""
  return setting(default, "True or False", lambda v: isinstance(v, bool), help_)


def text(default: str, help_: str, allowed: str = "a string"):
  """A string field (any string)."""
  return setting(default, allowed, lambda v: isinstance(v, str), help_)


def section(cls: type):
  """A field holding settings class `cls`, a sub-mapping of its own in `build`."""
  return dataclasses.field(default_factory=cls, metadata={_META: "section"})


def group(cls: type):
  """A field holding settings class `cls`, whose fields sit beside its owner's in `build`."""
  return dataclasses.field(default_factory=cls, metadata={_META: "group"})


def declared(field: dataclasses.Field) -> Declared | str | None:
  """A field's declaration: `Declared`, "section", "group", or None (not a setting)."""
  return field.metadata.get(_META)


def check(instance, owner: str) -> None:
  """FieldError naming `owner.field` for the first declared field whose value it does not allow."""
  for field in dataclasses.fields(instance):
    spec = declared(field)
    value = getattr(instance, field.name)
    if isinstance(spec, Declared) and not spec.check(value):
      raise FieldError(owner, field.name, f" must be {spec.allowed}; got {value!r} ({spec.help})")


def _read(cls: type) -> list[tuple[dataclasses.Field, Declared | str]]:
  """(field, declaration) of every setting and section `build` reads for `cls`, the fields of its
  groups in their place."""
  out = []
  for field in dataclasses.fields(cls):
    spec = declared(field)
    if spec == "group":
      out += _read(field.type)
    elif spec is not None:
      out.append((field, spec))
  return out


def names(cls: type) -> list[str]:
  """The names `build` reads for `cls`: its settings and sections, and the fields of its groups."""
  return [field.name for field, _ in _read(cls)]


def build(cls: type, values: Mapping, owner: str = ""):
  """The `cls` of `values` (plain values; a section's value a mapping).

  FieldError naming `owner.name` for a name `cls` does not declare or one it
  declares that is missing; the class's own checks raise for invalid values,
  named inside its section.
  """
  known = names(cls)
  for name in values:
    if name not in known:
      raise FieldError(owner, name, f" is not a known field; known fields: {', '.join(known)}")
  for name in known:
    if name not in values:
      raise FieldError(owner, name, " is missing")
  arguments = {}
  for field in dataclasses.fields(cls):
    spec = declared(field)
    if spec == "group":
      arguments[field.name] = _named(field, owner, {n: values[n] for n in names(field.type)})
    elif spec == "section":
      if not isinstance(values[field.name], Mapping):
        raise FieldError(
          owner, field.name, f" must be a section of fields; got {values[field.name]!r}"
        )
      arguments[field.name] = _named(
        field, FieldError(owner, field.name, "").path, values[field.name]
      )
    elif spec is not None:
      arguments[field.name] = values[field.name]
  return cls(**arguments)


def _named(field: dataclasses.Field, path: str, values: Mapping):
  """`build` of the section or group `field` at `path` (a group's is its owner's), the errors of
  its class's own checks (owner: the field's name) named from there."""
  try:
    return build(field.type, values, path)
  except FieldError as error:
    if error.owner != field.name:
      raise
    raise FieldError(path, error.field, error.detail) from None


def defaults(cls: type) -> dict:
  """`{name: declared default}` of `cls` as `build` reads it (groups flattened, sections nested)."""
  return {
    field.name: defaults(field.type) if spec == "section" else field.default
    for field, spec in _read(cls)
  }


def describe(cls: type, prefix: str = "") -> list[tuple[str, Any, str, str]]:
  """`(path, default, allowed, help)` of every setting of `cls`, for a reference of them."""
  out = []
  for field, spec in _read(cls):
    if spec == "section":
      out += describe(field.type, f"{prefix}{field.name}.")
    else:
      out.append((prefix + field.name, field.default, spec.allowed, spec.help))
  return out
