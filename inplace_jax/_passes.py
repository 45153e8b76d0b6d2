"""Normalisation passes: jaxpr -> jaxpr rewrites run before the analysis, in order.

Each pass computes exactly the values its input computes. They put the jaxpr in the
form the analysis and XLA handle best:

0. `inline_calls` (the program `inplace_jax.jit` compiles only): in clone rounds,
   `custom_jvp`, `custom_vjp` and `checkpoint` bodies are spliced into their
   caller, as their lowering splices them, and nested `jit` bodies, as XLA
   inlines their calls: the analysis then sees a read inside such a call and an
   update after it as one program. In the other rounds, only nested `jit` bodies
   that move data and compute nothing (`jnp.resize`), so that a read reaching an
   update through one is a chain the analysis follows. A jaxpr that may still be
   differentiated keeps them (their rules would be lost).
1. `discharge_refs`: mutable refs created inside the function become values.
   `fold_known_conditionals`: a `cond` whose index literals alone compute
   (`lax.switch(jnp.int32(2), ...)`) is the branch it takes, as XLA folds the
   index and inlines that branch; the analysis then sees that branch's reads and
   updates where they run.
   `forward_passed_carries`: a `while` loop's result its body passes through
   unchanged is the loop's operand, as XLA's while-loop simplifier makes it: an
   update after the loop updates that operand, which the loop reads.
2. `dead_code`: as `jax.jit` does before lowering; a dead read would otherwise be
   ordered by a barrier that keeps it (and its neighbours) from XLA's simplifier.
3. `predicate_batched_loops`: a `while` whose predicate is batched (`vmap` of a
   loop whose trip count differs between elements) runs while any element is
   active, as JAX lowers it, but the writes of a big carry are predicated at the
   size of each write instead of a whole-buffer select per step.
4. `pick_given_outputs`: a conditional's small outputs that a branch gives as a
   literal or an operand are picked after it by `select_n` on the index.
5. `merge_cond_operands`: a value a conditional takes twice (an operand and a
   closed-over one) is one operand, so a branch's reads of it are reads of the
   buffer the branch updates.
6. `carry_scanned_buffers`: a top-level `scan` over a donated buffer's rows that
   returns them updated carries the buffer instead (no whole-stack copy on entry).
7. `distinct_fills`: buffers filled with one constant (a `jnp.zeros`, the empty
   stacks a `scan` lowers its `ys` into) that start loops, made distinct: XLA
   merges identical fills into one buffer, and every loop that updates it in place
   but one then starts from a copy.
8. `erase_remat_barriers`: on backends where `jax.jit` erases every barrier before
   fusion, `jax.checkpoint`'s CSE barriers go too, so the options that keep
   inplace_jax's barriers do not keep those.
9. `clone_shared` (clone rounds only, `Hints.clone`): a cheap value several
   equations read is computed once per reader, as XLA computes it in each reader's
   fusion, so that a barrier can separate a read's copy from the update's. From
   `SINK_LEVEL` (the sink round), slices and reshapes of a cheap elementwise
   result are first done to its operands (`_moves_sunk`): a read of a slice of
   `b * b` becomes a slice of `b`, pure data movement a barrier may follow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _compat as C
from . import _rules
from . import _traits
from ._rules import _build, loops


@dataclasses.dataclass(frozen=True)
class PassContext:
  donated: tuple[bool, ...]
  in_loop: bool
  erase_remat_barriers: bool
  analyze: Callable[..., Any]
  # Names of the passes that restructured the jaxpr (filled as they run).
  restructured: list[str] = dataclasses.field(default_factory=list)
  # Cheap results read by several equations are computed once per reader
  # (`clone_shared`, `Hints.clone`): 0 none, 1 elementwise ones, 2 data movement too.
  clone: int = 0
  # Whether the jaxpr is only compiled, never differentiated (`inline_calls`):
  # True splices every call XLA inlines, "moves" only nested jits of data
  # movement, False none.
  inline_calls: bool | str = False
  # Every input's donation, where the jaxpr is a whole program (its outputs are
  # the compiled module's): what JAX's aliasing of outputs is predicted from.
  whole_donated: tuple[bool, ...] | None = None


def inline_calls(jaxpr, consts, ctx: PassContext):
  if not ctx.inline_calls:
    return jaxpr, consts
  return _inlined(jaxpr, ctx.erase_remat_barriers, {},
                  moves_only=ctx.inline_calls == "moves"), consts


def discharge_refs(jaxpr, consts, ctx: PassContext):
  if not C.creates_refs(jaxpr):
    return jaxpr, consts
  return C.discharge_refs(jaxpr, consts)


def fold_known_conditionals(jaxpr, consts, ctx: PassContext):
  return _known_branches_spliced(jaxpr, {}), consts


def _known_branches_spliced(jaxpr, memo: dict):
  """`jaxpr` with each `cond` whose index is known when it compiles (computed
  from literals only: `lax.switch(jnp.int32(2), ...)`) replaced by the branch it
  takes, at every depth, as XLA folds the index and inlines that branch."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  eqns: list = []
  alias: dict = {}
  producer: dict = {}
  values: dict = {}
  changed = False
  for e in jaxpr.eqns:
    new_params = _params_with(e.params, lambda j: _known_branches_spliced(j, memo))
    if new_params is not None:
      e = e.replace(params=new_params)
      changed = True
    if alias and any(not C.is_literal(v) and v in alias for v in e.invars):
      e = e.replace(invars=[_aliased(v, alias) for v in e.invars])
    if e.primitive is C.cond_p and not e.effects:
      index = _known_value(e.invars[0], producer, values, 0)
      branches = e.params["branches"]
      if index is not None:
        k = int(index)
        taken = branches[k if 0 <= k < len(branches) else len(branches) - 1]
        if not taken.consts and not taken.jaxpr.effects:
          eqns.extend(_spliced((taken.jaxpr, None), e.replace(invars=e.invars[1:]),
                               alias))
          changed = True
          continue
    for v in e.outvars:
      if not C.is_drop_var(v):
        producer[v] = e
    eqns.append(e)
  out = jaxpr
  if changed:
    out = C.Jaxpr(jaxpr.constvars, jaxpr.invars,
                  [_aliased(v, alias) for v in jaxpr.outvars], eqns, jaxpr.effects,
                  jaxpr.debug_info)
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def _known_value(v, producer: dict, values: dict, depth: int):
  """The value of integer or boolean scalar `v` where literals alone compute it
  (evaluated here, through the same primitives); else None."""
  if C.is_literal(v):
    return np.asarray(v.val)
  if v in values:
    return values[v]
  e = producer.get(v)
  values[v] = None
  if e is None or e.effects or depth > _KNOWN_DEPTH or any(
      o.aval.shape or (not np.issubdtype(o.aval.dtype, np.integer)
                       and o.aval.dtype != np.bool_)
      for o in e.outvars if not C.is_drop_var(o)):
    return None
  if C.jaxprs_in_params(e.params) and not (e.primitive is C.jit_p
                                           and C.plain_nested_jit(e.params)):
    return None
  args = [_known_value(x, producer, values, depth + 1) for x in e.invars]
  if any(a is None for a in args):
    return None
  try:
    with jax.ensure_compile_time_eval():
      outs = C.bind_eqn(e, [jax.numpy.asarray(a) for a in args])
  except Exception:     # a primitive that cannot run here: the index stays unknown
    return None
  for o, x in zip(e.outvars, outs, strict=True):
    if not C.is_drop_var(o):
      values[o] = np.asarray(x)
  return values[v]


