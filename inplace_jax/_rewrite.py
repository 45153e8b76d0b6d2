"""The rewrite: carries out a `Plan` (plan in, jaxpr out; it decides nothing).

Equations are emitted in the plan's order. A barrier step binds
`optimization_barrier` over the version and the pending read results; from then on
every use of those variables reads the barrier's outputs, which is what makes XLA
keep the order (a barrier orders only what flows through it). An equation whose
analysis asks for more than new operands is emitted by its primitive's rewrite rule
(`_rules/`: a conditional lowered to loops, an unrolled scan's entry barrier), with
its sub-jaxprs rewritten first, recursively, once per distinct sub-plan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import _compat as C
from . import _traits
from ._exactness import merge_key
from ._plan import Plan
from ._rules import _build, call_body, outputs_free_of, rule_for, updates


class Rewriter:
  """Rewrites plans, memoising per plan so a shared sub-jaxpr is rebuilt once."""

  def __init__(self):
    self._done: dict[int, tuple[Plan, Any]] = {}

  def __call__(self, plan: Plan):
    hit = self._done.get(id(plan))
    if hit is not None and hit[0] is plan:
      return hit[1]
    out = _rewrite(plan, self) if plan.changed else plan.jaxpr
    self._done[id(plan)] = (plan, out)
    return out


def rewrite(plan: Plan):
  """The open `core.Jaxpr` that plan `plan` describes."""
  return Rewriter()(plan)


def _default_rewrite(eqn, info, invars, params) -> list:
  del info
  return [eqn.replace(invars=invars, params=params)]


def _with_subplans(eqn, info, rewriter) -> dict:
  params = dict(eqn.params)
  for (key, pos), sub in info.subplans:
    if not sub.changed:
      continue
    new = rewriter(sub)
    old = params[key] if pos is None else params[key][pos]
    if isinstance(old, C.ClosedJaxpr):
      new = C.ClosedJaxpr(new, old.consts)
    if pos is None:
      params[key] = new
    else:
      seq = list(params[key])
      seq[pos] = new
      params[key] = type(params[key])(seq)
  return params


class _Emitter:
  """The state of one plan's emission: substitutions and the equations so far."""

  def __init__(self, plan: Plan, rewriter: Rewriter):
    self.plan, self.rewriter = plan, rewriter
    self.subst: dict[Any, Any] = {}
    self.old_read: dict[int, Any] = {}
    self.out: list[C.JaxprEqn] = []
    self.pre = {b.update: b for b in plan.barriers if b.kind == "pre"}
    self.post = {b.update: b for b in plan.barriers if b.kind == "post"}
    # Results of loops and conditionals that a barrier ties are used as they are
    # afterwards: being inputs of the barrier orders them before the update, and
    # XLA cannot move a loop or a conditional into its users as it can a slice (the
    # reason other tied reads are used through the barrier). Through it, a result
    # XLA would learn is constant (a loop of zero trips, a known branch) would be
    # hidden from its simplifier, which under jax.jit folds `-0.0 + 0.0` to -0.0.
    # Not a loop XLA inlines (one trip, `EqnInfo.forwards_reads`): its results are
    # the body's last operations, which XLA fuses into their users after the
    # update as it does a slice (a one-trip scan's `max(b[0, 0])` fused into the
    # scatter it feeds, fuzz seed 4700 #9197). Only results computed from an
    # operand: a constant one stays visible to the simplifier.
    # But a result computed from an operand that an update later takes in place (a
    # lowered switch's buffer, which reads another buffer tied before that one's
    # update): kept as it is, the barrier would hold its old value while the update
    # writes it, and XLA copies it (fuzz seed 6800 #2701). Used through the
    # barrier, the update writes what the barrier passes on.
    updated = {e.invars[u.operand] for e, info in zip(plan.jaxpr.eqns, plan.infos,
                                                      strict=True) for u in info.uses}
    self.control = {v for e, info in zip(plan.jaxpr.eqns, plan.infos, strict=True)
                    if _traits.has(e.primitive, _traits.Trait.CONTROL_FLOW)
                    for v in _kept_control(e, info, updated)}
    # Likewise a call's result computed from none of its operands (a nested jit
    # returning `0.0`): XLA inlines the call and folds `b + 0.0` to `b` under
    # jax.jit, keeping -0.0, where through the barrier it would add (fuzz seed 6300
    # #2501). It reads no buffer, so it needs no order.
    self.constant = set(_constant_call_results(
        plan.jaxpr, {v for b in self.pre.values() for v in b.reads}))

  def s(self, a):
    return a if C.is_literal(a) else self.subst.get(a, a)

  def pre_barrier(self, k: int) -> None:
    eqn, spec = self.plan.jaxpr.eqns[k], self.pre[k]
    extra = []
    if k in self.plan.splits:
      g_eqns, old = updates.split_read(eqn, self.s(eqn.invars[0]), self.s(eqn.invars[1]))
      self.out.extend(g_eqns)
      extra = [old]
    orig = list(spec.versions) + list(spec.reads)
    b_eqn, b_outs = _build.barrier_eqn([self.s(v) for v in orig] + extra, eqn)
    self.out.append(b_eqn)
    for v, w in zip(orig, b_outs, strict=False):
      if (v not in self.control and v not in self.constant) or v in spec.versions:
        self.subst[v] = w
    if extra:
      self.old_read[k] = b_outs[-1]

  def post_barrier(self, k: int) -> None:
    eqn, spec = self.plan.jaxpr.eqns[k], self.post[k]
    b_eqn, b_outs = _build.barrier_eqn([self.s(v) for v in spec.versions], eqn)
    self.out.append(b_eqn)
    for v, w in zip(spec.versions, b_outs, strict=True):
      self.subst[v] = w

  def equation(self, k: int) -> None:
    eqn, info = self.plan.jaxpr.eqns[k], self.plan.infos[k]
    invars = [self.s(v) for v in eqn.invars]
    if k in self.plan.splits:
      self.out.extend(updates.split_write(eqn, invars[0], invars[1], invars[2],
                                          self.old_read[k]))
    elif info.changed:
      params = _with_subplans(eqn, info, self.rewriter)
      rule = rule_for(eqn.primitive).rewrite or _default_rewrite
      self.out.extend(rule(eqn, info, invars, params))
    elif any(a is not b for a, b in zip(invars, eqn.invars, strict=True)):
      self.out.append(eqn.replace(invars=invars))
    else:
      self.out.append(eqn)


