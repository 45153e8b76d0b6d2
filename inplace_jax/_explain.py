"""Why XLA copies a buffer, read from the compiled HLO (pure text, like `_hlo.py`).

XLA copies a buffer when two values of it must live at once: the old value, still
read, and the new one an in-place update writes. In the HLO that is one of:

* the copy feeds the in-place update (XLA updates the copy) while the other users of
  the original read the old value;
* the copy feeds the readers (XLA keeps the old value aside) while the original is
  updated in place;
* the copy writes a result computed elsewhere into a donated buffer (an output
  aliased to a donated argument).

`explain` finds which, and names the reads and the update by their JAX operation and
the user's source line (looking inside fusions for the operation that reads the
buffer). Every statement it makes is what the HLO shows.
"""

from __future__ import annotations

import dataclasses

from ._hlo import ELEMENTWISE, Computation, HloModule, Instruction
from ._report import Access, CopyInfo

_IN_PLACE = frozenset({"dynamic-update-slice", "scatter"})
_VIEW = frozenset({"bitcast", "get-tuple-element", "tuple", "copy"})
_BITCAST = frozenset({"bitcast"})


def _op(ins: Instruction) -> str | None:
  name = ins.metadata.get("op_name")
  return name.rsplit("/", 1)[-1] if name else None


def _access(module: HloModule, ins: Instruction) -> Access:
  return Access(_op(ins), module.location(ins))


def _fused(module: HloModule, ins: Instruction) -> Computation | None:
  if ins.opcode != "fusion":
    return None
  name = ins.attributes.get("calls", "").strip().lstrip("%")
  return module.computations.get(name)


def _param(comp: Computation, k: int) -> Instruction | None:
  for i in comp.instructions:
    if i.opcode == "parameter" and i.operand_text.strip() == str(k):
      return i
  return None


def _writes_in_place(module: HloModule, comp: Computation, user: Instruction,
                     operand: str) -> bool:
  """Whether `user` writes its result over `operand`'s buffer: a dynamic-update-slice
  or scatter into it, a fusion whose root is one, or a loop carrying it."""
  if user.opcode in _IN_PLACE:
    return bool(user.operands) and user.operands[0] == operand
  if user.opcode == "while":
    return operand in user.operands
  fused = _fused(module, user)
  if fused is None:
    return False
  positions = {k for k, o in enumerate(user.operands) if o == operand}
  roots = [i for i in fused.instructions if i.is_root] or fused.instructions[-1:]
  def through(i):
    if i.opcode not in ("tuple", "bitcast"):
      return []
    return [fused.by_name[o] for o in i.operands if o in fused.by_name]

  for i in _walk(roots, through):
    if i.opcode in _IN_PLACE and i.operands:
      target = fused.by_name.get(i.operands[0])
      while target is not None and target.opcode in ("bitcast", "copy"):
        target = fused.by_name.get(target.operands[0]) if target.operands else None
      if target is not None and target.opcode == "parameter" and \
          target.operand_text.strip().isdigit() and \
          int(target.operand_text) in positions:
        return True
  return False


def _walk(start, expand):
  """Each instruction reachable from `start` once, depth first; `expand(i)`: the
  instructions to visit after `i`."""
  stack, seen = list(start), set()
  while stack:
    i = stack.pop()
    if i.name in seen:
      continue
    seen.add(i.name)
    yield i
    stack.extend(expand(i))


def _fused_readers(fused: Computation, k: int, through: frozenset[str]):
  """The operations of fusion computation `fused` that read its parameter `k`,
  looking through `through` (views the user did not write: no op name)."""
  p = _param(fused, k)
  if p is None:
    return
  def view(i) -> bool:
    return i.opcode in through and not _op(i)

  for i in _walk(fused.users.get(p.name, []),
                 lambda i: fused.users.get(i.name, []) if view(i) else []):
    if not view(i):
      yield i


def _reads(module: HloModule, user: Instruction, operand: str) -> list[Access]:
  """How `user` reads `operand`: inside a fusion, the fused operations that read the
  parameter bound to it; elsewhere `user` itself."""
  fused = _fused(module, user)
  if fused is None:
    return [_access(module, user)]
  out = [_access(module, i) for k, o in enumerate(user.operands) if o == operand
         for i in _fused_readers(fused, k, _VIEW)]
  return out or [_access(module, user)]


# Elementwise HLO ops: each result element reads its operands' elements at its own
# index, which a fusion writing over an operand may do in place.
_SAME_INDEX = ELEMENTWISE