_KNOWN_DEPTH = 16


def dead_code(jaxpr, consts, ctx: PassContext):
  """Dead equations removed, and the dead carries of `while` loops at any depth,
  which XLA removes too (its while-loop simplifier) and JAX's dead-code
  elimination keeps. A read of a buffer that only feeds a dead carry is no read
  to XLA: counted, it hid that an add is an additive scatter's one user, which
  XLA moves in front of the scatter (fuzz seed 4500 #3828: the argmax of a row,
  accumulated in a carry the loop's caller drops)."""
  jaxpr = C.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
  for _ in range(_DCE_ROUNDS):    # a carry pruned inside can free one outside
    pruned = _while_carries_pruned(jaxpr, {})
    if pruned is jaxpr:
      break
    jaxpr = C.dce_jaxpr(pruned, [True] * len(pruned.outvars), instantiate=True)[0]
  return jaxpr, consts


_DCE_ROUNDS = 4


def _while_carries_pruned(jaxpr, memo: dict):
  """`jaxpr` with each `while` loop's carries that nothing outside reads, and that
  feed no carry that is read, removed (at every depth)."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  used = C.used_vars(jaxpr)
  eqns, changed = [], False
  for e in jaxpr.eqns:
    new_params = _params_with(e.params, lambda j: _while_carries_pruned(j, memo))
    if new_params is not None:
      e, changed = e.replace(params=new_params), True
    if e.primitive is C.while_p:
      pruned = _pruned_while(e, used)
      if pruned is not e:
        e, changed = pruned, True
    eqns.append(e)
  out = jaxpr.replace(eqns=eqns) if changed else jaxpr
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def _pruned_while(eqn, used):
  """`eqn` (a `while`) without the carries no live value depends on, or `eqn`."""
  p = eqn.params
  body, cond = p["body_jaxpr"], p["cond_jaxpr"]
  nc, nb = p["cond_nconsts"], p["body_nconsts"]
  n = len(eqn.outvars)
  if body.jaxpr.effects or cond.jaxpr.effects:
    return eqn
  cond_used = C.used_vars(cond.jaxpr)
  live = {i for i in range(n) if eqn.outvars[i] in used
          or cond.jaxpr.invars[nc + i] in cond_used}
  while True:
    _, used_in = C.dce_jaxpr(body.jaxpr, [i in live for i in range(n)])
    more = {i for i in range(n) if used_in[nb + i]} - live
    if not more:
      break
    live |= more
  # Constants neither the body (for the live carries) nor the condition reads: a
  # carry JAX forwards around the loop stays behind as one (a buffer the loop
  # passes through), and would order the loop after that buffer's updates.
  keep_cc = [v in cond_used for v in cond.jaxpr.invars[:nc]]
  keep_bc = list(used_in[:nb])
  if len(live) == n and all(keep_cc) and all(keep_bc):
    return eqn
  keep = [i in live for i in range(n)]
  new_body, _ = C.dce_jaxpr(body.jaxpr, keep, instantiate=True)
  new_body = new_body.replace(
      invars=[v for k, v in enumerate(new_body.invars)
              if (keep_bc[k] if k < nb else keep[k - nb])],
      debug_info=C.loose_debug_info(new_body.debug_info))
  new_cond = cond.jaxpr.replace(
      invars=[v for k, v in enumerate(cond.jaxpr.invars)
              if (keep_cc[k] if k < nc else keep[k - nc])],
      debug_info=C.loose_debug_info(cond.jaxpr.debug_info))
  cconsts, bconsts = eqn.invars[:nc], eqn.invars[nc:nc + nb]
  carries = eqn.invars[nc + nb:]
  params = dict(p, body_jaxpr=C.ClosedJaxpr(new_body, body.consts),
                cond_jaxpr=C.ClosedJaxpr(new_cond, cond.consts),
                cond_nconsts=sum(keep_cc), body_nconsts=sum(keep_bc))
  return eqn.replace(invars=[v for v, k in zip(cconsts, keep_cc) if k]
                     + [v for v, k in zip(bconsts, keep_bc) if k]
                     + [v for v, k in zip(carries, keep) if k],
                     outvars=[v for v, k in zip(eqn.outvars, keep) if k], params=params)


def predicate_batched_loops(jaxpr, consts, ctx: PassContext):
  new = map_eqns(jaxpr, _scalar_predicate, {})
  if new is not jaxpr:
    ctx.restructured.append("predicate_batched_loops")
  return new, consts


def pick_given_outputs(jaxpr, consts, ctx: PassContext):
  return map_eqns(jaxpr, _given_outputs_picked, {}), consts


def merge_cond_operands(jaxpr, consts, ctx: PassContext):
  return map_eqns(jaxpr, _cond_operands_merged, {}), consts


def carry_scanned_buffers(jaxpr, consts, ctx: PassContext):
  if ctx.in_loop:
    return jaxpr, consts
  return _carry_scanned_buffers(jaxpr, ctx.donated, ctx.analyze), consts


def distinct_fills(jaxpr, consts, ctx: PassContext):
  if ctx.in_loop:
    return jaxpr, consts
  return _distinct_fills(jaxpr), consts


def erase_remat_barriers(jaxpr, consts, ctx: PassContext):
  if not ctx.erase_remat_barriers:
    return jaxpr, consts
  return map_eqns(jaxpr, _without_remat_barrier, {}), consts


def clone_shared(jaxpr, consts, ctx: PassContext):
  if not ctx.clone:
    return jaxpr, consts
  if ctx.clone >= SINK_LEVEL:
    jaxpr = _moves_sunk(jaxpr, {})
  return _cloned(jaxpr, ctx.clone, {}), consts


def forward_passed_carries(jaxpr, consts, ctx: PassContext):
  """Each use of a `while` loop's result that its body passes through unchanged
  reads the loop's operand instead (at every depth), as XLA's while-loop
  simplifier rewrites it. The loop then no longer stands between that value
  and its later update: with the loop's condition reading the buffer, jax.jit's
  program copies it for the update after the loop (fuzz seed 7000 #6811), and
  the analysis, seeing the update take the loop's result, saw the loop's read
  ordered by data. `scan` needs nothing: JAX forwards such carries itself."""
  return _forwarded(jaxpr, {}), consts


def _forwarded(jaxpr, memo: dict):
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  eqns: list = []
  alias: dict = {}        # a passed-through result -> the operand it equals
  changed = False
  for e in jaxpr.eqns:
    new_params = _params_with(e.params, lambda j: _forwarded(j, memo))
    if new_params is not None:
      e, changed = e.replace(params=new_params), True
    if alias and any(not C.is_literal(v) and v in alias for v in e.invars):
      e, changed = e.replace(invars=[_aliased(v, alias) for v in e.invars]), True
    if e.primitive is C.while_p:
      p = e.params
      body = p["body_jaxpr"].jaxpr
      nb, nc = p["body_nconsts"], p["cond_nconsts"]
      for o, x, out, init in zip(body.outvars, body.invars[nb:], e.outvars,
                                 e.invars[nc + nb:], strict=True):
        if o is x and not C.is_drop_var(out):
          alias[out] = init
    eqns.append(e)
  out = jaxpr
  if changed or alias:
    out = C.Jaxpr(jaxpr.constvars, jaxpr.invars,
                  [_aliased(v, alias) for v in jaxpr.outvars], eqns, jaxpr.effects,
                  jaxpr.debug_info)
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def tie_reshaped_outputs(jaxpr, consts, ctx: PassContext):
  """A barrier between the last version of a donated buffer and its reshape into
  an output. JAX aliases no output to such a buffer (none has its shape) but gives
  it to XLA as a donor, and XLA writes the output of its size over it; XLA fuses
  the update with the reshape and runs that fusion on a copy of the buffer (a
  cache returned reshaped, `benchmarks/probes`), where with the barrier the update
  runs in place and the reshape is a bitcast of its result."""
  if ctx.whole_donated is None:
    return jaxpr, consts
  aliases = C.predicted_aliases(jaxpr, ctx.whole_donated)
  donors = C.predicted_donors(jaxpr, ctx.whole_donated, aliases)
  buffers = {(tuple(v.aval.shape), v.aval.dtype): v
             for v, d, b in zip(jaxpr.invars, donors, ctx.donated, strict=True) if d and b}
  if not buffers:
    return jaxpr, consts
  # The donated buffers each value is computed from.
  reach: dict = {v: {v} for v in buffers.values()}
  producer: dict = {}
  for e in jaxpr.eqns:
    dep = set().union(*(reach.get(v, ()) for v in e.invars if not C.is_literal(v)))
    for o in e.outvars:
      producer[o] = e
      if dep:
        reach[o] = dep
  inputs = set(jaxpr.invars)
  tied = {}
  for o in jaxpr.outvars:
    e = producer.get(o) if not C.is_literal(o) else None
    if e is None or e.primitive not in (C.reshape_p, C.squeeze_p):
      continue
    v = e.invars[0]
    if C.is_literal(v) or v in inputs or v.aval.dtype != o.aval.dtype:
      continue
    x = buffers.get((tuple(v.aval.shape), v.aval.dtype))
    if x is not None and x in reach.get(v, ()):
      tied[id(e)] = e
  if not tied:
    return jaxpr, consts
  eqns = []
  for e in jaxpr.eqns:
    if id(e) in tied:
      barrier, (w,) = _build.barrier_eqn([e.invars[0]], e)
      eqns.append(barrier)
      e = e.replace(invars=[w] + list(e.invars[1:]))
    eqns.append(e)
  ctx.restructured.append("tie_reshaped_outputs")
  return jaxpr.replace(eqns=eqns), consts


PASSES = (inline_calls, discharge_refs, fold_known_conditionals, forward_passed_carries,
          dead_code, predicate_batched_loops, pick_given_outputs, merge_cond_operands,
          carry_scanned_buffers, distinct_fills, erase_remat_barriers, clone_shared,
          tie_reshaped_outputs)


def normalise(jaxpr, consts, ctx: PassContext):
  held = None
  for p in PASSES:
    if p in _ONLY_FOR:
      if held is None:
        held = _primitives_held(jaxpr, set(), set())
      primitive, instead = _ONLY_FOR[p]
      if primitive not in held:
        if instead is not None:
          jaxpr, consts = instead(jaxpr, consts, ctx)
        continue
    jaxpr, consts = p(jaxpr, consts, ctx)
  return jaxpr, consts


def _dce_only(jaxpr, consts, ctx: PassContext):
  """`dead_code` where no `while` is held: only JAX's dead-code elimination."""
  return C.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0], consts


