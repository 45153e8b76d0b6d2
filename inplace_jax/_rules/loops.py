"""Loops: `while` (and `fori_loop` with dynamic bounds) and `scan` (and static
`fori_loop`).

A loop owns its carry buffers: every sizeable carry is a buffer inside the body,
donated or not, and a copy there runs every iteration. The body is analysed as in a
loop (no read-modify-write splits); a carry is updated in place when the body's last
version of it is what the body returns for that carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .. import _compat as C
from .. import _traits
from .._plan import Conflict, EqnInfo, FindingKind, InplaceUse
from . import _build
from ._registry import is_big, normalised_float, register, type_str


def _carry_conflicts(eqn, plan, first_carry, n_carry, is_version):
  out = []
  for j in range(n_carry):
    i = first_carry + j
    if is_version[i] and plan.flows[i] != j:
      out.append(Conflict(
          FindingKind.NOT_IN_PLACE_CARRY,
          f"loop carry {j} ({eqn.invars[i].aval.str_short()}) is not updated in "
          "place by the loop body: its last version is not what the body returns "
          "for that carry, so XLA copies it every iteration",
          update=C.source_summary(eqn), buffer_type=type_str(eqn.invars[i].aval)))
  return tuple(out)


def _owned(v, ctx) -> bool:
  """Whether a carry is a buffer in the body though no version of one: sizeable,
  and not a version of a donated buffer left exactly as it is (`Context.left`).
  jax.jit updates such a buffer in place, in the loop too: a barrier the body
  placed on it anyway made XLA copy it twice (fuzz seed 7400 #294)."""
  return is_big(v.aval) and not ctx.left(v)


def _left(v, ctx) -> bool:
  return not C.is_literal(v) and ctx.left(v)


def _while_rule(eqn, is_version, ctx):
  cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
  carry = [c or _owned(v, ctx) for c, v in zip(is_version[cn + bn:],
                                                eqn.invars[cn + bn:], strict=True)]
  body = eqn.params["body_jaxpr"].jaxpr
  mask = [False] * bn + carry
  # Each carry's buffer is the body's output for that carry.
  plan = ctx.analyze(body, mask, True, ctx.manual,
                     targets=[None] * bn + list(range(len(carry))),
                     left=[_left(v, ctx) for v in eqn.invars[cn:]])
  uses = tuple(InplaceUse(cn + bn + j, j) for j in range(len(carry))
               if is_version[cn + bn + j] and plan.flows[bn + j] == j)
  # XLA inlines a loop whose bounds give one trip: its results are then the
  # body's last operations, as a call's are, and a read of one can be recomputed
  # from the buffer before it (fuzz seed 3400 #39). The trip count is XLA's to
  # find, so only a refinement round (copies remained) assumes it; a barrier after
  # a loop XLA keeps is after results already in memory.
  return EqnInfo(uses=uses, subplans=((("body_jaxpr", None), plan),),
                 forwards_reads=ctx.refining,
                 conflicts=_carry_conflicts(eqn, plan, bn, len(carry), mask))


@dataclasses.dataclass(frozen=True)
class EntryBarrier:
  """Rewrite action: pass these invars of an unrolled scan's body through one
  barrier at the start of the body (see `_unrolled_entry_barrier`)."""
  positions: tuple[int, ...]
  stat = "barriers"


def _scan_rule(eqn, is_version, ctx):
  nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
  body = eqn.params["jaxpr"].jaxpr
  carry = [c or _owned(v, ctx) for c, v in zip(is_version[nc:nc + nk],
                                                eqn.invars[nc:nc + nk], strict=True)]
  mask = [False] * nc + carry + [False] * (len(eqn.invars) - nc - nk)
  # XLA unrolls a loop of one trip into straight-line code.
  in_loop = ctx.in_loop or eqn.params["length"] > 1
  plan = ctx.analyze(body, mask, in_loop, ctx.manual,
                     targets=[None] * nc + list(range(nk)),
                     left=[_left(v, ctx) for v in eqn.invars])
  uses = tuple(InplaceUse(nc + j, j) for j in range(nk)
               if is_version[nc + j] and plan.flows[nc + j] == j)
  entry = _unrolled_entry_barrier(eqn, body, plan, nc, nk, mask)
  # Unrolled, its results are the body's last operations, as a call's are: a read
  # of one can be forwarded to, or recomputed from, the buffer before it.
  return EqnInfo(uses=uses, subplans=((("jaxpr", None), plan),),
                 forwards_reads=eqn.params["length"] == 1,
                 action=EntryBarrier(entry) if entry else None,
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
        and last.primitive in _traits.UPDATE_PRIMITIVES
        and not normalised_float(invar.aval) and _reads_version_chain(body, invar)):
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
      if e.primitive in _traits.UPDATE_PRIMITIVES and k == 0:
        versions.add(e.outvars[0])
      else:
        return True
  return False


def _scan_rewrite(eqn, info, invars, params):
  if isinstance(info.action, EntryBarrier):
    params = dict(params, jaxpr=_with_entry_barrier(params["jaxpr"],
                                                    info.action.positions, eqn))
  return [eqn.replace(invars=invars, params=params)]


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


# --------------------------------------------------------------------------- bindings


def _while_bindings(eqn, pos):
  cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
  cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
  if pos < cn:
    return [(cond, pos)]
  if pos < cn + bn:
    return [(body, pos - cn)]
  j = pos - cn - bn
  return [(body, bn + j), (cond, cn + j)]


def _scan_bindings(eqn, pos):
  return [(eqn.params["jaxpr"].jaxpr, pos)]


def _while_carries(eqn):
  n = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
  return [(n + j, j) for j in range(len(eqn.outvars))]


def _scan_carries(eqn):
  nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
  return [(nc + j, j) for j in range(nk)]


# --------------------------------------------------------------------------- scanned buffers


def scan_with_carried_xs(eqn: C.JaxprEqn, pairs: Sequence[tuple[int, int]],
                         fresh: Sequence[tuple[object, int]] = ()) -> C.JaxprEqn:
  """The `scan` with its scanned-over operands `xs[k]` turned into carried buffers
  whose row t the body reads and then writes back as `ys[j]`, for each `(k, j)`;
  and, for each `(init, j)` of `fresh`, `ys[j]` built in a carried buffer that
  starts as `init` (a buffer of its type that no row is read from).

  JAX's `scan` reads `xs` row by row and builds each `ys` as a new stacked array;
  when `ys[j]` is the updated `xs[k]` (a KV cache stacked over layers, scanned over
  the layers), XLA cannot reuse `xs[k]`'s buffer for `ys[j]` and copies the whole
  stack on entry, and each row per step. Carried, the stack is updated in place:
  row t is read with `dynamic_slice` and written back with `dynamic_update_slice`
  (rows counted down for `reverse`), the body's own equations unchanged: the
  values are the same, moved rather than computed.
  """
  p = eqn.params
  nc, nk = p["num_consts"], p["num_carry"]
  body = p["jaxpr"].jaxpr
  n_xs, n_ys = len(eqn.invars) - nc - nk, len(eqn.outvars) - nk
  moved_k = [k for k, _ in pairs]
  moved_j = [j for _, j in pairs] + [j for _, j in fresh]
  rest_k = [k for k in range(n_xs) if k not in moved_k]
  rest_j = [j for j in range(n_ys) if j not in moved_j]
  int32 = C.ShapedArray((), np.dtype(np.int32))
  count = C.new_var(int32)
  inits = [eqn.invars[nc + nk + k] for k in moved_k] + [a for a, _ in fresh]
  bufs = [C.new_var(a.aval) for a in inits]
  eqns, new_bufs, count_next = _carried_xs_body(eqn, body, moved_k, moved_j, bufs,
                                                count)
  invars = (list(body.invars[:nc + nk]) + bufs + [count]
            + [body.invars[nc + nk + k] for k in rest_k])
  outvars = (list(body.outvars[:nk]) + new_bufs + [count_next]
             + [body.outvars[nk + j] for j in rest_j])
  new_body = C.Jaxpr(body.constvars, invars, outvars, eqns, body.effects,
                     C.loose_debug_info(body.debug_info))
  params = dict(p, num_carry=nk + len(bufs) + 1,
                jaxpr=C.ClosedJaxpr(new_body, p["jaxpr"].consts))
  if "linear" in p:
    lin = tuple(p["linear"])
    params["linear"] = (lin[:nc + nk] + (False,) * (len(bufs) + 1)
                        + tuple(lin[nc + nk + k] for k in rest_k))
  zero = C.Literal(np.int32(0), int32)
  new_invars = (list(eqn.invars[:nc + nk]) + inits + [zero]
                + [eqn.invars[nc + nk + k] for k in rest_k])
  new_outvars = (list(eqn.outvars[:nk]) + [eqn.outvars[nk + j] for j in moved_j]
                 + [C.new_var(int32)] + [eqn.outvars[nk + j] for j in rest_j])
  return eqn.replace(invars=new_invars, outvars=new_outvars, params=params)


def _carried_xs_body(eqn, body, moved_k, moved_j, bufs, count):
  """The body's equations with row reads of the carried stacks before them and row
  writes after them, and the step counter advanced. `bufs` holds the stacks of
  `moved_k` first (read and written), then those only written."""
  from jax import lax
  nc, nk, length = eqn.params["num_consts"], eqn.params["num_carry"], eqn.params["length"]
  eqns: list[C.JaxprEqn] = []
  if eqn.params["reverse"]:
    idx_eqns, (row,) = _build.trace_eqns(lambda c: np.int32(length - 1) - c, [count],
                                         eqn)
    eqns += idx_eqns
  else:
    row = count
  for k, buf in zip(moved_k, bufs, strict=False):
    read, (got,) = _build.trace_eqns(
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
    write, (new,) = _build.trace_eqns(
        lambda b, y, i: lax.dynamic_update_slice_in_dim(b, y[None], i, 0),
        [buf, body.outvars[nk + j], row], eqn)
    eqns += write
    new_bufs.append(new)
  step, (count_next,) = _build.trace_eqns(lambda c: c + np.int32(1), [count], eqn)
  return eqns + step, new_bufs, count_next


# --------------------------------------------------------------------------- batched predicates


def scalar_predicate_while(eqn) -> C.JaxprEqn | None:
  """A `while` whose predicate is batched (`jax.vmap` of a loop whose trip count
  differs between batch elements) as a loop on "any element still active", or None.

  JAX lowers such a loop to run while any element is active and to select, after
  each step, the new value of every carry where its element is active and the old
  one elsewhere: a whole-buffer select per step, whose old operand XLA must keep
  aside from the in-place update (a copy of the buffer each step; jax#13522). Here
  the same loop is written out in the jaxpr, except that a big carry the body
  changes only by `dynamic_update_slice`s and `scatter`s is predicated at the size
  of each write: the written window keeps its old value where its element is done.
  The values are those of JAX's lowering: each element's carries change only while
  it is active, and batch elements do not interact (a body that names a vmap axis
  is left alone).
  """
  p = eqn.params
  cond, body = p["cond_jaxpr"], p["body_jaxpr"]
  pred = cond.out_avals[0]
  cn, bn = p["cond_nconsts"], p["body_nconsts"]
  carries = eqn.invars[cn + bn:]
  if not pred.shape or not any(is_big(v.aval) for v in carries):
    return None
  if any(tuple(v.aval.shape[:pred.ndim]) != tuple(pred.shape) for v in carries):
    return None
  if _names_an_axis(body.jaxpr) or _names_an_axis(cond.jaxpr):
    return None
  chains = [_set_chain(body.jaxpr, bn + i, i) if is_big(v.aval) else None
            for i, v in enumerate(carries)]
  avals = [v.aval for v in eqn.invars]
  cond_avals = avals[:cn] + avals[cn + bn:]
  with C.eqn_context(eqn):
    new_cond = _make_closed(lambda *a: _any_active(cond, a), cond_avals)
    new_body = _make_closed(
        lambda *a: _predicated_step(cond, body, cn, bn, chains, a), avals)
  params = dict(p, cond_jaxpr=new_cond, body_jaxpr=new_body, body_nconsts=cn + bn)
  invars = list(eqn.invars[:cn]) + list(eqn.invars[:cn + bn]) + list(carries)
  return eqn.replace(invars=invars, params=params)


def _names_an_axis(jaxpr) -> bool:
  """Whether `jaxpr` holds a collective over a named axis (batch elements would
  interact)."""
  for e in jaxpr.eqns:
    axes = e.params.get("axes")
    if "axis_name" in e.params or (isinstance(axes, (tuple, list)) and any(
        isinstance(a, str) for a in axes)):
      return True
    if any(_names_an_axis(j) for j in C.sub_jaxprs(e.params)):
      return True
  return False


def _set_chain(body, invar: int, out: int) -> tuple[int, ...] | None:
  """The equations (in order) of a chain of `dynamic_update_slice`s and `scatter`s
  that turns body input `invar` into body output `out`, or None if the output is
  computed otherwise (it is then selected whole)."""
  producer = {o: k for k, e in enumerate(body.eqns) for o in e.outvars}
  v, chain = body.outvars[out], []
  while v is not body.invars[invar]:
    k = producer.get(v)
    if C.is_literal(v) or k is None:
      return None
    e = body.eqns[k]
    if e.primitive not in (C.dynamic_update_slice_p, C.scatter_p) or \
        e.params.get("update_jaxpr") is not None:
      return None
    chain.append(k)
    v = e.invars[0]
  return tuple(reversed(chain))


def _make_closed(fn, avals) -> C.ClosedJaxpr:
  import jax
  return jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals])


