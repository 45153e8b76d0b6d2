"""Reading XLA HLO module text (`compiled.as_text()`) and finding its copies.

Pure text: this module imports nothing from JAX, so it can be tested on handwritten HLO
and can read text saved from any machine (GPU text on a CPU-only host, say).

Contract: `inspect_hlo(text)` returns every `copy` and every `copy-start`/`copy-done` pair
of every module in `text`, each with its size, the role of the computation it sits in,
what it copies and the user source line responsible. It never claims to have seen every
copy of text it did not fully understand: any line it cannot parse, a computation that
never closes, a module without an ENTRY computation or a reference to a computation
that is not there all end up in `problems`, and then `verified` is False.

The format followed is the one `HloModule::ToString` prints (XLA 2025-2026): a header
line `HloModule name, key=value, ...`, optional source tables (`FileNames`,
`FunctionNames`, `FileLocations`, `StackFrames`), then computations
`[ENTRY ]%name (params) -> shape {` ... `}`, one instruction a line:
`[ROOT ]%name = shape opcode(operands), key=value, ...`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from ._report import CopyInfo, SourceLocation

# --------------------------------------------------------------------------- shapes

# HLO primitive type -> (numpy dtype name, bytes per element as XLA stores it unpacked).
# Sub-byte types take a byte each unless the layout packs them (`E(4)`), see `nbytes`.
_DTYPES: dict[str, tuple[str, int]] = {
    "pred": ("bool", 1),
    "s2": ("int2", 1), "s4": ("int4", 1), "s8": ("int8", 1), "s16": ("int16", 2),
    "s32": ("int32", 4), "s64": ("int64", 8),
    "u2": ("uint2", 1), "u4": ("uint4", 1), "u8": ("uint8", 1), "u16": ("uint16", 2),
    "u32": ("uint32", 4), "u64": ("uint64", 8),
    "f16": ("float16", 2), "bf16": ("bfloat16", 2), "f32": ("float32", 4),
    "f64": ("float64", 8),
    "c64": ("complex64", 8), "c128": ("complex128", 16),
    "f8e4m3fn": ("float8_e4m3fn", 1), "f8e5m2": ("float8_e5m2", 1),
    "f8e4m3fnuz": ("float8_e4m3fnuz", 1), "f8e5m2fnuz": ("float8_e5m2fnuz", 1),
    "f8e4m3b11fnuz": ("float8_e4m3b11fnuz", 1), "f8e4m3": ("float8_e4m3", 1),
    "f8e3m4": ("float8_e3m4", 1), "f8e8m0fnu": ("float8_e8m0fnu", 1),
    "f4e2m1fn": ("float4_e2m1fn", 1),
    # Not arrays of numbers; they hold no data a copy could move.
    "token": ("token", 0), "opaque": ("opaque", 0),
}

_ELEMENT_BITS_RE = re.compile(r"E\((\d+)\)")


class HloParseError(ValueError):
  """Text that does not follow the HLO format this module knows."""


@dataclass(frozen=True)
class ArrayShape:
  """An HLO array shape such as `f32[100,100]{1,0}`."""
  element_type: str
  dims: tuple[int, ...]
  layout: str = ""

  @property
  def dtype(self) -> str:
    return _DTYPES[self.element_type][0]

  @property
  def nbytes(self) -> int:
    n = math.prod(self.dims)
    # A layout such as `{0:E(4)}` packs sub-byte elements; XLA then stores n*bits/8.
    m = _ELEMENT_BITS_RE.search(self.layout)
    if m:
      return (n * int(m.group(1)) + 7) // 8
    return n * _DTYPES[self.element_type][1]


@dataclass(frozen=True)
class TupleShape:
  """An HLO tuple shape such as `(f32[2]{0}, s32[])`."""
  elements: tuple[Shape, ...]


Shape = ArrayShape | TupleShape


def is_token(shape: Shape) -> bool:
  """Whether `shape` is `token[]` (an effect token JAX threads through)."""
  return isinstance(shape, ArrayShape) and shape.element_type == "token"

_ARRAY_RE = re.compile(r"^([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?$")


def parse_shape(text: str) -> Shape:
  """Parses `f32[10,20]{1,0}`, `pred[]`, `(f32[2], (s32[], u32[]))`, `f32[<=8]`.

  Raises:
    HloParseError: on anything else, including unknown element types and unbounded
      dynamic dimensions (`f32[?]`), whose size cannot be known from the text.
  """
  s = text.strip()
  if s.startswith("("):
    if _match_close(s, 0) != len(s) - 1:
      raise HloParseError(f"unbalanced tuple shape {text!r}")
    inner = s[1:-1].strip()
    if not inner:
      return TupleShape(())
    return TupleShape(tuple(parse_shape(p) for p in _split_top(inner)))
  m = _ARRAY_RE.match(s)
  if not m:
    raise HloParseError(f"not an HLO shape: {text!r}")
  etype, dims_text, layout = m.group(1), m.group(2).strip(), m.group(3) or ""
  if etype not in _DTYPES:
    raise HloParseError(f"unknown element type {etype!r} in {text!r}")
  dims: list[int] = []
  if dims_text:
    for d in dims_text.split(","):
      d = d.strip()
      if d.startswith("<="):  # bounded dynamic dimension: the buffer holds the bound
        d = d[2:]
      if not d.isdigit():
        raise HloParseError(f"dimension {d!r} of {text!r} has no static size")
      dims.append(int(d))
  return ArrayShape(etype, tuple(dims), layout)


# --------------------------------------------------------------------------- lexing

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}


# The characters the lexers act on; everything between them is skipped at once.
_BRACKETS = re.compile(r'["()\[\]{}]')
_COMMAS = re.compile(r'["()\[\]{},]')
_SPACES = re.compile(r'["()\[\]{}\s]')
_STRING_END = re.compile(r'["\\]')


def _match_close(s: str, start: int) -> int:
  """Index of the bracket closing the one at `s[start]`, or -1; skips quoted text."""
  depth = 0
  i = start
  search = _BRACKETS.search
  while (m := search(s, i)) is not None:
    i = m.start()
    ch = s[i]
    if ch == '"':
      i = _skip_string(s, i)
      continue
    if ch in _OPEN:
      depth += 1
    else:
      depth -= 1
      if depth == 0:
        return i
      if depth < 0:
        return -1
    i += 1
  return -1


def _skip_string(s: str, i: int) -> int:
  """Index just past the double-quoted string starting at `s[i]`."""
  i += 1
  search = _STRING_END.search
  while (m := search(s, i)) is not None:
    i = m.start()
    if s[i] == "\\":
      i += 2
      continue
    return i + 1
  raise HloParseError("unterminated string")


def _split_top(s: str, sep: str = ",") -> list[str]:
  """Splits at `sep` outside brackets and strings."""
  pattern = _COMMAS if sep == "," else re.compile(f'["()\\[\\]{{}}{re.escape(sep)}]')
  parts: list[str] = []
  depth = 0
  start = 0
  i = 0
  search = pattern.search
  while (m := search(s, i)) is not None:
    i = m.start()
    ch = s[i]
    if ch == '"':
      i = _skip_string(s, i)
      continue
    if ch in _OPEN:
      depth += 1
    elif ch in _CLOSE:
      depth -= 1
      if depth < 0:
        raise HloParseError(f"unbalanced brackets in {s!r}")
    elif depth == 0:
      parts.append(s[start:i].strip())
      start = i + 1
    i += 1
  if depth != 0:
    raise HloParseError(f"unbalanced brackets in {s!r}")
  parts.append(s[start:].strip())
  return parts


def _take_token(s: str) -> tuple[str, str]:
  """Splits off a leading shape: up to the first whitespace outside brackets."""
  depth = 0
  i = 0
  search = _SPACES.search
  while (m := search(s, i)) is not None:
    i = m.start()
    ch = s[i]
    if ch == '"':
      i = _skip_string(s, i)
      continue
    if ch in _OPEN:
      depth += 1
    elif ch in _CLOSE:
      depth -= 1
    elif depth == 0:
      return s[:i], s[i:]
    i += 1
  return s, ""


def _strip_comments(s: str) -> str:
  """Removes `/* ... */` outside double-quoted strings."""
  if "/*" not in s:
    return s
  out: list[str] = []
  i = 0
  while i < len(s):
    if s[i] == '"':
      j = _skip_string(s, i)
      out.append(s[i:j])
      i = j
    elif s.startswith("/*", i):
      j = s.find("*/", i + 2)
      if j < 0:
        raise HloParseError("unterminated comment")
      i = j + 2
    else:
      out.append(s[i])
      i += 1
  return "".join(out)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "?": "?"}


def unescape(s: str) -> str:
  """Undoes absl's `CEscape`, which XLA applies to strings (octal for non-ASCII bytes)."""
  if "\\" not in s:
    return s
  out = bytearray()
  i = 0
  while i < len(s):
    ch = s[i]
    if ch == "\\" and i + 1 < len(s):
      nxt = s[i + 1]
      if nxt in "01234567":
        j = i + 1
        while j < len(s) and j < i + 4 and s[j] in "01234567":
          j += 1
        out.append(int(s[i + 1:j], 8) & 0xFF)
        i = j
        continue
      if nxt == "x":
        m = re.match(r"[0-9a-fA-F]{1,2}", s[i + 2:])
        if m:
          out.append(int(m.group(0), 16))
          i += 2 + len(m.group(0))
          continue
      out += _ESCAPES.get(nxt, nxt).encode()
      i += 2
      continue
    out += ch.encode()
    i += 1
  return out.decode("utf-8", errors="replace")


