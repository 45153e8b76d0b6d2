"""Building equations for the rewrite.

Rules that turn one equation into several trace a small JAX function with
`jax.make_jaxpr` and splice its equations in place of the original, giving them the
original's source information so the compiled HLO still points at the user's line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from .. import _compat as C


def trace_eqns(fn, in_atoms: Sequence[Any], like: C.JaxprEqn
               ) -> tuple[list[C.JaxprEqn], list[Any]]:
  """Equations computing `fn(*in_atoms)`, and the atoms holding its outputs."""
  avals = [a.aval for a in in_atoms]
  closed = jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(a.shape, a.dtype)
                                for a in avals])
  jaxpr = closed.jaxpr
  if closed.consts:
    raise AssertionError("inplace_jax internal error: a spliced helper closed over "
                         "constants; please report this with the function you used.")
  subst = dict(zip(jaxpr.invars, in_atoms, strict=True))
  eqns = []
  for e in jaxpr.eqns:
    invars = [subst.get(v, v) if not C.is_literal(v) else v for v in e.invars]
    # JAX caches traces, so the same helper traced twice returns the same Var
    # objects: give every result a fresh variable, or two equations would bind one.
    outvars = []
    for v in e.outvars:
      w = C.new_var(v.aval)
      subst[v] = w
      outvars.append(w)
    eqns.append(e.replace(invars=invars, outvars=outvars,
                          source_info=like.source_info, ctx=like.ctx))
  outs = [subst.get(v, v) if not C.is_literal(v) else v for v in jaxpr.outvars]
  return eqns, outs


def barrier_eqn(operands, like) -> tuple[C.JaxprEqn, list[Any]]:
  """An `optimization_barrier` over `operands`, with fresh output variables."""
  outs = [C.new_var(a.aval) for a in operands]
  eqn = C.new_jaxpr_eqn(list(operands), outs, C.optimization_barrier_p, {},
                        C.no_effects, like.source_info, like.ctx)
  return eqn, outs


def zeros(aval):
  """Zeros of `aval`'s type (weak type kept, or loop carries stop matching)."""
  z = lax.full(aval.shape, 0, aval.dtype)
  if getattr(aval, "weak_type", False):
    z = C.as_weak_type(z)
  return z


def distinct_fill(value, aval, serial: int, like) -> tuple[list[C.JaxprEqn], Any]:
  """Equations filling a buffer of `aval`'s type with `value`, and its atom: a
  broadcast of the value picked by `serial` behind a barrier, so no compiler merges
  it with another fill of the same value (a merged fill that two loops update in
  place is copied on entry to all but one). XLA drops a barrier's unused outputs,
  hence the pick: the serial is used, and never equal to anything but itself."""
  v = np.asarray(value, aval.dtype)
  other = np.logical_not(v) if v.dtype == np.bool_ else np.asarray(
      1 if v == 0 else 0, aval.dtype)
  def fill():
    k = lax.optimization_barrier(np.int32(serial))
    x = lax.broadcast(lax.select(k == np.int32(serial), v, other), tuple(aval.shape))
    return C.as_weak_type(x) if getattr(aval, "weak_type", False) else x
  eqns, (out,) = trace_eqns(fill, [], like)
  return eqns, out
