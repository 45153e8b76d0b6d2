"""The arithmetic of a compiled program, as a fingerprint to compare two programs by.

A barrier inplace_jax adds changes no value as long as XLA computes every operation
whose result depends on how it is compiled exactly as it does in jax.jit's program:
dots and convolutions (their operand layouts and contracting dimensions decide the
summation order), reductions (their operand and what is fused into them decide the
accumulation), and transcendentals (XLA:CPU's scalar and vector code differ in the
last bit). `fingerprint` lists each such operation with everything that decides its
arithmetic as the compiled HLO shows it: its operands' shapes and layouts, its
dimensions, the operations fused into it and the fusion it sits in. Two programs
whose fingerprints are equal compute those operations alike; where they differ, the
sequenced program is not run (`_jit.py`), and the report names the operation.

Pure text, like `_hlo.py`. It errs on the side of "different": a difference it
reports may be harmless, one it misses is a bug.
"""

from __future__ import annotations

import collections
import dataclasses
import re

from ._hlo import ArrayShape, Computation, HloModule, Instruction, Shape
from ._report import SourceLocation

# Operations whose result depends on how they are compiled.
SENSITIVE_OPCODES = frozenset((
    "dot convolution reduce reduce-window select-and-scatter exponential "
    "exponential-minus-one log log-plus-one logistic tanh sine cosine tan power atan2 "
    "erf cbrt rsqrt custom-call").split())
# Operations that round, and whose rounding can depend on what they are fused with:
# the cone of operations fused into a sensitive one lists these only. Data movement,
# selects, comparisons and exact operations move or pick the same values whether
# fused or read from memory.
_ROUNDING = frozenset((
    "add subtract multiply divide remainder power exponential exponential-minus-one "
    "log log-plus-one logistic tanh sine cosine tan atan2 erf cbrt rsqrt sqrt reduce "
    "reduce-window dot convolution").split())
_STRUCTURAL = frozenset({"parameter", "bitcast", "get-tuple-element", "tuple"})
_ATTRS = ("dimensions", "lhs_contracting_dims", "rhs_contracting_dims",
          "lhs_batch_dims", "rhs_batch_dims", "window", "dim_labels",
          "custom_call_target", "feature_group_count", "batch_group_count")


@dataclasses.dataclass(frozen=True)
class Operation:
  """One sensitive operation: what it is, where the user wrote it, and its form."""
  op: str | None
  location: SourceLocation | None
  form: tuple

  @property
  def key(self) -> tuple[str, int, str] | None:
    """(file, line, primitive name), as the analysis keys equations."""
    if self.op is None or self.location is None:
      return None
    return (self.location.file, self.location.line, self.op)

  def __str__(self) -> str:
    where = f" at {self.location}" if self.location is not None else ""
    return f"{self.op or self.form[0]}{where}"


def _operation(module: HloModule, ins: Instruction, form: tuple) -> Operation:
  """`ins` as an `Operation` of `form`: the primitive its metadata names, where."""
  op = ins.metadata.get("op_name")
  return Operation(op.rsplit("/", 1)[-1] if op else None, module.location(ins), form)


def _operand_shape(comp: Computation, name: str) -> str:
  """An operand's shape with its layout."""
  ins = comp.by_name.get(name)
  return "?" if ins is None else ins.shape_text


_FLOAT_TYPES = ("f16", "bf16", "f32", "f64", "c64", "c128", "f8")


def _is_float(ins: Instruction) -> bool:
  return ins.shape_text.startswith(_FLOAT_TYPES)


def _cone(comp: Computation, ins: Instruction) -> tuple[str, ...]:
  """The floating-point operations fused into `ins` (its operands' producers inside
  `comp`), sorted (integer index arithmetic does not round)."""
  out: list[str] = []
  seen: set[str] = set()
  stack = list(ins.operands)
  while stack:
    name = stack.pop()
    if name in seen:
      continue
    seen.add(name)
    i = comp.by_name.get(name)
    if i is None:
      continue
    if i.opcode in _ROUNDING and _is_float(i):
      out.append(f"{i.opcode}:{i.shape_text}")
    if i.opcode != "parameter":
      stack.extend(i.operands)
  return tuple(sorted(out))