# key="quoted \"string\"" | key={braced list} | key=bare
_KV_RE = re.compile(r'([\w.\-]+)=("(?:[^"\\]|\\.)*"|\{[^{}]*\}|[^\s{}]+)')


def parse_metadata(value: str) -> dict[str, str]:
  """`{op_name="jit(f)/add" stack_frame_id=2}` -> {"op_name": "jit(f)/add", ...}."""
  v = value.strip()
  if not (v.startswith("{") and v.endswith("}")):
    raise HloParseError(f"metadata is not a braced list: {value!r}")
  inner = v[1:-1]
  out: dict[str, str] = {}
  for m in _KV_RE.finditer(inner):
    val = m.group(2)
    out[m.group(1)] = unescape(val[1:-1]) if val.startswith('"') else val
  # Anything left over means a form we do not know; refuse rather than guess.
  rest = _KV_RE.sub("", inner).strip()
  if rest:
    raise HloParseError(f"unexpected text {rest!r} in metadata")
  return out


# --------------------------------------------------------------------------- structure


@dataclass(frozen=True, eq=False)
class Instruction:
  """One HLO instruction line."""
  name: str
  shape_text: str
  shape: Shape
  opcode: str
  operands: tuple[str, ...]
  operand_text: str
  attributes: dict[str, str]
  metadata: dict[str, str]
  is_root: bool
  index: int
  lineno: int
  line: str