def _any_active(cond, args):
  import jax.numpy as jnp
  (active,) = C.eval_jaxpr(cond.jaxpr, cond.consts, *args)
  return jnp.any(active)


def _predicated_step(cond, body, cn: int, bn: int, chains, args):
  """One step of the loop: the predicate, the body with the chained writes of big
  carries predicated, and the other carries selected."""
  from jax import lax
  cconsts, bconsts, carries = args[:cn], args[cn:cn + bn], args[cn + bn:]
  (active,) = C.eval_jaxpr(cond.jaxpr, cond.consts, *cconsts, *carries)
  chained = {k: i for i, ks in enumerate(chains) if ks for k in ks}
  outs = _run_body(body, list(bconsts) + list(carries), chained, active)
  new = []
  for i, (old, out) in enumerate(zip(carries, outs, strict=True)):
    if chains[i] is not None:
      new.append(out)       # written in place, window by window
    else:
      mask = lax.broadcast_in_dim(active, old.shape, tuple(range(active.ndim)))
      new.append(lax.select(mask, out, old))
  return new


def _run_body(body, args, chained: dict[int, int], active):
  """`body` evaluated on `args`, each equation in `chained` (a write of a big
  carry's chain) predicated on `active`."""
  env: dict = {}
  for v, x in zip(body.jaxpr.constvars, body.consts, strict=True):
    env[v] = x
  for v, x in zip(body.jaxpr.invars, args, strict=True):
    env[v] = x
  read = lambda v: v.val if C.is_literal(v) else env[v]   # noqa: E731
  for k, e in enumerate(body.jaxpr.eqns):
    vals = [read(v) for v in e.invars]
    if k in chained:
      with C.eqn_context(e):
        outs = [_predicated_write(e, vals, active)]
    else:
      outs = C.bind_eqn(e, vals)
    for v, x in zip(e.outvars, outs, strict=True):
      if not C.is_drop_var(v):
        env[v] = x
  return [read(v) for v in body.jaxpr.outvars]


