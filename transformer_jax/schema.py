"""Typed settings: frozen dataclasses whose fields each declare once a default, a help and what
they allow.

A field's type is its annotation (`int`, `float`, `str`, `bool`, or one of them `| None`); what
it allows beyond its type is data (`Allowed`: bounds, a multiple, choices, values allowed besides
the bounds), from which both the check and the words of its help are made. A settings class
declares its fields with `setting` and calls `check(self, owner)` in `__post_init__`, so that an
instance exists only with valid values; an invalid one raises FieldError naming `owner.field`.
`build` makes an instance from a mapping of plain values (a config file's section), refusing
unknown and missing names; a field declared with `group` is a settings class whose fields sit
beside its owner's in that mapping, and one declared with `section` a settings class of its own
sub-mapping. A class may declare `MOVED` (a ClassVar `{old name: new path}`), settings it once
had that are now elsewhere: `build` refuses an old name with one line naming its new path, and
`moved` lists them all. `defaults` and `describe` list what a class declares, for a config
file's defaults and the reference of every setting.
"""

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from transformer_jax.errors import FieldError

_META = "schema"
_NOUNS = {bool: "True or False", int: "integer", float: "number", str: "string"}


@dataclasses.dataclass(frozen=True)
class Allowed:
  """What a setting allows beyond its type: bounds (`gt`, `ge`, `lt`, `le`), a `multiple_of`,
  `choices`, values allowed besides the bounds (`also`), `nonempty` text, and what some values
  mean (`means`, e.g. `{0: "off"}`)."""

  gt: float | None = None
  ge: float | None = None
  lt: float | None = None
  le: float | None = None
  multiple_of: int | None = None
  choices: tuple | Mapping = ()
  also: tuple = ()
  nonempty: bool = False
  means: tuple[tuple[Any, str], ...] = ()

  def admits(self, value) -> bool:
    """Whether `value`, of the field's type, is allowed."""
    if value in self.also:
      return True
    if self.choices:
      return value in self.choices
    bounds = (
      (self.gt, lambda b: value > b),
      (self.ge, lambda b: value >= b),
      (self.lt, lambda b: value < b),
      (self.le, lambda b: value <= b),
    )
    if not all(bound is None or holds(bound) for bound, holds in bounds):
      return False
    if self.multiple_of and value % self.multiple_of:
      return False
    return not (self.nonempty and value == "")

  def words(self, kind: type, optional: bool = False) -> str:
    """What a field of type `kind` (`optional`: or None) allows, in words: 'a number in [0, 1)',
    'an even positive integer', "'tokens' or 'packed'", 'a positive integer or -1 (-1 = the rest
    of the devices)'."""
    if self.choices:
      text = " or ".join(repr(c) for c in self.choices)
    elif kind is bool:
      text = _NOUNS[bool]
    else:
      text = self._numbers(kind) if kind in (int, float) else "a string"
      if self.nonempty:
        text = "a non-empty string"
    text += "".join(f" or {value!r}" for value in self.also + (None,) * optional)
    if self.means:
      text += f" ({', '.join(f'{value!r} = {meaning}' for value, meaning in self.means)})"
    return text

  def _numbers(self, kind: type) -> str:
    noun = _NOUNS[kind]
    low = (self.gt, "(", ">") if self.gt is not None else (self.ge, "[", ">=")
    high = (self.lt, ")", "<") if self.lt is not None else (self.le, "]", "<=")
    if kind is int and high[0] is None and (self.gt == 0 or self.ge == 1):
      if self.multiple_of in (None, 2):
        return "an even positive integer" if self.multiple_of else "a positive integer"
      return f"a positive multiple of {self.multiple_of}"
    article = "an" if noun == "integer" else "a"
    if low[0] is not None and high[0] is not None:
      return f"{article} {noun} in {low[1]}{low[0]:g}, {high[0]:g}{high[1]}"
    for bound, _, sign in (low, high):
      if bound is not None:
        return f"{article} {noun} {sign} {bound:g}"
    return f"{article} {noun}"


@dataclasses.dataclass(frozen=True)
class Declared:
  """What one field allows and what it is for (`help`)."""

  allowed: Allowed
  help: str


def setting(default: Any, help_: str, **allowed):
  """A settings field: its default, its help and what it allows (the fields of `Allowed`; `means`
  may be a dict). `choices` may be a mapping: its keys, as they are when a value is checked (a
  table that grows)."""
  if isinstance(allowed.get("means"), dict):
    allowed["means"] = tuple(allowed["means"].items())
  for name in ("choices", "also"):
    if name in allowed and not (name == "choices" and isinstance(allowed[name], Mapping)):
      allowed[name] = tuple(allowed[name])
  return dataclasses.field(default=default, metadata={_META: Declared(Allowed(**allowed), help_)})


def section(cls: type):
  """A field holding settings class `cls`, a sub-mapping of its own in `build`."""
  return dataclasses.field(default_factory=cls, metadata={_META: "section"})


def group(cls: type):
  """A field holding settings class `cls`, whose fields sit beside its owner's in `build`."""
  return dataclasses.field(default_factory=cls, metadata={_META: "group"})


def declared(field: dataclasses.Field) -> Declared | str | None:
  """A field's declaration: `Declared`, "section", "group", or None (not a setting)."""
  return field.metadata.get(_META)


def kind_of(field: dataclasses.Field) -> tuple[type, bool]:
  """(the type of `field`'s annotation, whether it also allows None)."""
  annotation = field.type
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return members[0], len(members) < len(typing.get_args(annotation))
  return annotation, False


def _of_kind(value, kind: type) -> bool:
  if kind is bool:
    return isinstance(value, bool)
  if isinstance(value, bool):  # True is an int in Python, not a number here.
    return False
  return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def allowed_words(field: dataclasses.Field) -> str:
  """What `field` allows, in words (its type, bounds and choices)."""
  return declared(field).allowed.words(*kind_of(field))


def check(instance, owner: str) -> None:
  """FieldError naming `owner.field` for the first declared field whose value it does not allow."""
  for field in dataclasses.fields(instance):
    spec = declared(field)
    if not isinstance(spec, Declared):
      continue
    value = getattr(instance, field.name)
    kind, optional = kind_of(field)
    if optional and value is None:
      continue
    if not (_of_kind(value, kind) and spec.allowed.admits(value)):
      raise FieldError(
        owner, field.name, f" must be {allowed_words(field)}; got {value!r} ({spec.help})"
      )


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
    if name in getattr(cls, "MOVED", {}):
      raise FieldError(owner, name, f" is now {FieldError(owner, cls.MOVED[name], '').path}")
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


def moved(cls: type, prefix: str = "") -> dict[str, str]:
  """`{old path: new path}` of the settings that `cls` and its sections declare `MOVED`."""
  out = {prefix + old: prefix + new for old, new in getattr(cls, "MOVED", {}).items()}
  for field, spec in _read(cls):
    if spec == "section":
      out.update(moved(field.type, f"{prefix}{field.name}."))
  return out


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
      out.append((prefix + field.name, field.default, allowed_words(field), spec.help))
  return out