@dataclass(eq=False)
class Computation:
  """One HLO computation: its instructions in text (schedule) order."""
  name: str
  is_entry: bool
  lineno: int
  instructions: list[Instruction] = field(default_factory=list)
  by_name: dict[str, Instruction] = field(default_factory=dict)
  users: dict[str, list[Instruction]] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
  """A reference to a computation from an instruction (`body=`, `calls=`, ...)."""
  caller: Computation
  instruction: Instruction
  key: str
  position: int


@dataclass(frozen=True)
class Alias:
  """One entry of `input_output_alias`: output `{1}` reuses parameter 0 at `{}`."""
  output_index: tuple[int, ...]
  parameter: int
  parameter_index: tuple[int, ...]
  kind: str


@dataclass(eq=False)
class HloModule:
  """One parsed `HloModule`."""
  name: str
  lineno: int
  attributes: dict[str, str] = field(default_factory=dict)
  computations: dict[str, Computation] = field(default_factory=dict)
  entry: Computation | None = None
  file_names: dict[int, str] = field(default_factory=dict)
  function_names: dict[int, str] = field(default_factory=dict)
  file_locations: dict[int, dict[str, int]] = field(default_factory=dict)
  stack_frames: dict[int, dict[str, int]] = field(default_factory=dict)
  aliases: tuple[Alias, ...] = ()
  callers: dict[str, list[Call]] = field(default_factory=dict)
  roles: dict[str, str] = field(default_factory=dict)

  def entry_parameters(self) -> dict[int, Instruction]:
    """ENTRY parameter number -> its `parameter` instruction."""
    if self.entry is None:
      return {}
    return {
        int(i.operand_text): i
        for i in self.entry.instructions
        if i.opcode == "parameter" and i.operand_text.strip().isdigit()
    }

  @functools.cached_property
  def arguments(self) -> dict[int, str]:
    """Each entry parameter's argument name as JAX gives it (its `op_name`), else
    `parameter k`, by parameter number."""
    return {k: p.metadata.get("op_name") or f"parameter {k}"
            for k, p in self.entry_parameters().items()}

  @functools.cached_property
  def argument_names(self) -> frozenset[str]:
    """The `op_name`s of the entry parameters: the argument names JAX gives them.
    XLA copies a parameter's metadata onto what it makes of it (a bitcast in a
    fusion), where the name names no operation."""
    return frozenset(p.metadata["op_name"] for p in self.entry_parameters().values()
                     if "op_name" in p.metadata)

  def _entry_root(self) -> Instruction | None:
    """The entry computation's result instruction (its last, where none is
    marked ROOT); None without an entry."""
    if self.entry is None or not self.entry.instructions:
      return None
    roots = [i for i in self.entry.instructions if i.is_root]
    return roots[0] if roots else self.entry.instructions[-1]

  def entry_result_is_tuple(self) -> bool:
    root = self._entry_root()
    return root is not None and isinstance(root.shape, TupleShape)

  @functools.cached_property
  def leading_tokens(self) -> int:
    """How many effect tokens open the entry's result tuple: JAX passes one per
    ordered effect (`io_callback(..., ordered=True)`) before the function's
    outputs, in parameters and results alike."""
    root = self._entry_root()
    if root is None or not isinstance(root.shape, TupleShape):
      return 0
    n = 0
    for e in root.shape.elements:
      if not is_token(e):
        break
      n += 1
    return n

  def output_number(self, k: int) -> int:
    """The function's output number (its flat output leaf) of entry result
    position `k`."""
    return k - self.leading_tokens

  def aliased_outputs(self) -> dict[str, int]:
    """Entry instructions whose results are outputs aliased to a parameter (they are
    written into that parameter's buffer), looked up through tuples and bitcasts,
    with the parameter's number."""
    entry = self.entry
    if entry is None or not entry.instructions:
      return {}
    roots = [i for i in entry.instructions if i.is_root] or entry.instructions[-1:]
    out: dict[str, int] = {}
    for alias in self.aliases:
      if alias.parameter_index != ():
        continue
      ins: Instruction | None = roots[0]
      path = list(alias.output_index)
      while ins is not None and ins.operands and (
          ins.opcode == "bitcast" or (ins.opcode == "tuple" and path)):
        ins = entry.by_name.get(ins.operands[path.pop(0)] if ins.opcode == "tuple"
                                else ins.operands[0])
      if ins is not None and not (ins.opcode == "tuple" and path):
        out[ins.name] = alias.parameter
    return out

  def location(self, ins: Instruction) -> SourceLocation | None:
    """User source of `ins` from its `stack_frame_id`, else `source_file`/`source_line`."""
    md = ins.metadata
    frame_id = md.get("stack_frame_id")
    if frame_id is not None and frame_id.isdigit():
      # The frame `stack_frame_id` names is the innermost user frame (JAX drops its own
      # frames before writing the table); its parents are the callers, not wanted here.
      frame = self.stack_frames.get(int(frame_id))
      loc = self.file_locations.get(frame.get("file_location_id", -1)) if frame else None
      if loc is not None and loc.get("file_name_id") in self.file_names:
        fn = self.function_names.get(loc.get("function_name_id", -1))
        return SourceLocation(self.file_names[loc["file_name_id"]], loc.get("line", 0), fn)
    if "source_file" in md and md.get("source_line", "").isdigit():
      return SourceLocation(md["source_file"], int(md["source_line"]), None)
    return None