def _constant_call_results(jaxpr, wanted: set) -> list:
  """Those of `wanted` that a call computes from none of its operands."""
  out: list = []
  for e in jaxpr.eqns:
    if not wanted.intersection(e.outvars) or call_body(e) is None:
      continue
    free = outputs_free_of(e, [i for i, v in enumerate(e.invars) if not C.is_literal(v)])
    out.extend(v for o, v in enumerate(e.outvars) if o in free and v in wanted)
  return out


def _kept_control(eqn, info, updated: set | frozenset = frozenset()) -> list:
  """The results of control-flow `eqn` that a barrier ties without their later uses
  reading its outputs: all of them, but for a loop XLA inlines, those computed
  without any operand; and but those computed from an operand that an update takes
  in place later (`updated`)."""
  if not info.forwards_reads and not updated.intersection(eqn.outvars):
    return list(eqn.outvars)
  free = outputs_free_of(
      eqn, [i for i, v in enumerate(eqn.invars) if not C.is_literal(v)])
  if not info.forwards_reads:
    return [v for o, v in enumerate(eqn.outvars) if o in free or v not in updated]
  return [v for o, v in enumerate(eqn.outvars) if o in free]


def _rewrite(plan: Plan, rewriter: Rewriter):
  em = _Emitter(plan, rewriter)
  emit = {"pre": em.pre_barrier, "post": em.post_barrier, "eqn": em.equation}
  for step in plan.order:
    emit[step.kind](step.index)
  j = plan.jaxpr
  return C.Jaxpr(j.constvars, j.invars, [em.s(v) for v in j.outvars], em.out,
                 j.effects, j.debug_info)


# --------------------------------------------------------------------------- check


