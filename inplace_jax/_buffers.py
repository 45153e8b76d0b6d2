"""Which copies in a compiled HLO module copy a buffer the user asked to update in place.

Pure text, like `_hlo.py`. A copy is one of four kinds (`CopyInfo.category`):

* `"buffer"`: it copies a version of a donated argument (the argument itself, an
  update of it, a loop or branch carry of it), or it writes a result into a donated
  argument's buffer (an output aliased to it, computed elsewhere). This is what a
  warning is about.
* `"argument"`: it copies an argument that was not donated (updating one needs a
  copy; the fix is to donate it).
* `"layout"`: it changes an array's layout (XLA spells transposes as `copy`) or sits
  inside a fusion, where `copy` is part of the fused loop, not a buffer of its own.
* `"temporary"`: anything else (random-number state, a slice kept for later, a
  new value returned at several positions none of which is a donated buffer's).

Versions are found by following the donated entry parameters forward through what
updates a value or passes it on: tuples, bitcasts, copies, dynamic-update-slice and
scatter (operand 0), elementwise ops whose result has an operand's type, fusions
whose result has the type of an operand they compute it from element by element
(`x * 0.9 + g`; not `b - A @ x`, whose x reaches the result only through a dot: a
new value computed from x is no version of it), loops, conditionals and calls. A
loop's carry is the buffer that enters it: the body writes each carry's new value
into that carry's buffer, whatever the value was computed from.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import Union

from . import _explain
from ._hlo import (
    ELEMENTWISE, ArrayShape, Computation, HloModule, Instruction, TupleShape,
    trace_source)
from ._report import CopyInfo

# A value's lineage: the donated parameters it may be a version of; for a tuple, one
# lineage per element.
Lineage = Union[frozenset, tuple]
_NONE: frozenset = frozenset()

_PASS = frozenset({"bitcast", "copy", "copy-done", "opt-barrier"})
_OPERAND0 = frozenset({"dynamic-update-slice", "scatter"})
_MAX_ROUNDS = 20


def _union(values: Iterable[Lineage]) -> frozenset:
  out: set = set()
  for v in values:
    out |= _flat(v)
  return frozenset(out)


def _flat(v: Lineage) -> frozenset:
  if isinstance(v, tuple):
    return _union(v)
  return v


def _element(v: Lineage, i: int) -> Lineage:
  if isinstance(v, tuple):
    return v[i] if i < len(v) else _NONE
  return v


def _merge(a: Lineage, b: Lineage) -> Lineage:
  if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
    return tuple(_merge(x, y) for x, y in zip(a, b, strict=True))
  if isinstance(a, tuple) or isinstance(b, tuple):
    return a if isinstance(a, tuple) else b if not _flat(a) else a
  return a | b


def _same_array(a, b) -> bool:
  return (isinstance(a, ArrayShape) and isinstance(b, ArrayShape)
          and a.element_type == b.element_type and a.dims == b.dims)


class _Lineages:
  """Lineage of every instruction of a module, computed to a fixpoint."""

  def __init__(self, module: HloModule, donated: frozenset[int]):
    self.module = module
    self.donated = donated
    self.values: dict[tuple[str, str], Lineage] = {}
    self.params: dict[str, dict[int, Lineage]] = {}   # computation -> parameter -> lin
    # Fusion computations hold no value of their own (a fusion's lineage is read
    # from the paths through its computation, `_elementwise_path`), memoised.
    self.paths: dict[tuple[str, int], bool] = {}
    computations = [c for c in module.computations.values()
                    if module.roles.get(c.name) != "fusion"]
    for _ in range(_MAX_ROUNDS):
      self.changed = False
      for comp in computations:
        self._computation(comp)
      if not self.changed:
        break

  def of(self, comp: Computation, name: str) -> Lineage:
    return self.values.get((comp.name, name), _NONE)

  def _set(self, comp: Computation, name: str, lin: Lineage) -> None:
    key = (comp.name, name)
    old = self.values.get(key, _NONE)
    new = _merge(old, lin)
    if new != old:
      self.values[key] = new
      self.changed = True

  def _feed(self, comp_name: str, number: int, lin: Lineage) -> None:
    params = self.params.setdefault(comp_name, {})
    old = params.get(number, _NONE)
    new = _merge(old, lin)
    if new != old:
      params[number] = new
      self.changed = True

  def _root(self, comp_name: str) -> Lineage:
    comp = self.module.computations.get(comp_name)
    if comp is None or not comp.instructions:
      return _NONE
    roots = [i for i in comp.instructions if i.is_root] or comp.instructions[-1:]
    return self.of(comp, roots[0].name)

  def _computation(self, comp: Computation) -> None:
    for ins in comp.instructions:
      lin = self._instruction(comp, ins)
      if lin:
        self._set(comp, ins.name, lin)

  def _instruction(self, comp: Computation, ins: Instruction) -> Lineage:
    op = ins.opcode
    ops = [self.of(comp, o) for o in ins.operands]
    if op == "parameter":
      return self._parameter(comp, ins)
    if op == "get-tuple-element" and ins.attributes.get("index", "").isdigit():
      return _element(ops[0], int(ins.attributes["index"])) if ops else _NONE
    if op == "tuple":
      return tuple(ops)
    if op in _PASS or op in _OPERAND0:
      return ops[0] if ops else _NONE
    if op == "copy-start":
      return (ops[0], ops[0], _NONE) if ops else _NONE
    if op in ("while", "conditional", "call", "fusion"):
      return self._control(comp, ins, op, ops)
    if op in ELEMENTWISE:
      return _union(lin for o, lin in zip(ins.operands, ops, strict=True)
                    if _same_array(comp.by_name[o].shape, ins.shape))
    return _NONE

  def _parameter(self, comp: Computation, ins: Instruction) -> Lineage:
    text = ins.operand_text.strip()
    if not text.isdigit():
      return _NONE
    if comp.is_entry:
      return frozenset({int(text)}) if int(text) in self.donated else _NONE
    return self.params.get(comp.name, {}).get(int(text), _NONE)

  def _callees(self, ins: Instruction, *keys: str) -> list[str]:
    out = []
    for key in keys:
      value = ins.attributes.get(key, "").strip()
      if value.startswith("{"):
        value = value[1:-1]
      out += [p.strip().lstrip("%") for p in value.split(",") if p.strip()]
    return out

  def _control(self, comp, ins, op, ops) -> Lineage:
    if op == "while":
      # Each carry is one buffer for the whole loop (XLA copies whatever the body
      # computes elsewhere into it): the buffer that enters the loop. A carry
      # computed from another one (`p + r`, `x + 0.1 * p`) is not that one's
      # version: it is written into its own carry's buffer.
      for name in self._callees(ins, "body", "condition"):
        self._feed(name, 0, ops[0] if ops else _NONE)
      return ops[0] if ops else _NONE
    if op == "conditional":
      branches = self._callees(ins, "branch_computations", "true_computation",
                               "false_computation")
      out: Lineage = _NONE
      for k, name in enumerate(branches):
        if k + 1 < len(ops):
          self._feed(name, 0, ops[k + 1])
        out = _merge(out, self._root(name))
      return out
    if op == "call":
      for name in self._callees(ins, "to_apply", "calls"):
        for k, lin in enumerate(ops):
          self._feed(name, k, lin)
        return self._root(name)
      return _NONE
    return self._fusion(comp, ins, ops)

  def _fusion(self, comp, ins, ops) -> Lineage:
    """A fusion's result is a version of an operand of its type that it computes
    the result from element by element (elementwise arithmetic, an in-place
    dynamic-update-slice or scatter into it; XLA writes it over the operand where
    nothing else in the fusion reads it, else into a buffer of its own and copies
    it on, the user's update all the same). Not of an operand that reaches the
    result only through a dot, a reduction, a broadcast or a slice: the result is
    a new value computed from it."""
    fused = self.module.computations.get(
        ins.attributes.get("calls", "").strip().lstrip("%"))
    shares = [fused is not None and self._path(fused, k) for k in range(len(ins.operands))]

    def like(shape):
      return _union(lin for o, lin, ok in zip(ins.operands, ops, shares, strict=True)
                    if ok and _same_array(comp.by_name[o].shape, shape))
    if isinstance(ins.shape, TupleShape):
      return tuple(like(s) for s in ins.shape.elements)
    return like(ins.shape)


  def _path(self, fused: Computation, k: int) -> bool:
    key = (fused.name, k)
    if key not in self.paths:
      self.paths[key] = _elementwise_path(fused, k)
    return self.paths[key]


def _elementwise_path(fused: Computation, k: int) -> bool:
  """Whether fusion computation `fused` computes its result from parameter `k`
  element by element: along a path of elementwise ops (and bitcasts, copies,
  tuples, the buffer a dynamic-update-slice or scatter writes into) from the
  parameter to the root, whatever else reads it (`x - 0.5 * x[5]` updates x;
  `b - A @ x`, where x reaches the result only through a dot, is a new value)."""
  start = [i for i in fused.instructions
           if i.opcode == "parameter" and i.operand_text.strip() == str(k)]
  stack, seen = list(start), set()
  while stack:
    ins = stack.pop()
    if ins.is_root or ins is fused.instructions[-1]:
      return True
    if ins.name in seen:
      continue
    seen.add(ins.name)
    for user in fused.users.get(ins.name, []):
      positions = [j for j, o in enumerate(user.operands) if o == ins.name]
      if user.opcode in ELEMENTWISE or user.opcode in _PASS or user.opcode == "tuple" \
          or (user.opcode in _OPERAND0 and 0 in positions):
        stack.append(user)
  return False


def _layout(shape) -> str:
  if not isinstance(shape, ArrayShape):
    return ""
  return shape.layout.split(":")[0].strip("{}")


def _into_donated(module: HloModule, donated: frozenset[int]) -> dict[str, int]:
  """Entry copies whose result is an output aliased to a donated parameter: XLA
  computed that output elsewhere and copies it into the donated buffer."""
  out: dict[str, int] = {}
  for name, param in module.aliased_outputs().items():
    ins = module.entry.by_name.get(name) if module.entry else None
    if param not in donated or ins is None or ins.opcode not in ("copy", "copy-done"):
      continue
    if ins.opcode == "copy-done" and module.entry is not None:
      ins = module.entry.by_name.get(ins.operands[0])
    if ins is not None:
      out[ins.name] = param
  return out


def classify(module: HloModule, copies: tuple[CopyInfo, ...],
             donated: Iterable[int]) -> tuple[CopyInfo, ...]:
  """`copies` of `module` with `category` and `buffer` set; `donated` are the entry
  parameter numbers of donated arguments."""
  donated = frozenset(donated)
  lineages = _Lineages(module, donated)
  into = _into_donated(module, donated)
  # The entry result positions that reuse a donated parameter's buffer.
  aliased = {a.output_index[0] for a in module.aliases
             if a.output_index and a.parameter in donated}
  names = module.arguments
  out = []
  for c in copies:
    if c.module != module.name:
      out.append(c)
      continue
    comp = module.computations[c.computation]
    into_buffer = comp.is_entry and c.name in into
    if into_buffer:
      category, param = "buffer", into[c.name]
    else:
      category, param = _category(module, comp, c, lineages)
    buffer = names.get(param) if param is not None else None
    c = dataclasses.replace(c, category=category, buffer=buffer, buffer_parameter=param)
    if category == "buffer":
      cause = _explain.explain(module, c, into_buffer, functools.partial(_versions, lineages, comp))
      if cause is not None and cause.twice and not into_buffer and \
          not (set(cause.outputs) | set(cause.twice)) & aliased:
        # One value returned at several positions, none of them a donated
        # buffer's output: each position needs a buffer of its own, and the copy
        # is of a new value (`b * b` returned twice, fuzz seed 7900 #120), not
        # of a buffer updated in place, under any order.
        out.append(dataclasses.replace(c, category="temporary", buffer=None,
                                       buffer_parameter=None))
        continue
      if cause is not None:
        c = dataclasses.replace(c, cause=cause.text(buffer), readers=cause.readers,
                                writer=cause.writer)
    out.append(c)
  return tuple(out)


def _versions(lineages: _Lineages, comp: Computation, name: str) -> frozenset:
  return _flat(lineages.of(comp, name))


def _category(module, comp, c: CopyInfo, lineages: _Lineages):
  ins = comp.by_name[c.name]
  operand = comp.by_name.get(c.operand)
  if c.role == "fusion":
    return "layout", None
  result = ins.shape.elements[0] if isinstance(ins.shape, TupleShape) else ins.shape
  if operand is not None and _layout(result) != _layout(operand.shape):
    return "layout", None
  lin = _flat(lineages.of(comp, c.operand))
  if lin:
    return "buffer", min(lin)
  src, _ = trace_source(module, comp, c.operand)
  if src is not None and src.opcode == "parameter" and module.entry is not None \
      and module.entry.by_name.get(src.name) is src:
    return "argument", None
  return "temporary", None
