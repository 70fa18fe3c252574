"""A reader of XLA's optimized HLO module text (`Compiled.as_text()`): its computations, their
instructions (name, shape, opcode, operands, attributes) in schedule order, the bytes of a shape,
and the Python source an instruction comes from.

It reads what the kernel reader (`kernels.py`) needs and no more: it does not
check the text, and it keeps an attribute's value as text (`attribute`, `json_attribute`).
"""

import dataclasses
import json
import math
import re

# Bits of an element type: the first number in its name (f32, bf16, s4, f8e4m3fn, c64), except:
_BITS = {"pred": 8, "token": 0, "opaque": 0}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_INSTRUCTION = re.compile(r"\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)")
_COMPUTATION = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s*->\s*.*\{\s*$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_OPEN, _CLOSE = "([{", ")]}"


def element_bits(element_type: str) -> int:
  if element_type in _BITS:
    return _BITS[element_type]
  digits = re.search(r"\d+", element_type)
  return int(digits[0]) if digits else 0


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """The arrays of a shape's text, `(element type, dimensions)` each: one for `f32[8,16]{1,0}`,
  one per element for a tuple `(f32[8], s8[1024])`. Bounded dynamic sizes (`<=8`) count
  their bound."""
  found = []
  for element_type, dims in _ARRAY.findall(shape):
    sizes = tuple(int(d.strip().lstrip("<=")) for d in dims.split(",") if d.strip())
    found.append((element_type, sizes))
  return found


def shape_bytes(shape: str) -> int:
  """Bytes of a shape's text: each array's elements times its element size, a tuple's summed."""
  return sum(
    math.ceil(math.prod(dims) * element_bits(element_type) / 8)
    for element_type, dims in arrays(shape)
  )


def _closing(text: str, start: int) -> int:
  """The index just past the bracket that closes the one at `start` (quotes respected)."""
  depth, quoted, index = 0, False, start
  while index < len(text):
    char = text[index]
    if quoted:
      if char == "\\":
        index += 1
      elif char == '"':
        quoted = False
    elif char == '"':
      quoted = True
    elif char in _OPEN:
      depth += 1
    elif char in _CLOSE:
      depth -= 1
      if depth == 0:
        return index + 1
    index += 1
  return len(text)


def _split_top_level(text: str) -> list[str]:
  """`text` split at the commas outside brackets and quotes."""
  parts, start, index = [], 0, 0
  while index < len(text):
    char = text[index]
    if char in _OPEN or char == '"':
      index = _closing(text, index) if char != '"' else _end_of_quote(text, index)
      continue
    if char == ",":
      parts.append(text[start:index].strip())
      start = index + 1
    index += 1
  parts.append(text[start:].strip())
  return [part for part in parts if part]


def _end_of_quote(text: str, start: int) -> int:
  index = start + 1
  while index < len(text) and text[index] != '"':
    index += 2 if text[index] == "\\" else 1
  return index + 1


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One line of a computation: `%name = shape opcode(operands), attributes`."""

  name: str
  shape: str
  opcode: str
  operands: tuple[str, ...]  # the names of the instructions it reads
  attributes: dict[str, str]  # key -> the value's text (`{...}`, `"..."`, `%name`, ...)
  arguments: str = ""  # the text between its opcode's parentheses (`0` of `parameter(0)`)

  def attribute(self, key: str) -> str:
    return self.attributes.get(key, "")

  def json_attribute(self, key: str) -> dict:
    """A JSON attribute (`backend_config`) as a dict; {} when absent or not JSON."""
    value = self.attribute(key)
    try:
      if value.startswith('"'):  # Older XLA writes it as a quoted string.
        value = json.loads(value)
      parsed = json.loads(value) if value else {}
    except json.JSONDecodeError:
      return {}
    return parsed if isinstance(parsed, dict) else {}

  def called(self, key: str) -> list[str]:
    """The computations an attribute names (`calls`, `body`, `branch_computations`, ...)."""
    return _OPERAND.findall(self.attribute(key))

  def metadata(self) -> dict[str, str]:
    """`op_name`, `source_file`, `source_line`, `stack_frame_id`, ... of the metadata."""
    return {
      k: v.strip('"')
      for k, v in re.findall(
        r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', self.attribute("metadata").strip("{}")
      )
    }


def parse_instruction(line: str) -> Instruction | None:
  """The instruction of one line of a computation's body, or None for anything else."""
  match = _INSTRUCTION.fullmatch(line)
  if match is None:
    return None
  name, rest = match[2], match[3]
  if rest.startswith("("):
    end = _closing(rest, 0)
  else:
    end = rest.find(" ")
    end = len(rest) if end < 0 else end
  shape, rest = rest[:end], rest[end:].lstrip()
  opcode = re.match(r"[\w\-]+", rest)
  if opcode is None or not rest[opcode.end() :].startswith("("):
    return None
  open_at = opcode.end()
  close_at = _closing(rest, open_at)
  arguments = rest[open_at + 1 : close_at - 1]
  operands = tuple(_OPERAND.findall(arguments))
  attributes = {}
  for part in _split_top_level(rest[close_at:].lstrip(", ")):
    key, _, value = part.partition("=")
    attributes[key.strip()] = value.strip()
  return Instruction(name, shape, opcode[0], operands, attributes, arguments.strip())


@dataclasses.dataclass
class Computation:
  name: str
  entry: bool
  instructions: list[Instruction]  # in the module's order: the schedule, when it is scheduled

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instructions}
    self.users = {}  # name -> the instructions that read it, in order
    for instruction in self.instructions:
      for operand in dict.fromkeys(instruction.operands):
        self.users.setdefault(operand, []).append(instruction)

  def parameters(self) -> dict[int, Instruction]:
    """The computation's parameters by number (`parameter(N)`)."""
    return {
      int(i.arguments): i
      for i in self.instructions
      if i.opcode == "parameter" and i.arguments.isdigit()
    }

  def shape_of(self, name: str) -> str:
    instruction = self.by_name.get(name)
    return instruction.shape if instruction else ""