def reads_across_barrier(jaxpr) -> bool:
  """Whether an equation after a barrier takes both the barrier's output for a
  buffer and a value computed from that buffer's input to the barrier by
  operations XLA may fuse into it (at any depth).

  XLA:CPU then miscompiles where barriers are kept: the barrier forwards the
  buffer, so both operands are one buffer, but its in-place check sees only the
  operand it writes over (read elementwise) and not the other's slice of it, and
  the fusion overwrites rows it reads later. Seen once, a clone round's candidate
  (`x = x + x[21] * c` after the tie; 240 of 768 elements wrong); such a program
  is never compiled (`inplace_jax.jit`)."""
  return _reads_across_barrier(jaxpr, {}, {}, {})


class _Origin:
  """What an invar of a call's body XLA inlines is in the caller: the outermost
  caller's value (`name`) and what it is computed from (`reach`, found when first
  asked: most bodies never ask)."""

  __slots__ = ("name", "_find", "_reach")

  def __init__(self, name, find: Callable[[], frozenset]):
    self.name, self._find = name, find
    self._reach: frozenset | None = None

  @property
  def reach(self) -> frozenset:
    out = self._reach
    if out is None:
      out = self._reach = self._find()
    return out


def _reads_across_barrier(jaxpr, origin: dict, memo: dict, tied_in: dict) -> bool:
  """`reads_across_barrier`, where `origin` maps each invar of `jaxpr` that is a
  call's body XLA inlines to what it is in the caller (`_Origin`: the caller's
  value, and what that value is computed from by operations XLA fuses, `_reach`).
  A value inside computed from the very value another invar is, is a read of that
  invar's buffer: a column sliced outside a `jax.checkpoint` body and the buffer
  its `jnp.where` writes over inside it (fuzz seed 7800 #4965). Not one computed
  from what that value was computed from: that is another buffer (a matmul's
  result both stepped into the buffer and read inside the body). `tied_in`: the
  invars that are a barrier's output in the caller, each with that barrier's input
  (as the outermost caller's name): the update may be inside the body and the
  barrier outside it (measured: miscompiled as when both are outside).
  `memo`: per jaxpr, whether it holds a barrier (`holds`; one that holds
  none and takes none's output has no such read) and its producers
  (`_producers`)."""
  if not tied_in and not holds(jaxpr, C.optimization_barrier_p, memo):
    return False
  jaxpr = _clones_merged(jaxpr, memo)
  producer = _producers(jaxpr, memo)
  # A barrier's output -> its input, for arrays.
  tied: dict[Any, Any] = dict(tied_in)
  # Each value's `_reach` and `_elementwise_roots`, found once: a value's roots
  # are barrier outputs made before it, so later barriers leave them as they are.
  reaches: dict[Any, frozenset] = {}
  roots_of: dict[Any, tuple] = {}
  # The values that have roots (a barrier's output, or computed elementwise at
  # their shape from one), found forward: an equation none of whose operands has
  # roots is passed over without looking back.
  rooted: set = set(tied)

  def reach_of(w) -> frozenset:
    hit = reaches.get(w)
    if hit is None:
      hit = reaches[w] = _reach(w, jaxpr, producer, origin)
    return hit

  for e in jaxpr.eqns:
    if e.primitive is C.optimization_barrier_p:
      for x, y in zip(e.invars, e.outvars, strict=True):
        if not C.is_literal(x) and not C.is_drop_var(y) and \
            getattr(x.aval, "ndim", 0) > 0:
          tied[y] = x
          rooted.add(y)
      continue
    if C.jaxprs_in_params(e.params):
      subs = list(C.sub_jaxprs(e.params))
      if e.primitive in _INLINED_CALLS and len(subs) == 1 and \
          len(subs[0].invars) == len(e.invars):
        # An operand computed elementwise from a barrier's output is that
        # buffer to the call's body too: XLA computes the chain in the loop that
        # writes over it (fuzz seed 8800 #6464: `b * 0.99 - 0.25 * b[5]` after
        # the tie, a row sliced before it set into the result by the nested jit
        # of `dynamic_update_index_in_dim`).
        inner_tied = {}
        for i, u in zip(subs[0].invars, e.invars, strict=True):
          if C.is_literal(u) or u not in rooted:
            continue
          roots = _elementwise_roots(u, tied, jaxpr, producer, roots_of)
          if roots:
            inner_tied[i] = _outermost(tied[roots[0]], origin)
        if inner_tied or holds(subs[0], C.optimization_barrier_p, memo):
          inner = {i: _Origin(origin[u].name if u in origin else u,
                              functools.partial(reach_of, u))
                   for i, u in zip(subs[0].invars, e.invars, strict=True)
                   if not C.is_literal(u)}
          if _reads_across_barrier(subs[0], inner, memo, inner_tied):
            return True
      elif any(_reads_across_barrier(j, {}, memo, {}) for j in subs):
        return True
      continue
    ins = [y for y in e.invars if not C.is_literal(y) and y in rooted]
    if not ins or e.primitive in _UNFUSED:
      continue
    if _traits.has(e.primitive, _traits.Trait.ELEMENTWISE):
      shapes = {getattr(y.aval, "shape", None) for y in ins}
      rooted.update(o for o in e.outvars
                    if not C.is_drop_var(o) and getattr(o.aval, "shape", None) in shapes)
    out_types = [(getattr(o.aval, "shape", None), getattr(o.aval, "dtype", None))
                 for o in e.outvars]
    for y in ins:
      y_type = (getattr(y.aval, "shape", None), getattr(y.aval, "dtype", None))
      if y_type[0] is None or y_type not in out_types:
        continue
      for root in _elementwise_roots(y, tied, jaxpr, producer, roots_of):
        x = tied[root]
        for w in e.invars:
          if w is y or C.is_literal(w):
            continue
          reach = reach_of(w)
          if x in reach or (x in origin and origin[x].name in reach):
            return True
  return False