def _reduced(comp: Computation, ins: Instruction, memo: dict
             ) -> tuple[str, ...]:
  """For a reduction in a fusion: the whole expression of what it reduces, data
  movement included, with shapes. XLA:CPU emits reductions with reassociation
  allowed, so LLVM's vector code decides the order of the sum from the loads it
  sees: a sum over a dynamic-update-slice fused into it and over the materialised
  result rounded differently (1 ulp, fuzz seed 2030 #202), and so did a sum over an
  update whose row was sliced out of a larger input and over the row materialised
  (seed 2042 #1218, AVX2: the one load's address differed, and LLVM vectorized
  only one of the two loops). A contiguous block of an input read through
  elementwise arithmetic reads as the input (`_INDEX_MOVES`); under a pick (a
  dynamic-update-slice, a select, ...) data movement is listed as it is."""
  if ins.opcode not in ("reduce", "reduce-window"):
    return ()
  return tuple(_tree(comp, o, memo, True, _INDEX_MOVES) for o in ins.operands)


# Data movement that only re-indexes an input, element for element, in memory
# order: a reduction over a contiguous block of an input (a row of a matrix) and
# over the same values materialised read them in one order (the row sums of
# tests/test_transform_matrix.py, values equal on AVX2 and AVX-512).
_INDEX_MOVES = frozenset({"bitcast", "reshape", "slice", "dynamic-slice"})
# Operations that pick each element from one of several places: the loads under
# them decide whether LLVM vectorizes the loop, data movement counts.
_PICKS = frozenset({"dynamic-update-slice", "select", "concatenate", "pad", "gather",
                    "scatter", "clamp"})


def _block(src: Shape, out: Shape) -> bool:
  """A slice that reads its input in runs as long as the materialised result's
  rows: a contiguous block, or whole rows (the minor dimension kept)."""
  if not isinstance(src, ArrayShape) or not isinstance(out, ArrayShape) or \
      len(src.dims) != len(out.dims) or not _row_major(src) or not _row_major(out):
    return False
  cut = [d for d, (a, b) in enumerate(zip(src.dims, out.dims)) if a != b]
  if not cut or cut[-1] < len(src.dims) - 1:
    return True
  return all(b == 1 for b in out.dims[:cut[-1]])


def _row_major(shape: ArrayShape) -> bool:
  n = len(shape.dims)
  return shape.layout in ("", "{" + ",".join(str(d) for d in range(n - 1, -1, -1)) + "}")


def _callers(module: HloModule) -> dict[str, Instruction]:
  out = {}
  for comp in module.computations.values():
    for ins in comp.instructions:
      if ins.opcode == "fusion":
        name = ins.attributes.get("calls", "").strip().lstrip("%")
        out[name] = ins
  return out


def has_small_calls(module: HloModule) -> bool:
  """Whether XLA:CPU hoisted a small loop of `module` into one kernel (`_small_calls`)."""
  return bool(_small_calls(module))


def _small_calls(module: HloModule) -> frozenset[str]:
  """The computations XLA:CPU emits inside one kernel with the computation that
  calls them: everything under a `call` marked `xla_cpu_small_call` (loops that
  touch little memory, xla/service/cpu/small_while_loop_hoisting_pass.cc). That
  emitter writes a fused reduction as other code than the fusion's own kernel:
  the same HLO summed 6 elements 1 ulp apart (fuzz seed 2038 #811, AVX2)."""
  callees: dict[str, list[str]] = {}
  for name, calls in module.callers.items():
    for call in calls:
      callees.setdefault(call.caller.name, []).append(name)
  stack = [name for name, calls in module.callers.items()
           if any('xla_cpu_small_call="true"' in
                  c.instruction.attributes.get("frontend_attributes", "")
                  for c in calls)]
  seen: set[str] = set()
  while stack:
    name = stack.pop()
    if name not in seen:
      seen.add(name)
      stack.extend(callees.get(name, ()))
  return frozenset(seen)


