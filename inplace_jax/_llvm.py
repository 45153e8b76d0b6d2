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
equal; a candidate whose HLO fingerprint is equal may not run if the kernels'
multiply-adds (`contractions`) differ.

Pure text, like `_hlo.py`; no JAX import.
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import hashlib
import re
from collections.abc import Iterable, Sequence

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


def _function_values(blocks: dict[str, list[str]],
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
  rhs: dict[str, str] = {}
  where: dict[str, str] = {}
  uses: collections.Counter = collections.Counter()
  stores: list[tuple[str, str]] = []
  for block, lines in blocks.items():
    for line in lines:
      m = _DEFINE.match(line)
      if m:
        rhs[m.group(1)], where[m.group(1)] = m.group(2), block
      elif stored is not None and (s := _STORE.match(line)):
        stores.append((s.group(1), block))
      uses.update(_VALUE.findall(m.group(2) if m else line))
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


def _root_form(form: str) -> str:
  """An expression without its own number of uses and block mark."""
  if form.startswith("^(") and form.endswith(")"):
    form = form[2:-1]
  return _ROOT_USES.sub("", form)


def _parsed(texts: Iterable[str]) -> list[dict[str, list[str]]]:
  return [blocks for text in texts for blocks in _functions(text)]


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
_SUM = re.compile(r"^(\^\()?(fadd|fsub) ")
_PRODUCT = re.compile(r"\bfmul\b|llvm\.fma|fmuladd")
_PLACEMENT = re.compile(r"\^\(|\*\d+")


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
      groups[_PLACEMENT.sub("", form)][form] += n
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


def read(texts: Sequence[str]) -> Kernels | None:
  """Both views of the kernels in `texts`, or None when there is none to read."""
  functions = _parsed(texts)
  values, shares = _values(functions), _contractions(functions)
  if values is None or shares is None:
    return None
  return Kernels(frozenset(values.items()), shares, tuple(functions))


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


class Dump:
  """The IR texts of one compile, read (`read`) on first use only: a program's
  kernels are compared only where a sequenced candidate's HLO leaves it open."""

  def __init__(self, texts: Sequence[str]):
    self._texts: Sequence[str] | None = texts
    self._kernels: Kernels | None = None

  def kernels(self) -> Kernels | None:
    if self._texts is not None:
      self._kernels, self._texts = read(self._texts), None
    return self._kernels
