"""`inplace_jax.jit`: `jax.jit` with sequencing, the right compile options, and a check.

Tracing runs the user function once per signature, as `jax.jit` does; the jaxpr is
sequenced (`_transform.sequence_jaxpr`) and evaluated into the trace, so what XLA
compiles is the sequenced program. Compilation uses the backend options that keep
barriers alive (`_compat.backend_compiler_options`) merged with the user's. After
the first call of each new signature, the compiled HLO is inspected once (a
cached lower+compile, no recompilation) and copies at or above `min_bytes` are
warned about or raised, with their source lines. A warm call goes straight to
`jax.jit`'s C++ dispatch: no Python-side analysis per call.

Conflicts the analysis finds at trace time (a read that needs the old and the new
value at once, two live updates of one buffer) are reported before anything runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _compat as C
from . import _plan
from ._check import CopiesFoundError, check_compiled
from ._report import CopyReport, Finding
from ._transform import run_traced, trace_and_sequence

ON_COPY = ("warn", "raise", "ignore")

_DEFINITE = _plan.DEFINITE


class InplaceCopyWarning(UserWarning):
  """A copy of a buffer remains in a function compiled by `inplace_jax.jit`."""


class InplaceDonationWarning(UserWarning):
  """A donated argument's buffer is not reused by any output (donation wasted)."""


class ConflictError(AssertionError):
  """Under `on_copy="raise"`: the function needs a copy no ordering can remove."""

  def __init__(self, message: str, conflicts: Sequence[_plan.Conflict]):
    super().__init__(message)
    self.conflicts = tuple(conflicts)


def compiler_options(backend: str | None = None) -> dict[str, Any]:
  """The XLA options `inplace_jax.jit` adds so that barriers reach copy insertion.

  Pass them to your own `jax.jit(..., compiler_options=...)` when you use
  `inplace_jax.sequence` inside it.

  Examples:
    >>> import inplace_jax
    >>> inplace_jax.compiler_options("cpu")
    {'xla_disable_hlo_passes': 'cse_barrier_expander'}
  """
  return C.backend_compiler_options(backend or jax.default_backend())


def findings_from(conflicts: Sequence[_plan.Conflict]) -> tuple[Finding, ...]:
  return tuple(Finding(kind=c.kind, message=c.message, locations=c.locations())
               for c in conflicts)