def _moved_reads(module: HloModule, comp: Computation, src: Instruction,
                 parameter: int | None) -> list[Access]:
  """The operations of fusion `src` that read entry parameter `parameter` other
  than element by element (a slice, a broadcast, a gather, ...): why XLA cannot
  write `src`'s result over the parameter's buffer."""
  fused = _fused(module, src)
  if fused is None or parameter is None or not comp.is_entry:
    return []
  names = {i.name for i in comp.instructions if i.opcode == "parameter"
           and i.operand_text.strip() == str(parameter)}
  out: list[Access] = []
  for k, o in enumerate(src.operands):
    ins = comp.by_name.get(o)
    while ins is not None and ins.opcode == "bitcast" and ins.operands:
      ins = comp.by_name.get(ins.operands[0])
    if ins is None or ins.name not in names:
      continue
    out += [_access(module, i) for i in _fused_readers(fused, k, _BITCAST)
            if i.opcode not in _SAME_INDEX]
  return out


def _held_reads(module: HloModule, comp: Computation, src: Instruction,
                parameter: int | None) -> list[Access]:
  """The reads of entry parameter `parameter` outside the chain of buffer-sized
  values `src` is computed from (a broadcast add, then the scatter into its
  result): the old value they read is live while that chain starts, which is why
  XLA starts it in another buffer. Only the operations that read it, seen inside
  fusions."""
  if parameter is None or not comp.is_entry or src.shape_text != _param_shape(comp, parameter):
    return []
  params = {i.name for i in comp.instructions if i.opcode == "parameter"
            and i.operand_text.strip() == str(parameter)}
  for i in comp.instructions:        # views of it: bitcasts
    if i.opcode == "bitcast" and i.operands and i.operands[0] in params:
      params.add(i.name)
  def data(i):
    # Through tuples (a barrier's, a conditional's, a loop's): they pass it on.
    return [comp.by_name[o] for o in i.operands if o in comp.by_name and o not in params
            and (comp.by_name[o].shape_text == src.shape_text
                 or comp.by_name[o].shape_text.startswith("("))]
  chain = {i.name: i for i in _walk([src], data)}
  # The chain's first steps, those that read the parameter, and what they wait
  # for: a read among those runs before them, and keeps nothing alive.
  heads = [i for i in chain.values() if any(o in params for o in i.operands)]
  before = {i.name for i in _walk(heads, lambda i: [comp.by_name[o] for o in i.operands
                                                    if o in comp.by_name])}
  return [a for name in params for u in comp.users.get(name, [])
          if u.name not in chain and u.name not in before and u.name not in params
          and u.opcode != "copy" for a in _reads(module, u, name)]


def _param_shape(comp: Computation, k: int) -> str | None:
  p = _param(comp, k)
  return p.shape_text if p is not None else None


def _origins(comp: Computation, name: str) -> set[str]:
  """`name` and the values it is a view of, up through get-tuple-element of an
  optimization barrier (or a tuple) and bitcasts: one buffer under several names."""
  out = {name}
  ins = comp.by_name.get(name)
  while ins is not None and ins.operands:
    if ins.opcode == "get-tuple-element":
      src = comp.by_name.get(ins.operands[0])
      while src is not None and src.opcode == "opt-barrier" and src.operands:
        src = comp.by_name.get(src.operands[0])
      index = ins.attributes.get("index", "").strip()
      if src is None or src.opcode != "tuple" or not index.isdigit() or \
          int(index) >= len(src.operands):
        break
      ins = comp.by_name.get(src.operands[int(index)])
    elif ins.opcode in ("bitcast", "opt-barrier"):
      ins = comp.by_name.get(ins.operands[0])
    else:
      break
    if ins is None:
      break
    out.add(ins.name)
  return out


def _parameter_view(comp: Computation, name: str) -> bool:
  """Whether `name` is the computation's parameter, or an element or view of it
  (get-tuple-element, bitcast)."""
  ins = comp.by_name.get(name)
  while ins is not None and ins.opcode in ("get-tuple-element", "bitcast") and ins.operands:
    ins = comp.by_name.get(ins.operands[0])
  return ins is not None and ins.opcode == "parameter"