def _emitter(comp: Computation, small: frozenset[str]) -> str:
  """How XLA:CPU emits `comp`'s operations (`_small_calls`)."""
  return "small call" if comp.name in small else "kernel"


def _applied(module: HloModule, ins: Instruction) -> str:
  """The opcodes of a reduction's combiner (`to_apply`)."""
  name = ins.attributes.get("to_apply", "").strip().lstrip("%")
  comp = module.computations.get(name)
  if comp is None:
    return ""
  return ",".join(sorted(i.opcode for i in comp.instructions
                         if i.opcode not in _STRUCTURAL))


_ELEMENTWISE_SENSITIVE = frozenset((
    "exponential exponential-minus-one log log-plus-one logistic tanh sine cosine tan "
    "power atan2 erf cbrt rsqrt").split())


_ROUNDING_COMBINERS = ("add", "multiply", "subtract", "divide")


_ELEMENT_TYPE = re.compile(r"\b(pred|[suf]\d+|bf16|c\d+|f8\w*)\[")
_EXACT_OPCODES = frozenset(
    "dot convolution reduce reduce-window select-and-scatter".split())


def _integral(ins: Instruction) -> bool:
  """Whether every value `ins` produces is an integer or a predicate."""
  types = _ELEMENT_TYPE.findall(ins.shape_text)
  return bool(types) and all(t == "pred" or t[0] in "su" for t in types)


def _order_free(module: HloModule, ins: Instruction) -> bool:
  """A reduction whose combiner does not round (max, min, argmax, logical), or a
  reduction, dot or convolution over integers (wrapping integer adds and multiplies
  are associative): its result does not depend on the order XLA computes it in."""
  if ins.opcode in _EXACT_OPCODES and _integral(ins):
    return True
  if ins.opcode not in ("reduce", "reduce-window"):
    return False
  applied = _applied(module, ins).split(",")
  return not any(op in _ROUNDING_COMBINERS for op in applied)


# Element-for-element moves: a product reached through them is still computed next
# to the add in the fused loop, where it can be contracted.
_MOVES = frozenset({"broadcast", "reshape", "bitcast", "slice", "dynamic-slice",
                    "transpose", "copy", "concatenate", "pad", "reverse"})


# A negated product contracts too: LLVM makes `x + -(a * b)` into `fma(-a, b, x)`
# (fuzz seed 5500 #3283: a window add of a negated square, fused with the square
# under jax.jit and loading it stored in a candidate, 4 ulps apart).
_CONTRACT_MOVES = _MOVES | {"negate"}


def _product(comp: Computation, name: str) -> bool:
  """Whether operand `name` is a multiply computed in `comp`, through data moves
  and negations."""
  ins = comp.by_name.get(name)
  seen = 0
  while ins is not None and ins.opcode in _CONTRACT_MOVES and ins.operands and seen < 16:
    ins, seen = comp.by_name.get(ins.operands[0]), seen + 1
  return ins is not None and ins.opcode == "multiply"


def _users_through_moves(comp: Computation, name: str) -> list:
  """The users of `name` in `comp`, and through data moves and negations theirs."""
  out: list = []
  stack, seen = [name], set[str]()
  while stack and len(seen) < 64:
    n = stack.pop()
    if n in seen:
      continue
    seen.add(n)
    for u in comp.users.get(n, []):
      if u.opcode in _CONTRACT_MOVES:
        stack.append(u.name)
      else:
        out.append(u)
  return out


