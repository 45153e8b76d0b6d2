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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _compat as C
from . import _passes
from . import _rewrite
from ._analysis import Analyzer
from ._errors import InplaceNestingWarning, user_stacklevel
from ._plan import Conflict, FindingKind, Hints, Plan
from ._rewrite import Rewriter
from ._rules import is_big


def sequence_jaxpr(closed_jaxpr, donated: Sequence[bool] | None = None, *,
                   in_loop: bool = False, boundary: bool = True,
                   erase_remat_barriers: bool = False, hints: Hints = Hints(),
                   buffers: Sequence[bool] | None = None, inline_calls: bool = False):
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
    hints: what an earlier compile showed (`inplace_jax.jit`'s refinement rounds):
      reads to tie that data alone would order, and ties through later updates.
    buffers: which donated inputs to sequence (default: all of them); the others
      are left exactly as they are. `donated` still says what JAX donates, which
      decides the outputs it aliases.
    inline_calls: the result is only compiled, never differentiated: `custom_jvp`,
      `custom_vjp` and `checkpoint` bodies are spliced into their callers, as
      their lowering does, so that reads inside them and updates outside are
      sequenced as one program (their derivative rules are dropped).

  Returns:
    `(new_closed_jaxpr, plan)`. The new jaxpr computes exactly the same values; the
    plan says what was done and which copies no ordering can remove
    (`plan.all_conflicts()`). A rewrite that XLA:CPU would miscompile where
    barriers are kept (an update after a barrier that also reads, through
    operations fused into it, the buffer's value from before the barrier; see
    docs/xla_notes.md) is withheld: the input is returned unchanged and
    `plan.refused` says why.

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
  with C.params_memoised():
    new, plan = _sequence_jaxpr(closed_jaxpr, donated, in_loop=in_loop,
                                boundary=boundary,
                                erase_remat_barriers=erase_remat_barriers, hints=hints,
                                buffers=buffers, inline_calls=inline_calls)
    jaxpr = closed_jaxpr.jaxpr if isinstance(closed_jaxpr, C.ClosedJaxpr) \
        else closed_jaxpr
    hazard = _rewrite.reads_across_barrier(new.jaxpr) and \
        not _rewrite.reads_across_barrier(jaxpr)
  if hazard:
    consts = closed_jaxpr.consts if isinstance(closed_jaxpr, C.ClosedJaxpr) else []
    return C.ClosedJaxpr(jaxpr, consts), dataclasses.replace(
        plan, refused="an update after a barrier would read the buffer's value from "
        "before it, which XLA:CPU miscompiles where barriers are kept")
  return new, plan


def _sequence_jaxpr(closed_jaxpr, donated: Sequence[bool] | None = None, *,
                    in_loop: bool = False, boundary: bool = True,
                    erase_remat_barriers: bool = False, hints: Hints = Hints(),
                    buffers: Sequence[bool] | None = None,
                    inline_calls: bool | str = False):
  """`sequence_jaxpr` without its last check: `inplace_jax.jit` checks each
  candidate itself and compiles none it refuses."""
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
  buffers = donated if buffers is None else tuple(
      bool(b) and d for b, d in zip(buffers, donated, strict=True))
  # The analysis allocates many small containers at once; the cyclic garbage
  # collector would rescan them repeatedly (a third of the time on 10k equations).
  gc_was_enabled = gc.isenabled()
  gc.disable()
  try:
    with C.params_memoised():
      analyzer = Analyzer(hints)
      ctx = _passes.PassContext(donated=buffers, in_loop=in_loop,
                                erase_remat_barriers=erase_remat_barriers,
                                analyze=analyzer, clone=hints.clone,
                                inline_calls=inline_calls,
                                whole_donated=donated if boundary and not in_loop
                                else None)
      jaxpr, consts = _passes.normalise(jaxpr, consts, ctx)
      # Donated buffers not to sequence are left exactly as they are.
      left = tuple(d and not b and hints.leave
                   for d, b in zip(donated, buffers, strict=True))
      # A whole program: each donated buffer's own output is the one JAX aliases it
      # to, which its chain of updates should end in; its conflicts name it.
      whole = boundary and not in_loop
      targets = tuple(C.predicted_aliases(analyzer.live(jaxpr), donated)) if whole \
          else ()
      names = _given_names(jaxpr) if whole else ()
      plan = analyzer(jaxpr, buffers, in_loop, left=left, targets=targets, names=names,
                      top=boundary)
      if ctx.restructured:
        plan = dataclasses.replace(plan, restructured=tuple(ctx.restructured))
      if whole:
        plan = _honour_aliases(plan, jaxpr, donated, buffers, analyzer, left, targets,
                               names)
      new = Rewriter()(plan)
  finally:
    if gc_was_enabled:
      gc.enable()
  if C.checks_enabled():
    C.check_jaxpr(new)
  return C.ClosedJaxpr(new, consts), plan


def _honour_aliases(plan: Plan, jaxpr, donated, buffers, analyzer, left=(),
                    targets=(), names=()) -> Plan:
  """The plan with only the donated buffers XLA can update in place: those whose
  last version is the output JAX aliases them to (JAX pairs donated inputs with
  outputs of the same shape and dtype, in order). The others are read-only to XLA,
  and sequencing them only costs; the report says why they are copied."""
  aliases = C.predicted_aliases(plan.jaxpr, donated)
  donors = C.predicted_donors(plan.jaxpr, donated, aliases)
  kept = tuple(b and f is not None and f == a
               for b, f, a in zip(buffers, plan.flows, aliases, strict=True))
  dropped = [i for i, (b, k, v) in enumerate(zip(buffers, kept, jaxpr.invars, strict=True))
             if b and not k and is_big(v.aval)]
  if not dropped:
    return plan
  first = plan
  plan = analyzer(jaxpr, kept, False, left=left, targets=targets, names=names, top=True)
  names = _arg_names(jaxpr)
  notes = tuple(_alias_conflict(names[i], first.flows[i], aliases[i],
                               unchanged=first.flows[i] is not None and
                               jaxpr.outvars[first.flows[i]] is jaxpr.invars[i],
                               donor=donors[i])
                for i in dropped)
  return dataclasses.replace(plan, conflicts=plan.conflicts + notes + tuple(
      c for c in first.all_conflicts() if c not in plan.all_conflicts()))


def _given_names(jaxpr) -> tuple[str | None, ...]:
  """Each input's argument name as JAX writes it (the report's `CopyInfo.buffer`);
  None where JAX gave none."""
  names = getattr(getattr(jaxpr, "debug_info", None), "arg_names", None)
  n = len(jaxpr.invars)
  if names is None or len(names) > n:
    return (None,) * n
  # Constants JAX hoisted come first and have no argument name.
  return (None,) * (n - len(names)) + tuple(str(a) if a else None for a in names)


def _arg_names(jaxpr) -> list[str]:
  return [a or f"input {i}" for i, a in enumerate(_given_names(jaxpr))]


def _alias_conflict(name: str, flow: int | None, alias: int | None,
                    unchanged: bool = False, donor: bool = False) -> Conflict:
  """Why a donated buffer is not sequenced, as JAX's aliasing makes it
  (`unchanged`: the function returns it as it came in; `donor`: JAX gives it to
  XLA as a buffer donor, `_compat.predicted_donors`)."""
  if alias is None and donor:
    # XLA may write an output of the same size over it (a cast, a reshape): the
    # compiled module's aliasing (the report's donations) says which, if any.
    msg = (f"no output has the shape and dtype of donated {name}, so JAX aliases it "
           "to none and leaves its buffer to XLA to reuse for an output of its size; "
           "inplace_jax orders reads only before updates into the output JAX aliases "
           "a donated buffer to")
  elif alias is None:
    msg = (f"no output reuses the buffer of donated {name} (JAX aliases a donated "
           "input only to an output of its shape and dtype, and no output has its "
           "number of elements for XLA to reuse it): it cannot be updated in place")
  elif flow is None:
    # What the analysis found, not what XLA does: XLA may still write the output
    # over the buffer (optax.MultiSteps' accumulator, whose elementwise chain
    # also feeds the moments' updates, is written in place with a copy kept).
    msg = (f"output {alias} reuses the buffer of donated {name}, but inplace_jax "
           f"follows no chain of updates from {name} to that output, so it does not "
           f"order the reads of {name} before its update")
  elif unchanged:
    msg = (f"{name} is returned unchanged as output {flow}, but JAX gives its buffer "
           f"to output {alias} (it pairs donated inputs with outputs of the same shape "
           "and dtype, in order)")
  else:
    msg = (f"the updated {name} is output {flow}, but JAX gives its buffer to output "
           f"{alias} (it pairs donated inputs with outputs of the same shape and "
           "dtype, in order): the update cannot be done in its buffer")
  return Conflict(FindingKind.NOT_ALIASED, msg, argument=name)


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
    >>> g = jax.jit(f, donate_argnums=0,
    ...             compiler_options=inplace_jax.compiler_options())
    >>> new_x, y = g(jnp.arange(4.0))
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

  warned: list[bool] = []

  @functools.wraps(fun)
  def wrapped(*args, **kwargs):
    if not warned and not C.barriers_kept(jax.default_backend(),
                                          C.outer_jit_options()):
      warned.append(True)
      warnings.warn(
          f"inplace_jax.sequence({getattr(fun, '__name__', fun)}) runs inside a "
          f"compilation that erases optimization barriers on {jax.default_backend()} "
          "(a jax.jit without inplace_jax.compiler_options(), or no jit): the values "
          "are right, but the copies it orders away may remain. Pass "
          "compiler_options=inplace_jax.compiler_options() to the outer jax.jit, or "
          "use inplace_jax.jit.", InplaceNestingWarning, stacklevel=user_stacklevel())
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
