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
import math
from collections.abc import Callable

from ._hlo import ELEMENTWISE, ArrayShape, Computation, HloModule, Instruction
from ._report import Access, CopyInfo

_IN_PLACE = frozenset({"dynamic-update-slice", "scatter"})
_VIEW = frozenset({"bitcast", "get-tuple-element", "tuple", "copy"})
_BITCAST = frozenset({"bitcast"})


def _op(module: HloModule, ins: Instruction) -> str | None:
  """The JAX operation `ins` computes, from its `op_name`; None for an argument's
  name (XLA copies a parameter's metadata onto a bitcast of it)."""
  name = ins.metadata.get("op_name")
  if not name or name in module.argument_names:
    return None
  return name.rsplit("/", 1)[-1]


def _access(module: HloModule, ins: Instruction) -> Access:
  return Access(_op(module, ins), module.location(ins))


def _named(a: Access) -> bool:
  return bool(a.op or a.location)


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


def _fused_readers(module: HloModule, fused: Computation, k: int,
                   through: frozenset[str]):
  """The operations of fusion computation `fused` that read its parameter `k`,
  looking through `through` and conversions the user did not write (no op name:
  XLA:CPU computes bfloat16 in float32 between two converts)."""
  p = _param(fused, k)
  if p is None:
    return
  def view(i) -> bool:
    return i.opcode in through | {"convert"} and not _op(module, i)

  for i in _walk(fused.users.get(p.name, []),
                 lambda i: fused.users.get(i.name, []) if view(i) else []):
    if not view(i):
      yield i


def _reads(module: HloModule, user: Instruction, operand: str) -> list[Access]:
  """How `user` reads `operand`: the entry's result, as the outputs it is; inside a
  fusion, the fused operations that read the parameter bound to it; elsewhere
  `user` itself."""
  if _is_result(module, user):
    return [_output(module.output_number(k)) for k in _positions(user, operand)]
  fused = _fused(module, user)
  if fused is None:
    return [_access(module, user)]
  out = [a for k, o in enumerate(user.operands) if o == operand
         for a in (_access(module, i) for i in _fused_readers(module, fused, k, _VIEW))
         if _named(a)]
  return out or [_access(module, user)]


def _is_result(module: HloModule, ins: Instruction) -> bool:
  """Whether `ins` is the entry computation's result tuple (the outputs)."""
  return (ins.is_root and ins.opcode == "tuple" and module.entry is not None
          and module.entry.by_name.get(ins.name) is ins)


def _positions(ins: Instruction, operand: str) -> list[int]:
  return [k for k, o in enumerate(ins.operands) if o == operand]