class InplaceJitted:
  """A function compiled by `inplace_jax.jit`. Call it like a `jax.jit` function."""

  def __init__(self, fun: Callable, *, donate_argnums=None, donate_argnames=None,
               static_argnums=None, static_argnames=None, on_copy: str = "warn",
               min_bytes: int = 1024, compiler_options=None, **jit_kwargs):
    if on_copy not in ON_COPY:
      raise ValueError(f"on_copy must be one of {ON_COPY}, got {on_copy!r}")
    if not callable(fun):
      raise TypeError(f"inplace_jax.jit expects a callable, got {type(fun).__name__}")
    if int(min_bytes) < 0:
      raise ValueError(f"min_bytes must be >= 0, got {min_bytes}")
    nums, names, s_nums, s_names = C.resolve_argnums(
        fun, donate_argnums, donate_argnames, static_argnums, static_argnames)
    _check_duplicates(donate_argnums, "donate_argnums")
    _check_duplicates(donate_argnames, "donate_argnames")
    self._fun = fun
    self._donate = (frozenset(nums), frozenset(names))
    self._static = (frozenset(s_nums), frozenset(s_names))
    self.on_copy = on_copy
    self.min_bytes = int(min_bytes)
    platform = jit_kwargs.get("backend") or jax.default_backend()
    self._compiler_options = C.merge_compiler_options(
        C.backend_compiler_options(platform), compiler_options)
    # Where jax.jit erases every barrier before fusion, so do we for the barriers
    # we did not add (jax.checkpoint's), to compile what jax.jit compiles.
    self._erase_remat = C.backend_erases_barriers(platform)
    self._trace_cache: dict = {}
    self._last = None          # the last traced record (plan and donated leaves)
    self._pending = False      # a trace happened: verify after the next call
    self.reports: list[CopyReport] = []

    @functools.wraps(fun)
    def traced(*args, **kwargs):
      return self._traced(args, kwargs)

    self._jitted = jax.jit(traced, donate_argnums=nums, donate_argnames=names,
                           static_argnums=s_nums, static_argnames=s_names,
                           compiler_options=self._compiler_options, **jit_kwargs)
    # Plain jax.jit of the same function, with the user's own options: the fallback
    # when the sequenced program turns out to copy more (see `_verify`).
    self._plain = jax.jit(fun, donate_argnums=nums, donate_argnames=names,
                          static_argnums=s_nums, static_argnames=s_names,
                          compiler_options=compiler_options, **jit_kwargs)
    self.fell_back: str | None = None
    functools.update_wrapper(self, fun)

  # ------------------------------------------------------------------ tracing

  def _is_static(self, key) -> bool:
    nums, names = self._static
    return key in nums if isinstance(key, int) else key in names

  def _is_donated(self, key) -> bool:
    nums, names = self._donate
    return key in nums if isinstance(key, int) else key in names

  def _traced(self, args: tuple, kwargs: dict):
    rec, flat = trace_and_sequence(self._fun, args, kwargs, self._is_donated,
                                   self._trace_cache, static=self._is_static,
                                   erase_remat_barriers=self._erase_remat)
    self._last = rec
    self._pending = True
    conflicts = rec.plan.all_conflicts()
    definite = [c for c in conflicts if c.kind in _DEFINITE
                and (c.nbytes is None or c.nbytes >= self.min_bytes)]
    if definite and self.on_copy == "raise":
      raise ConflictError(_conflict_message(self.__name__, definite), definite)
    if self.on_copy == "raise":
      self._precheck(rec, flat, args, kwargs)
    return run_traced(rec, flat)

  def _precheck(self, rec, flat, args, kwargs) -> None:
    """Under on_copy="raise": compile the sequenced program on its own, before the
    real call runs and consumes donated buffers, and raise if copies remain.

    This costs a second compilation of each new signature, in raise mode only.
    """
    avals = [jax.ShapeDtypeStruct(jax.typeof(x).shape, jax.typeof(x).dtype)
             for x in flat]
    donate = tuple(i for i, d in enumerate(rec.donated) if d)

    def program(*leaves):
      return C.eval_jaxpr(rec.closed.jaxpr, rec.closed.consts, *leaves)

    compiled = jax.jit(program, donate_argnums=donate,
                       compiler_options=self._compiler_options).lower(
                           *avals).compile()
    report = check_compiled(compiled).with_findings(
        findings_from(rec.plan.all_conflicts()))
    report = _rename_parameters(report, args, kwargs, self._is_static,
                                self._fun)
    copies = report.copies_over(self.min_bytes)
    if copies or not report.verified:
      raise CopiesFoundError(_copy_message(self.__name__, report, self.min_bytes),
                             report=report, copies=copies)

  # ------------------------------------------------------------------ calling

  def __call__(self, *args, **kwargs):
    # Forwarding an empty **kwargs costs jax.jit's C++ dispatch about 0.7 us.
    out = self._jitted(*args, **kwargs) if kwargs else self._jitted(*args)
    if self._pending:
      self._pending = False
      self._verify(args, kwargs)
    return out

  def _verify(self, args, kwargs) -> None:
    report = self._report(args, kwargs)
    # Copies under min_bytes (loop counters, scalars) are not worth a second
    # compilation; anything larger is compared with plain jax.jit's program.
    if (report.copies_over(self.min_bytes) and report.verified
        and self.on_copy != "raise"):
      report = self._maybe_fall_back(report, args, kwargs)
    self.reports.append(report)
    if self.on_copy == "ignore":
      return
    wasted = [d for d in report.wasted_donations() if d.nbytes >= self.min_bytes]
    if wasted:
      # JAX says nothing when it prunes an unused donated argument; say it here.
      names = ", ".join(f"{d.argument} ({d.dtype}{list(d.shape)})" for d in wasted)
      warnings.warn(
          f"inplace_jax.jit({self.__name__}): donated argument(s) {names} are not "
          "updated in place or returned: no output reuses their buffer, so "
          "donating them gains nothing. Stop donating them, or return the "
          "updated value.", InplaceDonationWarning, stacklevel=3)
    copies = report.copies_over(self.min_bytes)
    if not copies and report.verified:
      return
    message = _copy_message(self.__name__, report, self.min_bytes)
    if self.on_copy == "raise":
      raise CopiesFoundError(message, report=report, copies=copies)
    warnings.warn(message, InplaceCopyWarning, stacklevel=3)

  def _maybe_fall_back(self, report: CopyReport, args, kwargs) -> CopyReport:
    """Never copy more than plain `jax.jit`: when copies of at least `min_bytes`
    remain, compile the untransformed program too, and if it copies fewer bytes,
    use it from now on.

    XLA's fusion and simplification decisions around barriers are not fully
    predictable; this makes the promise hold on every program, at the cost of one
    more compilation where copies remain (and none where the rewrite removed them).
    """
    plain = check_compiled(self._plain.lower(*args, **kwargs).compile())
    if not plain.verified or plain.total_copy_bytes >= report.total_copy_bytes:
      return report
    self.fell_back = (
        f"the sequenced program copies {report.total_copy_bytes} bytes and plain "
        f"jax.jit {plain.total_copy_bytes}: using plain jax.jit for this function")
    self._jitted = self._plain
    return plain.with_findings(findings_from(self._last.plan.all_conflicts())
                               if self._last is not None else ()).with_findings(
        (Finding(kind="fell_back", message=self.fell_back),))

  def _report(self, args, kwargs, compiler_options=None) -> CopyReport:
    compiled = self._jitted.lower(*args, **kwargs).compile(
        compiler_options=compiler_options)
    report = check_compiled(compiled)
    if self._last is not None:
      report = report.with_findings(findings_from(self._last.plan.all_conflicts()))
    return report

  # ------------------------------------------------------------------ jax.jit API

  def lower(self, *args, **kwargs):
    return self._jitted.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    return self._jitted.trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self._jitted.eval_shape(*args, **kwargs)

  def clear_cache(self) -> None:
    self._jitted.clear_cache()
    self._trace_cache.clear()

  @property
  def last_report(self) -> CopyReport | None:
    return self.reports[-1] if self.reports else None

  @property
  def plan(self) -> _plan.Plan | None:
    """The sequencing plan of the most recent trace."""
    return None if self._last is None else self._last.plan

  def _inplace_check(self, *args, compiler_options=None, **kwargs) -> CopyReport:
    """`inplace_jax.check` on this function: compile (cached) and inspect."""
    return self._report(args, kwargs, compiler_options)

  def __get__(self, obj, objtype=None):
    if obj is None:
      return self
    return functools.partial(self, obj)

  def __repr__(self) -> str:
    return f"inplace_jax.jit({getattr(self._fun, '__qualname__', self._fun)!r})"