# Passes that change only equations of one primitive (at any depth), and what runs
# instead (None: nothing) where the program holds none: each is a walk over every
# equation, a fifth of the transform's time on 10,000 equations, and would return
# the program unchanged. What the program holds is collected once, after the
# passes that may bring in new primitives (`inline_calls`, `discharge_refs`); the
# later ones only remove equations or add others than these.
_ONLY_FOR: dict[Callable, tuple[Any, Callable | None]] = {
    fold_known_conditionals: (C.cond_p, None),
    forward_passed_carries: (C.while_p, None),
    dead_code: (C.while_p, _dce_only),
    predicate_batched_loops: (C.while_p, None),
    pick_given_outputs: (C.cond_p, None),
    merge_cond_operands: (C.cond_p, None),
    erase_remat_barriers: (C.remat_p, None),
}


def _primitives_held(jaxpr, seen: set, out: set) -> set:
  """The primitives of `jaxpr`'s equations, at every depth."""
  if id(jaxpr) in seen:
    return out
  seen.add(id(jaxpr))
  for e in jaxpr.eqns:
    out.add(e.primitive)
    for inner in C.sub_jaxprs(e.params):
      _primitives_held(inner, seen, out)
  return out


# --------------------------------------------------------------------------- helpers


def map_eqns(jaxpr, fn: Callable, memo: dict):
  """`jaxpr` with the equations `fn(eqn)` in place of each equation, at every depth
  (the jaxprs in an equation's params are mapped before the equation)."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  changed = False
  eqns = []
  for eqn in jaxpr.eqns:
    new_params = _mapped_params(eqn.params, fn, memo)
    if new_params is not None:
      eqn = eqn.replace(params=new_params)
      changed = True
    new = fn(eqn)
    changed |= len(new) != 1 or new[0] is not eqn
    eqns.extend(new)
  out = jaxpr if not changed else C.Jaxpr(
      jaxpr.constvars, jaxpr.invars, jaxpr.outvars, eqns, jaxpr.effects,
      jaxpr.debug_info)
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def _mapped_params(params, fn, memo) -> dict | None:
  return _params_with(params, lambda j: map_eqns(j, fn, memo))


def _params_with(params, transform: Callable) -> dict | None:
  """`params` with `transform` (open jaxpr -> open jaxpr) applied to each jaxpr in
  them, or None where it changed none."""
  new_params = None
  for key in C.jaxprs_in_params(params):
    val = params[key]
    seq = val if isinstance(val, (tuple, list)) else (val,)
    new_seq = []
    for j in seq:
      if isinstance(j, C.ClosedJaxpr):
        inner = transform(j.jaxpr)
        new_seq.append(j if inner is j.jaxpr else C.ClosedJaxpr(inner, j.consts))
      else:
        new_seq.append(transform(j))
    if any(a is not b for a, b in zip(seq, new_seq, strict=True)):
      new_params = dict(new_params or params)
      new_params[key] = (type(val)(new_seq) if isinstance(val, (tuple, list))
                         else new_seq[0])
  return new_params


def _inlined(jaxpr, erase_remat: bool, memo: dict, moves_only: bool = False):
  """`jaxpr` with the calls `_call_body` splices spliced, at every depth."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  eqns: list = []
  alias: dict = {}      # a spliced call's result -> the atom that holds it now
  changed = False
  for e in jaxpr.eqns:
    new_params = _params_with(e.params,
                              lambda j: _inlined(j, erase_remat, memo, moves_only))
    if new_params is not None:
      e = e.replace(params=new_params)
      changed = True
    if alias and any(not C.is_literal(v) and v in alias for v in e.invars):
      e = e.replace(invars=[_aliased(v, alias) for v in e.invars])
    body = (_call_body(e, erase_remat) if not moves_only or _moves_only_call(e)
            else None)
    if body is None:
      eqns.append(e)
      continue
    changed = True
    eqns.extend(_spliced(body, e, alias))
  out = jaxpr
  if changed:
    out = C.Jaxpr(jaxpr.constvars, jaxpr.invars,
                  [_aliased(v, alias) for v in jaxpr.outvars], eqns, jaxpr.effects,
                  jaxpr.debug_info)
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def _aliased(v, alias: dict):
  return v if C.is_literal(v) else alias.get(v, v)