@dataclasses.dataclass
class Module:
  """The computations of an HLO module's text and its stack frame index (if printed)."""

  computations: dict[str, Computation]
  frames: dict[str, dict[int, str]]  # section (FileNames, ...) -> id -> its text

  @property
  def entry(self) -> Computation:
    return next(c for c in self.computations.values() if c.entry)

  def source(self, metadata: dict[str, str]) -> str:
    """Where in Python an instruction comes from: `source_file:source_line` when the metadata
    has them, else the innermost frame of its `stack_frame_id`, followed by `via` the innermost
    frame outside installed packages where the two differ; "" when unknown."""
    if metadata.get("source_file"):
      return f"{_short(metadata['source_file'])}:{metadata.get('source_line', '?')}"
    frames = list(self._stack(int(metadata.get("stack_frame_id", 0) or 0)))
    if not frames:
      return ""
    own = next((f for f in frames if "-packages/" not in f[0]), frames[0])
    text = _frame_text(frames[0])
    return text if own is frames[0] else f"{text} via {_frame_text(own)}"

  def _stack(self, frame_id: int):
    """(file, line, function) of a stack frame and its callers, innermost first. The text gives
    a frame's parent as its id + 1 (0: none)."""
    seen = set()
    while frame_id and frame_id not in seen and frame_id in self.frames["StackFrames"]:
      seen.add(frame_id)
      frame = _numbers(self.frames["StackFrames"][frame_id])
      location = _numbers(self.frames["FileLocations"].get(frame.get("file_location_id", 0), ""))
      yield (
        self.frames["FileNames"].get(location.get("file_name_id", 0), "?").strip('"'),
        location.get("line", 0),
        self.frames["FunctionNames"].get(location.get("function_name_id", 0), "?").strip('"'),
      )
      frame_id = frame.get("parent_frame_id", 0) - 1


def _numbers(text: str) -> dict[str, int]:
  return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}


def _short(path: str) -> str:
  """A source path without the part that differs between machines."""
  for marker in ("-packages/", "/transformer_jax/"):
    if marker in path:
      return ("transformer_jax/" if marker[0] == "/" else "") + path.rsplit(marker, 1)[1]
  return path


def _frame_text(frame: tuple[str, int, str]) -> str:
  return f"{_short(frame[0])}:{frame[1]} ({frame[2]})"


def parse_module(text: str) -> Module:
  """The module of an HLO text: its computations (the entry one marked) and stack frames."""
  computations, frames = {}, {section: {} for section in _SECTIONS}
  current, section = None, None
  for line in text.splitlines():
    if line in _SECTIONS:
      section = line
      continue
    if section and line and line[0].isdigit():
      number, _, rest = line.partition(" ")
      frames[section][int(number)] = rest
      continue
    section = None
    if current is None:
      match = _COMPUTATION.match(line)
      if match:
        current, body = (match[2], bool(match[1])), []
      continue
    if line.strip() == "}":
      computations[current[0]] = Computation(current[0], current[1], body)
      current = None
      continue
    instruction = parse_instruction(line)
    if instruction is not None:
      body.append(instruction)
  return Module(computations, frames)
