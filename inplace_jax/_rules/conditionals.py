"""Conditionals: `cond` and `switch`.

XLA cannot order a write inside a conditional's branch against reads outside it, so
a branch that updates a buffer leaves a full copy on CPU whatever the barriers, and
which branch sits first decides whether the copy appears at all (jax#16661, #39449,
docs/xla_notes.md). A while loop carries its buffers in place, so such a conditional
is lowered to a chain of zero-or-one-trip while loops (`lower_cond`), unless XLA keeps
it in place as it is.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat as C
from .. import _traits
from .._plan import EqnInfo, InplaceUse
from . import _build
from ._registry import is_big, normalised_float, register


@dataclasses.dataclass(frozen=True)
class LowerCond:
  """Rewrite action: lower the conditional to zero-or-one-trip loops carrying these
  (operand, output) pairs (operand positions exclude the index)."""
  carries: tuple[tuple[int, int], ...]
  # Positions in `eqn.invars` (0: the index) of the operands computed by the
  # conditional's jaxpr (not constants XLA folds, not its inputs): those a
  # barrier in front of the loops may tie.
  computed: tuple[int, ...] = ()
  stat = "lowered_conds"


def cond_carries(eqn, plans) -> list[tuple[int, int]]:
  """(operand, output) pairs a lowered conditional carries through its loops.

  Operand i is carried to output o when some branch updates operand i in place and
  returns it as output o, and no branch returns it (updated or not) elsewhere.
  """
  ops = eqn.invars[1:]
  pairs = []
  taken = set()
  for i in range(len(ops)):
    targets = {p.flows[i] for p in plans if p.flows[i] is not None}
    updated = any(p.flows[i] is not None and p.jaxpr.outvars[p.flows[i]]
                  is not p.jaxpr.invars[i] for p in plans)
    if len(targets) == 1 and not updated:
      # A branch that replaces the buffer with a value computed afresh (zeros,
      # say) where another passes it through: carried, the new value is written
      # over the buffer.
      o = next(iter(targets))
      updated = any(p.flows[i] is None and _fresh(p.jaxpr, o) for p in plans)
    if len(targets) == 1 and updated:
      o = targets.pop()
      if o not in taken and ops[i].aval == eqn.outvars[o].aval:
        taken.add(o)
        pairs.append((i, o))
  return pairs


def _fresh(jaxpr, o: int) -> bool:
  """Whether output `o` of a branch is computed in the branch (not an operand or a
  literal passed through)."""
  v = jaxpr.outvars[o]
  return not C.is_literal(v) and all(v is not w for w in jaxpr.invars) and \
      is_big(v.aval)


def _cond_rule(eqn, is_version, ctx):
  branches = eqn.params["branches"]
  mask = list(is_version[1:])
  # Branches get no read-modify-write splits (as in loops): a split would force the
  # conditional into loops to stay in place, which costs more than it saves.
  targets = _passed_through(branches)
  plans = [ctx.analyze(b.jaxpr, mask, True, ctx.manual, targets=targets)
           for b in branches]
  pairs = cond_carries(eqn, plans)
  subplans = tuple((("branches", k), p) for k, p in enumerate(plans))
  carries = functools.cache(lambda: _all_carries(eqn, mask, pairs, ctx, targets))
  lower = bool(pairs) and _should_lower(eqn, plans, pairs, ctx, carries)
  uses = tuple(InplaceUse(1 + i, o) for i, o in pairs)
  if not lower:
    return EqnInfo(uses=uses, subplans=subplans)
  # Computed here: not an input, which may be a constant (a closed-over index
  # array), and not folded from constants.
  computed = tuple(i for i, v in enumerate(eqn.invars)
                   if not C.is_literal(v) and ctx.producer(v) is not None
                   and not ctx.constant(v))
  return EqnInfo(uses=uses, subplans=subplans, action=LowerCond(carries(), computed))


def _passed_through(branches) -> tuple[int | None, ...]:
  """Per operand, the output some branch returns it as unchanged (a branch that
  skips an update: `optax.MultiSteps`, `apply_if_finite`), where that is one
  output: the buffer's place among the outputs, which the other branches' chains
  of updates then lead to (an accumulator whose elementwise update also feeds
  other buffers' updates would otherwise continue into the first output it
  reaches)."""
  n = len(branches[0].jaxpr.invars)
  out: list[int | None] = []
  for i in range(n):
    places = {o for b in branches for o, v in enumerate(b.jaxpr.outvars)
              if v is b.jaxpr.invars[i]}
    out.append(places.pop() if len(places) == 1 else None)
  return tuple(out)


def _all_carries(eqn, mask, pairs, ctx, targets) -> tuple[tuple[int, int], ...]:
  """The carries of a lowered conditional: `pairs`, and every other big operand a
  branch updates in place into the same output. Passed into the loops as a
  constant, such an operand would be copied to be updated (under jax.jit the branch
  updates it in its own buffer). `targets`: `_passed_through` of the branches."""
  ops = eqn.invars[1:]
  full = [bool(m) or (not C.is_literal(v) and is_big(v.aval))
          for m, v in zip(mask, ops, strict=True)]
  if full == [bool(m) for m in mask]:
    return tuple(pairs)
  plans = [ctx.analyze(b.jaxpr, full, True, ctx.manual, targets=targets)
           for b in eqn.params["branches"]]
  ins, outs = {i for i, _ in pairs}, {o for _, o in pairs}
  extra = [(i, o) for i, o in cond_carries(eqn, plans)
           if i not in ins and o not in outs and not mask[i]]
  return tuple(pairs) + tuple(extra)


def _should_lower(eqn, plans, pairs, ctx, carries) -> bool:
  # Measured on CPU: a two-way conditional whose branch 0 (the false branch of
  # `lax.cond`) does not update the buffers in place (returns them untouched, or a
  # fresh value) is already copy-free once reads are tied before it, if its
  # branches need no barriers of their own; lowering it to loops would only cost
  # speed. With the updating branch first, three branches or more, or a branch
  # that reads its buffer after updating it, XLA copies inside the branch.
  # A branch 0 that rewrites the buffer elementwise (`x * 0.5 + 1`) or replaces it
  # (`zeros_like(x)`) copies it all the same (measured): XLA writes the branch's
  # result over the operand the other branch returns.
  keeps_in_place = (not ctx.lower and len(plans) == 2
                    and not any(plans[0].strong_flows[i] for i, _ in pairs)
                    and not any(_rewrites(plans[0], i, o) or (
                        plans[0].flows[i] is None and _fresh(plans[0].jaxpr, o))
                        for i, o in pairs)
                    and not any(p.changed for p in plans))
  # With a constant index XLA keeps only the chosen branch: nothing to lower.
  return (not keeps_in_place and not ctx.manual
          and not ctx.constant(eqn.invars[0]) and _can_lower_cond(eqn)
          # In a lowering round (copies remained at a conditional), the candidate's
          # fingerprint decides instead: XLA often keeps such a reduction in its
          # branch, reading the operand materialised as a loop does (fuzz seed
          # 5500 #9031).
          and (ctx.lower or not _hoistable_sensitive(eqn, pairs, ctx, carries))
          # XLA:CPU's f32 converts around 16-bit float loop carries copy them.
          and not any(normalised_float(eqn.invars[1 + i].aval) for i, _ in pairs)
          # A branch that rewrites a buffer elementwise (no strong update) gains
          # nothing from a loop: XLA keeps the copy and the loop adds its own.
          # Not so where the branch reads the result it rewrote, which jax.jit
          # computes again from the old buffer: tried in a lowering round.
          and (ctx.lower
               or not any(_weak_only(p, i, o) for p in plans for i, o in pairs)))


def _rewrites(plan, i: int, o: int) -> bool:
  """Whether the branch computes output `o` from operand `i` in place (elementwise)."""
  return plan.flows[i] == o and plan.jaxpr.outvars[o] is not plan.jaxpr.invars[i]


def _weak_only(plan, i: int, o: int) -> bool:
  # ... and reads it elsewhere first (the plan ties reads): XLA cannot rewrite it
  # in place then, loop or not.
  return (plan.flows[i] == o and not plan.strong_flows[i] and plan.changed
          and plan.jaxpr.outvars[o] is not plan.jaxpr.invars[i])


def _hoistable_sensitive(eqn, pairs, ctx, carries) -> bool:
  """Whether a branch reduces (or applies a transcendental to) an operand that is
  computed by a fusible op outside: XLA moves such code out of a conditional and
  fuses it with that op, which it would not do from inside a loop, so lowering
  would change the result's last bit (a gathered sum did, in the fuzzer).

  Not where only outputs that stay in a conditional of their own reduce it
  (`_side_outputs`: a sum of a slice, beside a row update): XLA moves that
  code out of the side conditional as it does under jax.jit."""
  carried = {i for i, _ in pairs}
  branches = [b.jaxpr for b in eqn.params["branches"]]
  hoistable = []
  for i, v in enumerate(eqn.invars[1:]):
    if i in carried or C.is_literal(v):
      continue
    producer = ctx.producer(v)
    if producer is None or not _traits.any_of(producer.primitive, _traits.TRANSPARENT):
      continue
    if any(ctx.inner_sensitive(j, i) for j in branches):
      hoistable.append(i)
  if not hoistable:
    return False
  side = set(_lowered_side(eqn.params["branches"], carries()))
  if not side:
    return True
  looped = [C.dce_jaxpr(j, [o not in side for o in range(len(j.outvars))],
                        instantiate=True)[0] for j in branches]
  return any(ctx.inner_sensitive(j, i) for i in hoistable for j in looped)


def _zero_initialisable(aval) -> bool:
  try:
    return np.dtype(aval.dtype).kind in "biufc" or aval.dtype == jax.numpy.bfloat16
  except TypeError:  # extended dtypes (PRNG keys) have no numpy equivalent
    return False


def _can_lower_cond(eqn) -> bool:
  if any(b.effects for b in eqn.params["branches"]):
    return False  # keep effects where they were; the conditional stays
  return all(_zero_initialisable(v.aval) for v in eqn.outvars)


def _cond_rewrite(eqn, info, invars, params):
  if isinstance(info.action, LowerCond):
    return lower_cond(eqn, params["branches"], info.action.carries, invars,
                      info.action.computed)
  return [eqn.replace(invars=invars, params=params)]


def _cond_bindings(eqn, pos):
  return [(b.jaxpr, pos - 1) for b in eqn.params["branches"]] if pos else []


# --------------------------------------------------------------------------- lowering


def lower_cond(eqn: C.JaxprEqn, branches: Sequence[C.ClosedJaxpr],
               pairs: Sequence[tuple[int, int]], invars: Sequence[Any],
               computed: Sequence[int] = ()) -> list[C.JaxprEqn]:
  """A `cond`/`switch` as a chain of while loops of zero or one trip each.

  Branch k becomes the body of loop k, entered iff the index is k; the buffers in
  `pairs` are carried through the loops and every other output is carried from a
  zero initial value. The branch bodies are used as they are, so the values are
  exactly the branch's.

  Outputs that no branch computes from a carried buffer (flags, scalars, slices,
  sums of other operands) stay in a `cond` of their own, cut down to what they need,
  ahead of the loops: a conditional XLA inlines and simplifies as under `jax.jit`
  when it learns the index, where the loops' trip count stays opaque to it (so
  `-0.0 + v` with `v` a branch's 0.0 is folded, or not, alike on both sides).
  """
  index, ops = invars[0], list(invars[1:])
  carried_in = [i for i, _ in pairs]
  carried_out = [o for _, o in pairs]
  const_ops = [i for i in range(len(ops)) if i not in carried_in]
  side = _lowered_side(branches, pairs)
  other_out = [o for o in range(len(eqn.outvars))
               if o not in carried_out and o not in side]
  new_eqns: list[C.JaxprEqn] = []
  if side and 0 in computed:
    # The side conditional and the loops both need the index: XLA recomputes a
    # cheap one in front of each (`b[21, 5] > 0`), and the side conditional's read
    # of a buffer the loops update in place, unordered against their writes,
    # costs a copy of it (fuzz seed 4700 #9680). Read once, before a barrier.
    # An integer: nothing to round.
    tie, (index,) = _build.barrier_eqn([index], eqn)
    new_eqns.append(tie)
  side_eqns = _side_cond(eqn, branches, side, carried_in, index, ops, const_ops)
  carry_in = [ops[i] for i in carried_in]
  if side_eqns and _reads_large(side_eqns[0]):
    # A side output read from a large operand (a branch's sum of a temporary):
    # XLA may fuse the operand's producer into the side conditional, which then
    # reads a buffer the loops update in place (`v = b // 2` summed, fuzz CI
    # sample seed 1000 #105). Its results and the carries go through one barrier,
    # so it runs before the loops. Small operands' side outputs stay untied, as
    # XLA simplifies them with the conditional when it learns the index.
    sc = side_eqns[0]
    fresh = [C.new_var(v.aval) for v in sc.outvars]
    tie, outs = _build.barrier_eqn(fresh + carry_in, eqn)
    side_eqns = [sc.replace(outvars=fresh),
                 tie.replace(outvars=list(sc.outvars) + outs[len(fresh):])]
    carry_in = outs[len(fresh):]
  new_eqns += side_eqns
  zero_eqns, zeros = _build.trace_eqns(
      lambda: [_build.zeros(eqn.outvars[o].aval) for o in other_out], [], eqn)
  new_eqns += zero_eqns
  carry = carry_in + zeros
  # Branches that leave every carried buffer as they are need no loop.
  run = [k for k, branch in enumerate(branches)
         if other_out or not all(branch.jaxpr.outvars[o] is branch.jaxpr.invars[i]
                                 for i, o in pairs)]
  flags = {}
  for k in run:
    flag_eqns, (flags[k],) = _build.trace_eqns(
        lambda i, k=k: (i == k).astype(np.int32), [index], eqn)
    new_eqns.extend(flag_eqns)
  consts = [ops[i] for i in const_ops]
  if len(run) > 1 and not C.is_literal(index):
    # Every trip count before the first loop: XLA recomputes a cheap flag from
    # what the index was read from (a buffer the loops update in place) in front
    # of each loop, and a later loop's read, unordered against the earlier loops'
    # writes, costs a copy of that buffer. Integers: nothing to round. So with the
    # small operands the loops read (a row of a carried buffer that only the
    # second loop reads, fuzz seed 4700 #4896): a conditional's operand is
    # materialised as a loop's is, whether or not a barrier follows it (the
    # fingerprint checks what a tie changes, as for every tie). Not a
    # constant (`computed`): behind a barrier XLA would not fold it into the
    # loops' code (a closed-over index array a branch gathers with: seed 4700 #879).
    small = [k for k, v in enumerate(consts) if 1 + const_ops[k] in computed
             and not C.is_literal(v) and not is_big(v.aval)]
    tie, outs = _build.barrier_eqn([flags[k] for k in run] + [consts[k] for k in small],
                                   eqn)
    new_eqns.append(tie)
    flags = dict(zip(run, outs, strict=False))
    for k, w in zip(small, outs[len(run):], strict=True):
      consts[k] = w
  for k in run:
    branch, flag = branches[k], flags[k]
    body = _branch_as_body(branch, const_ops, carried_in, carried_out, other_out)
    cond = _flag_cond(len(carry), [a.aval for a in carry])
    outvars = [C.new_var(flag.aval)] + [C.new_var(a.aval) for a in carry]
    new_eqns.append(C.new_jaxpr_eqn(
        consts + [flag] + carry, outvars, C.while_p,
        dict(cond_jaxpr=cond, body_jaxpr=body, cond_nconsts=0,
             body_nconsts=len(const_ops)),
        C.no_effects, eqn.source_info, eqn.ctx))
    carry = outvars[1:]
  # Bind the conditional's own output variables, so later equations need no renaming.
  last = new_eqns[-1]
  new_eqns[-1] = last.replace(outvars=[last.outvars[0]] + [
      eqn.outvars[o] for o in carried_out + other_out])
  return new_eqns


def _side_cond(eqn, branches, side, carried_in, index, ops, const_ops):
  """The conditional of the side outputs alone (or nothing)."""
  if not side:
    return []
  used = [o in side for o in range(len(eqn.outvars))]
  keep = [i not in carried_in for i in range(len(ops))]
  side_branches = []
  for branch in branches:
    j, _ = C.dce_jaxpr(branch.jaxpr, used, instantiate=keep)
    assert len(j.invars) == len(const_ops)
    side_branches.append(C.ClosedJaxpr(j, branch.consts))
  return [C.new_jaxpr_eqn(
      [index] + [ops[i] for i in const_ops], [eqn.outvars[o] for o in side],
      C.cond_p, dict(eqn.params, branches=tuple(side_branches)),
      C.no_effects, eqn.source_info, eqn.ctx)]


def _reads_large(cond) -> bool:
  """Whether a branch of conditional `cond` reads a large operand."""
  for branch in cond.params["branches"]:
    j = branch.jaxpr
    _, used = C.dce_jaxpr(j, [True] * len(j.outvars))
    if any(u and is_big(v.aval) for u, v in zip(used, j.invars, strict=True)):
      return True
  return False


def _flag_cond(n_carry: int, carry_avals) -> C.ClosedJaxpr:
  def cond(flag, *carry):
    del carry
    return flag > 0
  shapes = [jax.ShapeDtypeStruct((), np.int32)] + [
      jax.ShapeDtypeStruct(a.shape, a.dtype) for a in carry_avals]
  closed = jax.make_jaxpr(cond)(*shapes)
  assert len(closed.jaxpr.invars) == n_carry + 1
  return closed


def _lowered_side(branches: Sequence[C.ClosedJaxpr], pairs) -> list[int]:
  """`_side_outputs` of a conditional lowered carrying `pairs`."""
  return _side_outputs(branches, [o for _, o in pairs], [i for i, _ in pairs])


def _side_outputs(branches: Sequence[C.ClosedJaxpr], carried_out,
                  carried_in) -> list[int]:
  """`lower_cond`'s outputs that can stay in a conditional: in every branch computed
  from non-carried operands only, by equations no carried output needs.

  Large operands too: a reduction of a large temporary stays in a conditional as
  under jax.jit, where XLA hoists it out and fuses it with the op that computes
  the temporary; in a loop it would be computed apart (`_hoistable_sensitive`), so
  the conditional could not be lowered at all (fuzz seed 5500 #4751: a branch's
  `sum(v1)` of a product computed outside). Where the side conditional's read of
  an operand that a later update overwrites is left unordered, XLA copies; the
  candidate's checks count that as any other copy."""
  n_out = len(branches[0].jaxpr.outvars)
  side = []
  for o in range(n_out):
    if o in carried_out:
      continue
    mask = [k == o for k in range(n_out)]
    for branch in branches:
      _, used = C.dce_jaxpr(branch.jaxpr, mask)
      if any(used[i] for i in carried_in):
        break
    else:
      side.append(o)
  if not side:
    return side
  for branch in branches:
    halves = [C.dce_jaxpr(branch.jaxpr, [(k in side) == want for k in range(n_out)])[0]
              for want in (True, False)]
    defined = [{id(v) for e in h.eqns for v in e.outvars} for h in halves]
    if defined[0] & defined[1]:
      return []     # shared work: keep it in one place, the loops
  return side