def _output(k: int) -> Access:
  return Access(f"output {k}", None)


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
    out += [_access(module, i) for i in _fused_readers(module, fused, k, _BITCAST)
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
  return {i.name for i in _chain(comp, name)}


def _producer(comp: Computation, name: str, copies: bool = True) -> Instruction | None:
  """The instruction that computes the value `name` holds, looked back through
  views, optimization barriers and (with `copies`) copies."""
  chain = _chain(comp, name, copies)
  return chain[-1] if chain else None


def _chain(comp: Computation, name: str, copies: bool = False) -> list[Instruction]:
  """`name`'s instruction and those it is a view of, in order (through copies too
  with `copies`)."""
  ins = comp.by_name.get(name)
  out = [ins] if ins is not None else []
  passes = ("bitcast", "opt-barrier") + (("copy", "copy-start", "copy-done") if copies else ())
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
    elif ins.opcode in passes:
      ins = comp.by_name.get(ins.operands[0])
    else:
      break
    if ins is None:
      break
    out.append(ins)
  return out


def _update(module: HloModule, comp: Computation, ins: Instruction) -> Access:
  """The user's operation that computes `ins`'s value (through views, barriers and
  copies); for a fusion that names none, its in-place update, else the last
  operation inside it that has a name."""
  src = _producer(comp, ins.name) or ins
  a = _access(module, src)
  if src.opcode == "constant" and not _named(a):
    return Access("a constant", None)
  while not _named(a) and src.opcode == "get-tuple-element" and src.operands \
      and src.operands[0] in comp.by_name:
    # An element of a loop's, a conditional's or a call's result: that operation.
    src = comp.by_name[src.operands[0]]
    a = _access(module, src)
  fused = _fused(module, src)
  if _named(a) or fused is None:
    return a
  inner = [i for i in fused.instructions if i.opcode in _IN_PLACE] + fused.instructions[::-1]
  named = next((b for b in (_access(module, i) for i in inner) if _named(b)), None)
  if named is None and len(src.operands) == 1 and src.operands[0] in comp.by_name:
    # A fusion that only converts its one operand (XLA:CPU's bfloat16 around a
    # scatter): the operation that computes that operand.
    return _update(module, comp, comp.by_name[src.operands[0]])
  return named or a


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
  # The outputs the copy is (entry result positions), for `twice` and `foreign`.
  outputs: tuple[int, ...] = ()
  # Other outputs that hold the same value: one value returned more than once.
  twice: tuple[int, ...] = ()
  # For `into_buffer`: the copied value is no version of the buffer (another
  # buffer's update, or an argument returned as it came in: `returned` names it).
  foreign: bool = False
  returned: str | None = None
  # ... or the donated arguments it is an update of.
  of: tuple[str, ...] = ()
  # The writer is this output, aliased to the buffer, whose value is no version
  # of it (it overwrites the buffer without updating it).
  by_output: int | None = None
  # With `by_output`: the update runs on the copy, nothing reading the old value.
  in_copy: bool = False
  # The update's fusion ends in a reshape of its result to this shape (a cache
  # returned reshaped): XLA runs it on a copy, nothing reading the old value.
  reshaped: str | None = None

  def text(self, buffer: str | None) -> str:
    what = buffer or "the buffer"
    outs = " and ".join(f"output {k}" for k in self.outputs) or "an output"
    if self.passed_through:
      return (f"this branch of a conditional returns {what} unchanged, and XLA "
              "copies it into the conditional's result (jax#16661)")
    if self.twice:
      others = " and ".join(f"output {k}" for k in self.twice)
      return (f"the same value of {what} is {others} and {outs}: each output has a "
              f"buffer of its own, so XLA copies it into {outs}'s")
    if self.into_buffer and self.foreign:
      if self.returned is not None:
        return (f"{outs} is {self.returned}, returned unchanged, but its buffer is "
                f"that of donated {what} (an aliased output): XLA copies "
                f"{self.returned} into it")
      made = f" ({self.writer})" if self.writer else ""
      if self.of:
        return (f"{outs}{made} is an update of {' and '.join(self.of)}, not of {what}, "
                f"but its buffer is that of donated {what} (an aliased output): XLA "
                "computes it in another buffer and copies it in")
      return (f"{outs}{made} is computed in another buffer and copied into that of "
              f"donated {what}, which it is aliased to")
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
    if self.writer is None and self.by_output is None:
      return f"XLA keeps the old value of {what} for {reads}"
    if self.reshaped is not None and self.writer is not None:
      return (f"XLA runs the in-place update {self.writer} on a copy of {what}: the "
              f"update is fused with a reshape of its result to {self.reshaped}, and "
              "XLA does not run such a fusion in the buffer it updates")
    if self.in_copy and self.writer is not None:
      return (f"XLA runs the in-place update {self.writer} on a copy of {what}: the "
              f"buffer of {what} goes to output {self.by_output} (an aliased output), "
              "which is not that update's result")
    if self.by_output is not None:
      value = (f"{self.returned}, returned unchanged" if self.returned is not None
               else self.writer)
      return (f"XLA keeps the old value of {what} for {reads}, which output "
              f"{self.by_output} ({value}), written into the buffer of {what} "
              "(an aliased output), would overwrite")
    return (f"XLA keeps the old value of {what} for {reads}, which the in-place "
            f"update {self.writer} would overwrite")


def explain(module: HloModule, copy: CopyInfo, into_buffer: bool = False,
            versions: Callable[[str], frozenset[int]] | None = None) -> Cause | None:
  """Why `copy` (a buffer copy of `module`) is there, from the HLO; None when its
  instruction is not found. `versions(name)`: the donated parameters the value
  `name` (in the copy's computation) may be a version of."""
  comp = module.computations.get(copy.computation)
  ins = comp.by_name.get(copy.name) if comp is not None else None
  if comp is None or ins is None or not ins.operands:
    return None
  v = ins.operands[0]
  done = comp.by_name.get(copy.done_name) if copy.done_name else None
  me = (done or ins).name
  copy_users = comp.users.get(me, [])
  result = next((u for u in copy_users if _is_result(module, u)), None)
  outputs = tuple(module.output_number(k) for k in _positions(result, me)) \
      if result is not None else ()
  def version(name: str) -> bool:
    # Without lineages, every value is taken for a version (as before).
    return versions is None or copy.buffer_parameter in versions(name)

  if into_buffer:
    src = comp.by_name.get(v)
    if src is None:
      return Cause((), None, True)
    if not version(v):
      returned = _returned(module, comp, v)
      of = tuple(module.arguments[p] for p in sorted(versions(v) if versions else ())
                 if p in module.arguments)
      return Cause((), None if returned else _update(module, comp, src), True,
                   outputs=outputs, foreign=True, returned=returned, of=of)
    moved = _dedupe(_moved_reads(module, comp, src, copy.buffer_parameter))
    held = tuple(a for a in _dedupe(_held_reads(module, comp, src, copy.buffer_parameter))
                 if a not in moved)
    return Cause(moved + held, _update(module, comp, src), True, held)
  if module.roles.get(comp.name) == "branch" and copy_users and \
      all(u.is_root for u in copy_users) and _parameter_view(comp, v):
    return Cause((), None, passed_through=True)
  if result is not None and outputs and all(u is result for u in copy_users):
    # A copy that is only outputs, of a value also returned at another position.
    origin = _producer(comp, v)
    twice = tuple(module.output_number(k) for k, o in enumerate(result.operands)
                  if module.output_number(k) not in outputs
                  and origin is not None and _producer(comp, o) is origin)
    if twice:
      return Cause((), None, outputs=outputs, twice=twice)
  v_users = [u for u in comp.users.get(v, []) if u is not ins]
  writers = [u for u in copy_users if _writes_in_place(module, comp, u, me)]
  # A loop that carries the copy (in the tuple it starts from) updates it in place.
  writers += [w for u in copy_users if u.opcode == "tuple" and not _is_result(module, u)
              for w in comp.users.get(u.name, []) if w.opcode == "while"]
  writer: Instruction | None
  by_output: int | None = None
  if writers:
    readers = [a for u in v_users for a in _reads(module, u, v)]
    writer = writers[0]
    # The update may also read the old value under another name (the operand of a
    # barrier that `v` is an output of): those fused reads are why it is copied.
    same = _origins(comp, v) - {v}
    readers += [a for o in same if o in writer.operands
                for a in _reads(module, writer, o)]
    src = comp.by_name.get(v)
    if not _dedupe(readers) and _reshaped_update(module, writer, ins):
      return Cause((), _update(module, comp, writer), reshaped=writer.shape_text)
    if not _dedupe(readers) and src is not None and src.opcode == "parameter" \
        and comp.is_entry:
      # Nothing reads the old value: the buffer goes to an output that is no
      # version of it (ping-pong buffers returned swapped).
      by_output = _foreign_output(module, copy.buffer_parameter, version)
      if by_output is not None:
        return Cause((), _update(module, comp, writer), by_output=by_output,
                     in_copy=True)
  else:
    # An output computed from the old value (elementwise, `p - lr * g`) and written
    # into this buffer is the update, not a read. Only the output aliased to this
    # buffer's parameter writes it: another output that reads the old value
    # (`p + emit * sign(0.9 * mu + ...)` reading mu) is written into its own
    # parameter's buffer, and is a read here. An output reaches the result through
    # views and barriers (a tie's outputs): its producer writes it.
    aliased = module.aliased_outputs() if comp.is_entry else {}
    produced = {p.name: k for n, k in aliased.items()
                if (p := _producer(comp, n, copies=False)) is not None}
    src = comp.by_name.get(v)
    own = (int(src.operand_text) if src is not None and src.opcode == "parameter"
           and comp.is_entry and src.operand_text.strip().isdigit()
           else copy.buffer_parameter)
    writes = [u for u in copy_users if own is not None
              and own in (aliased.get(u.name), produced.get(u.name))]
    readers = [a for u in copy_users if u not in writes for a in _reads(module, u, me)]
    in_place = [u for u in v_users if _writes_in_place(module, comp, u, v)]
    if src is not None and src.opcode == "parameter" and comp.is_entry:
      # The donated buffer itself: whatever output is written into it overwrites it.
      # (An output that is the parameter itself overwrites nothing.)
      in_place += [comp.by_name[n] for n, k in aliased.items()
                   if k == own and n in comp.by_name and n != src.name]
    writer = (writes or in_place)[0] if (writes or in_place) else None
    if writer is not None:
      # The update may read the copy itself (through a barrier's outputs), other
      # than element by element: a row of it broadcast into an elementwise update
      # (a one-trip loop XLA inlined, whose constant was read from the buffer).
      # That fused read is why the update cannot run over the old value.
      # Reads on the update's own line (a scatter's out-of-bounds select reading
      # the row it writes) are the update itself.
      update = _update(module, comp, writer)
      readers += [a for a in _own_moved_reads(module, comp, writer, me)
                  if a.location is None or a.location != update.location]
      if not writes and writer.name in aliased and not version(writer.name):
        by_output = _foreign_output(module, own, version)
  returned = (_returned(module, comp, writer.name) if by_output is not None and writer
              else None)
  return Cause(_dedupe(readers),
               _update(module, comp, writer) if writer is not None and not returned
               else None, by_output=by_output, returned=returned)


def _reshaped_update(module: HloModule, writer: Instruction, copy: Instruction) -> bool:
  """Whether `writer`, a fusion updating `copy` in place, returns the update in
  another shape of as many elements (its root a bitcast of the update)."""
  if _fused(module, writer) is None or not isinstance(writer.shape, ArrayShape) or \
      not isinstance(copy.shape, ArrayShape):
    return False
  return (writer.shape.dims != copy.shape.dims and
          math.prod(writer.shape.dims) == math.prod(copy.shape.dims) and
          writer.shape.element_type == copy.shape.element_type)


def _returned(module: HloModule, comp: Computation, name: str) -> str | None:
  """The argument `name` is, returned as it came in (through views and copies)."""
  origin = _producer(comp, name)
  if origin is None or origin.opcode != "parameter" or not comp.is_entry or \
      not origin.operand_text.strip().isdigit():
    return None
  return module.arguments.get(int(origin.operand_text))


def _foreign_output(module: HloModule, parameter: int | None,
                    version: Callable[[str], bool]) -> int | None:
  """The output aliased to entry parameter `parameter` (written into its buffer),
  where its value is no version of that parameter."""
  for name, k in module.aliased_outputs().items():
    if k != parameter or version(name):
      continue
    return next((module.output_number(a.output_index[0]) for a in module.aliases
                 if a.parameter == k
                 and a.parameter_index == () and len(a.output_index) == 1), None)
  return None


def _own_moved_reads(module: HloModule, comp: Computation, writer: Instruction,
                     name: str) -> list[Access]:
  """The operations fused into `writer` that read `name` (under any of its names:
  through a barrier's outputs and bitcasts) other than element by element."""
  fused = _fused(module, writer)
  if fused is None:
    return []
  return [_access(module, i) for k, o in enumerate(writer.operands)
          if name in _origins(comp, o)
          for i in _fused_readers(module, fused, k, _BITCAST)
          if i.opcode not in _SAME_INDEX and i.opcode not in _IN_PLACE]