def _moves_only_call(eqn) -> bool:
  """A nested `jit` XLA inlines whose body only moves data (`jnp.resize`): no
  arithmetic whose fusion could change a value is spliced with it."""
  if eqn.primitive is not C.jit_p or not C.plain_nested_jit(eqn.params):
    return False
  body = eqn.params["jaxpr"]
  body = body.jaxpr if isinstance(body, C.ClosedJaxpr) else body
  return bool(body.eqns) and all(
      _traits.has(e.primitive, _traits.Trait.DATA_MOVEMENT) for e in body.eqns)


def _call_body(eqn, erase_remat: bool):
  """The body of a call whose lowering splices it into the caller (a `custom_jvp`
  or `custom_vjp` call's primal jaxpr; a `checkpoint` body where its lowering adds
  no barrier) or that XLA inlines (a nested `jit` with no shardings, layouts or
  options of its own), with the name the lowering gives it; else None. Calls with
  effects or constants are left as they are."""
  p = eqn.primitive
  if p is C.custom_jvp_call_p or p is C.custom_vjp_call_p:
    body, scope = eqn.params["call_jaxpr"], None
  elif p is C.jit_p and C.plain_nested_jit(eqn.params):
    body, scope = eqn.params["jaxpr"], f"jit({eqn.params['name']})"
  elif p is C.remat_p and (erase_remat or not (eqn.params.get("differentiated")
                                               and eqn.params.get("prevent_cse"))):
    body, scope = eqn.params["jaxpr"], "checkpoint"
  else:
    return None
  if isinstance(body, C.ClosedJaxpr):
    if body.consts:
      return None
    body = body.jaxpr
  if (eqn.effects or body.effects or body.constvars
      or len(body.invars) != len(eqn.invars) or len(body.outvars) != len(eqn.outvars)):
    return None
  return body, scope