def _branch_as_body(branch: C.ClosedJaxpr, const_ops, carried_in, carried_out,
                    other_out) -> C.ClosedJaxpr:
  j = branch.jaxpr
  used = set(carried_out) | set(other_out)
  # Only the equations the loop's outputs need (the rest went to the side `cond`);
  # dce_jaxpr keeps the variables, so the branch's own invars and outvars index them.
  eqns = C.dce_jaxpr(j, [o in used for o in range(len(j.outvars))],
                     instantiate=True)[0].eqns
  flag = C.new_var(C.ShapedArray((), np.dtype(np.int32)))
  dummies = [C.new_var(j.outvars[o].aval) for o in other_out]
  invars = [j.invars[i] for i in const_ops] + [flag] + [
      j.invars[i] for i in carried_in] + dummies
  zero = C.Literal(np.int32(0), C.ShapedArray((), np.dtype(np.int32)))
  carried = [j.outvars[o] for o in carried_out]
  # A carried buffer the branch reads and returns as it is: XLA forwards such a
  # loop result to the loop's operand, so a later loop that updates the buffer in
  # place no longer follows this one's reads and copies it (fuzz seed 8200 #885).
  # Behind a barrier the result is the loop's own.
  read = {id(v) for e in eqns for v in e.invars if not C.is_literal(v)}
  held = [k for k, (i, o) in enumerate(zip(carried_in, carried_out, strict=True))
          if j.outvars[o] is j.invars[i] and id(j.invars[i]) in read]
  if held:
    tie, outs = _build.barrier_eqn([carried[k] for k in held], eqns[-1] if eqns else None)
    eqns = list(eqns) + [tie]
    for k, w in zip(held, outs, strict=True):
      carried[k] = w
  outvars = [zero] + carried + [j.outvars[o] for o in other_out]
  body = C.Jaxpr(j.constvars, invars, outvars, eqns, j.effects,
                 C.loose_debug_info(j.debug_info))
  return C.ClosedJaxpr(body, branch.consts)


# --------------------------------------------------------------------------- registry

register(C.cond_p, analyze=_cond_rule, rewrite=_cond_rewrite, bindings=_cond_bindings)
