"""The transform's entry points: jaxpr -> jaxpr and function -> function.

`sequence_jaxpr` is for library authors who hold a jaxpr; `sequence` wraps a
function so that, wherever it is traced (inside the user's own `jax.jit`, under
`jax.vmap` or `jax.grad`), its reads of buffers are sequenced before their updates.
`inplace_jax.jit` (in `_jit.py`) builds on `sequence` and also compiles with the
options XLA needs and verifies the result.

.. warning:: On CPU, XLA erases optimization barriers before copy insertion unless
   the compile options from `inplace_jax.compiler_options()` are used; `sequence`
   inside a plain `jax.jit` then changes no value but may not remove copies.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _compat as C
from ._analysis import Analyzer
from ._plan import NOT_ALIASED, Conflict, Plan
from ._rewrite import Rewriter
from ._rules import UPDATE_PRIMITIVES, is_big, same_type, scan_with_carried_xs


def sequence_jaxpr(closed_jaxpr, donated: Sequence[bool] | None = None, *,
                   in_loop: bool = False, boundary: bool = True,
                   erase_remat_barriers: bool = False):
  """Sequences reads of donated buffers before their updates.

  Args:
    closed_jaxpr: a `jax.core.ClosedJaxpr` (as from `jax.make_jaxpr`) or open jaxpr.
    donated: one bool per invar: which inputs are buffers to update in place.
      Default: all of them.
    in_loop: analyse as the body of a loop (no read-modify-write splits).
    boundary: the jaxpr is a whole compiled function and `donated` its donated
      arguments, as for `jax.jit`: a donated buffer is updated in place only if
      its last version is the output JAX aliases it to (a donated argument whose
      buffer no output reuses is read-only to XLA, so sequencing it only costs).
    erase_remat_barriers: lower `jax.checkpoint` without its CSE-preventing
      barriers. `inplace_jax.jit` sets it on CPU, where plain `jax.jit` erases
      every barrier before fusion anyway: the options that keep inplace_jax's
      barriers alive would otherwise keep those too, and compile a program that
      fuses (and copies) differently from `jax.jit`'s.

  Returns:
    `(new_closed_jaxpr, plan)`. The new jaxpr computes exactly the same values; the
    plan says what was done and which copies no ordering can remove
    (`plan.all_conflicts()`).

  Examples:
    >>> import jax, inplace_jax
    >>> def f(x):
    ...   y = x[0, 0]
    ...   return x.at[0, 0].add(1.0), y
    >>> cj = jax.make_jaxpr(f)(jax.numpy.zeros((64, 64)))
    >>> new, plan = inplace_jax.sequence_jaxpr(cj, donated=[True])
    >>> print(plan.stats()["barriers"])
    1
  """
  if isinstance(closed_jaxpr, C.ClosedJaxpr):
    jaxpr, consts = closed_jaxpr.jaxpr, closed_jaxpr.consts
  else:
    jaxpr, consts = closed_jaxpr, []
  if donated is None:
    donated = [True] * len(jaxpr.invars)
  donated = tuple(bool(d) for d in donated)
  if len(donated) != len(jaxpr.invars):
    raise ValueError(f"donated has {len(donated)} entries but the jaxpr has "
                     f"{len(jaxpr.invars)} inputs")
  jaxpr, consts = _discharge_refs(jaxpr, consts)
  # Dead code first, as `jax.jit` does before lowering: a dead read (a value never
  # used, a conditional's operand no branch uses) would otherwise be ordered by a
  # barrier that keeps it, and its neighbours, from XLA's simplifier.
  jaxpr = C.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]
  jaxpr = _map_eqns(jaxpr, _given_outputs_picked, {})
  if not in_loop:
    jaxpr = _carry_scanned_buffers(jaxpr, donated)
  if erase_remat_barriers:
    jaxpr = _map_eqns(jaxpr, _without_remat_barrier, {})
  # The analysis allocates many small containers at once; the cyclic garbage
  # collector would rescan them repeatedly (a third of the time on 10k equations).
  gc_was_enabled = gc.isenabled()
  gc.disable()
  try:
    plan = Analyzer()(jaxpr, donated, in_loop)
    if boundary and not in_loop:
      aliases = C.predicted_aliases(plan.jaxpr, donated)
      kept = tuple(d and f is not None and f == a
                   for d, f, a in zip(donated, plan.flows, aliases, strict=True))
      dropped = [i for i, (d, k, v) in enumerate(
          zip(donated, kept, jaxpr.invars, strict=True)) if d and not k
                 and is_big(v.aval)]
      if dropped:
        first = plan
        plan = Analyzer()(jaxpr, kept, in_loop)
        notes = tuple(_alias_conflict(i, first.flows[i], aliases[i])
                      for i in dropped)
        plan = dataclasses.replace(plan, conflicts=plan.conflicts + notes + tuple(
            c for c in first.all_conflicts() if c not in plan.all_conflicts()))
    new = Rewriter()(plan)
  finally:
    if gc_was_enabled:
      gc.enable()
  if C.checks_enabled():
    C.check_jaxpr(new)
  return C.ClosedJaxpr(new, consts), plan


def _carry_scanned_buffers(jaxpr, donated: Sequence[bool]):
  """`jaxpr` with each top-level `scan` that maps rows of a donated buffer's version
  (an `xs`) to the rows of an output of the same type (a `ys`), through in-place
  updates of the row, rewritten to carry that buffer
  (`_rules.scan_with_carried_xs`)."""
  versions = {v for v, d in zip(jaxpr.invars, donated, strict=True)
              if d and is_big(v.aval)}
  eqns, changed = [], False
  for eqn in jaxpr.eqns:
    pairs = _scanned_buffer_pairs(eqn, versions) if eqn.primitive is C.scan_p else []
    if pairs:
      eqn = scan_with_carried_xs(eqn, pairs)
      changed = True
    eqns.append(eqn)
    for i, o in _in_place_pairs(eqn):
      if not C.is_literal(eqn.invars[i]) and eqn.invars[i] in versions:
        versions.add(eqn.outvars[o])
  return jaxpr.replace(eqns=eqns) if changed else jaxpr


def _in_place_pairs(eqn) -> list[tuple[int, int]]:
  """(operand, output) pairs of `eqn` that continue a buffer: updates, and the
  carries of loops."""
  if eqn.primitive in UPDATE_PRIMITIVES:
    return [(0, 0)]
  if eqn.primitive is C.scan_p:
    nc, nk = eqn.params["num_consts"], eqn.params["num_carry"]
    return [(nc + j, j) for j in range(nk)]
  if eqn.primitive is C.while_p:
    n = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
    return [(n + j, j) for j in range(len(eqn.outvars))]
  return []


def _scanned_buffer_pairs(eqn, versions) -> list[tuple[int, int]]:
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
                if not C.is_literal(v) and v in versions and is_big(v.aval)
                and sum(w is v for w in eqn.invars) == 1]
  if not candidates:
    return []
  mask = [False] * len(body.invars)
  for k in candidates:
    mask[nc + nk + k] = True
  plan = Analyzer()(body, mask, True)
  pairs, taken = [], set()
  for k in candidates:
    i = nc + nk + k
    o = plan.flows[i]
    if o is None or o < nk or not plan.strong_flows[i] or o in taken:
      continue
    out = eqn.outvars[o]
    if C.is_drop_var(out) or not same_type(out.aval, xs[k].aval):
      continue
    taken.add(o)
    pairs.append((k, o - nk))
  return pairs


def _alias_conflict(i: int, flow: int | None, alias: int | None) -> Conflict:
  if alias is None:
    msg = (f"donated input {i} is not returned updated: no output has its shape "
           "and dtype, so XLA keeps the buffer read-only and copies it to update it")
  elif flow is None:
    msg = (f"donated input {i} is aliased to output {alias}, but its updated value "
           "is not returned: XLA copies it to update it")
  else:
    msg = (f"donated input {i} is aliased to output {alias} (JAX pairs donated "
           f"inputs with outputs in order), but its updated value is output {flow}: "
           "XLA copies it")
  return Conflict(NOT_ALIASED, msg)


def _map_eqns(jaxpr, fn: Callable, memo: dict):
  """`jaxpr` with the equations `fn(eqn)` in place of each equation, at every depth
  (the jaxprs in an equation's params are mapped before the equation)."""
  hit = memo.get(id(jaxpr))
  if hit is not None and hit[0] is jaxpr:
    return hit[1]
  changed = False
  eqns = []
  for eqn in jaxpr.eqns:
    params = eqn.params
    new_params = None
    for key in C.jaxprs_in_params(params):
      val = params[key]
      seq = val if isinstance(val, (tuple, list)) else (val,)
      new_seq = []
      for j in seq:
        if isinstance(j, C.ClosedJaxpr):
          inner = _map_eqns(j.jaxpr, fn, memo)
          new_seq.append(j if inner is j.jaxpr else C.ClosedJaxpr(inner, j.consts))
        else:
          new_seq.append(_map_eqns(j, fn, memo))
      if any(a is not b for a, b in zip(seq, new_seq, strict=True)):
        new_params = dict(new_params or params)
        new_params[key] = (type(val)(new_seq) if isinstance(val, (tuple, list))
                           else new_seq[0])
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
  result, as it is under `jax.jit` (which folds `-0.0 + 0.0` to -0.0, not IEEE)."""
  if eqn.primitive is not C.cond_p:
    return [eqn]
  index, ops = eqn.invars[0], eqn.invars[1:]
  branches = eqn.params["branches"]
  outvars = list(eqn.outvars)
  picks = []
  for o, out in enumerate(eqn.outvars):
    if C.is_drop_var(out) or is_big(out.aval):
      continue
    given = [_given_atom(b.jaxpr, o, ops) for b in branches]
    if all(g is None for g in given):
      continue
    outvars[o] = C.new_var(out.aval)
    cases = [outvars[o] if g is None else g for g in given]
    picks.append(C.new_jaxpr_eqn([index, *cases], [out], C.select_n_p, {},
                                 C.no_effects, eqn.source_info, eqn.ctx))
  if not picks:
    return [eqn]
  return [eqn.replace(outvars=outvars), *picks]


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


def _discharge_refs(jaxpr, consts):
  """Mutable refs created inside the function become plain values first."""
  if not C.has_ref_effects(jaxpr):
    return jaxpr, consts
  return C.discharge_refs(jaxpr, consts)


class _Traced:
  """One traced and sequenced signature of a function."""

  __slots__ = ("closed", "plan", "out_tree", "donated")

  def __init__(self, closed, plan, out_tree, donated):
    self.closed, self.plan, self.out_tree, self.donated = closed, plan, out_tree, donated


def _leaf_key(x) -> Any:
  try:
    return jax.typeof(x)
  except TypeError:
    return type(x)


def trace_and_sequence(fun: Callable, args: tuple, kwargs: dict,
                       donated_leaf: Callable[[int | str], bool],
                       cache: dict | None = None,
                       static: Callable[[int | str], bool] = lambda key: False,
                       boundary: bool = True, erase_remat_barriers: bool = False,
                       ) -> tuple[_Traced, list]:
  """Traces `fun(*args, **kwargs)` to a jaxpr and sequences it.

  `donated_leaf(key)` says whether positional argument `key` (an int) or keyword
  argument `key` (a str) is donated; `static(key)` whether it is a static argument
  (passed through as a Python value, not traced). Returns the traced record and the
  flat leaves to evaluate it with.
  """
  dyn_args = [None if static(i) else a for i, a in enumerate(args)]
  dyn_kwargs = {k: (None if static(k) else a) for k, a in kwargs.items()}
  flat, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
  cache_key = None
  if cache is not None:
    statics = (tuple((i, a) for i, a in enumerate(args) if static(i)),
               tuple((k, a) for k, a in sorted(kwargs.items()) if static(k)))
    cache_key = (in_tree, tuple(_leaf_key(x) for x in flat), statics)
    hit = cache.get(cache_key)
    if hit is not None:
      return hit, flat
  donated: list[bool] = []
  for i, a in enumerate(dyn_args):
    donated += [donated_leaf(i)] * len(jax.tree_util.tree_leaves(a))
  for k, a in dyn_kwargs.items():
    donated += [donated_leaf(k)] * len(jax.tree_util.tree_leaves(a))

  def flat_fun(*leaves):
    a, kw = jax.tree_util.tree_unflatten(in_tree, leaves)
    a = [args[i] if static(i) else x for i, x in enumerate(a)]
    kw = {k: (kwargs[k] if static(k) else x) for k, x in kw.items()}
    return fun(*a, **kw)

  closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*flat)
  out_tree = jax.tree_util.tree_structure(out_shape)
  new, plan = sequence_jaxpr(closed, donated, boundary=boundary,
                             erase_remat_barriers=erase_remat_barriers)
  rec = _Traced(new, plan, out_tree, tuple(donated))
  if cache is not None:
    cache[cache_key] = rec
  return rec, flat


def run_traced(rec: _Traced, flat: list):
  outs = C.eval_jaxpr(rec.closed.jaxpr, rec.closed.consts, *flat)
  return jax.tree_util.tree_unflatten(rec.out_tree, outs)


def sequence(fun: Callable | None = None, *, donate_argnums=None,
             donate_argnames=None):
  """Function -> function: reads of buffers sequenced before their updates.

  The result computes exactly what `fun` computes. Use it inside your own
  `jax.jit` (with `compiler_options=inplace_jax.compiler_options()` on CPU), under
  `jax.vmap` or `jax.grad`; or use `inplace_jax.jit`, which does all of that.

  Args:
    fun: the function to transform.
    donate_argnums, donate_argnames: which arguments are buffers to update in
      place; by default every argument is.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> @inplace_jax.sequence
    ... def f(x):
    ...   y = x[0]
    ...   return x.at[0].set(x[1]), y
    >>> new_x, y = jax.jit(f, donate_argnums=0)(jnp.arange(4.0))
    >>> print(new_x, y)
    [1. 1. 2. 3.] 0.0
  """
  if fun is None:
    return functools.partial(sequence, donate_argnums=donate_argnums,
                             donate_argnames=donate_argnames)
  everything = donate_argnums is None and donate_argnames is None
  nums, names = C.resolve_donation(fun, donate_argnums, donate_argnames)
  cache: dict = {}

  def donated_leaf(key):
    return everything or (key in nums if isinstance(key, int) else key in names)

  @functools.wraps(fun)
  def wrapped(*args, **kwargs):
    rec, flat = trace_and_sequence(fun, args, kwargs, donated_leaf, cache,
                                   boundary=False)
    return run_traced(rec, flat)

  wrapped.plans = lambda: [r.plan for r in cache.values()]  # type: ignore[attr-defined]
  return wrapped


def signature_of(fun) -> inspect.Signature | None:
  try:
    return inspect.signature(fun)
  except (TypeError, ValueError):
    return None