def _spliced(call, eqn, alias: dict) -> list:
  """The equations of `call` = (body, scope) in place of `eqn`: the body's inputs
  are the call's operands, its results the call's results (`alias` learns those
  that are no equation's result: an operand passed through, a literal, a repeat),
  every other variable fresh; each equation named as the call's lowering names
  it."""
  body, scope = call
  subst: dict = dict(zip(body.invars, eqn.invars, strict=True))
  made = {v for e in body.eqns for v in e.outvars if not C.is_drop_var(v)}
  bound: dict = {}
  for outer, inner in zip(eqn.outvars, body.outvars, strict=True):
    if C.is_drop_var(outer):
      continue
    if not C.is_literal(inner) and inner in made and inner not in bound:
      bound[inner] = outer
  prefix = eqn.source_info.name_stack
  if scope is not None:
    prefix = prefix.extend(scope)
  out = []
  for e in body.eqns:
    outvars = []
    for v in e.outvars:
      w = v if C.is_drop_var(v) else bound.get(v) or C.new_var(v.aval)
      subst[v] = w
      outvars.append(w)
    info = e.source_info.replace(name_stack=prefix + e.source_info.name_stack)
    if C.user_frame(e) is None:
      # A body traced with no user frame (a jax helper's: `dynamic_index_in_dim`'s
      # slice) runs where it is called: its operations are the call's, by file and
      # line, as jax.jit's lowering of the call names them; left without one, the
      # lowering would name the frame that lowers the spliced program (inplace_jax's
      # own), and a copy's read would match no source line a later round ties.
      info = info.replace(traceback=eqn.source_info.traceback)
    out.append(e.replace(invars=[v if C.is_literal(v) else subst[v] for v in e.invars],
                         outvars=outvars, source_info=info))
  for outer, inner in zip(eqn.outvars, body.outvars, strict=True):
    if C.is_drop_var(outer):
      continue
    if C.is_literal(inner):
      alias[outer] = inner
    elif bound.get(inner) is not outer:
      alias[outer] = subst[inner]
  return out


def _scalar_predicate(eqn) -> list:
  """A `while` with a batched predicate, written out with its writes predicated
  (`loops.scalar_predicate_while`)."""
  if eqn.primitive is not C.while_p:
    return [eqn]
  new = loops.scalar_predicate_while(eqn)
  return [eqn] if new is None else [new]


def _without_remat_barrier(eqn) -> list:
  """A `remat2` equation with `prevent_cse` off."""
  if eqn.primitive is C.remat_p and eqn.params.get("prevent_cse"):
    return [eqn.replace(params=dict(eqn.params, prevent_cse=False))]
  return [eqn]


def _given_outputs_picked(eqn) -> list:
  """A `cond` whose small outputs some branch returns as a literal or an operand,
  followed by a `select_n` on the index per such output: that branch's atom, or the
  conditional's result for the others. The values are the conditional's own; but
  where XLA learns the index (a one-trip loop unrolled), a branch's literal is a
  constant to it even when a barrier inplace_jax adds holds the conditional's
  result, as it is under `jax.jit` (which folds `-0.0 + 0.0` to -0.0, not IEEE).
  Not where every branch gives a literal: `select_n` of equal literals is a
  constant to XLA even where the index is not known and jax.jit's conditional
  hides the value (fuzz seed 3200 #8540); such an output stays in the side
  conditional (`conditionals.lower_cond`), opaque or inlined as under jax.jit."""
  if eqn.primitive is not C.cond_p:
    return [eqn]
  index, ops = eqn.invars[0], eqn.invars[1:]
  branches = eqn.params["branches"]
  outvars = list(eqn.outvars)
  picks = []
  for o, out in enumerate(eqn.outvars):
    if C.is_drop_var(out) or _rules.is_big(out.aval):
      continue
    given = [_given_atom(b.jaxpr, o, ops) for b in branches]
    if all(g is None for g in given) or all(C.is_literal(g) for g in given):
      continue
    outvars[o] = C.new_var(out.aval)
    cases = [outvars[o] if g is None else g for g in given]
    picks.append(C.new_jaxpr_eqn([index, *cases], [out], C.select_n_p, {},
                                 C.no_effects, eqn.source_info, eqn.ctx))
  if not picks:
    return [eqn]
  return [eqn.replace(outvars=outvars), *picks]


def _cond_operands_merged(eqn) -> list:
  """A `cond` that takes one variable as several operands, taking it once: each
  branch reads its first parameter for it where it read the others."""
  if eqn.primitive is not C.cond_p:
    return [eqn]
  ops = eqn.invars[1:]
  first: dict[Any, int] = {}
  keep, same = [], {}
  for k, v in enumerate(ops):
    if not C.is_literal(v) and v in first:
      same[k] = first[v]
    else:
      if not C.is_literal(v):
        first[v] = k
      keep.append(k)
  if not same:
    return [eqn]
  branches = tuple(_merged_params(b, keep, same) for b in eqn.params["branches"])
  return [eqn.replace(invars=[eqn.invars[0]] + [ops[k] for k in keep],
                      params=dict(eqn.params, branches=branches))]