def _rename_parameters(report: CopyReport, args, kwargs, is_static, fun
                       ) -> CopyReport:
  """Names `leaves[i]` parameters of a flat program by the user's argument paths."""
  try:
    params = [p.name for p in inspect.signature(fun).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  dyn = ([None if is_static(i) else a for i, a in enumerate(args)],
         {k: (None if is_static(k) else a) for k, a in kwargs.items()})
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(dyn)[0]]
  pretty = []
  for p in paths:   # "[0][1]['k']" -> "args[1]['k']"; "[1]['scale']" -> "scale"
    m = re.match(r"\[0\]\[(\d+)\](.*)", p) or re.match(r"\[1\]\['([^']+)'\](.*)", p)
    if m and p.startswith("[0]"):
      i = int(m.group(1))
      head = params[i] if i < len(params) else f"args[{i}]"
      pretty.append(f"{head}{m.group(2)}")
    else:
      pretty.append(f"{m.group(1)}{m.group(2)}" if m else p)

  def rename(name):
    m = re.fullmatch(r"leaves\[(\d+)\]", name or "")
    return pretty[int(m.group(1))] if m and int(m.group(1)) < len(pretty) else name

  copies = tuple(dataclasses.replace(c, parameter=rename(c.parameter))
                 for c in report.copies)
  donations = tuple(dataclasses.replace(d, argument=rename(d.argument))
                    for d in report.donations)
  return dataclasses.replace(report, copies=copies, donations=donations)