def _predicated_write(e, vals, active):
  """Write `e` (a dynamic-update-slice or a scatter) with its update replaced, where
  its batch element is done, by the values it would overwrite."""
  from jax import lax
  x = vals[0]
  mask = lax.broadcast_in_dim(active, x.shape, tuple(range(active.ndim)))
  if e.primitive is C.dynamic_update_slice_p:
    update, index = vals[1], vals[2:]
    old = lax.dynamic_slice(x, index, update.shape)
    keep = lax.dynamic_slice(mask, index, update.shape)
  else:
    indices, update = vals[1], vals[2]
    old, keep = (_gathered(e, a, indices, update.shape) for a in (x, mask))
  new_update = lax.select(keep, update, old)
  return C.bind_eqn(e, [x, *([new_update] + vals[2:] if e.primitive is
                              C.dynamic_update_slice_p else [vals[1], new_update])])[0]


def _gathered(e, operand, indices, update_shape):
  """What scatter `e` would overwrite in `operand`: the gather its windows read."""
  from jax import lax
  dn = e.params["dimension_numbers"]
  batching = tuple(getattr(dn, "operand_batching_dims", ()))
  sizes, pos = [], 0
  for d in range(operand.ndim):
    if d in dn.inserted_window_dims or d in batching:
      sizes.append(1)
    else:
      sizes.append(update_shape[dn.update_window_dims[pos]])
      pos += 1
  gdn = lax.GatherDimensionNumbers(
      offset_dims=tuple(dn.update_window_dims),
      collapsed_slice_dims=tuple(dn.inserted_window_dims),
      start_index_map=tuple(dn.scatter_dims_to_operand_dims),
      operand_batching_dims=batching,
      start_indices_batching_dims=tuple(getattr(dn, "scatter_indices_batching_dims",
                                                ())))
  return lax.gather(operand, indices, gdn, tuple(sizes), mode=e.params["mode"],
                    indices_are_sorted=e.params.get("indices_are_sorted", False),
                    unique_indices=e.params.get("unique_indices", False),
                    fill_value=None)


# --------------------------------------------------------------------------- registry

register(C.while_p, analyze=_while_rule, bindings=_while_bindings,
         carries=_while_carries)
register(C.scan_p, analyze=_scan_rule, rewrite=_scan_rewrite, bindings=_scan_bindings,
         carries=_scan_carries)