def _merged_params(branch: C.ClosedJaxpr, keep: list[int], same: dict[int, int]):
  """`branch` with parameter k read as parameter `same[k]`, and only `keep` left."""
  j = branch.jaxpr
  sub = {j.invars[k]: j.invars[i] for k, i in same.items()}
  def get(v: Any) -> Any:
    return v if C.is_literal(v) else sub.get(v, v)
  eqns = [e.replace(invars=[get(v) for v in e.invars]) for e in j.eqns]
  new = C.Jaxpr(j.constvars, [j.invars[k] for k in keep], [get(v) for v in j.outvars],
                eqns, j.effects, C.loose_debug_info(j.debug_info))
  return C.ClosedJaxpr(new, branch.consts)


def _given_atom(jaxpr, o: int, ops) -> Any:
  """What branch `jaxpr` returns as output `o` when it is a literal or one of the
  conditional's operands (`ops`), as an atom outside the branch; else None."""
  v = jaxpr.outvars[o]
  if C.is_literal(v):
    return v
  for w, op in zip(jaxpr.invars, ops, strict=True):
    if w is v:
      return op
  return None


def _carry_scanned_buffers(jaxpr, donated: Sequence[bool], analyze):
  """`jaxpr` with each top-level `scan` that maps rows of a donated buffer's version
  (an `xs`) to the rows of an output of the same type (a `ys`), through in-place
  updates of the row, rewritten to carry that buffer (`loops.scan_with_carried_xs`)."""
  versions = {v for v, d in zip(jaxpr.invars, donated, strict=True)
              if d and _rules.is_big(v.aval)}
  eqns, changed = [], False
  for eqn in jaxpr.eqns:
    pairs = (_scanned_buffer_pairs(eqn, versions, analyze)
             if eqn.primitive is C.scan_p else [])
    if pairs:
      eqn = loops.scan_with_carried_xs(eqn, pairs)
      changed = True
    eqns.append(eqn)
    for i, o in _rules.carries(eqn):
      if not C.is_literal(eqn.invars[i]) and eqn.invars[i] in versions:
        versions.add(eqn.outvars[o])
  return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _scanned_buffer_pairs(eqn, versions, analyze) -> list[tuple[int, int]]:
  """`(k, j)` for each `xs[k]` of `eqn`, a big version of a donated buffer, whose row
  the body updates in place into `ys[j]` of the same type."""
  p = eqn.params
  unroll = p.get("unroll", 1)
  if unroll is True or unroll not in (1, False) or p["length"] < 1:
    return []
  nc, nk = p["num_consts"], p["num_carry"]
  body = p["jaxpr"].jaxpr
  xs = list(eqn.invars[nc + nk:])
  candidates = [k for k, v in enumerate(xs)
                if not C.is_literal(v) and v in versions and _rules.is_big(v.aval)
                and sum(w is v for w in eqn.invars) == 1]
  if not candidates:
    return []
  mask = [False] * len(body.invars)
  for k in candidates:
    mask[nc + nk + k] = True
  plan = analyze(body, mask, True)
  pairs, taken = [], set()
  for k in candidates:
    i = nc + nk + k
    o = plan.flows[i]
    if o is None or o < nk or not plan.strong_flows[i] or o in taken:
      continue
    out = eqn.outvars[o]
    if C.is_drop_var(out) or not _rules.same_type(out.aval, xs[k].aval):
      continue
    taken.add(o)
    pairs.append((k, o - nk))
  return pairs


def _fill_key(aval, value) -> tuple:
  return (tuple(aval.shape), str(aval.dtype), np.asarray(value, aval.dtype).tobytes())


def _scan_fills(eqn) -> tuple[list[tuple[int, int]], list[int]]:
  """For a top-level `scan` that runs at least two steps: `(i, j)` for each carry j
  that starts as a big constant fill (operand i) and that the body updates, and the
  big stacked outputs `ys[j]` (which JAX's lowering starts as zeros)."""
  p = eqn.params
  unroll = p.get("unroll", 1)
  if p["length"] < 2 or unroll is True or unroll not in (1, False):
    return [], []
  nc, nk = p["num_consts"], p["num_carry"]
  body = p["jaxpr"].jaxpr
  carries = [(nc + j, j) for j in range(nk)
             if body.outvars[j] is not body.invars[nc + j]
             and _rules.is_big(eqn.invars[nc + j].aval)]
  ys = [j for j, v in enumerate(eqn.outvars[nk:])
        if not C.is_drop_var(v) and _rules.is_big(v.aval)]
  return carries, ys


def _distinct_fills(jaxpr):
  """`jaxpr` with each top-level `scan`'s big constant-filled starts (carries and
  stacked outputs) given a fill of its own, where the program has two fills XLA
  would merge (`_build.distinct_fill`); the stacked outputs become carried buffers
  (`loops.scan_with_carried_xs`). The fills' values are unchanged, so is every
  value computed."""
  fills = {e.outvars[0]: e.invars[0].val for e in jaxpr.eqns
           if e.primitive is C.broadcast_in_dim_p and C.is_literal(e.invars[0])
           and _rules.is_big(e.outvars[0].aval)}
  per_scan, counts = {}, {}
  for k, e in enumerate(jaxpr.eqns):
    if e.primitive is not C.scan_p:
      continue
    carries, ys = _scan_fills(e)
    carries = [(i, j) for i, j in carries if e.invars[i] in fills]
    nk = e.params["num_carry"]
    keys = ([_fill_key(e.invars[i].aval, fills[e.invars[i]]) for i, _ in carries]
            + [_fill_key(e.outvars[nk + j].aval, 0) for j in ys])
    for key in keys:
      counts[key] = counts.get(key, 0) + 1
    per_scan[k] = (carries, ys, keys)
  if not any(n > 1 for n in counts.values()):
    return jaxpr
  eqns, serial = [], 0
  for k, e in enumerate(jaxpr.eqns):
    if k not in per_scan:
      eqns.append(e)
      continue
    carries, ys, keys = per_scan[k]
    shared = [counts[key] > 1 for key in keys]
    invars = list(e.invars)
    for (i, _), s in zip(carries, shared, strict=False):
      if s:
        new, invars[i] = _build.distinct_fill(fills[e.invars[i]], e.invars[i].aval,
                                              serial, e)
        eqns += new
        serial += 1
    fresh = []
    nk = e.params["num_carry"]
    for j, s in zip(ys, shared[len(carries):], strict=True):
      if s:
        new, init = _build.distinct_fill(0, e.outvars[nk + j].aval, serial, e)
        eqns += new
        serial += 1
        fresh.append((init, j))
    e = e.replace(invars=invars)
    eqns.append(loops.scan_with_carried_xs(e, [], fresh) if fresh else e)
  return jaxpr.replace(eqns=eqns)


