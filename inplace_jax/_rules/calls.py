"""Calls: nested `jit`, `checkpoint` (remat), `custom_jvp`/`custom_vjp` calls,
`closed_call`, `shard_map` bodies, and the user's own `optimization_barrier`.

A call's body is analysed as a jaxpr of its own whose buffers are the operands that
are buffer versions outside; the body's in-place flows become the call's in-place
uses. Bodies are rebuilt, never inlined: inlining would drop custom derivative rules
and remat policies.
"""

from __future__ import annotations

from .. import _compat as C
from .._plan import EqnInfo, InplaceUse
from ._registry import as_jaxpr, opaque_info, register


def _uses(plan, is_version) -> tuple[InplaceUse, ...]:
  return tuple(InplaceUse(i, o, strong=plan.strong_flows[i])
               for i, o in enumerate(plan.flows) if o is not None and is_version[i])


def _call_rule_for(key: str):
  def rule(eqn, is_version, ctx):
    inner = as_jaxpr(eqn.params[key])
    if len(inner.invars) != len(eqn.invars):
      return opaque_info(eqn, is_version)
    plan = ctx.analyze(inner, is_version, ctx.in_loop, ctx.manual)
    return EqnInfo(uses=_uses(plan, is_version), subplans=(((key, None), plan),),
                   forwards_reads=True)
  return rule


def _shard_map_rule(eqn, is_version, ctx):
  # The body sees one shard of each buffer; after partitioning XLA inlines it, so
  # it is sequenced like a call body, per device.
  inner = eqn.params["jaxpr"]
  if len(inner.invars) != len(eqn.invars):
    return opaque_info(eqn, is_version)
  plan = ctx.analyze(inner, is_version, ctx.in_loop, True)
  return EqnInfo(uses=_uses(plan, is_version), subplans=((("jaxpr", None), plan),),
                 forwards_reads=True)


def _one_to_one(key: str):
  def bindings(eqn, pos):
    inner = as_jaxpr(eqn.params[key])
    return [(inner, pos)] if pos < len(inner.invars) else []
  return bindings


def _barrier_rule(eqn, is_version, ctx):
  # The user's own barrier passes each buffer through, in place.
  del ctx
  return EqnInfo(uses=tuple(InplaceUse(i, i) for i, ver in enumerate(is_version)
                            if ver))


# --------------------------------------------------------------------------- registry

for _p, _key in ((C.jit_p, "jaxpr"), (C.remat_p, "jaxpr"),
                 (C.custom_jvp_call_p, "call_jaxpr"), (C.custom_vjp_call_p, "call_jaxpr"),
                 (C.closed_call_p, "call_jaxpr"), (C.core_call_p, "call_jaxpr")):
  register(_p, analyze=_call_rule_for(_key), bindings=_one_to_one(_key),
           call_param=_key)
register(C.shard_map_p, analyze=_shard_map_rule, bindings=_one_to_one("jaxpr"))
register(C.optimization_barrier_p, analyze=_barrier_rule)