@dataclass(frozen=True)
class HloInspection:
  """Everything `inspect_hlo` learned from a text."""
  modules: tuple[HloModule, ...]
  copies: tuple[CopyInfo, ...]
  problems: tuple[str, ...]

  @property
  def verified(self) -> bool:
    return bool(self.modules) and not self.problems


# --------------------------------------------------------------------------- parsing

_INSTR_RE = re.compile(r"^(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE_RE = re.compile(r"^\s*([a-z][a-z0-9\-_]*)\(")
_NAME_RE = re.compile(r"^[\w.\-]+$")
_COMP_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*)?\{$")
# Source tables XLA prints between the header and the computations. An unknown one is
# refused (unverified) rather than skipped: a truncated header could look like one.
_TABLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
_TABLE_STR_RE = re.compile(r'^(\d+)\s+"((?:[^"\\]|\\.)*)"$')
_TABLE_REC_RE = re.compile(r"^(\d+)\s+\{(.*)\}$")
_INT_KV_RE = re.compile(r"(\w+)=(-?\d+)")
# Opcodes whose parentheses hold a literal, not operand names.
_LITERAL_OPCODES = frozenset({"parameter", "constant"})


def parse_instruction(line: str, index: int = 0, lineno: int = 0) -> Instruction:
  """Parses one instruction line.

  Raises:
    HloParseError: when the line is not an instruction in a form known here.
  """
  text = line.strip()
  # Long tuples and operand lists carry `/*index=5*/` markers; they are not content.
  m = _INSTR_RE.match(_strip_comments(text))
  if not m:
    raise HloParseError("not an instruction")
  is_root, name, rest = bool(m.group(1)), m.group(2), m.group(3)
  shape_text, rest = _take_token(rest)
  shape = parse_shape(shape_text)
  m = _OPCODE_RE.match(rest)
  if not m:
    raise HloParseError(f"no opcode after the shape of {name}")
  opcode = m.group(1)
  open_at = rest.index("(", m.start(1))
  close_at = _match_close(rest, open_at)
  if close_at < 0:
    raise HloParseError(f"operand list of {name} does not close")
  operand_text = rest[open_at + 1:close_at]
  tail = rest[close_at + 1:].strip()
  operands: list[str] = []
  if opcode not in _LITERAL_OPCODES and operand_text.strip():
    for piece in _split_top(operand_text):
      # Operands print as `%x` or, with operand shapes on, `f32[2]{0} %x`.
      ref = piece.rsplit("%", 1)[1] if "%" in piece else piece.split()[-1] if piece else ""
      ref = ref.strip()
      if not _NAME_RE.match(ref):
        raise HloParseError(f"operand {piece!r} of {name} is not an instruction name")
      operands.append(ref)
  attributes: dict[str, str] = {}
  if tail:
    if not tail.startswith(","):
      raise HloParseError(f"unexpected {tail[:40]!r} after the operands of {name}")
    for piece in _split_top(tail[1:]):
      key, eq, value = piece.partition("=")
      if not eq or not _NAME_RE.match(key.strip()):
        raise HloParseError(f"attribute {piece[:60]!r} of {name} is not key=value")
      attributes[key.strip()] = value.strip()
  metadata = parse_metadata(attributes["metadata"]) if "metadata" in attributes else {}
  return Instruction(name=name, shape_text=shape_text, shape=shape, opcode=opcode,
                     operands=tuple(operands), operand_text=operand_text,
                     attributes=attributes, metadata=metadata, is_root=is_root,
                     index=index, lineno=lineno, line=text)


def _parse_aliases(value: str) -> tuple[Alias, ...]:
  """`{ {0}: (0, {}, may-alias), {1}: (1, {}) }` -> aliases."""
  v = value.strip()
  if not (v.startswith("{") and v.endswith("}")):
    raise HloParseError(f"input_output_alias is not a braced list: {value!r}")
  inner = v[1:-1].strip()
  out = []
  if not inner:
    return ()
  entry_re = re.compile(
      r"^\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}\s*(?:,\s*([\w\-]+)\s*)?\)$")
  for piece in _split_top(inner):
    m = entry_re.match(piece)
    if not m:
      raise HloParseError(f"input_output_alias entry {piece!r} not understood")
    out.append(Alias(_index(m.group(1)), int(m.group(2)), _index(m.group(3)),
                     m.group(4) or "may-alias"))
  return tuple(out)


def _index(s: str) -> tuple[int, ...]:
  return tuple(int(p) for p in s.replace(" ", "").split(",") if p)


def _parse_header(line: str, lineno: int) -> HloModule:
  body = line.strip()[len("HloModule"):].strip()
  name, _, rest = body.partition(",")
  module = HloModule(name=name.strip(), lineno=lineno)
  if rest.strip():
    for piece in _split_top(rest):
      key, eq, value = piece.partition("=")
      if not eq:
        raise HloParseError(f"module attribute {piece[:60]!r} is not key=value")
      module.attributes[key.strip()] = value.strip()
  if "input_output_alias" in module.attributes:
    module.aliases = _parse_aliases(module.attributes["input_output_alias"])
  return module


def _parse_table_entry(module: HloModule, table: str, s: str) -> None:
  if table in ("FileNames", "FunctionNames"):
    m = _TABLE_STR_RE.match(s)
    if not m:
      raise HloParseError(f"{table} entry not understood")
    names = module.file_names if table == "FileNames" else module.function_names
    names[int(m.group(1))] = unescape(m.group(2))
  elif table in ("FileLocations", "StackFrames"):
    m = _TABLE_REC_RE.match(s)
    if not m:
      raise HloParseError(f"{table} entry not understood")
    rec = {k: int(v) for k, v in _INT_KV_RE.findall(m.group(2))}
    records = module.file_locations if table == "FileLocations" else module.stack_frames
    records[int(m.group(1))] = rec


def parse_hlo(text: str) -> tuple[tuple[HloModule, ...], list[str]]:
  """Parses every module in `text`; returns the modules and the problems met."""
  problems: list[str] = []
  modules: list[HloModule] = []
  module: HloModule | None = None
  comp: Computation | None = None
  table: str | None = None

  def problem(lineno: int, msg: str, line: str) -> None:
    shown = line.strip()
    shown = shown if len(shown) <= 160 else shown[:157] + "..."
    problems.append(f"line {lineno}: {msg}: {shown!r}")

  for lineno, raw in enumerate(text.splitlines(), start=1):
    s = raw.strip()
    if comp is not None:
      if s == "}":
        comp = None
        continue
      if not s:
        continue
      try:
        ins = parse_instruction(raw, len(comp.instructions), lineno)
      except HloParseError as e:
        problem(lineno, f"instruction not understood ({e})", raw)
        continue
      if ins.name in comp.by_name:
        problem(lineno, f"instruction {ins.name} defined twice", raw)
      comp.instructions.append(ins)
      comp.by_name[ins.name] = ins
      continue
    if s.startswith("HloModule ") or s == "HloModule":
      try:
        module = _parse_header(s, lineno)
      except HloParseError as e:
        problem(lineno, f"module header not understood ({e})", raw)
        module = HloModule(name=s[len("HloModule"):].split(",")[0].strip() or "?",
                           lineno=lineno)
      modules.append(module)
      table = None
      continue
    if not s:
      table = None
      continue
    if module is None:
      problem(lineno, "text before any HloModule header", raw)
      continue
    if s in _TABLES:
      table = s
      continue
    if table is not None:
      try:
        _parse_table_entry(module, table, s)
      except HloParseError as e:
        problem(lineno, str(e), raw)
      continue
    m = _COMP_RE.match(s)
    if m:
      comp = Computation(name=m.group(2), is_entry=bool(m.group(1)), lineno=lineno)
      if comp.name in module.computations:
        problem(lineno, f"computation {comp.name} defined twice", raw)
      module.computations[comp.name] = comp
      if comp.is_entry:
        if module.entry is not None:
          problem(lineno, "second ENTRY computation", raw)
        module.entry = comp
      continue
    problem(lineno, "line not understood", raw)

  if comp is not None:
    problems.append(f"computation {comp.name} (line {comp.lineno}) never closes: "
                    "the text is truncated")
  if not modules:
    problems.append("no HloModule header found: this is not HLO module text")
  for mod in modules:
    _link(mod, problems)
  return tuple(modules), problems


# Attribute keys that name computations, and the role they give the callee.
_CALL_KEYS = {
    "body": "while_body",
    "condition": "while_condition",
    "branch_computations": "branch",
    "true_computation": "branch",
    "false_computation": "branch",
    "calls": "other",  # "fusion" when the caller is a fusion
    "to_apply": "other",
    "called_computations": "other",
}
_ROLE_ORDER = ("entry", "while_body", "while_condition", "branch", "fusion", "other")


def _computation_refs(value: str) -> list[str] | None:
  """`%c` or `{%a, %b}` -> names; None when the value is not such a list."""
  v = value.strip()
  if v.startswith("{") and v.endswith("}"):
    v = v[1:-1]
  names = [p.strip().lstrip("%") for p in v.split(",")] if v.strip() else []
  if not all(_NAME_RE.match(n) for n in names):
    return None
  return names


def _link(module: HloModule, problems: list[str]) -> None:
  """Builds users, callers and roles; records dangling references."""
  where = f"module {module.name}"
  if not module.computations:
    problems.append(f"{where}: no computations (text truncated?)")
  elif module.entry is None:
    problems.append(f"{where}: no ENTRY computation (text truncated?)")
  for comp in module.computations.values():
    for ins in comp.instructions:
      for op in ins.operands:
        if op not in comp.by_name:
          problems.append(f"{where}: {comp.name}/{ins.name} uses {op}, which is not "
                          "defined in the same computation")
          continue
        comp.users.setdefault(op, []).append(ins)
      for key, value in ins.attributes.items():
        if key == "metadata":
          continue
        refs = _computation_refs(value)
        if refs is None:
          if key in _CALL_KEYS:
            problems.append(f"{where}: {ins.name} {key}={value[:60]} not understood")
          continue
        for pos, ref in enumerate(refs):
          if ref not in module.computations:
            if key in _CALL_KEYS:
              problems.append(f"{where}: {ins.name} {key} names computation {ref}, "
                              "which is not in the text")
            continue
          module.callers.setdefault(ref, []).append(Call(comp, ins, key, pos))
  for comp in module.computations.values():
    roles = []
    if comp.is_entry:
      roles.append("entry")
    for call in module.callers.get(comp.name, []):
      role = _CALL_KEYS.get(call.key, "other")
      if call.key == "calls" and call.instruction.opcode == "fusion":
        role = "fusion"
      if call.key in ("body", "condition") and call.instruction.opcode != "while":
        role = "other"
      roles.append(role)
    module.roles[comp.name] = min(roles, key=_ROLE_ORDER.index) if roles else "other"


# Also matches the older form, JSON inside a quoted string: backend_config="{\"known...
_TRIP_RE = re.compile(
    r'\\?"known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(\d+)')


def known_trip_count(ins: Instruction) -> int | None:
  """`backend_config={"known_trip_count":{"n":"5"},...}` of a while -> 5."""
  m = _TRIP_RE.search(ins.attributes.get("backend_config", ""))
  return int(m.group(1)) if m else None


def enclosing_trip_count(module: HloModule, comp: Computation) -> int | None:
  """Trip count of the innermost while loop that runs `comp`, when XLA knows it."""
  seen = set()
  while comp.name not in seen:
    seen.add(comp.name)
    calls = module.callers.get(comp.name, [])
    if not calls:
      return None
    call = calls[0]
    if call.instruction.opcode == "while" and call.key in ("body", "condition"):
      return known_trip_count(call.instruction)
    comp = call.caller
  return None


# --------------------------------------------------------------------------- copies

# Ops that pass a buffer's contents through unchanged, for tracing what a copy copies.
_PASS_THROUGH = frozenset({"bitcast", "copy", "copy-done"})

# Elementwise opcodes (XLA's `HloInstruction::IsElementwise`): each result element
# reads its operands' elements at its own index, so the result may be written over
# an operand of its type, in place.
ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "compare", "convert",
    "cosine", "count-leading-zeros", "divide", "erf", "exponential",
    "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one",
    "logistic", "maximum", "minimum", "multiply", "negate", "not", "or",
    "popcnt", "power", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "xor"})