# Elementwise primitives XLA fuses into every fusion that reads their result,
# computing them once per fusion (not `IsExpensive` in xla/service/instruction_fusion.cc:
# no division, square root or transcendental).
_EXPENSIVE = frozenset({"div", "rem", "sqrt", "rsqrt", "pow"})
# Data movement XLA fuses into each reader alike (clone level 2).
_MOVES = frozenset({"slice", "dynamic_slice", "squeeze", "reshape", "broadcast_in_dim",
                    "tile"})
# At most this many equations are added per jaxpr (a chain read by many equations
# would otherwise grow as a tree).
_CLONE_LIMIT = 256


def fused_into_readers(eqn, level: int) -> bool:
  """Whether XLA computes `eqn` again in each fusion that reads its result, so that
  clone level `level` computes it once per reader (`clone_shared`)."""
  name = eqn.primitive.name
  if len(eqn.outvars) != 1 or eqn.effects or C.jaxprs_in_params(eqn.params):
    return False
  if level >= 2 and name in _MOVES and (name != "tile" or level < SINK_LEVEL):
    # (The sink round moves tiles rather than cloning them: cloned there too, the
    # sunk slices of a `jnp.resize` were tied whole again, fuzz seed 7400 #1954.)
    return True
  if level >= 1 and name == "div" and _by_literal(eqn):
    return True
  return (level >= 1 and name not in _EXPENSIVE
          and _traits.has(eqn.primitive, _traits.Trait.ELEMENTWISE)
          and not _traits.has(eqn.primitive, _traits.Trait.SENSITIVE))


def _by_literal(eqn) -> bool:
  """Whether `eqn` (a `div`) divides floats by a literal scalar. XLA's simplifier
  multiplies by the reciprocal instead, a cheap multiply it fuses into each reader.
  Not a division by a computed scalar: there XLA multiplies by the reciprocal only
  where the scalar has no other user (measured on XLA:CPU, `_scalar_divisors`), so
  clones of the division, or of the scalar, change its arithmetic."""
  d = eqn.invars[1]
  if not jax.numpy.issubdtype(eqn.outvars[0].aval.dtype, jax.numpy.inexact):
    return False
  return C.is_literal(d) and np.ndim(d.val) == 0


def _from_inputs(jaxpr, eqns) -> set:
  """The inputs of `jaxpr` and the results of `eqns` (its equations, in order)
  computed from them: chains of constants are left to XLA."""
  live = set(jaxpr.invars)
  for e in eqns:
    if any(not C.is_literal(v) and v in live for v in e.invars):
      live.update(e.outvars)
  return live