def _dedupe(accesses) -> tuple[Access, ...]:
  out: list[Access] = []
  for a in accesses:
    if a not in out and (a.op or a.location):
      out.append(a)
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class Cause:
  """The reads and the in-place update that make XLA copy."""
  readers: tuple[Access, ...]
  writer: Access | None
  into_buffer: bool = False
  # For `into_buffer`: reads of the old value outside the chain that computes the
  # new one (in `readers` too).
  held: tuple[Access, ...] = ()
  # A conditional's branch returns the buffer as it came in, copied.
  passed_through: bool = False

  def text(self, buffer: str | None) -> str:
    what = buffer or "the buffer"
    if self.passed_through:
      return (f"this branch of a conditional returns {what} unchanged, and XLA "
              "copies it into the conditional's result (jax#16661)")
    if self.into_buffer:
      made = f" (by {self.writer})" if self.writer else ""
      reads = "; ".join(str(a) for a in self.readers if a not in self.held)
      also = f", which also reads it other than element by element ({reads})," \
          if reads else ""
      held = "; ".join(str(a) for a in self.held)
      held = f"; the old value is also read by {held}" if held else ""
      return (f"the new value of {what} is computed in another buffer{made}{also} "
              f"and copied into the donated one{held}")
    reads = "; ".join(str(a) for a in self.readers) or "a later use"
    if self.writer is None:
      return f"XLA keeps the old value of {what} for {reads}"
    return (f"XLA keeps the old value of {what} for {reads}, which the in-place "
            f"update {self.writer} would overwrite")


def explain(module: HloModule, copy: CopyInfo, into_buffer: bool = False
            ) -> Cause | None:
  """Why `copy` (a buffer copy of `module`) is there, from the HLO; None when its
  instruction is not found."""
  comp = module.computations.get(copy.computation)
  ins = comp.by_name.get(copy.name) if comp is not None else None
  if comp is None or ins is None or not ins.operands:
    return None
  v = ins.operands[0]
  if into_buffer:
    src = comp.by_name.get(v)
    if src is None:
      return Cause((), None, True)
    moved = _dedupe(_moved_reads(module, comp, src, copy.buffer_parameter))
    held = tuple(a for a in _dedupe(_held_reads(module, comp, src, copy.buffer_parameter))
                 if a not in moved)
    return Cause(moved + held, _access(module, src), True, held)
  done = comp.by_name.get(copy.done_name) if copy.done_name else None
  copy_users = comp.users.get((done or ins).name, [])
  if module.roles.get(comp.name) == "branch" and copy_users and \
      all(u.is_root for u in copy_users) and _parameter_view(comp, v):
    return Cause((), None, passed_through=True)
  v_users = [u for u in comp.users.get(v, []) if u is not ins]
  writers = [u for u in copy_users if _writes_in_place(module, comp, u, (done or ins).name)]
  writer: Instruction | None
  if writers:
    readers = [a for u in v_users for a in _reads(module, u, v)]
    writer = writers[0]
    # The update may also read the old value under another name (the operand of a
    # barrier that `v` is an output of): those fused reads are why it is copied.
    same = _origins(comp, v) - {v}
    readers += [a for o in same if o in writer.operands
                for a in _reads(module, writer, o)]
  else:
    # An output computed from the old value (elementwise, `p - lr * g`) and written
    # into this buffer is the update, not a read. Only the output aliased to this
    # buffer's parameter writes it: another output that reads the old value
    # (`p + emit * sign(0.9 * mu + ...)` reading mu) is written into its own
    # parameter's buffer, and is a read here.
    outputs = module.aliased_outputs() if comp.is_entry else {}
    src = comp.by_name.get(v)
    own = (int(src.operand_text) if src is not None and src.opcode == "parameter"
           and comp.is_entry and src.operand_text.strip().isdigit()
           else copy.buffer_parameter)
    writes = [u for u in copy_users if own is not None and outputs.get(u.name) == own]
    readers = [a for u in copy_users if u not in writes
               for a in _reads(module, u, (done or ins).name)]
    in_place = [u for u in v_users if _writes_in_place(module, comp, u, v)]
    if src is not None and src.opcode == "parameter" and comp.is_entry:
      # The donated buffer itself: whatever output is written into it overwrites it.
      in_place += [comp.by_name[n] for n, k in outputs.items()
                   if k == own and n in comp.by_name]
    writer = (writes or in_place)[0] if (writes or in_place) else None
    if writer is not None:
      # The update may read the copy itself (through a barrier's outputs), other
      # than element by element: a row of it broadcast into an elementwise update
      # (a one-trip loop XLA inlined, whose constant was read from the buffer).
      # That fused read is why the update cannot run over the old value.
      readers += _own_moved_reads(module, comp, writer, (done or ins).name)
  return Cause(_dedupe(readers), _access(module, writer) if writer is not None else None)


def _own_moved_reads(module: HloModule, comp: Computation, writer: Instruction,
                     name: str) -> list[Access]:
  """The operations fused into `writer` that read `name` (under any of its names:
  through a barrier's outputs and bitcasts) other than element by element."""
  fused = _fused(module, writer)
  if fused is None:
    return []
  return [_access(module, i) for k, o in enumerate(writer.operands)
          if name in _origins(comp, o)
          for i in _fused_readers(fused, k, _BITCAST) if i.opcode not in _SAME_INDEX]
