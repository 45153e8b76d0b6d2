"""Per-primitive knowledge: which operands an equation updates in place, and how.

Each primitive that matters has an *analysis rule* (pure: equation in, `EqnInfo`
out) registered in `analysis_rules`, and, where the rewrite must do more than copy
the equation, a *rewrite rule* in `rewrite_rules`. Built-in registrations are in one
block at the end of this file. Where is scatter-add handled? `_scatter_rule` (what
it updates, whether it can be split) and `split_rmw` (the split itself).

Primitives with no rule: elementwise ones get `_elementwise_rule`; any other
primitive that carries jaxprs in its params gets `_opaque_rule`, which treats it as a
read of every buffer it is given and records a conflict, so nothing is skipped
silently. Everything else is a plain read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from . import _compat as C
from ._plan import (
    Conflict, EqnInfo, InplaceUse, NOT_IN_PLACE_CARRY, OPAQUE_PRIMITIVE, Plan)


@dataclasses.dataclass(frozen=True)
class Context:
  """What a rule may know besides the equation."""
  in_loop: bool
  # constant(var): the value is known at compile time (computed from literals).
  constant: Callable[[Any], bool]
  # producer(var): the equation of this jaxpr that computes var, or None.
  producer: Callable[[Any], Any]
  # Inside a `shard_map` body: types carry manual axes that helper equations traced
  # on their own would lack.
  manual: bool
  # analyze(jaxpr, buffers, in_loop, manual) -> Plan, for sub-jaxprs.
  analyze: Callable[..., Plan]


# Arrays smaller than this are not worth sequencing unless the user donated them:
# copying them costs less than the fusion a barrier prevents (FINDINGS.md measured a
# barrier in a hot loop body at 20x), and the inspector's default threshold matches.
MIN_BUFFER_BYTES = 1024


def is_big(aval) -> bool:
  try:
    return int(aval.size) * aval.dtype.itemsize >= MIN_BUFFER_BYTES
  except (AttributeError, TypeError):
    return False


def normalised_float(aval) -> bool:
  """16-bit floats, which XLA:CPU computes in f32 between converts."""
  return getattr(aval, "dtype", None) in (jax.numpy.bfloat16, jax.numpy.float16)


def is_slicing(eqn) -> bool:
  """Whether XLA's simplifier may rewrite this read of an update's result into a read
  of the update's operand (a slice of a dynamic-update-slice outside the updated
  window; inlined calls can hold such slices)."""
  return (eqn.primitive in _SLICING or C.call_jaxpr_param(eqn) is not None)


# Where a barrier may cut without changing a value. XLA:CPU contracts a multiply
# feeding an add into one fused multiply-add when both sit in one fusion; a barrier
# between them stops the fusion and shifts the last bit (FINDINGS.md: `A - outer(a,
# b)` with a barrier differed by 1e-6). So a barrier may follow only values whose
# last floating-point step is not a multiply: data movement, reductions, add/sub,
# selects and compares, library calls (dot), control flow and updates (their results
# are materialised buffers anyway). Transcendentals end in inlined polynomial
# multiplies, so they are not safe either.
_CUT_SAFE_NAMES = (
    "slice dynamic_slice gather squeeze reshape broadcast_in_dim transpose rev "
    "concatenate pad copy copy_p convert_element_type bitcast_convert_type select_n "
    "reduce_sum reduce_max reduce_min reduce_and reduce_or reduce_xor argmax argmin "
    "add sub neg abs max min clamp eq ne lt le gt ge and or not xor sign floor ceil "
    "round is_finite iota dot_general sort cumsum cummax cummin "
    "dynamic_update_slice scatter scatter-add scatter-sub scatter-mul scatter-min "
    "scatter-max while scan cond optimization_barrier add_any "
    "real imag conj stop_gradient").split()


# Arrays XLA generates inside the fusion that consumes them (a broadcast of zeros
# scattered into, as AD's transposes do): never a buffer of their own, so nothing
# to sequence, and barriers there would only force them into memory.
_GENERATED = frozenset({"broadcast_in_dim", "iota", "full"})


def can_root(eqn) -> bool:
  """Whether an array `eqn` creates can be a buffer worth sequencing."""
  return eqn.primitive.name not in _GENERATED


def cut_safe(eqn, out_index: int) -> bool:
  """Whether a barrier right after output `out_index` of `eqn` changes no value."""
  v = eqn.outvars[out_index]
  try:
    if not jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact):
      return True   # integers and booleans do not round
  except (AttributeError, TypeError):
    return False
  if eqn.primitive.name in _CUT_SAFE_NAMES:
    return True
  key = C.call_jaxpr_param(eqn)
  if key is not None:
    inner = _as_jaxpr(eqn.params[key])
    w = inner.outvars[out_index]
    if C.is_literal(w) or w in inner.invars or w in inner.constvars:
      return True
    for e in reversed(inner.eqns):
      if any(o is w for o in e.outvars):
        return cut_safe(e, [o is w for o in e.outvars].index(True))
    return False
  return False


# Ops whose result can change with the fusion around them: float reductions and
# scans (accumulation order follows the vectorisation), and transcendentals (XLA:CPU
# has scalar and vector implementations that differ in the last bit).
_SENSITIVE_NAMES = frozenset((
    "reduce_sum reduce_prod cumsum cumprod cumlogsumexp exp exp2 expm1 log log1p "
    "sin cos tan tanh logistic pow erf erfc erf_inv lgamma digamma atan2 asin acos "
    "atan sinh cosh asinh acosh atanh cbrt igamma igammac random_gamma_grad "
    "bessel_i0e bessel_i1e polygamma zeta regularized_incomplete_beta").split())
# Ops a fused value passes through unchanged in rounding: data movement and exact
# elementwise arithmetic (IEEE results do not depend on vector width).
_TRANSPARENT_NAMES = frozenset((
    "slice dynamic_slice gather squeeze reshape broadcast_in_dim transpose rev "
    "concatenate pad copy convert_element_type select_n add sub mul div neg abs max "
    "min clamp sign floor ceil round sqrt rsqrt square integer_pow rem "
    "dynamic_update_slice scatter add_any real imag conj").split())
_SENSITIVE_DEPTH = 12
# Reductions end a fusion: their results are materialised.
REDUCTION_NAMES = frozenset(
    "reduce_sum reduce_prod reduce_max reduce_min argmax argmin reduce_and "
    "reduce_or cumsum cumprod cumlogsumexp cummax cummin".split())
# What XLA fuses with a value it reads: data movement, elementwise arithmetic
# (transcendentals included) and the reductions that end such a fusion.
REGION_NAMES = _SENSITIVE_NAMES | _TRANSPARENT_NAMES | REDUCTION_NAMES | frozenset(
    "eq ne lt le gt ge and or not is_finite".split())


def _is_inexact(v) -> bool:
  try:
    return bool(jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact))
  except (AttributeError, TypeError):
    return False


def feeds_sensitive(var, eqns, consumers, memo: dict, depth: int = 0) -> bool:
  """Whether float `var` reaches a fusion-sensitive op through ops XLA would fuse
  with it, here or inside the sub-jaxprs it is passed to (XLA inlines calls and
  hoists loop-invariant and branch code out of loops and conditionals)."""
  if not _is_inexact(var):
    return False
  hit = memo.get(var)
  if hit is not None:
    return hit
  if depth > _SENSITIVE_DEPTH:
    return True     # too deep to tell: assume the worst
  memo[var] = False   # cycles cannot happen in a jaxpr; this only stops repeats
  out = False
  for k, pos in consumers.get(var, ()):
    e = eqns[k]
    name = e.primitive.name
    if name in _SENSITIVE_NAMES or _applies_function(e):
      out = True
    elif name in _TRANSPARENT_NAMES or e.primitive in _SCATTERS:
      out = any(feeds_sensitive(w, eqns, consumers, memo, depth + 1)
                for w in e.outvars if not C.is_drop_var(w))
    elif C.jaxprs_in_params(e.params):
      pairs = _inner_invars(e, pos)
      out = pairs is None or any(_inner_sensitive(j, i) for j, i in pairs)
    if out:
      break
  memo[var] = out
  return out


# The scatter family carries its combiner as a jaxpr, one exact operation (or none);
# it is data movement for this purpose, not a sub-computation.
_SCATTERS = frozenset(C.SCATTER_PRIMITIVES)
# The primitives that write into their operand 0: its next version, in place.
UPDATE_PRIMITIVES = frozenset((C.dynamic_update_slice_p, *C.SCATTER_PRIMITIVES))


def _applies_function(eqn) -> bool:
  """A `scatter` that applies a function to the old values (`.at[].apply`)."""
  return (eqn.primitive is C.scatter_p and eqn.params.get("update_jaxpr") is not None
          and bool(eqn.params["update_jaxpr"].eqns))


_inner_cache: dict = {}


def _inner_sensitive(jaxpr, index: int) -> bool:
  key = (id(jaxpr), index)
  hit = _inner_cache.get(key)
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  consumers: dict = {}
  for k, e in enumerate(jaxpr.eqns):
    for pos, v in enumerate(e.invars):
      if not C.is_literal(v):
        consumers.setdefault(v, []).append((k, pos))
  out = feeds_sensitive(jaxpr.invars[index], jaxpr.eqns, consumers, {}, 1)
  _inner_cache[key] = (jaxpr, out)
  return out


def _inner_invars(eqn, pos: int) -> list[tuple[Any, int]] | None:
  """(sub-jaxpr, invar index) pairs that operand `pos` of `eqn` binds; None for a
  primitive whose jaxprs this module does not know."""
  p = eqn.primitive
  key = C.call_jaxpr_param(eqn)
  if key is not None or (C.shard_map_p is not None and p is C.shard_map_p):
    inner = _as_jaxpr(eqn.params[key or "jaxpr"])
    return [(inner, pos)] if pos < len(inner.invars) else []
  if p is C.cond_p:
    return [(b.jaxpr, pos - 1) for b in eqn.params["branches"]] if pos else []
  if p is C.while_p:
    cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
    if pos < cn:
      return [(cond, pos)]
    if pos < cn + bn:
      return [(body, pos - cn)]
    j = pos - cn - bn
    return [(body, bn + j), (cond, cn + j)]
  if p is C.scan_p:
    return [(eqn.params["jaxpr"].jaxpr, pos)]
  return None


# Ops that move data without arithmetic: a value read through them rounds as its
# source did.
_DATA_MOVEMENT_NAMES = frozenset((
    "broadcast_in_dim reshape squeeze expand_dims transpose rev slice dynamic_slice "
    "gather concatenate pad copy copy_p tile select_n").split())


def additive_source_safe(var, eqns, producer, depth: int = 0) -> bool:
  """Whether the float value `var` comes, through data movement only, from a value
  whose last step is not a multiply (nor a division XLA may turn into one, nor a
  transcendental). Adding such a value in a fusion of its own rounds as adding it
  in the producer's fusion; a multiply could instead be contracted into an FMA on
  one side and not the other (a split `.at[rows].add(mean(x))` differed by 1 ulp)."""
  if C.is_literal(var) or not _is_inexact(var):
    return True
  k = producer.get(var)
  if k is None:
    return True                     # an input: materialised
  if depth > _SENSITIVE_DEPTH:
    return False
  e = eqns[k]
  if e.primitive.name in _DATA_MOVEMENT_NAMES:
    return all(additive_source_safe(x, eqns, producer, depth + 1) for x in e.invars)
  key = C.call_jaxpr_param(e)
  if key is not None:
    inner = _as_jaxpr(e.params[key])
    idx = [o is var for o in e.outvars].index(True)
    inner_producer = {o: i for i, q in enumerate(inner.eqns) for o in q.outvars}
    w = inner.outvars[idx]
    return _inner_source_safe(w, inner, inner_producer, e, eqns, producer, depth)
  return cut_safe(e, [o is var for o in e.outvars].index(True))


def _inner_source_safe(w, inner, inner_producer, call, eqns, producer, depth):
  if C.is_literal(w) or not _is_inexact(w):
    return True
  if w in inner.invars:
    outer = call.invars[list(inner.invars).index(w)]
    return additive_source_safe(outer, eqns, producer, depth + 1)
  k = inner_producer.get(w)
  if k is None:
    return True
  e = inner.eqns[k]
  if e.primitive.name in _DATA_MOVEMENT_NAMES:
    return all(_inner_source_safe(x, inner, inner_producer, call, eqns, producer,
                                  depth + 1) for x in e.invars)
  return additive_source_safe(w, inner.eqns, inner_producer, depth + 1)


AnalysisRule = Callable[[C.JaxprEqn, Sequence[bool], Context], EqnInfo]
analysis_rules: dict[C.Primitive, AnalysisRule] = {}


def eqn_info(eqn: C.JaxprEqn, is_version: Sequence[bool], ctx: Context) -> EqnInfo:
  """The analysis of one equation; `is_version[i]` says invar i is a buffer version."""
  if not any(is_version) and not C.jaxprs_in_params(eqn.params):
    return EqnInfo()
  rule = analysis_rules.get(eqn.primitive)
  if rule is not None:
    return rule(eqn, is_version, ctx)
  if eqn.primitive in C.ELEMENTWISE_PRIMITIVES:
    return _elementwise_rule(eqn, is_version, ctx)
  if C.jaxprs_in_params(eqn.params):
    return _opaque_rule(eqn, is_version, ctx)
  return EqnInfo()


def same_type(a, b) -> bool:
  return (getattr(a, "shape", None) == getattr(b, "shape", None)
          and getattr(a, "dtype", None) == getattr(b, "dtype", None))


# --------------------------------------------------------------------------- updates

_SLICING = frozenset({C.slice_p, C.dynamic_slice_p, C.gather_p})


def _dus_rule(eqn, is_version, ctx):
  del ctx
  if not is_version[0]:
    return EqnInfo()
  return EqnInfo(uses=(InplaceUse(0, 0),), forwards_reads=True)


# Read-modify-write scatters whose combiner is one exact IEEE operation, applied as
# combiner(old, update): splitting them into gather -> combiner -> scatter gives
# bit-identical results. (`.at[].apply` is a `scatter` with an arbitrary update
# jaxpr; it is not split, since a vectorised transcendental need not match XLA's
# scalar one bit for bit.)
_RMW_COMBINERS: dict[C.Primitive, Any] = {
    C.scatter_add_p: lax.add,
    C.scatter_sub_p: lax.sub,
    C.scatter_mul_p: lax.mul,
    C.scatter_min_p: lax.min,
    C.scatter_max_p: lax.max,
}


def _scatter_rule(eqn, is_version, ctx):
  del ctx
  if not is_version[0]:
    return EqnInfo()
  # A scatter-add with indices that may repeat must keep its accumulation, so only
  # unique-index read-modify-writes are split.
  splittable = (eqn.primitive in _RMW_COMBINERS
                and bool(eqn.params.get("unique_indices"))
                and not eqn.params.get("update_consts")
                and _one_window(eqn))
  return EqnInfo(uses=(InplaceUse(0, 0),), forwards_reads=True,
                 splittable=splittable)


def _one_window(eqn) -> bool:
  """Whether the scatter updates one window (per batch element, under vmap).

  That is the case the split is for (`x.at[i].add(v)`, fused, rewrites the whole
  buffer on CPU); gathering several windows, columns say, costs transposes.
  """
  dn = eqn.params["dimension_numbers"]
  shape = eqn.invars[1].aval.shape
  batch = set(dn.scatter_indices_batching_dims)
  n = 1
  for d, size in enumerate(shape[:-1]):   # the last dimension holds the index vector
    if d not in batch:
      n *= size
  return n == 1


def _elementwise_rule(eqn, is_version, ctx):
  del ctx
  out = eqn.outvars[0].aval
  for i, (v, ver) in enumerate(zip(eqn.invars, is_version, strict=True)):
    if ver and same_type(v.aval, out):
      return EqnInfo(uses=(InplaceUse(i, 0, strong=False),))
  return EqnInfo()


def _barrier_rule(eqn, is_version, ctx):
  del ctx
  uses = tuple(InplaceUse(i, i) for i, ver in enumerate(is_version) if ver)
  return EqnInfo(uses=uses)


def _opaque_rule(eqn, is_version, ctx):
  del ctx
  if not any(is_version):
    return EqnInfo()
  return EqnInfo(conflicts=(Conflict(
      OPAQUE_PRIMITIVE,
      f"primitive '{eqn.primitive}' carries jaxprs inplace_jax does not know how to "
      "sequence; it is treated as reading every buffer it is given, and updates "
      "inside it are left as they are",
      update=C.source_summary(eqn)),))


# --------------------------------------------------------------------------- calls


def _as_jaxpr(j) -> Any:
  return j.jaxpr if isinstance(j, C.ClosedJaxpr) else j


def _call_rule(eqn, is_version, ctx):
  key = C.call_jaxpr_param(eqn)
  inner = _as_jaxpr(eqn.params[key])
  if len(inner.invars) != len(eqn.invars):
    return _opaque_rule(eqn, is_version, ctx)
  plan = ctx.analyze(inner, is_version, ctx.in_loop, ctx.manual)
  uses = tuple(InplaceUse(i, o, strong=plan.strong_flows[i])
               for i, o in enumerate(plan.flows) if o is not None and is_version[i])
  return EqnInfo(uses=uses, subplans=(((key, None), plan),), forwards_reads=True)


def _shard_map_rule(eqn, is_version, ctx):
  # The body sees one shard of each buffer; after partitioning XLA inlines it, so
  # it is sequenced like a call body, per device.
  inner = eqn.params["jaxpr"]
  if len(inner.invars) != len(eqn.invars):
    return _opaque_rule(eqn, is_version, ctx)
  plan = ctx.analyze(inner, is_version, ctx.in_loop, True)
  uses = tuple(InplaceUse(i, o, strong=plan.strong_flows[i])
               for i, o in enumerate(plan.flows) if o is not None and is_version[i])
  return EqnInfo(uses=uses, subplans=((("jaxpr", None), plan),), forwards_reads=True)


# --------------------------------------------------------------------------- loops


def _carry_conflicts(eqn, plan, first_carry, n_carry, is_version):
  out = []
  for j in range(n_carry):
    i = first_carry + j
    if is_version[i] and plan.flows[i] != j:
      out.append(Conflict(
          NOT_IN_PLACE_CARRY,
          f"loop carry {j} ({eqn.invars[i].aval.str_short()}) is not updated in "
          "place by the loop body: its last version is not what the body returns "
          "for that carry, so XLA copies it every iteration",
          update=C.source_summary(eqn)))
  return tuple(out)


def _while_rule(eqn, is_version, ctx):
  cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
  # Every sizeable carry is a buffer inside the body, donated or not: the loop owns
  # its carry buffers, and a copy there runs every iteration.
  carry = [c or is_big(v.aval) for c, v in zip(is_version[cn + bn:],
                                                eqn.invars[cn + bn:], strict=True)]
  body = eqn.params["body_jaxpr"].jaxpr
  mask = [False] * bn + carry
  plan = ctx.analyze(body, mask, True, ctx.manual)
  uses = tuple(InplaceUse(cn + bn + j, j) for j in range(len(carry))
               if is_version[cn + bn + j] and plan.flows[bn + j] == j)
  return EqnInfo(uses=uses, subplans=((("body_jaxpr", None), plan),),
                 conflicts=_carry_conflicts(eqn, plan, bn, len(carry), mask))


def _scan_rule(eqn, is_version, ctx):
  nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
  body = eqn.params["jaxpr"].jaxpr
  carry = [c or is_big(v.aval) for c, v in zip(is_version[nc:nc + nk],
                                                eqn.invars[nc:nc + nk], strict=True)]
  mask = [False] * nc + carry + [False] * (len(eqn.invars) - nc - nk)
  # XLA unrolls a loop of one trip into straight-line code.
  in_loop = ctx.in_loop or eqn.params["length"] > 1
  plan = ctx.analyze(body, mask, in_loop, ctx.manual)
  uses = tuple(InplaceUse(nc + j, j) for j in range(nk)
               if is_version[nc + j] and plan.flows[nc + j] == j)
  return EqnInfo(uses=uses, subplans=((("jaxpr", None), plan),),
                 entry_barrier=_unrolled_entry_barrier(eqn, body, plan, nc, nk, mask),
                 conflicts=_carry_conflicts(eqn, plan, nc, nk, mask))




def _unrolled_entry_barrier(eqn, body, plan, nc, nk, mask) -> tuple[int, ...]:
  """Carries of an unrolled scan body to tie at the start of the body.

  With `unroll=k` JAX lays k copies of the body side by side in one XLA loop body,
  so one step's update of a carried buffer meets the next step's reads of it in
  straight-line code, where XLA fuses the update into the reads' fusion and then
  copies the whole buffer to do the update in place (jax.jit too: 2 MB per step
  for f32[2048,256]). A barrier on the carry at the start of each step keeps the
  steps apart. Only carries updated in place by a dynamic-update-slice or scatter,
  as the body's last step, and read in the body besides; not 16-bit floats (XLA
  computes those in f32 across fused steps, so a barrier could round)."""
  unroll = eqn.params.get("unroll", 1)
  length = eqn.params["length"]
  if unroll is False or unroll == 1 or length <= 1:
    return ()
  producer = {v: e for e in body.eqns for v in e.outvars}
  out = []
  for j in range(nk):
    i = nc + j
    invar, outvar = body.invars[i], body.outvars[j]
    last = producer.get(outvar) if not C.is_literal(outvar) else None
    if (mask[i] and plan.flows[i] == j and last is not None
        and last.primitive in UPDATE_PRIMITIVES and not normalised_float(invar.aval)
        and _reads_version_chain(body, invar)):
      out.append(i)
  return tuple(out)


def _reads_version_chain(jaxpr, invar) -> bool:
  """Whether `invar`, or a version an update made of it, is used other than as the
  operand an update writes into."""
  versions = {invar}
  for e in jaxpr.eqns:
    for k, v in enumerate(e.invars):
      if C.is_literal(v) or v not in versions:
        continue
      if e.primitive in UPDATE_PRIMITIVES and k == 0:
        versions.add(e.outvars[0])
      else:
        return True
  return False


# --------------------------------------------------------------------------- cond


def _zero_initialisable(aval) -> bool:
  try:
    return np.dtype(aval.dtype).kind in "biufc" or aval.dtype == jax.numpy.bfloat16
  except TypeError:  # extended dtypes (PRNG keys) have no numpy equivalent
    return False


def outputs_free_of(eqn, operands: Sequence[int]) -> set[int]:
  """Positions of `eqn`'s outputs computed without any of its `operands` (positions
  in `eqn.invars`), by JAX's own dead-code rules (loops to their fixpoint; an
  equation with effects needs every operand)."""
  key = C.call_jaxpr_param(eqn)
  if key is not None and not eqn.effects:
    # Calls: their bodies (custom_jvp/vjp calls have no dead-code rule of their own).
    inner = eqn.params[key]
    inner = inner.jaxpr if isinstance(inner, C.ClosedJaxpr) else inner
    if len(inner.invars) == len(eqn.invars):
      free = set()
      for o in range(len(eqn.outvars)):
        _, used = C.dce_jaxpr(inner, [k == o for k in range(len(eqn.outvars))])
        if not any(used[i] for i in operands):
          free.add(o)
      return free
  targets = {id(eqn.invars[i]) for i in operands if not C.is_literal(eqn.invars[i])}
  ins: list[Any] = []
  for v in eqn.invars:
    if not C.is_literal(v) and all(v is not w for w in ins):
      ins.append(v)
  free = set()
  for o, out in enumerate(eqn.outvars):
    if C.is_drop_var(out):
      continue
    one = C.scratch_jaxpr(ins, [out], [eqn], eqn.effects)
    _, used = C.dce_jaxpr(one, [True])
    if not any(u and id(v) in targets for v, u in zip(ins, used, strict=True)):
      free.add(o)
  return free


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
    if len(targets) == 1 and updated:
      o = targets.pop()
      if o not in taken and ops[i].aval == eqn.outvars[o].aval:
        taken.add(o)
        pairs.append((i, o))
  return pairs


def _cond_rule(eqn, is_version, ctx):
  branches = eqn.params["branches"]
  mask = list(is_version[1:])
  # Branches get no read-modify-write splits (as in loops): a split would force the
  # conditional into loops to stay in place, which costs more than it saves.
  plans = [ctx.analyze(b.jaxpr, mask, True, ctx.manual) for b in branches]
  pairs = cond_carries(eqn, plans)
  subplans = tuple((("branches", k), p) for k, p in enumerate(plans))
  # Measured on CPU: a two-way conditional whose branch 0 (the false branch of
  # `lax.cond`) does not update the buffers in place (returns them untouched, or a
  # fresh value) is already copy-free once reads are tied before it, if its
  # branches need no barriers of their own; lowering it to loops would only cost
  # speed. With the updating branch first, three branches or more, or a branch
  # that reads its buffer after updating it, XLA copies inside the branch.
  keeps_in_place = (len(plans) == 2
                    and not any(plans[0].strong_flows[i] for i, _ in pairs)
                    and not any(p.changed for p in plans))
  # With a constant index XLA keeps only the chosen branch: nothing to lower.
  lower = (bool(pairs) and not keeps_in_place and not ctx.manual
           and not ctx.constant(eqn.invars[0]) and _can_lower_cond(eqn)
           and not _hoistable_sensitive(eqn, pairs, ctx)
           # XLA:CPU's f32 converts around 16-bit float loop carries copy them.
           and not any(normalised_float(eqn.invars[1 + i].aval) for i, _ in pairs)
           # A branch that rewrites a buffer elementwise (no strong update) gains
           # nothing from a loop: XLA keeps the copy and the loop adds its own.
           and not any(_weak_only(p, i, o) for p in plans for i, o in pairs))
  uses = tuple(InplaceUse(1 + i, o) for i, o in pairs)
  return EqnInfo(uses=uses, subplans=subplans, lower_cond=lower,
                 cond_carries=tuple(pairs))


def _weak_only(plan, i: int, o: int) -> bool:
  # ... and reads it elsewhere first (the plan ties reads): XLA cannot rewrite it
  # in place then, loop or not.
  return (plan.flows[i] == o and not plan.strong_flows[i] and plan.changed
          and plan.jaxpr.outvars[o] is not plan.jaxpr.invars[i])


def _hoistable_sensitive(eqn, pairs, ctx) -> bool:
  """Whether a branch reduces (or applies a transcendental to) an operand that is
  computed by a fusible op outside: XLA moves such code out of a conditional and
  fuses it with that op, which it would not do from inside a loop, so lowering
  would change the result's last bit (a gathered sum did, in the fuzzer)."""
  carried = {i for i, _ in pairs}
  for i, v in enumerate(eqn.invars[1:]):
    if i in carried or C.is_literal(v):
      continue
    producer = ctx.producer(v)
    if producer is None or producer.primitive.name not in _TRANSPARENT_NAMES:
      continue
    if any(_inner_sensitive(b.jaxpr, i) for b in eqn.params["branches"]):
      return True
  return False