def trace_source(module: HloModule, comp: Computation,
                 name: str) -> tuple[Instruction | None, Computation]:
  """Follows `name` back through tuples, bitcasts, copies and call boundaries.

  Returns the instruction the value comes from and its computation: an ENTRY
  `parameter` when the value is (a view of) an argument. Loop carries are not
  followed into the loop's initial value: inside a body the carry is last iteration's
  result, not the argument.
  """
  path: tuple[int, ...] = ()
  ins: Instruction | None = None
  for _ in range(100_000):
    ins = comp.by_name.get(name)
    if ins is None:
      return None, comp
    op = ins.opcode
    if op == "get-tuple-element" and ins.attributes.get("index", "").isdigit():
      path = (int(ins.attributes["index"]),) + path
      name = ins.operands[0]
    elif op == "tuple" and path and path[0] < len(ins.operands):
      name, path = ins.operands[path[0]], path[1:]
    elif op in _PASS_THROUGH and ins.operands:
      name = ins.operands[0]
    elif op == "copy-start" and ins.operands and (not path or path[0] in (0, 1)):
      name, path = ins.operands[0], path[1:]
    elif op == "parameter" and not comp.is_entry:
      calls = module.callers.get(comp.name, [])
      if len(calls) != 1 or not ins.operand_text.strip().isdigit():
        return ins, comp
      call = calls[0]
      num = int(ins.operand_text)
      caller = call.instruction
      if caller.opcode == "conditional":
        if call.key == "branch_computations":
          at = call.position + 1
        elif call.key == "true_computation":
          at = 1
        else:
          at = 2
      elif caller.opcode in ("fusion", "call") and call.key in ("calls", "to_apply"):
        at = num
      else:
        return ins, comp
      if at >= len(caller.operands):
        return ins, comp
      comp, name = call.caller, caller.operands[at]
    else:
      return ins, comp
  return ins, comp