def _clones_merged(jaxpr, memo: dict):
  """`jaxpr` with each operand named as XLA's CSE leaves it: a value an equal
  equation computed before (equal primitive, parameters and operands; one
  result, no effects, no jaxpr inside) read as that first value. Clones of an
  update that a round gives each reader (`_passes.clone_shared`) are merged so
  where nothing tells them apart: one read after the barrier that materialises
  the other is then a read of that barrier's input (fuzz seed 8800 #1963: a row
  of `b - 0.5 * v` set into the buffer `b - 0.5 * v` overwrote, read after it)."""
  key = ("merged", id(jaxpr))
  hit = memo.get(key)
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  alias: dict = {}
  first: dict = {}
  eqns = []
  changed = False
  for e in jaxpr.eqns:
    ins = [v if C.is_literal(v) else alias.get(v, v) for v in e.invars]
    if any(a is not b for a, b in zip(ins, e.invars)):
      e, changed = e.replace(invars=ins), True
    eqns.append(e)
    if len(e.outvars) != 1 or C.is_drop_var(e.outvars[0]) or e.effects or \
        C.jaxprs_in_params(e.params):
      continue
    try:
      v = first.setdefault(merge_key(e, lambda x: x), e.outvars[0])
    except TypeError:         # a parameter whose hash raised late: never merged
      continue
    if v is not e.outvars[0]:
      alias[e.outvars[0]] = v
  out = jaxpr.replace(eqns=eqns) if changed else jaxpr
  memo[key] = (jaxpr, out)
  return out


def _producers(jaxpr, memo: dict) -> dict:
  """Each value `jaxpr` computes -> the index of its equation (memoised by id, with
  the jaxpr kept alive: a body is visited once per call of it)."""
  key = ("producers", id(jaxpr))
  hit = memo.get(key)
  if hit is None or hit[0] is not jaxpr:
    hit = memo[key] = (jaxpr, {v: k for k, e in enumerate(jaxpr.eqns) for v in e.outvars
                               if not C.is_drop_var(v)})
  return hit[1]


def _outermost(v, origin: dict):
  """`v` as the outermost caller names it (`_Origin.name`)."""
  return origin[v].name if v in origin else v