def _cloned(jaxpr, level: int, memo: dict):
  """`jaxpr` with each cheap equation (`fused_into_readers` at `level`) whose float
  result several equations read (and that depends on an input) computed once per
  reading equation, at every depth.

  XLA fuses such an operation into each fusion that reads it and computes it there
  again, so the clones change no fusion and no value; its CSE merges any two that
  nothing tells apart. What tells them apart is a barrier the analysis puts between
  a read of a buffer and its update: the read's fusion computes the elementwise
  chain from the buffer before the barrier, the update's from the buffer after it,
  as under jax.jit, where without the clones the chain would be tied, materialised
  and read from memory by both (`b = b * 0.99 - 0.01 * (b * b)` returning `b * b`
  too: the product `b * b` tied, its multiply-add changed)."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  eqns = []
  for e in jaxpr.eqns:
    new_params = _params_with(e.params, lambda j: _cloned(j, level, memo))
    eqns.append(e if new_params is None else e.replace(params=new_params))
  live = _from_inputs(jaxpr, eqns)
  outs = set(v for v in jaxpr.outvars if not C.is_literal(v))
  # Reverse pass: `readers[v]` are the (kept or cloned) equations reading v, each a
  # mutable list of invars.
  readers: dict = {}
  rev: list = []
  owner: dict = {}        # id of a reader's invars -> that reader
  budget = _CLONE_LIMIT
  divisors = _scalar_divisors(eqns)
  for e in reversed(eqns):
    v = e.outvars[0] if len(e.outvars) == 1 else None
    users = readers.get(v, []) if v is not None else []
    n = len(users) + (1 if v in outs else 0)
    copies = [(e, list(e.invars))]
    cloned: list = []
    if v is not None and v in live and n > 1 and v not in divisors \
        and fused_into_readers(e, level) \
        and jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact) and budget >= n - 1:
      # The first reader (or the outputs) keeps `v`; every other reader gets its own.
      cloned = users[0 if v in outs else 1:]
    elif v is not None and v in live and n > 1 and level >= 2 \
        and e.primitive is C.dynamic_update_slice_p:
      # XLA fuses an update of a slice into each reduction that reads its result,
      # computing it there again from the buffer before it (fuzz seed 8800 #999:
      # the sum of a buffer just after a row is set); the others keep `v`.
      cloned = [ins for ins in users if _traits.has(owner[id(ins)].primitive,
                                                     _traits.Trait.REDUCTION)]
      if len(cloned) == n:
        cloned = cloned[1:]
      if len(cloned) > budget:
        cloned = []
    if cloned and v is not None:
      for ins in cloned:
        w = C.new_var(v.aval)
        for k, a in enumerate(ins):
          if a is v:
            ins[k] = w
        copies.append((e.replace(outvars=[w]), list(e.invars)))
        budget -= 1
    for eqn, ins in copies:
      rev.append((eqn, ins))
      owner[id(ins)] = eqn
      for a in ins:
        if not C.is_literal(a):
          lst = readers.setdefault(a, [])
          if not any(x is ins for x in lst):
            lst.append(ins)
  if budget == _CLONE_LIMIT:
    out = jaxpr if all(a is b for a, b in zip(eqns, jaxpr.eqns)) else \
        jaxpr.replace(eqns=eqns)
  else:
    out = jaxpr.replace(eqns=[eqn.replace(invars=ins) for eqn, ins in reversed(rev)])
  memo[id(jaxpr)] = (jaxpr, out)
  return out


def _scalar_divisors(eqns) -> set:
  """The scalars, and broadcasts and casts of scalars, that some `div` of `eqns`
  divides an array by. XLA's simplifier turns `A / broadcast(s)` into
  `A * broadcast(1 / s)` only where `s` has no other user (measured on XLA:CPU:
  `t = 1 - s; a / t, b / t` keeps both divisions, `a / (1 - s), b / (1 - s)`
  multiplies both by the reciprocal), so a clone of `s`, or of its broadcast, per
  division would change their arithmetic (Adam's bias corrections,
  `eqx_mlp_adam`)."""
  made = {v: e for e in eqns for v in e.outvars}
  out: set = set()
  for e in eqns:
    d = e.invars[1] if e.primitive is C.div_p else None
    if d is None or C.is_literal(d) or e.outvars[0].aval.shape == ():
      continue
    # Up through broadcasts and casts (XLA drops a cast to the same type) to the
    # scalar: every value on the way is the divisor to XLA's simplifier.
    chain = [d]
    while True:
      b = made.get(chain[-1])
      if b is None or b.primitive not in (C.broadcast_in_dim_p,
                                          C.convert_element_type_p) \
          or C.is_literal(b.invars[0]):
        break
      chain.append(b.invars[0])
    if any(v.aval.shape == () for v in chain):
      out.update(chain)
  return out


# Clone level from which data movement is also moved above the cheap elementwise
# operations it reads (`_moves_sunk`).
SINK_LEVEL = 3
# Data movement `_moves_sunk` moves, and how many operations deep.
_SINKS = frozenset({"slice", "dynamic_slice", "squeeze", "reshape", "tile"})
_SINK_DEPTH = 8


def _moves_sunk(jaxpr, memo: dict):
  """`jaxpr` with each move (`_SINKS`: a slice, dynamic slice, squeeze, reshape or
  tile) of a cheap elementwise result (`fused_into_readers` at level 1, a float
  computed from an input) done to the operation's operands instead, the
  operation then computed on the moved values, at every depth: `(b * b)[0]`
  becomes `b[0] * b[0]`.

  XLA's fusions compute it so: a reader of the slice of an elementwise result
  computes the operation at the slice's elements, from the operands. The values
  are the same, element for element. What changes is where a read of a buffer
  sits: after the move it is a slice of the buffer, pure data movement, which a
  barrier may follow without changing arithmetic; the operation after it stays in
  its reader's fusion, as under jax.jit (fuzz seed 7400 #1954: rows and a column
  of `b0 @ w * 0.125`, `jnp.resize`d, set into b0 after b0 is stepped)."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  eqns = []
  changed = False
  for e in jaxpr.eqns:
    new_params = _params_with(e.params, lambda j: _moves_sunk(j, memo))
    if new_params is not None:
      e = e.replace(params=new_params)
      changed = True
    eqns.append(e)
  live = _from_inputs(jaxpr, eqns)
  made = {v: e for e in eqns for v in e.outvars}

  def sink(move, depth: int, moved: dict) -> list:
    src = move.invars[0]
    p = made.get(src)
    if depth >= _SINK_DEPTH or p is None or src not in live or \
        not jax.numpy.issubdtype(src.aval.dtype, jax.numpy.inexact) or \
        not fused_into_readers(p, 1):
      return [move]
    ins, pre = [], []
    for a in p.invars:
      if C.is_literal(a) and np.ndim(a.val) == 0:
        ins.append(a)
        continue
      if a.aval.shape != src.aval.shape:
        return [move]
      if a not in moved:       # `b * b`: one slice of `b`
        w = C.new_var(move.outvars[0].aval.update(dtype=a.aval.dtype,
                                                 weak_type=a.aval.weak_type))
        pre.extend(sink(move.replace(invars=[a, *move.invars[1:]], outvars=[w]),
                        depth + 1, moved))
        moved[a] = w
      ins.append(moved[a])
    return [*pre, p.replace(invars=ins, outvars=list(move.outvars))]

  out = []
  for e in eqns:
    if e.primitive.name in _SINKS and len(e.outvars) == 1 and not e.effects:
      new = sink(e, 0, {})
      if len(new) != 1 or new[0] is not e:
        changed = True
        for n in new:       # a move of the result sinks through these in turn
          made.update((w, n) for w in n.outvars)
          live.update(n.outvars)
      out.extend(new)
    else:
      out.append(e)
  if not changed:
    result = jaxpr
  else:
    result = C.dce_jaxpr(jaxpr.replace(eqns=out), [True] * len(jaxpr.outvars),
                         instantiate=True)[0]
  memo[id(jaxpr)] = (jaxpr, result)
  return result

