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

import functools
import gc
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _compat as C
from ._analysis import Analyzer
from ._plan import Plan
from ._rewrite import Rewriter


def sequence_jaxpr(closed_jaxpr, donated: Sequence[bool] | None = None, *,
                   in_loop: bool = False):
  """Sequences reads of donated buffers before their updates.

  Args:
    closed_jaxpr: a `jax.core.ClosedJaxpr` (as from `jax.make_jaxpr`) or open jaxpr.
    donated: one bool per invar: which inputs are buffers to update in place.
      Default: all of them.
    in_loop: analyse as the body of a loop (barriers only where data does not
      already order a read before its update).

  Returns:
    `(new_closed_jaxpr, plan)`. The new jaxpr computes exactly the same values; the
    plan says what was done and which copies no ordering can remove
    (`plan.all_conflicts()`).

  Examples:
    >>> import jax, inplace_jax
    >>> def f(x):
    ...   y = x[0, 0]
    ...   return x.at[0, 0].add(1.0), y
    >>> cj = jax.make_jaxpr(f)(jax.numpy.zeros((4, 4)))
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
  # The analysis allocates many small containers at once; the cyclic garbage
  # collector would rescan them repeatedly (a third of the time on 10k equations).
  gc_was_enabled = gc.isenabled()
  gc.disable()
  try:
    plan = Analyzer()(jaxpr, donated, in_loop)
    new = Rewriter()(plan)
  finally:
    if gc_was_enabled:
      gc.enable()
  if C.checks_enabled():
    C.check_jaxpr(new)
  return C.ClosedJaxpr(new, consts), plan


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
  new, plan = sequence_jaxpr(closed, donated)
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
    rec, flat = trace_and_sequence(fun, args, kwargs, donated_leaf, cache)
    return run_traced(rec, flat)

  wrapped.plans = lambda: [r.plan for r in cache.values()]  # type: ignore[attr-defined]
  return wrapped


def signature_of(fun) -> inspect.Signature | None:
  try:
    return inspect.signature(fun)
  except (TypeError, ValueError):
    return None