def _can_lower_cond(eqn) -> bool:
  if any(b.effects for b in eqn.params["branches"]):
    return False  # keep effects where they were; the conditional stays
  return all(_zero_initialisable(v.aval) for v in eqn.outvars)


# --------------------------------------------------------------------------- rewrite
# Builders that turn one equation into several. Each traces a small JAX function
# with `jax.make_jaxpr` and splices its equations in place of the original, giving
# them the original's source information so the HLO still points at the user's line.

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


def split_rmw_read(eqn: C.JaxprEqn, operand, indices
                   ) -> tuple[list[C.JaxprEqn], Any]:
  """The gather that reads what a read-modify-write scatter is about to modify."""
  p = eqn.params
  dn = p["dimension_numbers"]
  updates_aval = eqn.invars[2].aval
  window = [d for d in range(operand.aval.ndim)
            if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
  slice_sizes = [1] * operand.aval.ndim
  for d, u in zip(window, dn.update_window_dims, strict=True):
    slice_sizes[d] = updates_aval.shape[u]
  gdn = lax.GatherDimensionNumbers(
      offset_dims=tuple(dn.update_window_dims),
      collapsed_slice_dims=tuple(dn.inserted_window_dims),
      start_index_map=tuple(dn.scatter_dims_to_operand_dims),
      operand_batching_dims=tuple(dn.operand_batching_dims),
      start_indices_batching_dims=tuple(dn.scatter_indices_batching_dims))

  def read(x, idx):
    return lax.gather(x, idx, gdn, tuple(slice_sizes),
                      indices_are_sorted=p["indices_are_sorted"],
                      unique_indices=p["unique_indices"], mode=p["mode"])

  eqns, (old,) = trace_eqns(read, [operand, indices], eqn)
  if old.aval.shape != updates_aval.shape:
    raise AssertionError("inplace_jax internal error: gather/scatter shapes differ "
                         f"({old.aval.shape} vs {updates_aval.shape}); please report.")
  return eqns, old


def split_rmw_write(eqn: C.JaxprEqn, operand, indices, updates, old
                    ) -> list[C.JaxprEqn]:
  """combiner(old, updates) written back by a plain scatter into `operand`."""
  combine = _RMW_COMBINERS[eqn.primitive]
  eqns, (new,) = trace_eqns(combine, [old, updates], eqn)
  params = dict(eqn.params, update_jaxpr=None, update_consts=())
  write = eqn.replace(primitive=C.scatter_p, invars=[operand, indices, new],
                      params=params)
  return eqns + [write]


def lower_cond(eqn: C.JaxprEqn, branches: Sequence[C.ClosedJaxpr],
               pairs: Sequence[tuple[int, int]], invars: Sequence[Any]
               ) -> list[C.JaxprEqn]:
  """A `cond`/`switch` as a chain of while loops of zero or one trip each.

  XLA cannot order a write inside a conditional's branch against reads outside it,
  so a branch that updates a buffer leaves a full copy on CPU whatever the barriers
  (FINDINGS.md), and which branch sits first decides whether the copy appears at all
  (jax#16661, #39449). A while loop carries its buffers in place. Branch k becomes
  the body of loop k, entered iff the index is k; the buffers in `pairs` are carried
  through the loops and every other output is carried from a zero initial value. The
  branch bodies are used as they are, so the values are exactly the branch's.

  Outputs that no branch computes from a carried buffer or a large operand (flags,
  scalars, small slices) stay in a `cond` of their own, cut down to what they need,
  ahead of the loops: a conditional XLA inlines and simplifies as under `jax.jit`
  when it learns the index, where the loops' trip count stays opaque to it (so
  `-0.0 + v` with `v` a branch's 0.0 is folded, or not, alike on both sides).
  """
  index, ops = invars[0], list(invars[1:])
  carried_in = [i for i, _ in pairs]
  carried_out = [o for _, o in pairs]
  const_ops = [i for i in range(len(ops)) if i not in carried_in]
  side = _side_outputs(branches, carried_out, carried_in, const_ops)
  other_out = [o for o in range(len(eqn.outvars))
               if o not in carried_out and o not in side]
  out_avals = [v.aval for v in eqn.outvars]

  new_eqns: list[C.JaxprEqn] = []
  if side:
    used = [o in side for o in range(len(eqn.outvars))]
    keep = [i not in carried_in for i in range(len(ops))]
    side_branches = []
    for branch in branches:
      j, _ = C.dce_jaxpr(branch.jaxpr, used, instantiate=keep)
      assert len(j.invars) == len(const_ops)
      side_branches.append(C.ClosedJaxpr(j, branch.consts))
    new_eqns.append(C.new_jaxpr_eqn(
        [index] + [ops[i] for i in const_ops], [eqn.outvars[o] for o in side],
        C.cond_p, dict(eqn.params, branches=tuple(side_branches)),
        C.no_effects, eqn.source_info, eqn.ctx))

  def zeros():
    def make():
      return [_zeros(out_avals[o]) for o in other_out]
    eqns, outs = trace_eqns(make, [], eqn)
    new_eqns.extend(eqns)
    return outs

  carry = [ops[i] for i in carried_in] + zeros()
  for k, branch in enumerate(branches):
    if not other_out and all(branch.jaxpr.outvars[o] is branch.jaxpr.invars[i]
                             for i, o in pairs):
      continue  # this branch leaves every carried buffer as it is: nothing to run
    flag_eqns, (flag,) = trace_eqns(
        lambda i, k=k: (i == k).astype(np.int32), [index], eqn)
    new_eqns.extend(flag_eqns)
    body = _branch_as_body(branch, const_ops, carried_in, carried_out, other_out)
    cond = _flag_cond(len(carry), [a.aval for a in carry])
    outvars = [C.new_var(flag.aval)] + [C.new_var(a.aval) for a in carry]
    new_eqns.append(C.new_jaxpr_eqn(
        [ops[i] for i in const_ops] + [flag] + carry, outvars, C.while_p,
        dict(cond_jaxpr=cond, body_jaxpr=body, cond_nconsts=0,
             body_nconsts=len(const_ops)),
        C.no_effects, eqn.source_info, eqn.ctx))
    carry = outvars[1:]
  # Bind the conditional's own output variables, so later equations need no renaming.
  last = new_eqns[-1]
  new_eqns[-1] = last.replace(outvars=[last.outvars[0]] + [
      eqn.outvars[o] for o in carried_out + other_out])
  return new_eqns


def scan_with_carried_xs(eqn: C.JaxprEqn, pairs: Sequence[tuple[int, int]]
                         ) -> C.JaxprEqn:
  """The `scan` with its scanned-over operands `xs[k]` turned into carried buffers
  whose row t the body reads and then writes back as `ys[j]`, for each `(k, j)`.

  JAX's `scan` reads `xs` row by row and builds each `ys` as a new stacked array;
  when `ys[j]` is the updated `xs[k]` (a KV cache stacked over layers, scanned over
  the layers), XLA cannot reuse `xs[k]`'s buffer for `ys[j]` and copies the whole
  stack on entry, and each row per step. Carried, the stack is updated in place:
  row t is read with `dynamic_slice` and written back with `dynamic_update_slice`
  (rows counted down for `reverse`), the body's own equations unchanged: the
  values are the same, moved rather than computed.
  """
  p = eqn.params
  nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
  closed = p["jaxpr"]
  body = closed.jaxpr
  n_xs = len(eqn.invars) - nc - nk
  n_ys = len(eqn.outvars) - nk
  moved_k = [k for k, _ in pairs]
  moved_j = [j for _, j in pairs]
  rest_k = [k for k in range(n_xs) if k not in moved_k]
  rest_j = [j for j in range(n_ys) if j not in moved_j]
  int32 = C.ShapedArray((), np.dtype(np.int32))
  count = C.new_var(int32)
  bufs = [C.new_var(eqn.invars[nc + nk + k].aval) for k in moved_k]

  eqns: list[C.JaxprEqn] = []
  if p["reverse"]:
    idx_eqns, (row,) = trace_eqns(lambda c: np.int32(length - 1) - c, [count], eqn)
    eqns += idx_eqns
  else:
    row = count
  for k, buf in zip(moved_k, bufs, strict=True):
    read, (got,) = trace_eqns(
        lambda b, i: lax.squeeze(lax.dynamic_slice_in_dim(b, i, 1, 0), (0,)),
        [buf, row], eqn)
    # Bind the body's own input variable, so its equations need no renaming.
    target = body.invars[nc + nk + k]
    read[-1] = read[-1].replace(outvars=[target if v is got else v
                                         for v in read[-1].outvars])
    eqns += read
  eqns += body.eqns
  new_bufs = []
  for j, buf in zip(moved_j, bufs, strict=True):
    write, (new,) = trace_eqns(
        lambda b, y, i: lax.dynamic_update_slice_in_dim(b, y[None], i, 0),
        [buf, body.outvars[nk + j], row], eqn)
    eqns += write
    new_bufs.append(new)
  step, (count_next,) = trace_eqns(lambda c: c + np.int32(1), [count], eqn)
  eqns += step

  invars = (list(body.invars[:nc + nk]) + bufs + [count]
            + [body.invars[nc + nk + k] for k in rest_k])
  outvars = (list(body.outvars[:nk]) + new_bufs + [count_next]
             + [body.outvars[nk + j] for j in rest_j])
  new_body = C.Jaxpr(body.constvars, invars, outvars, eqns, body.effects,
                     C.loose_debug_info(body.debug_info))
  params = dict(p, num_carry=nk + len(pairs) + 1,
                jaxpr=C.ClosedJaxpr(new_body, closed.consts))
  if "linear" in p:
    lin = tuple(p["linear"])
    params["linear"] = (lin[:nc + nk] + (False,) * (len(pairs) + 1)
                        + tuple(lin[nc + nk + k] for k in rest_k))
  zero = C.Literal(np.int32(0), int32)
  new_invars = (list(eqn.invars[:nc + nk])
                + [eqn.invars[nc + nk + k] for k in moved_k] + [zero]
                + [eqn.invars[nc + nk + k] for k in rest_k])
  new_outvars = (list(eqn.outvars[:nk]) + [eqn.outvars[nk + j] for j in moved_j]
                 + [C.new_var(int32)] + [eqn.outvars[nk + j] for j in rest_j])
  return eqn.replace(invars=new_invars, outvars=new_outvars, params=params)


def _zeros(aval):
  z = lax.full(aval.shape, 0, aval.dtype)
  if getattr(aval, "weak_type", False):
    z = C.as_weak_type(z)
  return z


def _flag_cond(n_carry: int, carry_avals) -> C.ClosedJaxpr:
  def cond(flag, *carry):
    del carry
    return flag > 0
  shapes = [jax.ShapeDtypeStruct((), np.int32)] + [
      jax.ShapeDtypeStruct(a.shape, a.dtype) for a in carry_avals]
  closed = jax.make_jaxpr(cond)(*shapes)
  assert len(closed.jaxpr.invars) == n_carry + 1
  return closed


def _side_outputs(branches: Sequence[C.ClosedJaxpr], carried_out, carried_in,
                  const_ops) -> list[int]:
  """`lower_cond`'s outputs that can stay in a conditional: in every branch computed
  from small non-carried operands only, by equations no carried output needs."""
  n_out = len(branches[0].jaxpr.outvars)
  side = []
  for o in range(n_out):
    if o in carried_out:
      continue
    mask = [k == o for k in range(n_out)]
    for branch in branches:
      _, used = C.dce_jaxpr(branch.jaxpr, mask)
      invars = branch.jaxpr.invars
      if any(used[i] for i in carried_in) or any(
          used[i] and is_big(invars[i].aval) for i in const_ops):
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
  outvars = [zero] + [j.outvars[o] for o in carried_out] + [
      j.outvars[o] for o in other_out]
  body = C.Jaxpr(j.constvars, invars, outvars, eqns, j.effects,
                 C.loose_debug_info(j.debug_info))
  return C.ClosedJaxpr(body, branch.consts)


# --------------------------------------------------------------------------- registry

for _p in (C.dynamic_update_slice_p,):
  analysis_rules[_p] = _dus_rule
for _p in C.SCATTER_PRIMITIVES:
  analysis_rules[_p] = _scatter_rule
analysis_rules[C.optimization_barrier_p] = _barrier_rule
for _p in (C.jit_p, C.remat_p, C.custom_jvp_call_p, C.custom_vjp_call_p,
           C.closed_call_p, C.core_call_p):
  analysis_rules[_p] = _call_rule
if C.shard_map_p is not None:
  analysis_rules[C.shard_map_p] = _shard_map_rule
analysis_rules[C.while_p] = _while_rule
analysis_rules[C.scan_p] = _scan_rule
analysis_rules[C.cond_p] = _cond_rule