def _fma_able(comp: Computation, ins: Instruction) -> bool:
  """An add or subtract of a product computed in the same fusion: XLA:CPU may
  contract the pair into one fused multiply-add, and which pair it contracts depends
  on the fused expression around it."""
  if ins.opcode not in ("add", "subtract") or not _is_float(ins):
    return False
  return any(_product(comp, o) for o in ins.operands)


def _local(comp: Computation, ins: Instruction) -> tuple[str, ...]:
  """For a fused multiply-add candidate: which operands are products fused with it
  (contraction is decided by the add and its direct operands)."""
  kinds = tuple("multiply" if _product(comp, o) else "other" for o in ins.operands)
  # An add commutes; a subtract does not (which side is the product matters).
  return tuple(sorted(kinds)) if ins.opcode == "add" else kinds


def _context(caller: Instruction | None, comp: Computation, ins: Instruction) -> str:
  """The fusion an operation sits in: its kind, and its root where the root decides
  the code (a reduction, or the output of an elementwise chain it feeds)."""
  if caller is None:
    return ""
  kind = caller.attributes.get("kind", "")
  if ins.opcode not in _ELEMENTWISE_SENSITIVE:
    return kind
  roots = [i for i in comp.instructions if i.is_root] or comp.instructions[-1:]
  root = roots[0].opcode if roots else ""
  return f"{kind}/{'reduce' if root in ('reduce', 'reduce-window') else 'elementwise'}"


def _root_shape(comp: Computation) -> str:
  """The shape of what a fusion computes (the extent of its loop)."""
  roots = [i for i in comp.instructions if i.is_root] or comp.instructions[-1:]
  if not roots:
    return ""
  reduce = "reduce:" if roots[0].opcode in ("reduce", "reduce-window") else ""
  return f"{reduce}{roots[0].shape_text}"


# Floating-point arithmetic an expression is made of (its rounding can depend on the
# expression around it: contraction into FMAs, constant folding, vector code).
_ARITH = frozenset((
    "add subtract multiply divide negate power exponential exponential-minus-one log "
    "log-plus-one logistic tanh sine cosine tan atan2 erf cbrt rsqrt sqrt").split())
_PRODUCTS = frozenset(("multiply", "divide"))
_SUMS = frozenset(("add", "subtract"))
_TREE_LIMIT = 400


_BITCAST = frozenset({"bitcast"})


def _tree(comp: Computation, name: str, memo: dict,
          full: bool = False, moves: frozenset[str] = _BITCAST) -> str:
  """The floating-point expression computed at `name` inside `comp`, canonical:
  operands that are not float arithmetic (parameters, data movement, selects) are
  leaves, constants are their values. With `full`, every operation (data movement
  and selects too) down to the fusion's parameters, with its shape, but `moves` of
  a fusion's input, which are read as the input."""
  key = (name, moves)
  hit = memo.get(key)
  if hit is not None:
    return hit
  ins = comp.by_name.get(name)
  if ins is None:
    out = "?"
  elif ins.opcode == "constant":
    out = f"c{ins.operand_text.strip()}"
  elif ins.opcode == "parameter" or _moved_input(comp, ins, moves):
    # A bitcast of a fusion's input reads the same elements in the same order:
    # no operation, nothing to contract.
    out = "p"
  elif not full and ins.opcode == "broadcast" and ins.operands and \
      comp.by_name.get(ins.operands[0]) is not None and \
      comp.by_name[ins.operands[0]].opcode == "constant":
    out = _tree(comp, ins.operands[0], memo)
  elif full or (ins.opcode in _ARITH and _is_float(ins)):
    inner = _BITCAST if ins.opcode in _PICKS else moves
    args = [_tree(comp, o, memo, full, inner) for o in ins.operands]
    if not full and ins.opcode in ("add", "multiply"):
      args.sort()
    head = f"{ins.opcode}:{ins.shape_text}" if full else ins.opcode
    out = f"{head}({','.join(args)})"
    if len(out) > _TREE_LIMIT:
      out = f"{ins.opcode}(#{hash(out) & 0xffffffff:x})"
  else:
    out = "p"
  memo[key] = out
  return out