def _check_duplicates(spec, name: str) -> None:
  if spec is None or isinstance(spec, (int, str)):
    return
  spec = list(spec)
  dups = sorted({x for x in spec if spec.count(x) > 1}, key=str)
  if dups:
    raise ValueError(f"{name} names {dups} more than once; each argument can be "
                     "donated once.")


def _conflict_message(name: str, conflicts) -> str:
  lines = [f"inplace_jax.jit({name}): {len(conflicts)} copy(ies) no ordering can "
           "remove:"]
  for c in conflicts:
    lines.append(f"  - {c.message}")
    for loc in c.locations():
      lines.append(f"      {loc}")
  lines.append("Restructure the code so the old value is read before the update, "
               "or pass on_copy='warn' to accept the copy.")
  return "\n".join(lines)


def _copy_message(name: str, report: CopyReport, min_bytes: int) -> str:
  if not report.verified:
    return (f"inplace_jax.jit({name}): the compiled program could not be verified: "
            + "; ".join(report.problems))
  copies = report.copies_over(min_bytes)
  lines = [f"inplace_jax.jit({name}): {len(copies)} copy(ies) of at least "
           f"{min_bytes} bytes remain:"]
  for c in copies:
    where = f" in {c.role}" + (f" (x{c.trip_count})" if c.trip_count else "")
    what = f"argument {c.parameter}" if c.parameter else c.operand
    loc = f" at {c.location}" if c.location else ""
    lines.append(f"  - {c.nbytes} bytes {c.type_str}{where}, copying {what}{loc}")
  for f in report.findings:
    lines.append(f"  why: {f.message}" + (" [" + "; ".join(f.locations) + "]"
                                           if f.locations else ""))
  return "\n".join(lines)


def jit(fun: Callable | None = None, *, donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None,
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        on_copy: str = "warn", min_bytes: int = 1024,
        compiler_options: dict[str, Any] | None = None, **jit_kwargs):
  """A drop-in for `jax.jit` whose donated buffers are updated in place, verified.

  Reads of each donated buffer are sequenced before its updates, the program is
  compiled with the options XLA needs to honour that order, and the compiled HLO is
  checked once per signature for remaining copies.

  Args:
    fun: the function to compile. Usable bare (`inplace_jax.jit(f, ...)`) or as a
      decorator (`@inplace_jax.jit(donate_argnums=0)`).
    donate_argnums, donate_argnames, static_argnums, static_argnames: as `jax.jit`.
    on_copy: what to do when a copy of at least `min_bytes` remains: `"warn"`
      (an `InplaceCopyWarning` after the first call of each signature), `"raise"`
      or `"ignore"`. Under `"raise"` nothing runs with a copy: copies no ordering
      can remove raise `ConflictError` at trace time, and any other copy in the
      compiled HLO raises `CopiesFoundError` before the first call of a signature
      executes (this compiles each new signature twice).
    min_bytes: copies smaller than this are not warned about.
    compiler_options: XLA options, merged with ours (`xla_disable_hlo_passes`
      lists are joined).
    **jit_kwargs: passed to `jax.jit` (`in_shardings`, `out_shardings`,
      `keep_unused`, ...).

  Examples:
    >>> import jax.numpy as jnp, inplace_jax
    >>> @inplace_jax.jit(donate_argnums=0)
    ... def f(x):
    ...   y = x[0, 0]
    ...   return x.at[0, 0].add(1.0), y
    >>> x, y = f(jnp.zeros((64, 64)))
    >>> f.last_report.copies
    ()
  """
  kw = dict(donate_argnums=donate_argnums, donate_argnames=donate_argnames,
            static_argnums=static_argnums, static_argnames=static_argnames,
            on_copy=on_copy, min_bytes=min_bytes, compiler_options=compiler_options,
            **jit_kwargs)
  if fun is None:
    return lambda f: InplaceJitted(f, **kw)
  return InplaceJitted(fun, **kw)