# Calls XLA inlines into their caller, whose body's operations fuse with it.
_INLINED_CALLS = frozenset({C.jit_p, C.closed_call_p, C.core_call_p, C.remat_p,
                            C.custom_jvp_call_p, C.custom_vjp_call_p})


def _reach(w, jaxpr, producer, origin: dict) -> frozenset:
  """`w` and every value it is computed from by operations XLA fuses into a loop
  (`_LOOP_FUSED`: elementwise, data movement, slicing, predicates; no barrier,
  reduction, update, dot, loop or call on the way), through the invars `origin`
  maps to the caller's values, as the outermost caller's names."""
  out: set = set()
  stack, seen = [w], set()
  while stack:
    v = stack.pop()
    if C.is_literal(v) or v in seen:
      continue
    seen.add(v)
    if v in origin:
      out |= origin[v].reach
      continue
    out.add(v)
    k = producer.get(v)
    if k is None:
      continue
    e = jaxpr.eqns[k]
    if e.primitive is C.optimization_barrier_p or \
        not _traits.any_of(e.primitive, _LOOP_FUSED) or \
        _traits.any_of(e.primitive, _MATERIALISED):
      continue
    stack.extend(e.invars)
  return frozenset(out)


def loop_fused_reach(w, jaxpr, producer) -> frozenset:
  """`w` and every value of `jaxpr` it is computed from by operations XLA fuses
  into a loop (`_reach`; `producer`: each value's equation index)."""
  return _reach(w, jaxpr, producer, {})


# XLA:CPU's `small-while-loop-hoisting` threshold: a loop whose one iteration
# (body and condition, by HLO cost analysis) accesses fewer bytes is hoisted.
SMALL_LOOP_BYTES = 1024


def barrier_in_small_loop(jaxpr) -> bool:
  """Whether an `optimization_barrier` sits (at any depth) in the body of a `while`
  or `scan` that XLA:CPU's small-while-loop hoisting might take.

  The pass emits a loop whose iteration accesses under `SMALL_LOOP_BYTES` (a
  barrier costs nothing there) as one kernel of nested code, whose emitter has no
  rule for a barrier: the compile aborts the process (`Check failed: buffer !=
  nullptr`, jaxlib 0.10.2; fuzz seed 6000 #256's hand-tied reference, a row tied
  with its 384-byte buffer in a scan body). A program with such a barrier is
  compiled with the pass off (`_compat.small_loops_hoisted`). A loop is taken as
  too large to hoist only where its body surely accesses that many bytes each
  iteration (`_surely_large`)."""
  for eqn in jaxpr.eqns:
    inner = list(C.sub_jaxprs(eqn.params))
    loop = _loop_body(eqn)
    if loop is not None and any(holds(j, C.optimization_barrier_p) for j in inner) and \
        not _surely_large(*loop):
      return True
    # A large loop may hold a small one, which the pass takes on its own.
    if any(barrier_in_small_loop(j) for j in inner):
      return True
  return False


def _loop_body(eqn) -> tuple[Any, int] | None:
  """A `while` or `scan` equation's body (open) and how many of its leading inputs
  are loop constants; None for any other equation."""
  if eqn.primitive is C.while_p:
    return eqn.params["body_jaxpr"].jaxpr, eqn.params["body_nconsts"]
  if eqn.primitive is C.scan_p:
    return eqn.params["jaxpr"].jaxpr, eqn.params["num_consts"]
  return None


def holds(jaxpr, primitive, memo: dict | None = None) -> bool:
  """Whether `jaxpr` holds an equation of `primitive`, at any depth. `memo`, for
  one primitive: the answers by jaxpr id (each jaxpr kept alive with its answer)."""
  if memo is not None:
    hit = memo.get(id(jaxpr))
    if hit is not None and hit[0] is jaxpr:
      return hit[1]
  out = any(e.primitive is primitive
            or any(holds(j, primitive, memo) for j in C.sub_jaxprs(e.params))
            for e in jaxpr.eqns)
  if memo is not None:
    memo[id(jaxpr)] = (jaxpr, out)
  return out


def _nbytes(v) -> int:
  aval = v.aval
  shape = getattr(aval, "shape", None)
  if shape is None:
    return 0
  n = aval.dtype.itemsize
  for d in shape:
    n *= int(d)
  return n