def _moved_input(comp: Computation, ins: Instruction, moves: frozenset[str]) -> bool:
  """A fusion parameter, or `moves` of one, each slice reading whole rows or one
  contiguous block (`_block`; docs/xla_notes.md, "Where a barrier changes a
  value")."""
  while ins.opcode in moves and ins.operands:
    nxt = comp.by_name.get(ins.operands[0])
    if nxt is None or (ins.opcode in ("slice", "dynamic-slice")
                       and not _block(nxt.shape, ins.shape)):
      return False
    ins = nxt
  return ins.opcode == "parameter"


def _ambiguous(comp: Computation, ins: Instruction) -> bool:
  """An add or subtract of two products: XLA:CPU contracts one of them into an FMA,
  and which one depends on the code around them (a dynamic-update-slice fused into
  one operand moved the last bit of one element in the fuzzer, seed 2026:248)."""
  return ins.opcode in _SUMS and _is_float(ins) and len(ins.operands) == 2 and \
      all(_product(comp, o) for o in ins.operands)


def _expressions(module: HloModule, small: frozenset[str]) -> collections.Counter:
  """Each product (multiply, divide) computed in a fusion, with the whole float
  expression it is computed from and what consumes it there, and the loop the fusion
  runs: XLA:CPU contracts a product into the add that consumes it, and how depends
  on the product's own expression and its loop. A sum of values that are not
  products rounds alike wherever it is computed, so sums are not listed."""
  out: collections.Counter = collections.Counter()
  callers = _callers(module)
  for comp in module.computations.values():
    memo: dict = {}
    full: dict = {}
    loop = _root_shape(comp) if comp.name in callers else ""
    kind = callers[comp.name].attributes.get("kind", "") if comp.name in callers else ""
    for ins in comp.instructions:
      if ins.opcode not in _PRODUCTS or not _is_float(ins):
        continue
      users = [u.opcode for u in _users_through_moves(comp, ins.name)
               if u.opcode in _ARITH and _is_float(u)]
      if not any(u in _SUMS for u in users):
        continue     # nothing to contract it into
      ambiguous = any(_ambiguous(comp, u) for u in comp.users.get(ins.name, []))
      tree = (_tree(comp, ins.name, full, True) if ambiguous
              else _tree(comp, ins.name, memo))
      out[_operation(module, ins, ("product", ins.shape_text, tree,
                                   tuple(sorted(set(users))), loop,
                                   _emitter(comp, small), kind))] += 1
  return out


def fingerprint(module: HloModule) -> collections.Counter:
  """Every sensitive operation of `module` with the form that decides its result."""
  callers = _callers(module)
  small = _small_calls(module)
  out: collections.Counter = collections.Counter()
  for comp in module.computations.values():
    caller = callers.get(comp.name)
    emitter = _emitter(comp, small)
    full: dict = {}
    reduced: dict = {}
    for ins in comp.instructions:
      if ins.opcode not in SENSITIVE_OPCODES and not _fma_able(comp, ins):
        continue
      if _order_free(module, ins):
        continue
      fusion = _context(caller, comp, ins)
      form: tuple
      if ins.opcode in ("add", "subtract"):
        # Contraction also depends on the loop the fusion runs (its output: a row
        # sliced out of the expression, a reduction over it, the whole of it), and
        # on everything fused into the add's operands: with a dynamic-update-slice
        # fused into the other operand or materialised, XLA:CPU contracted
        # differently (fuzz seed 2027 #3030, #3042, #3267: 1 ulp in up to 72 of
        # 1,024 elements), so the whole fused expression is listed.
        form = (ins.opcode, ins.shape_text, _local(comp, ins), fusion.split("/")[0],
                _root_shape(comp), _tree(comp, ins.name, full, True), emitter)
      else:
        form = (ins.opcode, ins.shape_text,
                tuple(_operand_shape(comp, o) for o in ins.operands),
                tuple((a, ins.attributes[a]) for a in _ATTRS if a in ins.attributes),
                _applied(module, ins), _cone(comp, ins) if caller is not None else (),
                fusion, _reduced(comp, ins, reduced) if caller is not None else (),
                emitter)
      out[_operation(module, ins, form)] += 1
  out.update(_expressions(module, small))
  out.update(_computed(module))
  return out