def _has_location(module: HloModule, ins: Instruction) -> bool:
  return module.location(ins) is not None


_FOLLOW_USERS = frozenset({"get-tuple-element", "tuple", "bitcast"})


def consumer(module: HloModule, comp: Computation, name: str) -> Instruction | None:
  """The first instruction (in schedule order) with a source location that uses `name`,
  looking through get-tuple-element/tuple/bitcast, in the same computation."""
  seen: set[str] = set()
  frontier = list(comp.users.get(name, []))
  found: list[Instruction] = []
  while frontier:
    u = frontier.pop()
    if u.name in seen:
      continue
    seen.add(u.name)
    if _has_location(module, u):
      found.append(u)
    elif u.opcode in _FOLLOW_USERS:
      frontier.extend(comp.users.get(u.name, []))
  return min(found, key=lambda i: i.index) if found else None


def _copy_info(module: HloModule, comp: Computation, ins: Instruction,
               array: ArrayShape, done: Instruction | None) -> CopyInfo:
  src, _ = trace_source(module, comp, ins.operands[0])
  is_param = src is not None and src.opcode == "parameter" and _is_entry_param(module, src)
  use = consumer(module, comp, (done or ins).name)
  if use is None:
    use = comp.by_name.get(ins.operands[0])
    if use is not None and not _has_location(module, use):
      use = None
  return CopyInfo(
      name=ins.name,
      kind=ins.opcode,
      done_name=done.name if done is not None else None,
      shape=array.dims,
      dtype=array.dtype,
      nbytes=array.nbytes,
      module=module.name,
      computation=comp.name,
      role=module.roles.get(comp.name, "other"),
      trip_count=enclosing_trip_count(module, comp),
      source="parameter" if is_param else "instruction",
      parameter=(src.metadata.get("op_name") or None) if is_param and src else None,
      operand=ins.operands[0],
      location=module.location(use) if use is not None else None,
      op_name=use.metadata.get("op_name") if use is not None else None,
      hlo=ins.line,
  )