def _identity_literal(eqn) -> bool:
  """Whether `eqn` takes a literal 0 or 1 (`y * 1.0`, `y + 0`): XLA's simplifier may
  remove such an operation, and its store with it."""
  for v in eqn.invars:
    if C.is_literal(v):
      try:
        if float(v.val) in (0.0, 1.0):
          return True
      except (TypeError, ValueError):
        return True
  return False


def _surely_large(body, nconsts: int) -> bool:
  """Whether an iteration of loop body `body` accesses `SMALL_LOOP_BYTES` or more
  whatever XLA makes of it: an elementwise operation on what the loop carries (or
  scans over) writes that much into the carry (its result is an output of the
  body, so every element is stored each iteration), or a reduction or a dot reads
  that much of it in full (which XLA does not narrow to a slice) for a value the
  body's outputs are computed from. Values computed from loop constants alone are
  left out (XLA hoists them out of the loop), and so are values nothing uses (XLA
  removes them)."""
  varying = set(body.invars[nconsts:])
  outputs = {v for v in body.outvars if not C.is_literal(v)}
  live = set(outputs)             # what the outputs are computed from: the rest
  used = set()                    # XLA removes as dead code (fuzz seed 6100 #2411)
  for k in range(len(body.eqns) - 1, -1, -1):
    e = body.eqns[k]
    if any(v in live for v in e.outvars if not C.is_drop_var(v)):
      used.add(k)
      live.update(v for v in e.invars if not C.is_literal(v))
  for k, e in enumerate(body.eqns):
    ins = [v for v in e.invars if not C.is_literal(v) and v in varying]
    if not ins or k not in used:
      continue
    varying.update(v for v in e.outvars if not C.is_drop_var(v))
    if _traits.has(e.primitive, _traits.Trait.ELEMENTWISE) and not _identity_literal(e) \
        and any(v in outputs and _nbytes(v) >= SMALL_LOOP_BYTES for v in e.outvars):
      return True
    if _traits.any_of(e.primitive, _traits.Trait.REDUCTION | _traits.Trait.CONTRACTION) \
        and any(_nbytes(v) >= SMALL_LOOP_BYTES for v in ins):
      return True
  return False


def _elementwise_roots(y, tied: dict, jaxpr, producer, memo: dict) -> tuple:
  """The barrier outputs `y` is computed from elementwise, at its shape (`y` itself
  if it is one): XLA computes such a chain in the loop that writes over that
  buffer, so a read of the buffer from before the barrier that meets the chain
  later (`x * 0.5 + x[21]` after the tie, where the barrier output's first user
  is the multiply; fuzz seed 5600 #5521, its row tiled by `jnp.resize`) is read
  in that loop too."""
  hit = memo.get(y)
  if hit is not None:
    return hit
  roots, stack, seen = [], [y], set()
  while stack:
    v = stack.pop()
    if v in seen:
      continue
    seen.add(v)
    if v in tied:
      roots.append(v)
      continue
    known = memo.get(v)
    if known is not None:     # found from an earlier operand (at `y`'s shape)
      roots.extend(known)
      continue
    k = producer.get(v)
    if k is None:
      continue
    e = jaxpr.eqns[k]
    if not _traits.has(e.primitive, _traits.Trait.ELEMENTWISE) or e.primitive in (
        C.optimization_barrier_p,):
      continue
    stack.extend(u for u in e.invars if not C.is_literal(u)
                 and getattr(u.aval, "shape", None) == y.aval.shape)
  out = memo[y] = tuple(dict.fromkeys(roots))
  return out


_UNFUSED = frozenset({C.dot_general_p})
# What XLA fuses into an elementwise loop that reads its operand at other indices
# than it writes (a reduction's or an update's result is materialised first).
_LOOP_FUSED = (_traits.Trait.ELEMENTWISE | _traits.Trait.DATA_MOVEMENT
               | _traits.Trait.SLICING | _traits.Trait.PREDICATE)
_MATERIALISED = _traits.Trait.REDUCTION | _traits.Trait.UPDATE
