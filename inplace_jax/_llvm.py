"""The floating-point arithmetic of XLA:CPU's kernels, read from their optimised LLVM IR.

The HLO fingerprint (`_fingerprint.py`) cannot tell whether XLA:CPU contracts a
multiply and an add into one fused multiply-add: LLVM decides that while selecting
instructions, one basic block at a time, from the IR it has optimised. The HLO
does not show what decides it. A product that depends only on a row of a
broadcast (`b + row * c`) is loop-invariant, and LLVM hoists it out of the loop
over the rows when it can prove that the row is not written by the loop. A
hoisted product sits in another block than the add and is never contracted; one
left in the loop is (docs/xla_notes.md, "Reading the kernels' LLVM IR").

`fingerprint(texts)` reads the optimised IR of every kernel of a program (the
`*.ir-with-opt.ll` files XLA writes under `xla_dump_to`) and lists every
floating-point value it computes as a canonical expression over its block:
operations with their flags, types and constants, where an operand computed in
another block is marked as such (`^(...)`: it cannot be contracted into this one),
a load, a loop's phi and integer arithmetic are leaves, and names and addresses are
gone. Two programs with equal fingerprints build the same floating-point
instruction DAG in each block, and LLVM selects the same instructions for it: each
elementwise result is computed alike. Reductions are left to the HLO fingerprint:
their order of accumulation is also decided by the integer control flow of their
loops, which this reads as leaves.

`_jit.py` uses it twice (`read`): a candidate whose HLO fingerprint differs from
jax.jit's only in elementwise operations may run if the whole fingerprints are
equal, or equal up to values one program stores and the other recomputes
(`same_up_to_materialisation`); a candidate whose HLO fingerprint is equal may not
run if the kernels' multiply-adds differ (`contractions_match`).

Where the exact multiply-add shares differ, they are compared on lane-free forms
(`_lane_values`): the expression of one lane (vector and scalar code of one
expression compute each element with the same instructions), with every
multiply-add written out as LLVM forms it (the first operand of an add that is a
product in its block with that one use), so that where a product is computed
matters only through which FMA it makes (docs/xla_notes.md, "Which product an
add takes").

Pure text, like `_hlo.py`; no JAX import.
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import hashlib
import math
import re
import struct
from collections.abc import Callable, Iterable, Sequence

import numpy as np

_DEFINE = re.compile(r"^\s*(%[\w.\-]+)\s*=\s*(.*)$")
_LABEL = re.compile(r"^([\w.\-]+):")
_VALUE = re.compile(r"%[\w.\-]+")
_METADATA = re.compile(r",\s*!.*$")
# Opcodes that compute or convert floating-point values.
_FLOAT_OPS = frozenset(
    "fadd fsub fmul fdiv frem fneg fcmp fpext fptrunc sitofp uitofp fptosi fptoui"
    .split())
# Opcodes whose result is an address or an integer (exact) value: leaves.
_INTEGER_OPS = frozenset(
    "getelementptr icmp add sub mul shl and or xor lshr ashr zext sext trunc udiv "
    "sdiv urem srem ptrtoint inttoptr alloca".split())
# Opcodes that pick or move floating-point lanes or values.
_MOVES = frozenset("select phi shufflevector extractelement insertelement call".split())
_FLOAT_TYPE = re.compile(r"\b(half|bfloat|float|double|fp128|x86_fp80)\b")
_LIMIT = 512


def _functions(text: str, constants: dict[str, dict[int, str]] | None = None
               ) -> list[dict[str, list[str]]]:
  """Each function of an LLVM module: its basic blocks, each a list of its
  instructions (metadata dropped); where `constants` gives a function's arguments
  that hold a constant (`constant_arguments`), a division or comparison reads the
  constant instead of its load (`_constant_loads`). Selects LLVM branches are
  split (`_selects_branched`); exact scalings are left to `_parsed`.

  Memoised by a function's body text (and its constants) until `forget`: jax.jit's
  program and its candidates compile most kernels alike, under other names."""
  out: list[dict[str, list[str]]] = []
  for name, body in _bodies(text):
    arguments = constants.get(name) if constants else None
    key = (body, tuple(sorted(arguments.items())) if arguments else ())
    hit = _PARSE_MEMO.get(key)
    if hit is None:
      blocks = _blocks(body)
      if arguments:
        blocks = _constant_loads(blocks, arguments)
      if len(_PARSE_MEMO) > 4096:
        _PARSE_MEMO.clear()
      hit = _PARSE_MEMO[key] = _selects_branched(blocks)
    out.append(hit)
  return out


def _bodies(text: str) -> list[tuple[str, str]]:
  """(name, body) of each function defined in `text`: the lines after a line
  that starts with `define ` up to the next line that starts with `}`."""
  out: list[tuple[str, str]] = []
  first = text.find("\ndefine ")
  start = 0 if text.startswith("define ") else first + 1 if first >= 0 else -1
  while start >= 0:
    eol = text.find("\n", start)
    if eol < 0:
      name = _FUNCTION_NAME.search(text[start:])
      out.append((name.group(1) if name else "", ""))
      break
    name = _FUNCTION_NAME.search(text[start:eol])
    end = text.find("\n}", eol)
    out.append((name.group(1) if name else "",
                text[eol + 1:] if end < 0 else text[eol + 1:end + 1]))
    if end < 0:
      break
    nxt = text.find("\ndefine ", end + 1)
    start = nxt + 1 if nxt >= 0 else -1
  return out


def _blocks(body: str) -> dict[str, list[str]]:
  """A function body's basic blocks, each a list of its instructions (metadata
  and comments dropped)."""
  blocks: dict[str, list[str]] = {"": []}
  block = ""
  for line in body.splitlines():
    m = _LABEL.match(line)
    if m:
      block = m.group(1)
      blocks[block] = []
      continue
    line = _METADATA.sub("", line).strip()
    if line and not line.startswith(";"):
      blocks[block].append(line)
  return blocks


_FUNCTION_NAME = re.compile(r"@([\w.\-]+)\(")
# XLA:CPU's kernel API (xla/backends/cpu/codegen/kernel_api_ir_builder.cc): a
# kernel's one parameter is a call frame whose field at byte 24 points to its
# arguments, 16 bytes each (a data pointer, a size): one per array of each operand
# of its HLO instruction, in operand order, then one per result. The same buffer
# may be passed twice; arguments are never merged.
_FRAME_ARGUMENTS = re.compile(r"^getelementptr inbounds (?:nuw )?i8, ptr %0, i64 24$")
_POINTER_LOAD = re.compile(r"^load ptr, ptr (%[\w.\-]+)(?:,|$)")
_BYTE_OFFSET = re.compile(r"^getelementptr inbounds (?:nuw )?i8, ptr (%[\w.\-]+), i64 (\d+)$")
_SCALAR_LOAD = re.compile(r"^load (float|<1 x float>), ptr (%[\w.\-]+)(?:,|$)")
_LANE_OF = re.compile(r"^(?:extractelement <1 x float> (%[\w.\-]+), i64 0"
                      r"|shufflevector <1 x float> (%[\w.\-]+), <1 x float> poison, "
                      r"<\d+ x i32> zeroinitializer)$")
# A splat built in two steps: the value into lane 0 of a poison vector, then that
# lane shuffled into every lane.
_INTO_LANE0 = re.compile(r"^insertelement <\d+ x float> poison, float (%[\w.\-]+), i64 0$")
_SPLAT_OF = re.compile(r"^shufflevector <\d+ x float> (%[\w.\-]+), <\d+ x float> poison, "
                       r"<\d+ x i32> zeroinitializer$")
# Where a constant computes the same bits as a literal and loaded: as the
# dividend of a division (nothing folds `c / x`) and in a comparison. Not as a
# divisor: XLA multiplies by the reciprocal of a literal, and LLVM folds `x / 1`
# where the processor flushes a subnormal `x` (docs/xla_notes.md, measured on
# every kind of float32).
_FDIV = re.compile(r"^(fdiv )((?:<\d+ x )?float>?) (\S+), (\S+)$")
# An add that no flag lets LLVM fold with a constant (`nsz` and `fast` would let
# it drop `x + 0.0`): where a constant operand is not -0.0 (`x + -0.0` is `x`
# to LLVM under any flag), the add computes the same bits from the value loaded
# as from the literal: a reduction's initial value, which XLA keeps out of a
# kernel of one reduction (`wrapped_reduce`) and jax.jit's fused kernel holds.
_FADD = re.compile(
    r"^(fadd (?:(?:reassoc|contract|arcp|afn|nnan|ninf) )*)((?:<\d+ x )?float>?) (\S+), (\S+)$")
_FCMP = re.compile(r"^(fcmp (?:\w+ )+?)((?:<\d+ x )?float>?) (\S+), (\S+)$")


def _constant_loads(blocks: dict[str, list[str]], arguments: dict[int, str]
                    ) -> dict[str, list[str]]:
  """`blocks` with each load of a kernel argument that holds a one-element float32
  constant (`arguments`: the argument's index and the constant as LLVM writes it)
  replaced, in the divisions and comparisons that use it, by the constant: XLA
  keeps a constant out of a kernel of one operation (a `wrapped_divide` its
  operand reaches through a barrier) and loads it, where jax.jit's fused kernel
  holds it; the division computes the same bits from the same value. A load that
  anything else uses is left a load."""
  rhs, _, _, _ = _define(blocks)
  frames = {n for n, t in rhs.items() if _FRAME_ARGUMENTS.match(t)}
  tables = {n for n, t in rhs.items()
            if (m := _POINTER_LOAD.match(t)) and m.group(1) in frames}
  pointers: dict[str, int] = {}
  for n, t in rhs.items():
    m = _POINTER_LOAD.match(t)
    if m is None:
      continue
    if m.group(1) in tables:
      pointers[n] = 0
    elif (g := _BYTE_OFFSET.match(rhs.get(m.group(1), ""))) and g.group(1) in tables \
        and int(g.group(2)) % 16 == 0:
      pointers[n] = int(g.group(2)) // 16
  constant: dict[str, str] = {}
  for n, t in rhs.items():
    m = _SCALAR_LOAD.match(t)
    if m and pointers.get(m.group(2), -1) in arguments:
      constant[n] = arguments[pointers[m.group(2)]]
  inserted: dict[str, str] = {}     # a constant in lane 0 of a poison vector
  grown = True
  while grown:
    grown = False
    for n, t in rhs.items():
      if n in constant or n in inserted:
        continue
      m = _LANE_OF.match(t)
      source = (m.group(1) or m.group(2)) if m else None
      if source in constant:
        constant[n] = constant[source]
        grown = True
      elif (m := _INTO_LANE0.match(t)) and m.group(1) in constant:
        inserted[n] = constant[m.group(1)]
        grown = True
      elif (m := _SPLAT_OF.match(t)) and m.group(1) in inserted:
        constant[n] = inserted[m.group(1)]
        grown = True
  if not constant:
    return blocks
  users: dict[str, list[str]] = collections.defaultdict(list)
  for lines in blocks.values():
    for line in lines:
      d = _DEFINE.match(line)
      for v in _VALUE.findall(d.group(2) if d else line):
        users[v].append(d.group(2) if d else line)

  def safe(use: str, name: str) -> bool:
    """A lane move of constants, a comparison, a division of the constant, an
    add of a constant other than -0.0 that no flag lets LLVM fold."""
    if name in inserted:
      return (m := _SPLAT_OF.match(use)) is not None and m.group(1) == name
    if (m := _LANE_OF.match(use)) is not None:
      return (m.group(1) or m.group(2)) in constant
    if (m := _INTO_LANE0.match(use)) is not None:
      return m.group(1) in constant
    if (d := _FDIV.match(use)) is not None:
      return d.group(3) == name != d.group(4)
    if _FADD.match(use) is not None:
      return constant[name] != "-0.000000e+00"
    return _FCMP.match(use) is not None

  if any(not safe(u, n) for n in (*constant, *inserted) for u in users[n]):
    return blocks

  def substitute(text: str) -> str:
    m = _FCMP.match(text) or _FDIV.match(text) or _FADD.match(text)
    if m is None:
      return text
    head, ty, a, b = m.groups()
    vector = ty != "float"

    def value(v: str) -> str:
      if v not in constant:
        return v
      if not vector:
        return constant[v]
      # As LLVM writes a vector constant: a zero one as `zeroinitializer`.
      return ("zeroinitializer" if constant[v] == "0.000000e+00"
              else f"splat (float {constant[v]})")

    if head.startswith("fadd") and a in constant and b not in constant:
      # An add's constant on the right, where LLVM puts a literal one.
      a, b = b, a
    # A division reads its dividend only as the constant (`safe`).
    return f"{head}{ty} {value(a)}, {value(b) if not head.startswith('fdiv') else b}"

  out: dict[str, list[str]] = {}
  for label, lines in blocks.items():
    out[label] = []
    for line in lines:
      d = _DEFINE.match(line)
      out[label].append(f"{d.group(1)} = {substitute(d.group(2))}" if d else line)
  return out


_HLO_CONSTANT = re.compile(
    r"^\s*(?:ROOT )?%([\w.\-]+) = f32\[1?\](?:\{0?\})? constant\(\{?\s*([^(){}\s,]+)\s*\}?\)")
_HLO_COPY = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = f32\[1?\](?:\{0?\})? copy\(%([\w.\-]+)\)")
_HLO_FUSION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \S+ fusion\(([^()]*)\), kind=")
_HLO_SHAPE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S)")


def constant_arguments(hlo: str) -> dict[str, dict[int, str]]:
  """For each fusion of an optimised HLO module (its text) that takes a
  one-element float32 constant (or a copy of one) as an operand, its kernel's
  argument index for it (operands before it are arrays, one argument each) and
  the constant as LLVM writes a float: `%e` where that reads back exactly, else
  the double's bits."""
  constants: dict[str, str] = {}
  copies: dict[str, str] = {}
  tuples: set[str] = set()
  fusions: list[tuple[str, list[str]]] = []
  for line in hlo.splitlines():
    if m := _HLO_COPY.match(line):
      copies[m.group(1)] = m.group(2)
    if (m := _HLO_SHAPE.match(line)) and m.group(2) == "(":
      tuples.add(m.group(1))
    if m := _HLO_CONSTANT.match(line):
      literal = _llvm_float(m.group(2))
      if literal is not None:
        constants[m.group(1)] = literal
    if m := _HLO_FUSION.match(line):
      fusions.append((m.group(1), [o.strip().lstrip("%") for o in m.group(2).split(",")]))
  # A copy of a constant (XLA copies one that a loop's initial carries share).
  constants.update({c: constants[src] for c, src in copies.items() if src in constants})
  out: dict[str, dict[int, str]] = {}
  for name, operands in fusions:
    args = {}
    for k, o in enumerate(operands):
      if o in tuples:
        break                    # a tuple operand passes one argument per array
      if o in constants:
        args[k] = constants[o]
    if args:
      out[name] = args
  return out


def _llvm_float(text: str) -> str | None:
  """A float32 literal of HLO text as LLVM's IR writes the constant (a double)."""
  try:
    value = struct.unpack("<f", struct.pack("<f", float(text)))[0]
  except (ValueError, OverflowError):
    return None
  if not math.isfinite(value):
    return None
  short = "%.6e" % value
  if float(short) == value:
    return short
  return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


# A product by a power of two, `x * 0.5`, is exact wherever it is a normal
# number, so where its only uses are compares and adds of a constant c with
# |c| >= 2^-100, whether LLVM contracts such an add (an FMA) or not gives the
# same bits: where the product is subnormal (flushed to zero or not), c + p
# rounds to c either way (|p| < 2^-126, under half an ulp of c; measured in
# tests/test_llvm.py, docs/xla_notes.md). `x * 0.5 + 1`, recomputed contracted
# in jax.jit's readers' fusions and computed once, its product used twice, by a
# sequenced program (fuzz seed 7600 #6490), is one value. Such a product is
# written as the division it equals (`x / 2`, the same correctly rounded
# quotient), which no add contracts. Not a product a kernel stores: a stored
# value keeps its form, so that a recomputation of it elsewhere that an add
# does contract is still matched with it, and refused (`_Semantics.refused`;
# fuzz seed 7600 #5969, where a stored `dot * 0.125` written as a division let
# jax.jit's kernel, which contracts it into an add of a variable, pass).
_SCALING = re.compile(r"^fmul((?: [a-z]+)*) ((?:<\d+ x )?float>?) (.*)$")
_FLOAT_LITERAL = re.compile(r"f0x[0-9A-Fa-f]{8}|0x[0-9A-Fa-f]{16}|-?\d\.\d+e[+-]\d+")
_SCALED_SUM = re.compile(r"^(fadd|fsub)((?: [a-z]+)*) ((?:<\d+ x )?float>?) (.*)$")
_NO_REORDER = frozenset({"reassoc", "fast", "arcp", "afn"})


def _splat_value(text: str) -> float | None:
  """The one value of a float constant operand (a literal, a splat, or a vector
  of one literal: `_constant_value` of each), or None where it is no constant or
  holds several values."""
  if "%" in text or "@" in text:
    return None
  values = {_constant_value(m) for m in _FLOAT_LITERAL.findall(text)}
  if len(values) != 1:
    return None
  (value,) = values
  return None if value is None else float(value)


def _power_of_two(value: float | None) -> bool:
  return value is not None and value != 0 and math.frexp(abs(value))[0] == 0.5 \
      and 2.0 ** -100 <= abs(value) <= 1.0


def _exact_scalings(blocks: dict[str, list[str]]) -> dict[str, list[str]]:
  """`blocks` with each product by a power of two whose every use rounds alike
  contracted or not, and that no kernel stores, written as the division it
  equals (see `_SCALING`)."""
  scalings: dict[str, tuple[str, str, str, float]] = {}
  for lines in blocks.values():
    for line in lines:
      d = _DEFINE.match(line)
      m = _SCALING.match(d.group(2)) if d is not None else None
      if d is None or m is None or _flags(m.group(1)) & _NO_REORDER:
        continue
      ops = _operands(m.group(3))
      if len(ops) != 2:
        continue
      for i in (0, 1):
        value = _splat_value(ops[1 - i])
        if value is not None and _VALUE.fullmatch(ops[i]) and _power_of_two(value):
          scalings[d.group(1)] = (m.group(1), m.group(2), ops[i], value)
          break
  if not scalings:
    return blocks

  def harmless(name: str, line: str) -> bool:
    d = _DEFINE.match(line)
    text = d.group(2) if d else line
    op = _opcode(text)
    if op == "fcmp":
      return True
    if op in ("fadd", "fsub"):
      m = _SCALED_SUM.match(text)
      if m is None or _flags(m.group(2)) & _NO_REORDER:
        return False
      ops = _operands(m.group(4))
      if len(ops) != 2 or name not in ops:
        return False
      other = _splat_value(ops[1 - ops.index(name)])
      return other is not None and other != 0 and 2.0 ** -100 <= abs(other)
    return False

  for lines in blocks.values():
    for line in lines:
      used = set(_VALUE.findall(line)) & scalings.keys()
      d = _DEFINE.match(line)
      if d is not None:
        used.discard(d.group(1))
      for name in used:
        if not harmless(name, line):
          scalings.pop(name)
  if not scalings:
    return blocks
  out: dict[str, list[str]] = {}
  for label, lines in blocks.items():
    new = []
    for line in lines:
      d = _DEFINE.match(line)
      hit = scalings.get(d.group(1)) if d is not None else None
      if d is not None and hit is not None:
        flags, ty, x, value = hit
        divisor = _llvm_float(repr(1.0 / value))
        lanes = _WIDTH.match(ty)
        c = f"splat (float {divisor})" if lanes else divisor
        line = f"{d.group(1)} = fdiv{flags} {ty} {x}, {c}"
      new.append(line)
    out[label] = new
  return out


# A select on one (scalar) condition, a compare of one use, one of whose values
# is a division of one use: LLVM's CodeGenPrepare (x86, where a predictable
# select costs more than a branch) turns it into a branch, and what follows the
# select in its block goes to another block. A product before it is then never
# contracted into an add after it: XLA's tanh selects `|x| < 4e-4 ? x : p / q`,
# and in a kernel of scalar code `b * 0.9 + tanh(c)` rounds twice, where vector
# code (a select on a vector of conditions is never branched) computes one FMA
# (fuzz seed 4900 #2723, docs/xla_notes.md). Measured on XLA:CPU: a select of
# a division is branched, one of a `sqrt` or an `exp` is not; a remainder (a
# library call) is assumed to be, as a division, not measured. Either mistake
# misreads a kernel: not splitting where LLVM branches reads a contraction that
# does not happen, splitting where it does not misses one.
_SELECTED_TYPE = r"(?:<\d+ x )?(?:half|bfloat|float|double)>?"
_BRANCHED_SELECT = re.compile(
    r"^select\s+(?:fast\s+|nnan\s+|ninf\s+|nsz\s+)*i1\s+(%[\w.\-]+),\s*"
    + _SELECTED_TYPE + r"\s+(\S+),\s*" + _SELECTED_TYPE + r"\s+(\S+)$")
_EXPENSIVE = re.compile(r"^(?:fdiv|frem)\b")


def _selects_branched(blocks: dict[str, list[str]]) -> dict[str, list[str]]:
  """`blocks` with each block split after the instructions that precede a select
  LLVM turns into a branch (`_BRANCHED_SELECT`): the select and what follows it
  read as another block."""
  rhs, _, uses, _ = _define(blocks)

  def branched(text: str) -> bool:
    s = _BRANCHED_SELECT.match(text)
    if s is None:
      return False
    cond, *values = s.groups()
    if uses[cond] != 1 or _opcode(rhs.get(cond, "")) not in ("fcmp", "icmp"):
      return False
    return any(uses[v] == 1 and _EXPENSIVE.match(rhs.get(v, "")) for v in values)

  splits = {name for name, text in rhs.items() if branched(text)}
  if not splits:
    return blocks
  out: dict[str, list[str]] = {}
  for label, lines in blocks.items():
    part, k = label, 0
    out[part] = []
    for line in lines:
      m = _DEFINE.match(line)
      if m and m.group(1) in splits:
        k += 1
        part = f"{label}~{k}"
        out[part] = []
      out[part].append(line)
  return out


def _interned(blocks: dict[str, list[str]]) -> dict[str, list[str]]:
  """One object per function text within a decision (`forget`): the kernels jax.jit's
  program and its candidates compile alike are read once, the memos keyed by a
  function's id hitting for all of them."""
  key = tuple((k, tuple(v)) for k, v in blocks.items())
  hit = _INTERN.get(key)
  if hit is None:
    if len(_INTERN) > 4096:
      _INTERN.clear()
      _DEFINITIONS.clear()
      _STORED.clear()
      _VALUES_MEMO.clear()
    hit = _INTERN[key] = blocks
  return hit


def _opcode(rhs: str) -> str:
  words = rhs.split()
  while words and words[0] in ("tail", "musttail", "notail"):
    words = words[1:]
  return words[0] if words else ""


def _definitions(blocks: dict[str, list[str]]):
  """One function's values: each one's instruction text and block, how many uses
  each has, and each float store (the value stored, the block); memoised (the
  callers read them only: jax.jit's kernels are read for each candidate)."""
  hit = _DEFINITIONS.get(id(blocks))
  if hit is not None and hit[0] is blocks:
    return hit[1]
  out = _define(blocks)
  if len(_DEFINITIONS) > 4096:
    _DEFINITIONS.clear()
  _DEFINITIONS[id(blocks)] = (blocks, out)   # keeps `blocks` alive: its id stays
  return out


def _define(blocks: dict[str, list[str]]):
  rhs: dict[str, str] = {}
  where: dict[str, str] = {}
  uses: collections.Counter = collections.Counter()
  stores: list[tuple[str, str]] = []
  for block, lines in blocks.items():
    for line in lines:
      m = _DEFINE.match(line)
      if m:
        rhs[m.group(1)], where[m.group(1)] = m.group(2), block
      elif s := _STORE.match(line):
        stores.append((s.group(1), block))
      uses.update(_VALUE.findall(m.group(2) if m else line))
  # Instruction selection builds one DAG per block and merges identical nodes: two
  # products of the same operands in one block are one product with the uses of
  # both, and x86 contracts a product of one use only. LLVM's IR may keep both
  # (a reload between them that GVN left): fuzz seed 7300 #7235, `b + v * -0.1`
  # written in place, where the first two columns' products of the same loaded
  # `v` were merged and not contracted and the third's, of a reload, was.
  twins: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
  for name, text in rhs.items():
    if _opcode(text) == "fmul":
      twins[(where[name], text)].append(name)
  for names in twins.values():
    if len(names) > 1:
      total = sum(uses[n] for n in names)
      for n in names:
        uses[n] = total
  return rhs, where, uses, stores


def _merges(blocks: dict[str, list[str]]) -> frozenset[str]:
  """The float phis of one function that no loop carries: those whose incoming
  values do not depend on the phi itself. LLVM sinks an expression's last step
  into the block where the paths of a split loop body meet (a row loop split on
  the row a dynamic-update-slice writes): a phi there merges values computed on
  each path, rounded, and its consumer cannot contract them. Read as a leaf, an add
  of such a phi shows no product, and a kernel that contracts the same add in one
  block would look alike (fuzz seed 8800 #5975: jax.jit's kernel added column
  31's `b * 0.5`, computed on both paths, after the phi; the candidate's
  contracted it). Memoised like `_definitions`."""
  hit = _MERGES.get(id(blocks))
  if hit is not None and hit[0] is blocks:
    return hit[1]
  rhs = _definitions(blocks)[0]

  def operands(name: str) -> list[str]:
    text = rhs[name]
    found = _PHI_INCOMING.findall(text) if _opcode(text) == "phi" else \
        _VALUE.findall(text)
    return [o for o in found if o in rhs]

  out = set()
  for name, text in rhs.items():
    if _opcode(text) != "phi" or not _FLOAT_TYPE.search(text.split("[")[0]):
      continue
    seen, todo, carried = set(), operands(name), False
    while todo and not carried:
      n = todo.pop()
      if n == name:
        carried = True
      elif n not in seen:
        seen.add(n)
        todo.extend(operands(n))
    if not carried:
      out.add(name)
  if len(_MERGES) > 4096:
    _MERGES.clear()
  found = frozenset(out)
  _MERGES[id(blocks)] = (blocks, found)
  return found


def _merge_form(text: str, block: str, expr: Callable[[str, str], str]) -> str:
  """A merging phi (`_merges`) as the set of the values it picks among, each
  formed by `expr` as an operand of `block`."""
  forms = sorted({expr(v, block) if _VALUE.fullmatch(v) else v
                  for v in _PHI_INCOMING.findall(text)})
  return "phi:" + text.split("[")[0][len("phi"):].strip() + "[" + "|".join(forms) + "]"


def _function_values(blocks: dict[str, list[str]],
                     product_uses_only: bool = False,
                     materialised: frozenset[str] | None = None,
                     stored: set[str] | None = None,
                     rounding_only: bool = False) -> collections.Counter:
  """`_values_of`, memoised by function (its id, the function kept) and arguments;
  the Counter returned is shared: read it only."""
  key = (id(blocks), product_uses_only, materialised, rounding_only)
  hit = _VALUES_MEMO.get(key)
  if hit is None or hit[0] is not blocks:
    if len(_VALUES_MEMO) > 8192:
      _VALUES_MEMO.clear()
    mine: set[str] = set()
    hit = _VALUES_MEMO[key] = (blocks, _values_of(
        blocks, product_uses_only, materialised, mine, rounding_only), frozenset(mine))
  if stored is not None:
    stored.update(hit[2])
  return hit[1]


def _values_of(blocks: dict[str, list[str]],
               product_uses_only: bool = False,
               materialised: frozenset[str] | None = None,
               stored: set[str] | None = None,
               rounding_only: bool = False) -> collections.Counter:
  """The canonical expressions of the floating-point values one function computes,
  each with how many times it computes it; with `product_uses_only`, only products
  carry their number of uses (the only count that decides contraction).

  With `materialised` (`same_up_to_materialisation`): an operand whose expression,
  without its own number of uses, is one that a kernel stores reads as a load of
  it, where that cannot change how the consumer rounds (the operand is no product
  and the consumer may not reassociate). `stored`, where given, collects the
  expressions this function stores, in that form. With `rounding_only`, only
  values whose expression holds an operation that rounds are listed."""
  rhs, where, uses, stores = _definitions(blocks)
  merges = _merges(blocks)
  memo: dict[tuple[str, str], str] = {}
  rounds: dict[tuple[str, str], bool] = {}

  def operand(name: str, home: str, consumer: str, key: tuple[str, str]) -> str:
    out = expr(name, home)
    if (materialised and name in rhs and _opcode(rhs[name]) not in _CONTRACTIBLE
        and not _REASSOCIATES.search(consumer)
        and _root_form(out) in materialised):
      ty = _FLOAT_VALUE_TYPE.search(rhs[name])
      if ty is not None:
        return f"(load:{ty.group(0)})"
    rounds[key] = rounds[key] or rounds.get((name, home), False)
    return f"({out})"

  def expr(name: str, block: str) -> str:
    if name not in rhs:
      return "arg"
    key = (name, block)
    hit = memo.get(key)
    if hit is not None:
      return hit
    text = rhs[name]
    op = _opcode(text)
    if op == "load":
      out = "load:" + text.split(",")[0][len("load"):].strip()
    elif op in _INTEGER_OPS:
      out = "int"
    elif op == "phi" and name in merges:
      out = _merge_form(text, where[name], lambda v, b: f"({expr(v, b)})")
      rounds[key] = any(rounds.get((v, where[name]), False)
                        for v in _PHI_INCOMING.findall(text))
      if len(out) > _LIMIT:
        out = f"phi#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
    elif op == "phi":
      out = "phi:" + text.split("[")[0][len("phi"):].strip()
    else:
      home = where[name]
      rounds[key] = op in _ROUNDING_OPS
      out = _VALUE.sub(lambda m: operand(m.group(0), home, text, key), text)
      if len(out) > _LIMIT:
        out = f"{op}#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
      # LLVM contracts a product into an add only where the product has no other
      # use: how many uses a value has is part of what decides its rounding.
      if not product_uses_only or op == "fmul":
        out = f"{out}*{uses[name]}"
    if where[name] != block:
      out = f"^({out})"    # computed in another block: not contracted into this one
    memo[key] = out
    return out

  values: collections.Counter = collections.Counter()
  for name, text in rhs.items():
    op = _opcode(text)
    if op in _FLOAT_OPS or (op in _MOVES and _FLOAT_TYPE.search(text)):
      form = expr(name, where[name])
      if not rounding_only or rounds.get((name, where[name]), False):
        values[form] += 1
  if stored is not None:
    stored.update(_root_form(expr(n, b)) for n, b in stores if n in rhs)
  return values


_STORE = re.compile(r"^store\s+(?:volatile\s+)?(?:<\d+ x )?(?:half|bfloat|float|double)"
                    r">?\s+(%[\w.\-]+),")
# Roots an add could contract into itself (a product, or one negated or widened).
_CONTRACTIBLE = frozenset({"fmul", "fneg", "fpext"})
_REASSOCIATES = re.compile(r"\b(reassoc|fast)\b")
_FLOAT_VALUE_TYPE = re.compile(
    r"<\d+ x (?:half|bfloat|float|double)>|\b(?:half|bfloat|float|double)\b")
_ROOT_USES = re.compile(r"\*\d+$")
# Operations that round (or call a function that may): an expression without any
# moves, picks or compares values only.
_ROUNDING_OPS = frozenset(
    "fadd fsub fmul fdiv frem fptrunc sitofp uitofp fptosi fptoui call".split())


# Lane-free forms (`_lane_values`). Vector code computes each lane
# with the instruction the scalar code uses for one element (IEEE operations are
# defined per element, and an FMA is formed per instruction from the same DAG in
# either), so one lane's expression is what decides its bits; the lane moves
# around it (a splat, an extraction, a masked load of a row's last elements) move
# values without rounding. Not lane-free: calls (`@llvm.sin.v8f32` and
# `@llvm.sin.f32` keep their names: XLA:CPU's vector and scalar transcendentals
# may differ) and reductions across lanes.
_VECTOR_TYPE = re.compile(r"<\d+ x (\w+)>")
_SPLAT = re.compile(r"splat \((\w+) ([^()]+)\)")
_VECTOR_CONSTANT = re.compile(r"<((?:half|bfloat|float|double) [^<>,]+)(?:, \1)*>")
_WIDTH = re.compile(r"<(\d+) x ")
_LANE_LOADS = re.compile(r"@llvm\.masked\.(?:load|gather|expandload)\.")
_INSERT = re.compile(
    r"^insertelement <\d+ x \w+> (?:poison|undef), \w+ (%[\w.\-]+), i\d+ 0$")
_EXTRACT = re.compile(r"^extractelement <\d+ x \w+> (%[\w.\-]+), i\d+ \S+$")
_BROADCAST = re.compile(r"^shufflevector <\d+ x \w+> (%[\w.\-]+), <\d+ x \w+> "
                        r"(?:poison|undef), <\d+ x i32> zeroinitializer$")
_SUM_TEXT = re.compile(r"^(fadd|fsub)((?: [a-z]+)*) (\w+) (.*)$")
_PRODUCT_TEXT = re.compile(r"^fmul((?: [a-z]+)*) (\w+) (.*)$")
_FLAG_WORDS = frozenset("nnan ninf nsz arcp contract afn reassoc fast".split())
# Flags under which an operation rounds the same wherever its operands are
# computed (the others let LLVM reassociate or approximate within a block).
_PLAIN_FLAGS = frozenset({"nnan", "ninf", "nsz", "contract"})


def _lane_text(text: str) -> str:
  """An instruction's text with vector types and splatted constants of one lane."""
  text = _SPLAT.sub(lambda m: m.group(2), text)
  text = _VECTOR_CONSTANT.sub(lambda m: m.group(1).split(" ", 1)[1], text)
  return _VECTOR_TYPE.sub(lambda m: m.group(1), text)


def _lane_move(text: str) -> str | None:
  """The value whose lane `text` moves (a scalar inserted into an empty vector,
  a lane extracted, lane 0 broadcast), or None."""
  for pattern in (_INSERT, _EXTRACT, _BROADCAST):
    m = pattern.match(text)
    if m is not None:
      return m.group(1)
  return None


def _operands(text: str, opening: str = "(", closing: str = ")") -> list[str]:
  """`text` split at its commas outside the brackets `opening` and `closing` list
  (parentheses only, by default)."""
  out, depth, start = [], 0, 0
  for i, ch in enumerate(text):
    if ch in opening:
      depth += 1
    elif ch in closing:
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(text[start:i].strip())
      start = i + 1
  out.append(text[start:].strip())
  return out


def _flags(text: str) -> frozenset[str]:
  return frozenset(w for w in text.split() if w in _FLAG_WORDS)


def _unmarked(form: str) -> str:
  """A form without its own block mark (`^(...)`)."""
  return form[2:-1] if form.startswith("^(") and form.endswith(")") else form


def _lane_values(blocks: dict[str, list[str]],
                 resolve: bool = True) -> list[tuple[str, int]]:
  """The floating-point values one function computes, each as the expression of
  one lane with its number of lanes, in program order.

  Where each multiply-add is formed is written out (`resolve`): LLVM's
  instruction selection, one basic block at a time, folds an add or subtract
  with a product operand into an FMA where the product is computed in the same
  block, has that one use and no flags beyond `_PLAIN_FLAGS`; of two such
  operands, the first (DAGCombiner's visitFADDForFMACombine and
  visitFSUBForFMACombine, x86 not "aggressive": each product has one use). So an
  add's form is `fma`/`fms`/`fnma` of its contracted product's operands and its
  other operand, or the add of two rounded values (in either order: IEEE addition
  commutes), and where an operand is computed no longer matters; it is kept,
  block marks and product uses (`*1`: contractible, `*n`), where it could (an
  add of a negated or widened product, which other folds take, and operations
  with flags that let LLVM reassociate). `resolve=False` leaves every add of a
  product unresolved, to group the forms by (`_lane_shares`)."""
  rhs, where, uses, _ = _definitions(blocks)
  merges = _merges(blocks)
  memo: dict[tuple[str, str], str] = {}

  def source(name: str) -> str:
    """The value whose lane `name` moves (a splat, an extraction), or `name`."""
    seen = set()
    while name in rhs and name not in seen:
      seen.add(name)
      moved = _lane_move(rhs[name])
      if moved is None:
        break
      name = moved
    return name

  def contractible(name: str | None, home: str) -> bool:
    return (name is not None and name in rhs and _opcode(rhs[name]) == "fmul"
            and where[name] == home and uses[name] == 1
            and _flags(rhs[name]) <= _PLAIN_FLAGS)

  def operand(text: str, home: str, placed: bool) -> str:
    if not _VALUE.fullmatch(text):
      return text                          # a constant
    out = expr(text, home)
    if not placed:
      out = _unmarked(out)
    elif text in rhs and _opcode(rhs[text]) == "fmul":
      out = f"{out}*{'1' if contractible(text, home) else 'n'}"
    return f"({out})"

  def generic(text: str, home: str, placed: bool) -> str:
    return _VALUE.sub(lambda m: operand(m.group(0), home, placed), text)

  def summed(text: str, op: str, home: str) -> str:
    m = _SUM_TEXT.match(text)
    ops = _operands(m.group(4)) if m else []
    names: list[str | None] = [o if _VALUE.fullmatch(o) and o in rhs else None
                               for o in ops]
    if m is None or len(ops) != 2 or any(
        n is not None and _opcode(rhs[n]) in ("fneg", "fpext") for n in names):
      return generic(text, home, True)
    head = f"{m.group(2)} {m.group(3)}"
    chosen = next((i for i in (0, 1) if contractible(names[i], home)), None) \
        if resolve else None
    if chosen is None:
      a, b = (operand(o, home, False) for o in ops)
      if op == "fadd":
        a, b = sorted((a, b))
      return f"{op}{head} {a}, {b}"
    product = names[chosen]
    assert product is not None
    p = _PRODUCT_TEXT.match(_lane_text(rhs[product]))
    factors = _operands(p.group(3)) if p else []
    if p is None or len(factors) != 2:
      return generic(text, home, True)
    x, y = sorted(operand(f, home, False) for f in factors)
    other = operand(ops[1 - chosen], home, False)
    kind = "fma" if op == "fadd" else ("fms" if chosen == 0 else "fnma")
    return f"{kind}{head}|{p.group(1)} {x}, {y}, {other}"

  def expr(name: str, block: str) -> str:
    if name not in rhs:
      return "arg"
    key = (name, block)
    hit = memo.get(key)
    if hit is not None:
      return hit
    src = source(name)
    if src != name:
      out = expr(src, block) if src in rhs else "arg"
      memo[key] = out
      return out
    text = _lane_text(rhs[name])
    op = _opcode(text)
    if _LANE_LOADS.search(text):
      ty = _FLOAT_VALUE_TYPE.search(text)
      op, text = "load", f"load {ty.group(0) if ty else '?'}"
    if op == "load":
      out = "load:" + text.split(",")[0][len("load"):].strip()
    elif op in _INTEGER_OPS:
      out = "int"
    elif op == "phi" and name in merges:
      out = _merge_form(text, where[name], lambda v, b: f"({expr(v, b)})")
      if len(out) > _LIMIT:
        out = f"phi#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
    elif op == "phi":
      out = "phi:" + text.split("[")[0][len("phi"):].strip()
    else:
      home = where[name]
      placed = not _flags(text) <= _PLAIN_FLAGS
      if op in ("fadd", "fsub") and not placed:
        out = summed(text, op, home)
      elif op == "fmul" and not placed:
        p = _PRODUCT_TEXT.match(text)
        factors = _operands(p.group(3)) if p else []
        if p is not None and len(factors) == 2:
          x, y = sorted(operand(f, home, False) for f in factors)
          out = f"fmul{p.group(1)} {p.group(2)} {x}, {y}"
        else:
          out = generic(text, home, False)
      else:
        out = generic(text, home, placed)
      if len(out) > _LIMIT:
        out = f"{op}#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
    if where[name] != block:
      out = f"^({out})"
    memo[key] = out
    return out

  values: list[tuple[str, int]] = []
  for name, text in rhs.items():
    op = _opcode(text)
    if op in _FLOAT_OPS or (op in _MOVES and _FLOAT_TYPE.search(text)):
      if _lane_move(text) or _LANE_LOADS.search(text):
        continue      # the lane it moves is listed where it is computed
      width = _WIDTH.search(text.split(",")[0])
      values.append((expr(name, where[name]), int(width.group(1)) if width else 1))
  return values


def _root_form(form: str) -> str:
  """An expression without its own number of uses and block mark."""
  if form.startswith("^(") and form.endswith(")"):
    form = form[2:-1]
  return _ROOT_USES.sub("", form)


def _parsed(texts: Iterable[str], constants: dict[str, dict[int, str]] | None = None
            ) -> list[dict[str, list[str]]]:
  """The functions of `texts` (`_functions`), exact power-of-two scalings read as
  divisions (`_exact_scalings`)."""
  return [_interned(_exact_scalings(blocks))
          for text in texts for blocks in _functions(text, constants)]


def _values(functions: Sequence[dict[str, list[str]]], product_uses_only: bool = False,
            materialised: frozenset[str] | None = None) -> collections.Counter | None:
  values: collections.Counter = collections.Counter()
  for blocks in functions:
    values.update(_function_values(blocks, product_uses_only, materialised))
  return values if functions else None


def fingerprint(texts: Iterable[str]) -> frozenset[tuple[str, int]] | None:
  """The canonical floating-point expressions of every kernel in `texts` (optimised
  LLVM IR modules), each with how many times the program computes it, or None
  when there is none to read."""
  values = _values(_parsed(texts))
  return None if values is None else frozenset(values.items())


# What `Candidate.changed` names when the kernels' multiply-adds differ.
CONTRACTIONS = "the multiply-adds of its kernels (their LLVM IR)"
# What it names when LLVM folds arithmetic away in one program's kernels only
# (`folds_alike`).
FOLDS = "elements whose arithmetic LLVM folds away in one program's kernels only (their LLVM IR)"
_SUM = re.compile(r"^(\^\()?(fadd|fsub) ")
_PRODUCT = re.compile(r"\bfmul\b|llvm\.fma|fmuladd")
_PLACEMENT = re.compile(r"\*(?:\d+|n)")


def _unplaced(form: str) -> str:
  """`form` without its placement: block marks (`^(...)`, both parentheses), use
  counts and number of lanes."""
  out: list[str] = []
  closes: list[bool] = []     # per open parenthesis: whether it opened a block mark
  i = 0
  while i < len(form):
    if form.startswith("^(", i):
      closes.append(True)
      i += 2
      continue
    ch = form[i]
    if ch == "(":
      closes.append(False)
    elif ch == ")" and closes and closes.pop():
      i += 1
      continue
    out.append(ch)
    i += 1
  return _PLACEMENT.sub("", "".join(out))


def contractions(texts: Iterable[str]) -> frozenset | None:
  """What decides FMA contraction in the kernels of `texts`: every add or subtract
  with a product in its expression, grouped by the expression without its
  placement (which block each operand is computed in, how many uses each product
  has), each group as the share of each placement in it.

  A share, not a count: loops unrolled 4 or 16 times compute one expression 16
  or 64 times, alike (a conditional lowered to loops, tests/test_cond_traps.py).
  A change of shares is a change of which elements are contracted: jax.jit's
  kernel left 7 of 24 products in the loop, contracted, and the sequenced one 2
  (fuzz regression `sgd_step_in_place_over_bf16_column`, 1 ulp)."""
  return _contractions(_parsed(texts))


def _contractions(functions: Sequence[dict[str, list[str]]],
                  materialised: frozenset[str] | None = None) -> frozenset | None:
  values = _values(functions, product_uses_only=True, materialised=materialised)
  if values is None:
    return None
  groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for form, n in values.items():
    if _SUM.match(form) and _PRODUCT.search(form):
      groups[_unplaced(form)][form] += n
  return frozenset(
      (key, frozenset((form, fractions.Fraction(n, sum(g.values())))
                      for form, n in g.items()))
      for key, g in groups.items())


@dataclasses.dataclass(frozen=True)
class Kernels:
  """What `_jit.py` compares of two programs' kernels."""
  values: frozenset          # `fingerprint`
  contractions: frozenset    # `contractions`
  # The parsed kernels, for `same_up_to_materialisation`.
  functions: tuple = dataclasses.field(default=(), compare=False, repr=False)
  # Whether the reading wrote some product as a division (`_exact_scalings`):
  # where neither program's was, the reading without them is this one.
  scaled: bool = dataclasses.field(default=False, compare=False)
  # The indices (into `functions`) of kernels that store a loaded value where
  # their fusion computes arithmetic (`folded_kernels`).
  folded: frozenset = dataclasses.field(default=frozenset(), compare=False)


def read(texts: Sequence[str], constants: dict[str, dict[int, str]] | None = None,
         scalings: bool = True) -> Kernels | None:
  """Both views of the kernels in `texts`, or None when there is none to read;
  `constants`: the constant arguments of the program's kernels
  (`constant_arguments`); `scalings`: exact power-of-two scalings read as the
  divisions they equal (`_exact_scalings`)."""
  return _read([f for text in texts for f in _functions(text, constants)], scalings)


def _read(raw: Sequence[dict[str, list[str]]], scalings: bool,
          folded: frozenset[int] = frozenset()) -> Kernels | None:
  scaled = [_exact_scalings(f) for f in raw] if scalings else list(raw)
  functions = [_interned(f) for f in scaled]
  values, shares = _values(functions), _contractions(functions)
  if values is None or shares is None:
    return None
  return Kernels(frozenset(values.items()), shares, tuple(functions),
                 scaled=any(a is not b for a, b in zip(scaled, raw)), folded=folded)


def same_up_to_materialisation(a: Kernels, b: Kernels) -> bool:
  """Whether two programs' kernels compute the same floating-point values where
  they differ only in which values one program stores and the other recomputes.

  XLA duplicates cheap elementwise producers into their consumers' fusions: jax.jit's
  program recomputes `x * 0.5 - 2` inside the loop of an argmin over it, where a
  sequenced program, whose update is ordered after that argmin, reads it back from
  the buffer the update kernel stored. The values are the same bits when the
  recomputation is the same expression as the stored one (the same operations,
  flags and contractions: its products' uses are part of its form) and reading it
  from memory cannot change how its consumer rounds: it is not a product an add
  could contract (an FMA) and its consumer does not reassociate (a reduction).

  So: every operand whose expression, without its own number of uses, is stored
  by a kernel of either program reads as a load, and the two programs must then
  compute the same set of expressions that round, and their multiply-adds the
  same shares (`contractions`). An expression of loads, compares, selects and phis
  alone rounds nothing (an argmin's loop, unrolled in one program and not in the
  other, picks the same element). A set, not a count: the recomputation is the same expression
  once more. It errs towards "different": a stored value in another form (vector
  code where the consumer is scalar) is not matched."""
  # Exact forms, not lane-free ones: compared lane-free (1c84ba6), a sequenced
  # program of fuzz seed 2063 (#8875) passed as equal and came out 1 ulp off in
  # one element (pinned in tests/test_fuzz_regressions.py).
  if not a.functions or not b.functions:
    return False
  def stored(product_uses_only: bool) -> frozenset[str]:
    out: set[str] = set()
    for blocks in (*a.functions, *b.functions):
      _function_values(blocks, product_uses_only, stored=out)
    return frozenset(out)

  materialised, products = stored(False), stored(True)
  if not materialised or (_contractions(a.functions, products)
                          != _contractions(b.functions, products)):
    return False

  def forms(k: Kernels) -> frozenset[str]:
    out: set[str] = set()
    for blocks in k.functions:
      out.update(_root_form(f) for f in _function_values(
          blocks, materialised=materialised, rounding_only=True))
    return frozenset(out)

  return forms(a) == forms(b)


# `_lane_values` by function text and arguments: jax.jit's program's kernels are
# compared with each candidate's, and most kernels are the same in both. Emptied
# when a signature is decided (`forget`), so no IR outlives its compile.
_LANE_MEMO: dict[tuple, tuple[tuple[str, int], ...]] = {}
# `_definitions` and `_Semantics.stored` by function (its id, the function kept).
_DEFINITIONS: dict[int, tuple[dict, tuple]] = {}
_MERGES: dict[int, tuple[dict, frozenset[str]]] = {}
_STORED: dict[int, tuple[dict, frozenset[str]]] = {}
# `_function_values` and `same_semantics`' groups by function id and arguments, and
# one object per function text (`_interned`).
_VALUES_MEMO: dict[tuple, tuple[dict, collections.Counter, frozenset[str]]] = {}
_GROUPS_MEMO: dict[tuple, tuple[dict, list[tuple[str, str]], bool, list[str]]] = {}
# `_functions` by function body text and constants.
_PARSE_MEMO: dict[tuple, dict[str, list[str]]] = {}
# `_kernel_forms` by function id and stored forms.
_FORMS_MEMO: dict[tuple, tuple[dict, list, list]] = {}
_INTERN: dict[tuple, dict[str, list[str]]] = {}


def forget() -> None:
  """Drops the memoised lane-free forms (`_lane`), definitions, stored forms,
  values, semantic groups and form tables, the parsed and the interned functions."""
  _LANE_MEMO.clear()
  _DEFINITIONS.clear()
  _MERGES.clear()
  _STORED.clear()
  _VALUES_MEMO.clear()
  _GROUPS_MEMO.clear()
  _FORMS_MEMO.clear()
  _PARSE_MEMO.clear()
  _INTERN.clear()


def _lane(blocks: dict[str, list[str]], resolve: bool = True
          ) -> tuple[tuple[str, int], ...]:
  """`_lane_values` of `blocks`, memoised."""
  key = (tuple((k, tuple(v)) for k, v in blocks.items()), resolve)
  hit = _LANE_MEMO.get(key)
  if hit is None:
    if len(_LANE_MEMO) > 4096:
      _LANE_MEMO.clear()
    hit = _LANE_MEMO[key] = tuple(_lane_values(blocks, resolve))
  return hit


def contractions_match(a: Kernels, b: Kernels) -> bool:
  """Whether two programs' kernels form the same multiply-adds: the same shares
  (`contractions`), or the same lane-free ones (`_lane_shares`), which vector and
  scalar code of one expression have alike, and placements that form the same
  FMAs too."""
  if a.contractions == b.contractions:
    return True
  return bool(a.functions and b.functions) and _shares_match(
      _lane_shares(a.functions), _lane_shares(b.functions))


def _lane_shares(functions: Sequence[dict[str, list[str]]]
                 ) -> dict[str, collections.Counter]:
  """Each add or subtract with a product in its expression (`_lane_values` with
  `resolve=False`), with how often it is formed each way (resolved) and with how
  many lanes."""
  groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for blocks in functions:
    formed = _lane(blocks)
    plain = _lane(blocks, resolve=False)
    for (form, lanes), (key, _) in zip(formed, plain, strict=True):
      if _SUM.match(key) and _PRODUCT.search(key):
        groups[_unplaced(key)][(form, lanes)] += 1
  return groups


def _shares_match(a: dict[str, collections.Counter],
                  b: dict[str, collections.Counter]) -> bool:
  """Whether two programs contract alike: the same sums with products, each formed
  one way only, the same in both (then every element is, whatever the vector
  width), or else in the same shares of form and width."""
  if a.keys() != b.keys():
    return False
  for key, ga in a.items():
    gb = b[key]
    formed = {form for form, _ in ga}
    if len(formed) == 1 and formed == {form for form, _ in gb}:
      continue
    if _shares(ga) != _shares(gb):
      return False
  return True


def _shares(group: collections.Counter) -> dict:
  total = sum(group.values())
  return {k: fractions.Fraction(n, total) for k, n in group.items()}


_HLO_CALLS = re.compile(
    r"^\s*(?:ROOT )?%([\w.\-]+) = [^(]\S* fusion\(.*\), kind=\w+, calls=%([\w.\-]+)")
_HLO_COMPUTATION = re.compile(r"^%([\w.\-]+) \(.*\{$")
_HLO_ROOT = re.compile(r"^\s*ROOT %[\w.\-]+ = [^(\s]\S* ([a-z][\w\-]*)\(")
# Fusion roots that compute every element: each rounds or, under XLA:CPU's
# denormals-are-zero, flushes a subnormal operand; a store of a loaded value is
# none of them.
_ARITHMETIC_ROOTS = frozenset(
    "add subtract multiply divide maximum minimum clamp".split())
_LOADED = re.compile(r"^\s*(%[\w.\-]+) = load (?:<\d+ x )?(?:half|bfloat|float|double)\b")
# Operations that move a loaded value without rounding or flushing it: a sign
# flip or clear (`-b` fused in, `x * -1` folded), lanes moved.
_MOVED = re.compile(r"^\s*(%[\w.\-]+) = (?:fneg\b|(?:tail )?call\b.*@llvm\.fabs\.|"
                    r"shufflevector\b|insertelement\b|extractelement\b|bitcast\b)(.*)$")
_STORE_OF = re.compile(
    r"^\s*store (?:volatile )?(?:<\d+ x )?(?:half|bfloat|float|double)>? (%[\w.\-]+),")


def folded_kernels(texts: Sequence[str], hlo: str) -> frozenset[int]:
  """The indices (in `_functions` order over `texts`) of the kernels whose fusion's
  root is arithmetic (`_ARITHMETIC_ROOTS`) but which store a value as loaded (or
  moved without rounding: negated, lanes moved; fuzz seed 9000 #9355, `-b` fused
  into the maximum):
  LLVM folded the operation for those elements. jax.jit's kernel of a row swap
  fused with `maximum(b, resize(v))` splits its row loop on the swapped rows; on
  row 21 both operands are the same load, and LLVM folds `maximum(x, x)` to `x`,
  so a subnormal is stored as it is, where a program that computes the maximum
  flushes it (XLA:CPU reads denormals as zero; fuzz seed 8800 #4642). Neither
  program's HLO nor the kernels' floating-point expressions show it."""
  calls: dict[str, str] = {}
  roots: dict[str, str] = {}
  computation = None
  for line in hlo.splitlines():
    if m := _HLO_CALLS.match(line):
      calls[m.group(1)] = m.group(2)
    if m := _HLO_COMPUTATION.match(line):
      computation = m.group(1)
    elif computation is not None and (m := _HLO_ROOT.match(line)):
      roots[computation] = m.group(1)
  out: set[int] = set()
  k = 0
  for text in texts:
    for name, body in _bodies(text):
      fusion = calls.get(name) or calls.get(name.removesuffix("_wrapped"))
      if fusion is not None and roots.get(fusion) in _ARITHMETIC_ROOTS:
        loaded = set()
        for line in body.splitlines():
          if m := _LOADED.match(line):
            loaded.add(m.group(1))
          elif m := _MOVED.match(line):
            operands = _VALUE.findall(m.group(2))
            if operands and all(v in loaded for v in operands):
              loaded.add(m.group(1))
          elif (m := _STORE_OF.match(line)) and m.group(1) in loaded:
            out.add(k)
            break
      k += 1
  return frozenset(out)


def folds_alike(a: Kernels, b: Kernels) -> bool:
  """Whether every kernel of either program that folds some element's arithmetic
  away (`folded_kernels`) is one both programs compile alike (`_shared`): a
  folding kernel stores those elements as loaded, where another kernel computes
  them, and the two differ wherever an operand is subnormal."""
  if not a.folded and not b.folded:
    return True
  both = _shared(a, b)
  return all(id(k.functions[i]) in both for k in (a, b) for i in k.folded)


class Dump:
  """The IR texts of one compile, read (`read`) on first use only: a program's
  kernels are compared only where a sequenced candidate's HLO leaves it open."""

  def __init__(self, texts: Sequence[str], hlo: Callable[[], str] | None = None):
    self._texts: Sequence[str] | None = texts
    self._hlo = hlo               # the program's optimised HLO text, on first use
    self._raw: list[dict[str, list[str]]] = []
    self._folded: frozenset[int] = frozenset()
    self._kernels: dict[bool, Kernels | None] = {}

  def kernels(self, scalings: bool = True) -> Kernels | None:
    """The kernels read with exact scalings as divisions (`read`), or without."""
    if self._texts is not None:
      hlo = self._hlo() if self._hlo is not None else None
      constants = constant_arguments(hlo) if hlo is not None else None
      self._raw = [f for text in self._texts for f in _functions(text, constants)]
      self._folded = frozenset() if hlo is None else folded_kernels(self._texts, hlo)
      self._texts, self._hlo = None, None
    if scalings not in self._kernels:
      self._kernels[scalings] = _read(self._raw, scalings, self._folded)
    return self._kernels[scalings]


# --------------------------------------------------------------------------- semantics
#
# `same_semantics`: the floating-point values each lane computes, compared as the
# operations that round them. What decides an element's bits is the sequence of
# rounding operations applied to the values it loads: adds, subtracts, products,
# divisions, conversions, and the multiply-adds instruction selection forms (LLVM
# contracts an add or subtract with a product in its block that has one use, the
# first such operand: `_lane_values`). Vector and scalar code of one expression
# compute each lane with the same instructions; lane moves (splats, extractions,
# insertions, shuffles that keep one form in every lane, masked loads), picks
# (select, compare, min/max), sign operations and the block an operand is computed
# in change no bits, except where the operand is a product an add could contract
# (then the contraction is written out) or the consumer may reassociate (then its
# operands stay as they are, placed).

# Calls that compute one IEEE-defined value per lane, the same in vector and scalar
# code: exact operations, sqrt (correctly rounded), and the transcendentals whose
# XLA:CPU vector and scalar code were measured to give the same bits on every
# input tried (`tests/test_llvm.py::test_lane_transcendentals_match_scalar_code`;
# `tan` differed in a quarter of them, so it is not here and keeps its width).
_LANE_CALLS = re.compile(
    r"@llvm\.(maximum|minimum|maxnum|minnum|fabs|copysign|floor|ceil|trunc|rint|"
    r"nearbyint|round|roundeven|sqrt|sin|cos|exp|log)\.(?:v\d+)?f(?:16|32|64)\(")
_EXACT_CALLS = frozenset(
    "maximum minimum maxnum minnum fabs copysign floor ceil trunc rint nearbyint "
    "round roundeven".split())
_PICK_CALL = re.compile(r"@lane\.(\w+)\(")
# A vector reduction by maximum or minimum (IEEE 754-2019: NaN propagates, -0 is
# below +0) picks one of its operands whatever the order: exact under `reassoc`.
# Not fmax/fmin (maxnum: either zero where they compare equal).
_EXACT_REDUCE = re.compile(r"@llvm\.vector\.reduce\.f(?:maximum|minimum)\.")
_LLVM_EXACT = re.compile(
    r"@llvm\.(?:maximum|minimum|maxnum|minnum|fabs|copysign|floor|ceil|trunc|rint|"
    r"nearbyint|round|roundeven|masked)\.")
_ROUNDS = frozenset("fadd fsub fmul fdiv frem fptrunc sitofp uitofp".split())
_ANY_VECTOR_CONSTANT = re.compile(
    r"<(?:(?:half|bfloat|float|double|i\d+) [^<>,]+)"
    r"(?:, (?:half|bfloat|float|double|i\d+) [^<>,]+)*>")
_SHUFFLE_OPERANDS = re.compile(r"^shufflevector <\d+ x \w+> (\S+), <\d+ x \w+> (\S+), ")
_INSERT_OPERANDS = re.compile(r"^insertelement <\d+ x \w+> (\S+), \w+ ([^,\s]+), ")
_FLAG_PREFIX = re.compile(r"\b(?:reassoc|fast|arcp|afn|contract|nnan|ninf|nsz) ")
_LEAVES = frozenset({"load", "phi", "int", "arg"})
# A phi's incoming values: `[ %v, %block ]`.
_PHI_INCOMING = re.compile(r"\[\s*([^,\]\s]+)\s*,\s*%[\w.\-]+\s*\]")


_LATTICE = re.compile(
    r"^(?:tail )?call(?: [a-z]+)* \w+ @(?:lane\.(maximum|minimum)|"
    r"llvm\.vector\.reduce\.f(maximum|minimum)\.\w+)\(")


def _lattice(text: str) -> str | None:
  """"maximum" or "minimum" for an IEEE maximum or minimum of lanes or a vector
  reduction by one (`text` semantic), else None."""
  m = _LATTICE.match(text)
  return None if m is None else (m.group(1) or m.group(2))


def _choices(text: str) -> list[str] | None:
  """The values a pick chooses among: a phi's incoming values, a float select's
  two operands; None for any other instruction (`text` semantic)."""
  op = _opcode(text)
  if op == "phi":
    return _PHI_INCOMING.findall(text)
  if op == "select" and _FLOAT_TYPE.search(text) and \
      len(ops := _operands(text.split(" ", 1)[1])) == 3:
    return [o.rsplit(" ", 1)[-1] for o in ops[1:]]
  return None


_FLOAT_ZEROS = re.compile(r"<\d+ x (float|double)> zeroinitializer")


def _semantic_text(text: str) -> str:
  """An instruction's text as one lane: splats and vector constants as the value
  of their lanes (poison lanes left out), lane-wise calls without their width."""
  text = _SPLAT.sub(lambda m: m.group(2), text)
  # A zero vector is the zero of each lane, as scalar code writes it.
  text = _FLOAT_ZEROS.sub(lambda m: f"{m.group(1)} 0.000000e+00", text)

  def constant(m: re.Match) -> str:
    lanes = [x.strip() for x in m.group(0)[1:-1].split(",")]
    lanes = [x for x in lanes if not x.endswith((" poison", " undef"))]
    if lanes and all(x == lanes[0] for x in lanes):
      return lanes[0].split(" ", 1)[1]
    return m.group(0)

  text = _ANY_VECTOR_CONSTANT.sub(constant, text)
  text = _LANE_CALLS.sub(lambda m: f"@lane.{m.group(1)}(", text)
  return _VECTOR_TYPE.sub(lambda m: m.group(1), text)


def _constant_value(text: str):
  """A float32 constant as LLVM's IR writes it (decimal, a double's bits, or a
  float's bits), as a numpy float32; None for anything else."""
  text = text.strip()
  try:
    if text.startswith("0x") and len(text) == 18:
      v = struct.unpack("<d", struct.pack("<Q", int(text[2:], 16)))[0]
    elif text.startswith("f0x") and len(text) == 11:
      v = struct.unpack("<f", struct.pack("<I", int(text[3:], 16)))[0]
    else:
      # LLVM writes a float constant in decimal where that reads back as the
      # same float (`1.500000e-02`), else as the float's bits (`f0x3C75C28F`).
      v = float(np.float32(float(text)))
      if "%.6e" % v != text:
        return None
  except (ValueError, OverflowError, struct.error):
    return None
  f = np.float32(v)
  if not np.isfinite(f) or float(f) != v or (f != 0 and abs(f) < np.finfo(np.float32).tiny):
    return None       # not a float32, or subnormal (flushed at run time, not folded)
  return f


_STORED_PICK = re.compile(r"select i1 (.*), float (\(load\)|[^,() ]+), float (\(load\)|[^,() ]+)")
_FOLDABLE_CALLS = {"maximum": np.maximum, "minimum": np.minimum,
                   "maxnum": np.fmax, "minnum": np.fmin}


def _foldable(text: str) -> tuple[str, list[str]] | None:
  """(operation, operands) of a float32 add, subtract, multiply (plain flags) or
  maximum/minimum call of two operands; None for anything else."""
  m = _SUM_TEXT.match(text) or _PRODUCT_TEXT.match(text)
  if m is not None:
    kind = _opcode(text)
    flags, ty, rest = (m.group(2), m.group(3), m.group(4)) if kind != "fmul" else \
        (m.group(1), m.group(2), m.group(3))
    ops = _operands(rest)
    if ty != "float" or set(flags.split()) - _PLAIN_FLAGS or len(ops) != 2:
      return None
    return kind, ops
  call = _PICK_CALL.search(text)
  if call is not None and call.group(1) in _FOLDABLE_CALLS and text.count("(") == 1:
    args = [a.strip() for a in text[text.index("(") + 1:text.rindex(")")].split(",")]
    if len(args) == 2 and all(a.startswith("float ") for a in args):
      return call.group(1), [a.split(" ", 1)[1] for a in args]
  return None


def _folds(kind: str, k, m, value_at: int):
  """`kind` of the constant `k` in the value's place and `m`, in float32."""
  a, b = (k, m) if value_at == 0 else (m, k)
  with np.errstate(all="ignore"):
    if kind == "fmul":
      out = np.float32(a * b)
    elif kind == "fadd":
      out = np.float32(a + b)
    elif kind == "fsub":
      out = np.float32(a - b)
    elif a == 0 and b == 0:
      return None       # which zero a maximum picks: not modelled
    else:
      out = np.float32(_FOLDABLE_CALLS[kind](a, b))
  if not np.isfinite(out) or (out != 0 and abs(out) < np.finfo(np.float32).tiny):
    return None
  return out


class _Semantics:
  """The semantic forms of one function's values (`same_semantics`).

  `form(name, resolve, mat)`: the value as one lane's expression, a string, and
  whether it rounds; with `resolve`, every multiply-add written out as the FMA it
  becomes; with `mat`, every operand whose form (unresolved by nothing of this
  function's) is one that some kernel stores reads as a load (`materialised`),
  unless the operand is a product an add could take into an FMA."""

  def __init__(self, blocks: dict[str, list[str]],
               materialised: frozenset[str] = frozenset()):
    self.rhs, self.where, self.uses, self.stores = _definitions(blocks)
    self.materialised = materialised
    self.memo: dict[tuple[str, bool, bool], tuple[str, bool]] = {}
    # Whether a value some kernel stores is recomputed here where it cannot read
    # as a load (a product an add contracts, a reassociating consumer): the other
    # program may load it for the same element, in a form found elsewhere too.
    self.refused = False
    # The picks of each form `lattice` made, to merge nests across lane moves.
    self.lattices: dict[str, frozenset[str]] = {}

  def source(self, name: str) -> str:
    seen = set()
    while name in self.rhs and name not in seen:
      seen.add(name)
      moved = _lane_move(self.rhs[name])
      if moved is None:
        break
      name = moved
    return name

  def contractible(self, name: str | None, home: str) -> bool:
    rhs = self.rhs
    return (name is not None and name in rhs and _opcode(rhs[name]) == "fmul"
            and self.where[name] == home and self.uses[name] == 1
            and _flags(rhs[name]) <= _PLAIN_FLAGS)

  def operand(self, text: str, home: str, resolve: bool, mat: bool,
              consumer: str, placed: bool = False) -> tuple[str, bool]:
    if not _VALUE.fullmatch(text):
      if mat and "=" + text in self.materialised:
        # A constant some kernel stores (a window set to it in place) is the
        # value the other program may load there: jax.jit computes `b - p` over
        # `b.at[i, 8:].set(-2.0)` fused, as `-2.0 - p` for the window's elements,
        # where a sequenced program sets the window and loads it (fuzz seed 7400
        # #2611). Either rounds as `load - p`.
        return "(load)", False
      return text, False                      # a constant
    name = self.source(text)
    if name not in self.rhs:
      return "(arg)", False
    stored = mat and self.form(name, True, False)[0] in self.materialised
    if placed:
      # A consumer that may reassociate: where its operands are computed, and how
      # many uses a product has, can change what LLVM makes of it.
      out, r = self.form(name, resolve, False)
      self.refused = self.refused or (stored and out not in _LEAVES)
      mark = "^" if self.where[name] != home and out not in _LEAVES else ""
      uses = f"*{self.uses[name]}" if _opcode(self.rhs[name]) == "fmul" else ""
      return f"{mark}({out}{uses})", r
    out, r = self.form(name, resolve, mat)
    if mat and not stored and out not in _LEAVES:
      # A value whose operands some kernel stores, itself stored in terms of
      # those loads (`max(x, v)` for a stored `v`, stored by the candidate's
      # scatter-max and recomputed by jax.jit's subtract): the same value.
      stored = self.form(name, True, True)[0] in self.materialised
    if stored and out not in _LEAVES:
      if _opcode(self.rhs[name]) in _CONTRACTIBLE and \
          consumer in ("fadd", "fsub", "fneg", "fpext") and \
          not self.shared_product(text, name, consumer):
        self.refused = True
      else:
        return "(load)", False
    return f"({out})", r

  def shared_product(self, text: str, name: str, consumer: str) -> bool:
    """Whether operand `text` of an add is a product LLVM cannot contract into
    it: the product itself (not moved across lanes) with more than one use. x86's
    instruction selection forms an FMA only from a product with one use (no
    aggressive FMA fusion), so a product an add shares with another use rounds
    on its own, as a stored one loaded (`v - v` for `v = b * b`, recomputed by
    jax.jit in the subtraction's loop and loaded by a sequenced program: fuzz
    seed 5800 #237)."""
    return consumer in ("fadd", "fsub") and text == name and \
        _opcode(self.rhs[name]) == "fmul" and self.uses[name] > 1

  def generic(self, text: str, home: str, resolve: bool, mat: bool,
              placed: bool) -> tuple[str, bool]:
    op, rounds = _opcode(text), [False]

    def sub(m: re.Match) -> str:
      f, r = self.operand(m.group(0), home, resolve, mat, op, placed)
      rounds[0] = rounds[0] or r
      return f

    return _VALUE.sub(sub, text), rounds[0]

  def summed(self, text: str, op: str, home: str, resolve: bool,
             mat: bool) -> tuple[str, bool]:
    m = _SUM_TEXT.match(text)
    ops = _operands(m.group(4)) if m else []
    names = [o if _VALUE.fullmatch(o) and o in self.rhs else None for o in ops]
    if m is None or len(ops) != 2 or any(
        n is not None and _opcode(self.rhs[n]) in ("fneg", "fpext") for n in names):
      # An add of a negated or widened product: other folds decide; placed.
      return self.generic(text, home, resolve, mat, True)[0] + "@placed", True
    head = f"{m.group(2)} {m.group(3)}"
    chosen = next((i for i in (0, 1) if self.contractible(names[i], home)), None) \
        if resolve else None
    if chosen is None:
      negated = self.negated_product(names[1], mat, home, resolve) \
          if op == "fsub" else None
      if negated is not None:
        # `c - a * b` is `c + (-a) * b`, bit for bit: read as the add.
        op, ops = "fadd", ops[:1]
      a, *rest = (self.operand(o, home, resolve, mat, op)[0] for o in ops)
      b = rest[0] if rest else f"({negated})"
      if op == "fadd":
        a, b = sorted((a, b))
      return f"{op}{head} {a}, {b}", True
    product = names[chosen]
    assert product is not None
    if mat and self.form(product, True, False)[0] in self.materialised:
      self.refused = True       # a stored product contracted here
    p = _PRODUCT_TEXT.match(_semantic_text(self.rhs[product]))
    factors = _operands(p.group(3)) if p else []
    if p is None or len(factors) != 2:
      return self.generic(text, home, resolve, mat, True)[0] + "@placed", True
    other = self.operand(ops[1 - chosen], home, resolve, mat, op)[0]
    if op == "fsub" and chosen == 1:
      # `c - a * b` fused is `fma(-a, b, c)`, bit for bit: read as that, the
      # negated factor a load where some kernel stores it (`negated_factors`).
      x, y = self.negated_factors(factors, p.group(2), home, resolve, mat)
      kind = "fma"
    else:
      x, y = sorted(self.operand(f, home, resolve, mat, "fmul")[0] for f in factors)
      kind = "fma" if op == "fadd" else "fms"
    return f"{kind}{head}|{p.group(1)} {x}, {y}, {other}", True

  def reads_stored(self, product: str) -> bool:
    """Whether a factor of `product` is a value some kernel stores, computed here
    (read as a load by `operand`, though this function computes it)."""
    p = _PRODUCT_TEXT.match(_semantic_text(self.rhs[product]))
    for f in _operands(p.group(3)) if p else ():
      if not _VALUE.fullmatch(f):
        continue
      name = self.source(f)
      if name in self.rhs:
        form = self.form(name, True, False)[0]
        if form not in _LEAVES and form in self.materialised:
          return True
    return False

  def negated_factors(self, factors: Sequence[str], ty: str, home: str, resolve: bool,
                      mat: bool) -> tuple[str, str]:
    """The factors of `-(a * b)` as `(-a) * b`, sorted: the factor negated is one
    whose negation some kernel stores (read as a load), else the first in order.
    Negation is exact, so either way the product rounds alike."""
    forms = sorted(self.operand(f, home, resolve, mat, "fmul")[0] for f in factors)
    negs = [f"fneg {ty} {f}" for f in forms]
    k = next((i for i in (0, 1) if mat and negs[i] in self.materialised), 0)
    forms[k] = "(load)" if mat and negs[k] in self.materialised else f"({negs[k]})"
    x, y = sorted(forms)
    return x, y

  def negated_product(self, name: str | None, mat: bool, home: str,
                      resolve: bool) -> str | None:
    """`-(a * b)` as the form of the product `(-a) * b`, where `name` is a plain
    product of two factors; else None."""
    if name is not None:
      # A product moved across lanes (a scalar's splat) is negated alike.
      name = self.source(name)
    if name is not None and name in self.rhs and _opcode(self.rhs[name]) == "phi" and \
        self.form(name, resolve, mat)[0] != "phi":
      # A phi of one product computed alike on every path (`merged`) is negated
      # as that product (fuzz seed 7000 #2240: `x * 0.99 - 0.01 * v` with the
      # product sunk into the block a split row loop's paths meet).
      incoming = [v for v in _PHI_INCOMING.findall(_semantic_text(self.rhs[name]))
                  if _VALUE.fullmatch(v)]
      name = self.source(incoming[0])
    if mat and name is not None and name in self.rhs and \
        _opcode(self.rhs[name]) == "select":
      # A select a product was folded into (`unfolded`): negated as that product.
      arm = self.unfolded(_semantic_text(self.rhs[name]))
      name = self.source(arm) if arm is not None else name
    if name is None or name not in self.rhs or _opcode(self.rhs[name]) != "fmul" or \
        not _flags(self.rhs[name]) <= _PLAIN_FLAGS:
      return None
    if mat and self.uses[name] > 1 and self.form(name, True, False)[0] in self.materialised:
      return None     # a stored product no add contracts: read as a load (`operand`)
    p = _PRODUCT_TEXT.match(_semantic_text(self.rhs[name]))
    factors = _operands(p.group(3)) if p else []
    if p is None or len(factors) != 2:
      return None
    x, y = self.negated_factors(factors, p.group(2), home, resolve, mat)
    return f"fmul{p.group(1)} {p.group(2)} {x}, {y}"

  def moved(self, name: str, text: str, home: str, resolve: bool,
            mat: bool) -> tuple[str, bool]:
    """A shuffle or insertion: the form of its lanes where every lane that is
    not poison holds one form, else an opaque blend of its operands."""
    raw = _SPLAT.sub(lambda m: m.group(2), self.rhs[name])
    m = (_SHUFFLE_OPERANDS.match(raw) if _opcode(raw) == "shufflevector"
         else _INSERT_OPERANDS.match(raw))
    if m is not None:
      parts = [self.operand(o, home, resolve, mat, "move")
               for o in m.groups() if o not in ("poison", "undef")]
      forms = {f for f, _ in parts}
      if len(forms) == 1:
        f = forms.pop()
        return (f[1:-1] if f.startswith("(") and f.endswith(")") else f,
                any(r for _, r in parts))
    out, r = self.generic(text, home, resolve, mat, False)
    return "blend " + out, r

  def form(self, name: str, resolve: bool, mat: bool) -> tuple[str, bool]:
    key = (name, resolve, mat)
    hit = self.memo.get(key)
    if hit is not None:
      return hit
    raw = self.rhs[name]
    text = _semantic_text(raw)
    op = _opcode(text)
    home = self.where[name]
    if op == "load" or _LANE_LOADS.search(raw):
      out, r = "load", False
    elif op in _INTEGER_OPS:
      # Integer arithmetic is exact: a value computed so is the same value
      # loaded where another program stores it (`-b` for an int32 `b`, converted
      # to float32 from the negated buffer in one program and from the stored
      # result in the other: fuzz seed 1000 #62). It rounds nothing; its
      # consumers' forms do not depend on where it was computed.
      out, r = "load", False
    elif op == "phi":
      self.memo[key] = ("phi", False)      # a loop-carried phi reads itself: opaque
      incoming = _PHI_INCOMING.findall(text)
      if self.picks_leaves(incoming, resolve, mat):
        out, r = "load", False
      else:
        out, r = self.merged(incoming, resolve, mat)
    elif op == "select" and (choices := _choices(text)) is not None and \
        self.picks_leaves(choices, resolve, mat):
      out, r = "load", False
    elif op == "select" and mat and (arm := self.unfolded(text)) is not None:
      out, r = self.form(arm, resolve, mat)
    elif op in ("shufflevector", "insertelement"):
      out, r = self.moved(name, text, home, resolve, mat)
    elif (kind := _lattice(text)) is not None:
      out, r = self.lattice(name, kind, resolve, mat)
    else:
      call = _PICK_CALL.search(text)
      exact = (call is not None and call.group(1) in _EXACT_CALLS) or \
          _EXACT_REDUCE.search(text) is not None
      if exact:
        text = _FLAG_PREFIX.sub("", text)   # exact in any order
      plain = _flags(text) <= _PLAIN_FLAGS
      if op in ("fadd", "fsub") and plain:
        out, r = self.summed(text, op, home, resolve, mat)
      elif op == "fmul" and plain and (p := _PRODUCT_TEXT.match(text)) and \
          len(factors := _operands(p.group(3))) == 2:
        x, y = sorted(self.operand(f, home, resolve, mat, "fmul")[0] for f in factors)
        out, r = f"fmul{p.group(1)} {p.group(2)} {x}, {y}", True
      else:
        out, r = self.generic(text, home, resolve, mat, not plain)
        r = r or op in _ROUNDS or (op == "call" and not exact)
        if not plain:
          out += "@placed"
      if len(out) > 4 * _LIMIT:
        out = f"{op}#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
    self.memo[key] = (out, r)
    return out, r

  def lattice(self, name: str, kind: str, resolve: bool, mat: bool) -> tuple[str, bool]:
    """A nest of IEEE maximums (or minimums: `_lattice`), with the vector
    reductions and loop-carried accumulators among them, as the set of the forms
    it picks among. Such a maximum picks one of its operands whatever the order
    and grouping (NaN propagates, -0 is below +0; idempotent): jax.jit's reduce
    kernel ends in `llvm.vector.reduce.fmaximum` where a sequenced program's
    fusion reduces the same row by shuffles and lane maximums (fuzz seed 1000
    #98), the same pick for every element."""
    picks: set[str] = set()
    rounds = False
    home = self.where[name]

    def nested(v: str) -> bool:
      # Another of the same picks, or a loop's accumulator of them.
      t = _semantic_text(self.rhs[v])
      return _lattice(t) == kind or (_opcode(t) == "phi" and all(
          not _VALUE.fullmatch(x) or self.source(x) in seen or (
              self.source(x) in self.rhs
              and _lattice(_semantic_text(self.rhs[self.source(x)])) == kind)
          for x in _PHI_INCOMING.findall(t)))

    seen: set[str] = {name}
    todo = [name]
    while todo:
      text = _semantic_text(self.rhs[todo.pop()])
      args = _PHI_INCOMING.findall(text) if _opcode(text) == "phi" else [
          a.rsplit(" ", 1)[-1] for a in
          _operands(text[text.index("(", text.index("@")) + 1:text.rindex(")")])]
      for v in args:
        n = self.source(v) if _VALUE.fullmatch(v) else None
        if n is not None and n in seen:
          continue
        if n is not None and n in self.rhs and nested(n):
          seen.add(n)
          todo.append(n)
          continue
        f, r = self.operand(v, home, resolve, mat, kind)
        # The same picks moved across lanes (a reduction's shuffles): merged.
        picks |= self.lattices.get(f[1:-1], {f})
        rounds = rounds or r
    out = f"{kind}{{{', '.join(sorted(picks))}}}"
    self.lattices[out] = frozenset(picks)
    return out, rounds

  def unfolded(self, text: str) -> str | None:
    """For a select `c ? op(y, M) : K'` (or its mirror) of a loaded `y`, constants
    `M` and `K'`, where some kernel stores `c ? y : K` with `op(K, M)` exactly
    `K'`: the arm `op(y, M)`, which is then the select's value. InstCombine folds
    an operation with a constant into a select with a constant arm: jax.jit
    computes `0.01 * where(b > 0, b, 1.5)[22]` from the buffer as `b > 0 ? b *
    0.01 : 0.015`, where a sequenced program that stores the `where` loads it and
    multiplies (fuzz seed 7200 #17). Both are `op(load, M)` for every element:
    the folded constant is the product LLVM computed, rounded as at run time."""
    choices = _choices(text)
    words = text.split(" ")
    if choices is None or len(choices) != 2 or len(words) < 3 or words[1] != "i1" or \
        not _VALUE.fullmatch(words[2].rstrip(",")):
      return None
    arms = [i for i, c in enumerate(choices) if _VALUE.fullmatch(c)]
    if len(arms) != 1:
      return None
    i = arms[0]
    arm, folded = choices[i], _constant_value(choices[1 - i])
    if folded is None or arm not in self.rhs:
      return None
    op = _foldable(_semantic_text(self.rhs[arm]))
    if op is None:
      return None
    kind, operands = op
    values = [k for k, o in enumerate(operands) if _VALUE.fullmatch(o)]
    if len(values) != 1:
      return None
    y = self.source(operands[values[0]])
    m = _constant_value(operands[1 - values[0]])
    if m is None or y not in self.rhs or self.form(y, True, False)[0] != "load":
      return None
    for stored in self.materialised:
      # The condition is not compared: forms read a pick of loads as a load
      # whatever it picks by (`picks_leaves`); here, alike, the stored pick and
      # this one choose `y` or a constant, the same constant `op` folds.
      pick = _STORED_PICK.fullmatch(stored)
      if pick is None or pick.group(2 + i) != "(load)":
        continue
      kv = _constant_value(pick.group(3 - i))
      out = None if kv is None else _folds(kind, kv, m, values[0])
      if out is not None and out.tobytes() == folded.tobytes():
        return arm
    return None

  def merged(self, values: Sequence[str], resolve: bool, mat: bool) -> tuple[str, bool]:
    """A phi that merges one value computed alike on every incoming path (LLVM
    sinks code into a block that several paths reach): that value, rounded, since
    no consumer can contract a phi (`contractible`). jax.jit's kernel of `x * 0.99
    - 0.5 * v` computed column 23's `x * 0.99` on each path of a split row loop and
    subtracted in the block they meet, so the other product was contracted; the
    sequenced kernel subtracted in the same block and contracted `x * 0.99` (fuzz
    seed 6200 #699, 1 ulp in 9 of 768 elements, a lowered conditional; the other
    path brought the constant 2.97, the updated row's `3.0 * 0.99`). Read as
    `phi`, the two were alike; read as the product, the subtract's group holds
    both forms, and the kernels are compared in order
    (`kernels_of_ambiguous_forms_differ`). Constants on other paths are passed
    over; anything else (values that differ by path, a loop-carried phi, which
    reads itself) stays opaque."""
    forms = set()
    rounds = False
    for v in values:
      if not _VALUE.fullmatch(v):
        continue                        # a constant on another path
      name = self.source(v)
      if name not in self.rhs:
        return "phi", False
      f, r = self.form(name, resolve, mat)
      if f in ("phi", "load", "int"):
        return "phi", False
      forms.add(f)
      rounds = rounds or r
    if len(forms) != 1:
      return "phi", False
    return forms.pop(), rounds

  def picks_leaves(self, values: Sequence[str], resolve: bool, mat: bool) -> bool:
    """Whether a pick (a phi, a select) chooses only among memory and constants:
    each value loaded or constant, or such a pick itself, or (with `mat`) a value
    whose form some kernel stores, as `operand` reads it. It rounds nothing, and
    reads as a load: where a dynamic-update-slice fused into arithmetic picks the
    update or the old element, the other program may load the element from the
    buffer the update wrote in place (an update computed as `sin(y)` and stored
    there: fuzz seed 3700 #715)."""
    for v in values:
      if not _VALUE.fullmatch(v):
        continue                             # a constant
      name = self.source(v)
      if name not in self.rhs:
        return False
      if self.form(name, resolve, mat)[0] != "load" and not (
          mat and self.form(name, True, False)[0] in self.materialised):
        return False
    return bool(values)

  def stored(self) -> set[str]:
    """The forms (unresolved by materialisation) of the values this function
    stores that are not loads themselves. A stored pick (a phi, a select) stores
    each of its choices for the elements that take it: a dynamic-update-slice or
    scatter that XLA fuses into the kernel writing the buffer picks the updated
    element or the old one (fuzz seed 6700 #770: `b.at[:, 53].add(0.5)` stored by
    a phi of the loaded element and `x + 0.5`), so those choices are stored too."""
    out: set[str] = set()
    seen: set[str] = set()

    def add(name: str) -> None:
      name = self.source(name)
      if name not in self.rhs or name in seen:
        return
      seen.add(name)
      f, _ = self.form(name, True, False)
      text = _semantic_text(self.rhs[name])
      if f not in _LEAVES:
        out.add(f)
      elif f == "load" and _opcode(text) == "select":
        # A stored pick of loads and constants (`where(b > 0, b, 1.5)`), as
        # written: a select another program folds an operation into (`unfolded`).
        out.add(self.generic(text, self.where[name], True, False, False)[0])
      for c in _choices(text) or ():
        if _VALUE.fullmatch(c):
          add(c)

    for n, _ in self.stores:
      add(n)
    return out

  def refusing(self) -> bool:
    """Whether this function recomputes a stored value where it cannot read as a
    load (`refused`, after reading every value)."""
    self.groups()
    return self.refused

  def groups(self) -> list[tuple[str, str]]:
    """(unresolved form, resolved form) of every value that rounds at its root,
    and of every comparison of such a value (`compared`)."""
    return [(self.form(name, False, True)[0], self.form(name, True, True)[0])
            for name in self.roots()]

  def roots(self) -> list[str]:
    """The values `groups` reads: `rounding`, then `compared`."""
    return self.rounding() + self.compared()

  def compared(self) -> list[str]:
    """The comparisons with an operand that rounds at its root (read as a load
    where stored), in text order. A comparison rounds nothing, but which rounded
    value it compares decides what a select picks: `b - 0.1 * r > 0` and
    `b > 0.1 * r` round the same values and, where the difference is flushed to
    zero, pick differently (fuzz seed 7900 #659, tiny data). A comparison of
    picks and loads alone (an argmin's running minimum) is left out: it reads the
    same values however a loop lays it out."""
    out = []
    for name, text in self.rhs.items():
      if _FCMP.match(text) is None:
        continue
      form = self.form(name, False, True)[0]
      head = _COMPARE_HEAD.match(form)
      if head is not None and any(
          _ROUNDING_OPERAND.match(o) for o in _operands(form[head.end():], "([<", ")]>")):
        out.append(name)
    return out

  def rounding(self) -> list[str]:
    """The values that round at their root, in text order."""
    out = []
    for name, text in self.rhs.items():
      op = _opcode(text)
      if op in _ROUNDS or (op == "call" and _FLOAT_TYPE.search(text)
                           and not _LLVM_EXACT.search(text)
                           and not _EXACT_REDUCE.search(text)):
        out.append(name)
    return out


# A comparison's form (`_Semantics.form`) up to its operands, and an operand
# that is a rounding operation (where stored, the form reads it as a load).
_COMPARE_HEAD = re.compile(r"^fcmp (?:\w+ )+?(?:<\d+ x \w+>|\w+) ")
_ROUNDING_OPERAND = re.compile(r"^\(\^?\(?(?:%s)\b" % "|".join(sorted(_ROUNDS)))


_STORE_CONSTANT = re.compile(
    r"^store\s+(?:volatile\s+)?((?:<\d+ x )?(?:half|bfloat|float|double)>?\s+[^%\s][^,]*),")


def _stored(blocks: dict[str, list[str]]) -> frozenset[str]:
  """`_Semantics(blocks).stored()`, memoised, with `=K` for each float constant
  `K` the function stores (`_Semantics.operand`)."""
  hit = _STORED.get(id(blocks))
  if hit is not None and hit[0] is blocks:
    return hit[1]
  constants = {"=" + _semantic_text(m.group(1)).rsplit(" ", 1)[-1]
               for lines in blocks.values() for line in lines
               if (m := _STORE_CONSTANT.match(line.strip()))}
  out = frozenset(_Semantics(blocks).stored()) | constants
  if len(_STORED) > 4096:
    _STORED.clear()
  _STORED[id(blocks)] = (blocks, out)
  return out


def _materialised(a: Kernels, b: Kernels) -> frozenset[str]:
  return frozenset().union(*(_stored(f) for f in (*a.functions, *b.functions)))


def _shared(a: Kernels, b: Kernels) -> set[int]:
  """The ids of the kernels both programs compile alike (one interned text,
  `_interned`): such a kernel computes the same forms for the same elements in
  both, so its refusal (`_Semantics.refused`) tells them apart nowhere."""
  return {id(f) for f in a.functions} & {id(f) for f in b.functions}


def recomputes_unloadably(a: Kernels, b: Kernels) -> bool:
  """Whether a value some kernel of either program stores is recomputed where it
  cannot read as a load (a product an add contracts, a reassociating consumer's
  operand): then the other program may load it for the same element, and forms
  compared as sets or shares can match while that element rounds otherwise (fuzz
  seed 2063 #8875; seed 3200 #4528, let through by the lane-free shares of the
  multiply-add veto). Comparisons other than `same_semantics` require it False."""
  if not a.functions or not b.functions:
    return True
  materialised = _materialised(a, b)
  both = _shared(a, b)
  return any(_groups(blocks, materialised)[1]
             for blocks in (*a.functions, *b.functions) if id(blocks) not in both)


def _groups(blocks: dict[str, list[str]], materialised: frozenset[str]
            ) -> tuple[list[tuple[str, str]], bool]:
  """`_Semantics(blocks, materialised)`'s groups and whether it refused, memoised:
  a kernel both programs compile alike (most are) is read once, for every
  candidate of a decision where the stored forms are the same (`_interned`)."""
  hit = _semantic_reading(blocks, materialised)
  return hit[1], hit[2]


def _semantic_reading(blocks: dict[str, list[str]], materialised: frozenset[str]
                      ) -> tuple[dict, list[tuple[str, str]], bool, list[str]]:
  """(blocks, groups, refused, roots) of `_Semantics(blocks, materialised)`,
  memoised (`_groups`). The roots are read first, as `groups` reads them: a form
  once read is remembered, so reading them again changes nothing."""
  key = (id(blocks), materialised)
  hit = _GROUPS_MEMO.get(key)
  if hit is None or hit[0] is not blocks:
    if len(_GROUPS_MEMO) > 4096:
      _GROUPS_MEMO.clear()
    semantics = _Semantics(blocks, materialised)
    roots = semantics.roots()
    groups = semantics.groups()
    hit = _GROUPS_MEMO[key] = (blocks, groups, semantics.refused, roots)
  return hit


def _paired_refusals(a: Kernels, b: Kernels, materialised: frozenset[str],
                     shared: set[int]) -> set[int]:
  """The ids of refusing kernels (`_Semantics.refused`) that pair one for one
  with a refusing kernel of the other program that rounds the same values in the
  same forms, in the same text order, over the same loops (`_extent`): the same
  kernel compiled from two programs whose texts differ elsewhere (fuzz seed 7200
  #695: the kernel that recomputes a stored product in an add, in jax.jit's
  program and in the candidate's alike). Such a kernel tells the programs apart
  nowhere, as a shared one (`_shared`)."""
  def refusing(k: Kernels) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = collections.defaultdict(list)
    for blocks in k.functions:
      if id(blocks) in shared:
        continue
      pairs, refused = _groups(blocks, materialised)
      if refused:
        out[(tuple(pairs), _extent(blocks))].append(id(blocks))
    return out

  ra = refusing(a)
  if not ra:
    return set()
  rb = refusing(b)
  out: set[int] = set()
  for key, ids in ra.items():
    others = rb.get(key, [])
    n = min(len(ids), len(others))
    out.update(ids[:n])
    out.update(others[:n])
  return out


def same_semantics(a: Kernels, b: Kernels) -> bool:
  """Whether two programs' kernels round every value alike, read as one lane's
  operations that round (`_Semantics`), values that some kernel stores and the
  other program recomputes read as loads.

  Each rounding value is grouped by its expression without contractions; the
  two programs must compute the same groups with the same resolved forms. Where
  each group has one form, every element an expression computes, in either
  program and whichever instance computes it, rounds the same way. A group
  formed two ways (a product contracted in one loop and hoisted out of another,
  fuzz regressions #3030, #1475) is not compared by counts: each program must
  compute each of its forms in kernels over the same loops (`_form_table`, as
  `kernels_of_ambiguous_forms_differ` asks of the other comparisons; fuzz seed
  6500 #4846: an argmin that recomputes a column of a step, contracted, beside
  the step's own loop, not). Anything this reading does not model is
  "different": a blend of lanes of different forms, reductions whose adds may
  reassociate (their operands placed), transcendentals other than those
  measured, a kernel that recomputes a stored value where it cannot read as a
  load (`_Semantics.refused`), unless both programs compile that kernel alike
  (`_paired_refusals`)."""
  if not a.functions or not b.functions:
    return False
  materialised = _materialised(a, b)
  both = _shared(a, b)
  both |= _paired_refusals(a, b, materialised, both)

  def groups(k: Kernels) -> dict[str, set[str]] | None:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for blocks in k.functions:
      pairs, refused = _groups(blocks, materialised)
      if refused and id(blocks) not in both:
        return None
      for g, r in pairs:
        out[g].add(r)
    return out

  ga, gb = groups(a), groups(b)
  if ga is None or gb is None or ga.keys() != gb.keys() or any(
      ga[k] != gb[k] for k in ga):
    return False
  if all(len(ga[k]) == 1 for k in ga):
    return True
  try:
    ka, kb = _form_table(a, materialised)[1], _form_table(b, materialised)[1]
  except RecursionError:
    return False
  return all(ka.get(k) == kb.get(k) for k in ga if len(ga[k]) > 1)


_ICMP_CONSTANT = re.compile(r"^icmp\s+\w+\s+i\d+\s+\S+,\s*(-?\d+)$")


def _extent(blocks: dict[str, list[str]]) -> tuple:
  """What says how many elements a kernel computes besides its text: its loops'
  integer compares with constants (trip counts, rows picked out), sorted; () for
  straight-line code, where each instance of an expression is one element."""
  rhs, _, _, _ = _definitions(blocks)
  loops = any(_opcode(t) == "phi" for t in rhs.values())
  return (loops, tuple(sorted({int(m.group(1)) for t in rhs.values()
                               if (m := _ICMP_CONSTANT.match(t))})))


_INDUCTION_STEP = re.compile(r"^add(?: nuw| nsw)* i\d+ (%[\w.\-]+), (\d+)$")
_INDUCTION_PHI = re.compile(r"^phi i\d+ \[ 0, %[\w.\-]+ \], \[ (%[\w.\-]+), %[\w.\-]+ \]$")
_BOUND = re.compile(r"^icmp (?:eq|ne|ult|slt) i\d+ (%[\w.\-]+), (\d+)$")


def _elements(blocks: dict[str, list[str]], names: Sequence[str]) -> int | None:
  """How many elements the values `names` (instances of one expression in one
  kernel) compute: each one's lanes, times the trips of the loop whose block
  holds it. Known where the kernel has no loop, or one loop of one block,
  counted from 0 by a constant step to a constant bound that the step divides,
  that holds them all but those in the entry block; else None (`_form_table`
  keys such a kernel by its extent)."""
  rhs, where, _, _ = _definitions(blocks)
  loop_blocks = {where[n] for n, t in rhs.items() if _opcode(t) == "phi"}
  trips: dict[str, int] = {}
  for block in loop_blocks:
    found = None
    for n, t in rhs.items():
      m = _INDUCTION_PHI.match(t)
      if where[n] != block or m is None:
        continue
      step = _INDUCTION_STEP.match(rhs.get(m.group(1), ""))
      if step is None or step.group(1) != n:
        continue            # not an induction (an argmin's index, picked)
      bounds = {int(b.group(2)) for x, u in rhs.items()
                if where[x] == block and (b := _BOUND.match(u)) and b.group(1) == m.group(1)}
      if len(bounds) != 1 or found is not None:
        return None
      k, bound = int(step.group(2)), bounds.pop()
      if k <= 0 or bound % k:
        return None
      found = bound // k
    if found is None:
      return None
    trips[block] = found
  entry = next(iter(blocks), None)
  if len(trips) > 1 or (trips and any(where[n] not in trips and where[n] != entry
                                      for n in names)):
    # Nested loops, or instances in a block other than the loop's one block and
    # the entry (which runs once): a block the loop branches to runs on some
    # trips, or all, not once.
    return None
  total = 0
  for n in names:
    w = _WIDTH.match(rhs[n].split(" ", 1)[-1]) or _WIDTH.search(rhs[n])
    total += (int(w.group(1)) if w else 1) * trips.get(where[n], 1)
  return total


def _form_table(k: Kernels, materialised: frozenset[str]):
  """Each group's forms (`_groups`) in `k`, and per group the kernels computing
  it: a count of (the forms' instances in the kernel's text order, `_extent`).

  A loop that holds one form only is counted by that form, not by how many
  instances its text holds: unrolled six times in one program and vectorized in
  the other (fuzz seed 6500 #4846: an argmin's loop over a recomputed column),
  it computes its elements with that form in both. In straight-line code each
  instance is an element, and in a kernel of two forms their order says which
  element takes which (fuzz seed 6100 #3057): there the instances count."""
  forms: dict[str, set[str]] = collections.defaultdict(set)
  kernels: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for blocks in k.functions:
    pairs, keys = _kernel_forms(blocks, materialised)
    for g, r in pairs:
      forms[g].add(r)
    for g, key in keys:
      kernels[g][key] += 1
  return forms, kernels


def _kernel_forms(blocks: dict[str, list[str]], materialised: frozenset[str]
                  ) -> tuple[list[tuple[str, str]], list[tuple[str, tuple]]]:
  """One kernel's share of `_form_table`: its groups' (unresolved, resolved) forms
  and, per group, the key it counts under; memoised like `_groups` (jax.jit's
  kernels are tabled against each candidate's, and most kernels are the same)."""
  memo_key = (id(blocks), materialised)
  hit = _FORMS_MEMO.get(memo_key)
  if hit is not None and hit[0] is blocks:
    return hit[1], hit[2]
  per: dict[str, list[str]] = collections.defaultdict(list)
  at: dict[str, list[str]] = collections.defaultdict(list)
  _, pairs, _, names = _semantic_reading(blocks, materialised)
  for (g, r), name in zip(pairs, names, strict=True):
    per[g].append(r)
    at[g].append(name)
  extent = _extent(blocks) if per else None
  keys: list[tuple[str, tuple]] = []
  for g, seq in per.items():
    n = _elements(blocks, at[g]) if len(set(seq)) == 1 else None
    if n is not None:
      keys.append((g, (("*", seq[0]), ("elements", n))))
    elif extent and extent[0] and len(set(seq)) == 1:
      keys.append((g, (("*", seq[0]), extent)))
    else:
      keys.append((g, (tuple(seq), extent)))
  if len(_FORMS_MEMO) > 4096:
    _FORMS_MEMO.clear()
  _FORMS_MEMO[memo_key] = (blocks, pairs, keys)
  return pairs, keys


def kernels_of_ambiguous_forms_differ(a: Kernels, b: Kernels) -> bool:
  """Whether an expression some kernel of either program forms two ways (a product
  contracted in one kernel, rounded on its own in another) is computed in the two
  programs by kernels that differ in how many instances of each form they hold
  or in their loops' extents (`_extent`). Then equal counts of forms do not say
  which output elements take which form: the kernel that writes most rows of an
  update can contract where the other program's rounds (fuzz seed 5100 #6690,
  where jax.jit contracts in a straight-line kernel of one row and the candidate
  in a loop over all rows). The instances are compared in the order the kernel's
  text computes them, not only counted: two kernels of one fusion held the same
  two forms as often, but for other columns (fuzz seed 6100 #3057: with row 18 of
  `x * 0.99 - 0.25 * x[18]` loaded from its own buffer, LLVM hoisted column 0's
  `0.25 * x[18, 0]` out of the row loop, so that column's subtract contracted the
  other product; 15 of 384 elements 1 ulp off). Kernels that differ in text but
  not in these (an update in place beside one that writes a new buffer) compute
  each form for the same elements in both."""
  if not a.functions or not b.functions:
    return False
  materialised = _materialised(a, b)

  try:
    (fa, ka), (fb, kb) = _form_table(a, materialised), _form_table(b, materialised)
  except RecursionError:
    return True
  ambiguous = {g for g in (*fa, *fb) if len(fa.get(g, ())) > 1 or len(fb.get(g, ())) > 1}
  return any(ka.get(g) != kb.get(g) for g in ambiguous)