def _is_entry_param(module: HloModule, ins: Instruction) -> bool:
  return module.entry is not None and module.entry.by_name.get(ins.name) is ins


def find_copies(module: HloModule, problems: list[str]) -> list[CopyInfo]:
  """Every copy and copy-start/copy-done pair in `module`, in text order."""
  out: list[CopyInfo] = []
  where = f"module {module.name}"
  for comp in module.computations.values():
    for ins in comp.instructions:
      if ins.opcode == "copy":
        if len(ins.operands) != 1:
          problems.append(f"{where}: {ins.name} has {len(ins.operands)} operands")
          continue
        shape = ins.shape
        if isinstance(shape, TupleShape):
          # A tuple copy moves only the tuple's index table; its elements, if copied,
          # appear as copies of their own.
          shape = ArrayShape("opaque", ())
        out.append(_copy_info(module, comp, ins, shape, None))
      elif ins.opcode == "copy-start":
        # `(dest, src, context)`: the copied array is the first element.
        shape = ins.shape
        first = shape.elements[0] if isinstance(shape, TupleShape) and shape.elements \
            else None
        if not isinstance(first, ArrayShape) or len(ins.operands) != 1:
          problems.append(f"{where}: {ins.name} copy-start of unexpected form")
          continue
        dones = [u for u in comp.users.get(ins.name, []) if u.opcode == "copy-done"]
        if len(dones) != 1:
          problems.append(f"{where}: {ins.name} has {len(dones)} copy-done, expected 1")
          continue
        out.append(_copy_info(module, comp, ins, first, dones[0]))
      elif ins.opcode == "copy-done":
        src = comp.by_name.get(ins.operands[0]) if ins.operands else None
        if src is None or src.opcode != "copy-start":
          problems.append(f"{where}: {ins.name} copy-done not fed by a copy-start")
  return out


def inspect_hlo(text: str) -> HloInspection:
  """Parses `text` (one or several HLO modules) and finds every copy in it."""
  if not isinstance(text, str):
    return HloInspection((), (), (f"expected HLO text, got {type(text).__name__}",))
  if not text.strip():
    return HloInspection((), (), ("the HLO text is empty",))
  try:
    modules, problems = parse_hlo(text)
    copies: list[CopyInfo] = []
    for module in modules:
      copies += find_copies(module, problems)
  except Exception as e:  # noqa: BLE001 - a parser bug must not read as "no copies"
    return HloInspection((), (), (f"internal error while reading the HLO text: {e!r}; "
                                  "please report it with the text attached",))
  return HloInspection(tuple(modules), tuple(copies), tuple(problems))
