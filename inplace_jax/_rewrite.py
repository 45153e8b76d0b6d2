"""The rewrite: carries out a `Plan` (plan in, jaxpr out; it decides nothing).

Equations are emitted in the plan's order. A barrier step binds
`optimization_barrier` over the version and the pending read results; from then on
every use of those variables reads the barrier's outputs, which is what makes XLA
keep the order (a barrier orders only what flows through it). Sub-jaxprs are
rewritten recursively, once per distinct sub-plan.
"""

from __future__ import annotations

from typing import Any

from . import _compat as C
from . import _rules
from ._plan import Plan


class Rewriter:
  """Rewrites plans, memoising per plan so a shared sub-jaxpr is rebuilt once."""

  def __init__(self):
    self._done: dict[int, tuple[Plan, Any]] = {}

  def __call__(self, plan: Plan):
    hit = self._done.get(id(plan))
    if hit is not None and hit[0] is plan:
      return hit[1]
    out = _rewrite(plan, self)
    self._done[id(plan)] = (plan, out)
    return out


def rewrite(plan: Plan):
  """The open `core.Jaxpr` that plan `plan` describes."""
  return Rewriter()(plan)


_CONTROL_FLOW = frozenset((C.while_p, C.scan_p, C.cond_p))


def _barrier_eqn(operands, like):
  outs = [C.new_var(a.aval) for a in operands]
  eqn = C.new_jaxpr_eqn(list(operands), outs, C.optimization_barrier_p, {},
                        C.no_effects, like.source_info, like.ctx)
  return eqn, outs


def _with_entry_barrier(closed, positions, like):
  """`closed` with its invars at `positions` passed through one barrier first; the
  barrier binds the old invars, so the body's equations stay as they are."""
  j = closed.jaxpr
  fresh = {i: C.new_var(j.invars[i].aval) for i in positions}
  b_eqn = C.new_jaxpr_eqn([fresh[i] for i in positions], [j.invars[i] for i in positions],
                          C.optimization_barrier_p, {}, C.no_effects, like.source_info,
                          like.ctx)
  invars = [fresh.get(i, v) for i, v in enumerate(j.invars)]
  body = C.Jaxpr(j.constvars, invars, j.outvars, [b_eqn, *j.eqns], j.effects,
                 j.debug_info)
  return C.ClosedJaxpr(body, closed.consts)


def _with_subplans(eqn, info, rewriter):
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


def _rewrite(plan: Plan, rewriter: Rewriter):
  j = plan.jaxpr
  if not plan.changed:
    return j
  subst: dict[Any, Any] = {}

  def s(a):
    return a if C.is_literal(a) else subst.get(a, a)

  pre = {b.update: b for b in plan.barriers if b.kind == "pre"}
  post = {b.update: b for b in plan.barriers if b.kind == "post"}
  old_read: dict[int, Any] = {}
  out: list[C.JaxprEqn] = []
  # Results of loops and conditionals that a barrier ties are used as they are
  # afterwards: being inputs of the barrier orders them before the update, and XLA
  # cannot move a loop or a conditional into its users as it can a slice (the reason
  # other tied reads are used through the barrier). Through it, a result XLA would
  # learn is constant (a loop of zero trips, a known branch) would be hidden from
  # its simplifier, which under jax.jit folds `-0.0 + 0.0` to -0.0.
  control = {v for e in j.eqns if e.primitive in _CONTROL_FLOW for v in e.outvars}

  for step in plan.order:
    eqn = j.eqns[step.index]
    if step.kind == "pre":
      spec = pre[step.index]
      extra = []
      if step.index in plan.splits:
        g_eqns, old = _rules.split_rmw_read(eqn, s(eqn.invars[0]), s(eqn.invars[1]))
        out.extend(g_eqns)
        extra = [old]
      orig = list(spec.versions) + list(spec.reads)
      b_eqn, b_outs = _barrier_eqn([s(v) for v in orig] + extra, eqn)
      out.append(b_eqn)
      for v, w in zip(orig, b_outs, strict=False):
        if v not in control or v in spec.versions:
          subst[v] = w
      if extra:
        old_read[step.index] = b_outs[-1]
    elif step.kind == "post":
      spec = post[step.index]
      b_eqn, b_outs = _barrier_eqn([s(v) for v in spec.versions], eqn)
      out.append(b_eqn)
      for v, w in zip(spec.versions, b_outs, strict=True):
        subst[v] = w
    else:
      info = plan.infos[step.index]
      invars = [s(v) for v in eqn.invars]
      if step.index in plan.splits:
        out.extend(_rules.split_rmw_write(eqn, invars[0], invars[1], invars[2],
                                          old_read[step.index]))
      elif info.lower_cond:
        params = _with_subplans(eqn, info, rewriter)
        out.extend(_rules.lower_cond(eqn, params["branches"], info.cond_carries,
                                     invars))
      elif info.subplans and info.changed:
        params = _with_subplans(eqn, info, rewriter)
        if info.entry_barrier:
          params["jaxpr"] = _with_entry_barrier(params["jaxpr"], info.entry_barrier, eqn)
        out.append(eqn.replace(invars=invars, params=params))
      elif any(a is not b for a, b in zip(invars, eqn.invars, strict=True)):
        out.append(eqn.replace(invars=invars))
      else:
        out.append(eqn)
  outvars = [s(v) for v in j.outvars]
  return C.Jaxpr(j.constvars, j.invars, outvars, out, j.effects, j.debug_info)
