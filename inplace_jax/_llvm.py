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

Pure text, like `_hlo.py`; no JAX import.
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Iterable

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


def _functions(text: str) -> list[dict[str, list[str]]]:
  """Each function of an LLVM module: its basic blocks, each a list of its
  instructions (metadata dropped)."""
  out: list[dict[str, list[str]]] = []
  blocks: dict[str, list[str]] | None = None
  block = ""
  for line in text.splitlines():
    if line.startswith("define "):
      blocks, block = {"": []}, ""
      out.append(blocks)
      continue
    if blocks is None:
      continue
    if line.startswith("}"):
      blocks = None
      continue
    m = _LABEL.match(line)
    if m:
      block = m.group(1)
      blocks[block] = []
      continue
    line = _METADATA.sub("", line).strip()
    if line and not line.startswith(";"):
      blocks[block].append(line)
  return out


def _opcode(rhs: str) -> str:
  words = rhs.split()
  while words and words[0] in ("tail", "musttail", "notail"):
    words = words[1:]
  return words[0] if words else ""


def _function_values(blocks: dict[str, list[str]]) -> collections.Counter:
  """The canonical expressions of the floating-point values one function computes,
  each with how many times it computes it."""
  rhs: dict[str, str] = {}
  where: dict[str, str] = {}
  uses: collections.Counter = collections.Counter()
  for block, lines in blocks.items():
    for line in lines:
      m = _DEFINE.match(line)
      if m:
        rhs[m.group(1)], where[m.group(1)] = m.group(2), block
      uses.update(_VALUE.findall(m.group(2) if m else line))
  memo: dict[tuple[str, str], str] = {}

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
    elif op == "phi":
      out = "phi:" + text.split("[")[0][len("phi"):].strip()
    else:
      home = where[name]
      out = _VALUE.sub(lambda m: "(" + expr(m.group(0), home) + ")", text)
      if len(out) > _LIMIT:
        out = f"{op}#{hashlib.sha1(out.encode()).hexdigest()[:16]}"
      # LLVM contracts a product into an add only where the product has no other
      # use: how many uses a value has is part of what decides its rounding.
      out = f"{out}*{uses[name]}"
    if where[name] != block:
      out = f"^({out})"    # computed in another block: not contracted into this one
    memo[key] = out
    return out

  values: collections.Counter = collections.Counter()
  for name, text in rhs.items():
    op = _opcode(text)
    if op in _FLOAT_OPS or (op in _MOVES and _FLOAT_TYPE.search(text)):
      values[expr(name, where[name])] += 1
  return values


def fingerprint(texts: Iterable[str]) -> frozenset[tuple[str, int]] | None:
  """The canonical floating-point expressions of every kernel in `texts` (optimised
  LLVM IR modules), each with how many times the program computes it, or None
  when there is none to read."""
  values: collections.Counter = collections.Counter()
  seen = False
  for text in texts:
    for blocks in _functions(text):
      seen = True
      values.update(_function_values(blocks))
  return frozenset(values.items()) if seen else None