# Elementwise operations that round: `_computed` lists where each is computed.
_ROUNDING_ELEMENTWISE = frozenset("add subtract multiply divide".split())


def _computed(module: HloModule) -> collections.Counter:
  """Each source line's floating-point adds, subtracts, multiplies and divides, by
  kind, type and the constants they take: where a program computes one and the
  other does not, XLA folded it in one of them with a constant the other did not
  see (`x + 0.0` to `x`, wrong for -0.0 and for the subnormals XLA:CPU flushes; a
  branch's operand that a loop made constant: fuzz seed 8500 #955); where they
  take other constants, XLA folded a chain of them in one (`(x * 0.99) * 0.99` to
  `x * 0.9801`, one rounding instead of two) that a barrier kept apart in the
  other (fuzz seed 8800 #2206). Where each is fused does not count here
  (`fingerprint` lists what contraction depends on)."""
  out: collections.Counter = collections.Counter()
  for comp in module.computations.values():
    for ins in comp.instructions:
      if ins.opcode in _ROUNDING_ELEMENTWISE and _is_float(ins):
        element = _ELEMENT_TYPE.search(ins.shape_text)
        out[_operation(module, ins, ("computed", ins.opcode,
                                     element.group(1) if element else "",
                                     _constant_operands(comp, ins)))] = 1
  return out


def _constant_operands(comp: Computation, ins: Instruction) -> tuple[str, ...]:
  """The values of `ins`'s operands that are constants, or broadcasts of one."""
  out = []
  for o in ins.operands:
    a = comp.by_name.get(o)
    if a is not None and a.opcode == "broadcast" and a.operands:
      a = comp.by_name.get(a.operands[0])
    if a is not None and a.opcode == "constant":
      out.append(a.operand_text.strip())
  return tuple(sorted(out))


# Fusion kinds whose code XLA:CPU emits through LLVM (a `kCustom` fusion runs a
# library's kernel, which `_llvm.py` cannot read).
_LLVM_KINDS = frozenset({"", "kLoop", "kInput", "kOutput"})


def elementwise(op: Operation | str) -> bool:
  """Whether `op` is an operation in code XLA:CPU emits through LLVM whose
  kernels' IR can say what it computes: a multiply-add candidate, a product, an
  elementwise transcendental, or a reduction (its order of adds is in the IR,
  `reassoc` keeping its operands placed). Where two programs differ only in such
  operations, their kernels' LLVM IR decides whether they compute alike
  (`_llvm.py`)."""
  if not isinstance(op, Operation):
    return False
  head = op.form[0]
  if head == "computed":
    return True     # the kernels' IR says whether it is computed alike
  if head in ("add", "subtract"):
    kind = op.form[3]
  elif head == "product":
    kind = op.form[-1]
  elif head in _ELEMENTWISE_SENSITIVE or head == "reduce":
    kind = op.form[6].split("/")[0]
  else:
    return False
  return kind in _LLVM_KINDS


def differences(plain: collections.Counter, other: collections.Counter
                ) -> list[Operation]:
  """The operations whose form differs between two fingerprints (those of `plain`
  that `other` lacks, and the reverse). How many times an operation appears does not
  count: XLA computes a cheap fused operation once in each fusion that needs it,
  and each copy computes the same value."""
  return sorted(set(plain) ^ set(other), key=str)
