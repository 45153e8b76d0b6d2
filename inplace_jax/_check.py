"""Compile a function and say, from the compiled HLO, which buffers XLA copies.

Entry points, from the most to the least convenient:

* `assert_no_copies(fn, *args, ...)`: for tests. Compiles, and raises `CopiesFoundError`
  naming every copy of at least `min_bytes`, with its size and the user source line
  responsible, or when the compiled text could not be fully read.
* `check(fn, *args, ...)`: compiles and returns a `CopyReport` to read or print.
* `check_compiled(compiled)`: the report of a `jax.stages.Compiled` you already have.

Nothing is executed and nothing is allocated when the arguments are
`jax.ShapeDtypeStruct`s: only lowering and compilation run.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _buffers
from . import _compat
from . import _hlo
from ._report import CopyInfo, CopyReport, DonationInfo, format_copy, human_bytes


class CopiesFoundError(AssertionError):
  """The compiled program copies buffers (or could not be checked).

  Attributes:
    report: the full `CopyReport`.
    copies: the copies that made the assertion fail (at least `min_bytes` each).
  """

  def __init__(self, message: str, report: CopyReport | None = None,
               copies: tuple[CopyInfo, ...] = ()):
    super().__init__(message)
    self.report = report
    self.copies = tuple(copies)


class CopiesUnverifiedError(CopiesFoundError):
  """The compiled HLO could not be fully read, so "no copies" cannot be asserted."""


# --------------------------------------------------------------------------- check


def _given(v: Any) -> bool:
  return v is not None and not (isinstance(v, (tuple, list)) and len(v) == 0)


def _none_if_empty(v: Any) -> Any:
  return v if _given(v) else None


def check(fn: Callable[..., Any], *args: Any,
          donate_argnums: int | Sequence[int] = (),
          donate_argnames: str | Sequence[str] = (),
          static_argnums: int | Sequence[int] = (),
          static_argnames: str | Sequence[str] = (),
          compiler_options: dict[str, Any] | None = None,
          **kwargs: Any) -> CopyReport:
  """Compiles `fn` for `args` and reports the copies in the compiled program.

  Args:
    fn: a plain function (jitted here with the donate/static options given), or an
      object with a `.lower` method such as a `jax.jit` object (then give the
      donate/static options to `jax.jit`, not here), or an `inplace_jax.jit` object.
    *args: arguments, as arrays or `jax.ShapeDtypeStruct`s.
    donate_argnums: as for `jax.jit`.
    donate_argnames: as for `jax.jit`.
    static_argnums: as for `jax.jit`.
    static_argnames: as for `jax.jit`.
    compiler_options: XLA options for this compile, as for `Lowered.compile`.
    **kwargs: keyword arguments of `fn`.

  Returns:
    The `CopyReport`. Check `report.verified` before trusting an empty `copies`.

  Raises:
    TypeError: donate/static options given together with an already-jitted `fn`.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> x = jax.ShapeDtypeStruct((1000, 1000), jnp.float32)
    >>> report = inplace_jax.check(lambda x: x.at[0].set(1.), x, donate_argnums=0)
    >>> report.verified, len(report.copies)
    (True, 0)
  """
  jit_options = dict(donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                     static_argnums=static_argnums, static_argnames=static_argnames)
  passed = sorted(k for k, v in jit_options.items() if _given(v))
  if hasattr(fn, "_inplace_check"):
    if passed:
      raise TypeError(f"check() got {', '.join(passed)} for an inplace_jax.jit object; "
                      "pass them to inplace_jax.jit(...) instead.")
    return fn._inplace_check(*args, compiler_options=compiler_options, **kwargs)
  if hasattr(fn, "lower"):
    if passed:
      raise TypeError(f"check() got {', '.join(passed)} for an already-jitted function; "
                      "pass them to jax.jit(...) instead, e.g. "
                      "check(jax.jit(f, donate_argnums=0), x).")
    lowered = fn.lower(*args, **kwargs)
  elif callable(fn):
    # `None`, not `()`, for options not given: jax.jit then infers static_argnames from
    # static_argnums (and back), as it does for a direct call.
    jitted = jax.jit(fn, **{k: _none_if_empty(v) for k, v in jit_options.items()})
    lowered = jitted.lower(*args, **kwargs)
  else:
    raise TypeError(f"check() needs a function or a jitted function, got {fn!r}")
  return check_compiled(lowered.compile(compiler_options=compiler_options))


def check_compiled(compiled: jax.stages.Compiled) -> CopyReport:
  """The `CopyReport` of an already compiled program.

  Copies come from `compiled.as_text()` alone. Memory numbers come from
  `compiled.memory_analysis()`; when that is unavailable they are None and the report
  stays verified, since the copies do not depend on them. The report is unverified
  when the text is unavailable or not fully understood.
  """
  return inspect_compiled(compiled)[0]


def inspect_compiled(compiled: jax.stages.Compiled
                     ) -> tuple[CopyReport, tuple[_hlo.HloModule, ...]]:
  """`check_compiled`'s report, and the parsed HLO modules it was read from."""
  problems: list[str] = []
  try:
    text = compiled.as_text()
  except Exception as e:  # noqa: BLE001 - any failure means: not verified
    text = None
    problems.append(f"compiled.as_text() failed: {e!r}")
  if text is None and not problems:
    problems.append("compiled.as_text() returned None: this backend does not expose "
                    "the compiled HLO")
  inspection = _hlo.inspect_hlo(text) if text is not None else None
  if inspection is not None:
    problems += inspection.problems
  donations = _donations(compiled, inspection.modules if inspection else (), problems)
  temp = alias = None
  try:
    stats = compiled.memory_analysis()
    temp = _int_or_none(getattr(stats, "temp_size_in_bytes", None))
    alias = _int_or_none(getattr(stats, "alias_size_in_bytes", None))
  except Exception:  # noqa: BLE001 - informational only, see the docstring
    pass
  verified = inspection is not None and inspection.verified
  if not verified and not problems:  # never unverified without saying why
    problems.append("the HLO text held no module")
  donated = [d.parameter for d in donations if d.donated and d.parameter is not None]
  report = CopyReport(
      copies=_classified(inspection, donated),
      donations=donations,
      temp_size_in_bytes=temp,
      alias_size_in_bytes=alias,
      backend=_compat.compiled_platform(compiled) or "unknown",
      jax_version=_compat.JAX_VERSION,
      jaxlib_version=_compat.JAXLIB_VERSION,
      verified=verified,
      problems=tuple(problems),
      modules=tuple(m.name for m in inspection.modules) if inspection else (),
      partitions=_partitions(inspection),
  )
  return report, (inspection.modules if inspection else ())


def report_from_text(text: str, backend: str = "unknown") -> CopyReport:
  """A `CopyReport` (without donations or memory) of saved HLO text, e.g. from a GPU run."""
  inspection = _hlo.inspect_hlo(text)
  return CopyReport(
      copies=_classified(inspection, None), donations=(), temp_size_in_bytes=None,
      alias_size_in_bytes=None, backend=backend, jax_version=_compat.JAX_VERSION,
      jaxlib_version=_compat.JAXLIB_VERSION, verified=inspection.verified,
      problems=inspection.problems, modules=tuple(m.name for m in inspection.modules))


def _classified(inspection, donated) -> tuple[CopyInfo, ...]:
  """The copies, each with its category (`_buffers.classify`). `donated`: the donated
  entry parameters; None takes the aliased ones from the module header."""
  if inspection is None:
    return ()
  copies = inspection.copies
  for module in inspection.modules:
    params = donated if donated is not None else [a.parameter for a in module.aliases]
    try:
      copies = _buffers.classify(module, copies, params)
    except Exception:  # noqa: BLE001 - categories are a refinement; keep the copies
      pass
  return copies


def _partitions(inspection) -> int:
  if not inspection or not inspection.modules:
    return 1
  return _int_or_none(inspection.modules[0].attributes.get("num_partitions")) or 1


def _int_or_none(v: Any) -> int | None:
  try:
    return None if v is None else int(v)
  except (TypeError, ValueError):
    return None


# --------------------------------------------------------------------------- donations


def _fallback_name(path: tuple[Any, ...]) -> str:
  """A name for a leaf of `compiled.args_info` == `(args, kwargs)`, when JAX kept none."""
  if len(path) >= 2 and getattr(path[0], "idx", None) == 0:
    return f"args[{path[1].idx}]{jax.tree_util.keystr(tuple(path[2:]))}"
  if len(path) >= 2 and getattr(path[0], "idx", None) == 1:
    return f"{path[1].key}{jax.tree_util.keystr(tuple(path[2:]))}"
  return jax.tree_util.keystr(tuple(path))


def _leaf_type(info: Any) -> tuple[tuple[int, ...], str, int]:
  aval = _compat.arg_info_aval(info)
  shape = tuple(int(d) for d in getattr(aval, "shape", getattr(info, "shape", ())))
  dtype = getattr(aval, "dtype", getattr(info, "dtype", None))
  name = getattr(dtype, "name", str(dtype))
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (PRNG keys): no numpy itemsize
    itemsize = getattr(dtype, "itemsize", 0) or 0
  return shape, name, math.prod(shape) * itemsize


def _donations(compiled: Any, modules: Sequence[_hlo.HloModule],
               problems: list[str]) -> tuple[DonationInfo, ...]:
  """One `DonationInfo` per argument leaf of `compiled`.

  JAX drops arguments the function never uses before lowering, so the HLO can have
  fewer parameters than there are leaves. The kept leaves, in order, are the HLO
  parameters (after any hoisted constants); where JAX's bookkeeping is unavailable,
  leaves are matched to parameters by the `op_name` JAX writes on each parameter.
  """
  try:
    leaves = jax.tree_util.tree_flatten_with_path(
        compiled.args_info, is_leaf=lambda x: isinstance(x, jax.stages.ArgInfo))[0]
  except Exception as e:  # noqa: BLE001 - donations are informational
    problems.append(f"could not read compiled.args_info: {e!r}")
    return ()
  n = len(leaves)
  module = modules[0] if modules else None
  params = module.entry_parameters() if module is not None else {}
  param_names = {p: ins.metadata.get("op_name") for p, ins in params.items()}

  n_const = _compat.compiled_num_const_args(compiled)
  all_names = _compat.compiled_arg_names(compiled)
  names = [_fallback_name(path) for path, _ in leaves]
  if all_names is not None and len(all_names) == n + n_const:
    names = [jax_name or fallback
             for jax_name, fallback in zip(all_names[n_const:], names, strict=True)]

  kept = _compat.compiled_kept_var_idx(compiled)
  # Effect tokens (one per ordered effect) come before the arguments' parameters.
  token_params = sorted(p for p, ins in params.items() if _hlo.is_token(ins.shape))
  # Not leading (never seen): match by name.
  tokens = len(token_params) if token_params == list(range(len(token_params))) else -1
  param_of: list[int | None]
  if kept is not None and tokens >= 0 and (not params or len(kept) == len(params) - tokens):
    position = {k: p + tokens for p, k in enumerate(sorted(kept))}
    param_of = [position.get(j + n_const) for j in range(n)]
  else:
    by_name = {v: p for p, v in param_names.items() if v}
    param_of = [by_name.get(name) for name in names]
    if kept is not None:
      problems.append(f"JAX kept {len(kept)} inputs but the HLO has {len(params)} "
                      "parameters; donations matched by parameter name")
  for j, p in enumerate(param_of):
    hlo_name = param_names.get(p) if p is not None else None
    if hlo_name and hlo_name != names[j]:
      names[j] = hlo_name  # what the HLO says is what a reader of the HLO will see

  result_is_tuple = module.entry_result_is_tuple() if module is not None else True
  aliased: dict[int, tuple[int, ...]] = {}
  for a in (module.aliases if module is not None else ()):
    if a.parameter_index == ():
      # A non-tuple result is the only output: call it output 0, as a flat leaf index.
      out = a.output_index if (a.output_index or result_is_tuple) else (0,)
      if out and module is not None:   # effect tokens are no output of the function
        out = (module.output_number(out[0]),) + tuple(out[1:])
      aliased.setdefault(a.parameter, out)

  infos: list[DonationInfo] = []
  for (path, info), name, p in zip(leaves, names, param_of, strict=True):
    shape, dtype, nbytes = _leaf_type(info)
    donated = bool(getattr(info, "donated", False))
    infos.append(DonationInfo(
        argument=name, parameter=p, shape=shape, dtype=dtype, nbytes=nbytes,
        donated=donated,
        aliased_output=aliased.get(p) if donated and p is not None else None))
  return tuple(infos)


# --------------------------------------------------------------------------- assertions


def _copies_message(report: CopyReport, copies, min_bytes: int) -> str:
  total = sum(c.nbytes for c in copies)
  mods = ", ".join(report.modules) or "?"
  lines = [f"{len(copies)} cop{'y' if len(copies) == 1 else 'ies'} of at least "
           f"{min_bytes:,} bytes in the compiled program ({mods}, backend "
           f"{report.backend}), {total:,} bytes ({human_bytes(total)}) per call:"]
  lines += [f"  {i}. {format_copy(c)}" for i, c in enumerate(copies, start=1)]
  wasted = report.wasted_donations()
  if wasted:
    lines.append("Donated but not aliased (donation wasted): " +
                 ", ".join(d.argument for d in wasted))
  undonated = [d.argument for d in report.donations if not d.donated]
  if undonated and any(c.source == "parameter" for c in copies):
    lines.append("Not donated: " + ", ".join(undonated) +
                 " (an updated argument that is not donated needs one copy)")
  lines.append("Each copy reads and writes the whole buffer on every call (every "
               "iteration, in a loop). The source line is where the copied value is "
               "used; inplace_jax.jit orders reads before updates to remove such "
               "copies, and str(error.report) shows the full report.")
  return "\n".join(lines)


def _no_copies(report: CopyReport, min_bytes: int) -> None:
  """The check itself: raises `AssertionError` with what failed."""
  if not report.verified:
    problems = "\n".join(f"  - {p}" for p in report.problems) or "  - (none recorded)"
    raise AssertionError(
        "the compiled HLO could not be fully read, so the absence of copies cannot "
        f"be asserted (backend {report.backend}, jax {report.jax_version}). "
        f"Problems:\n{problems}\nIf this is real XLA output, please report it to "
        "inplace_jax with the text of compiled.as_text() attached.")
  copies = report.copies_over(min_bytes)
  if copies:
    raise AssertionError(_copies_message(report, copies, min_bytes))


# chex's assertion machinery: its message prefix, the custom message, and
# `chex.disable_asserts()` / `chex.enable_asserts()`.
_chex_no_copies = _compat.chex_assertion(_no_copies, name="assert_no_copies")


def assert_report_no_copies(report: CopyReport, min_bytes: int = 1024,
                            msg: str | None = None) -> CopyReport:
  """Raises unless `report` is verified and has no copy of at least `min_bytes`.

  A chex assertion: disabled by `chex.disable_asserts()`, and `msg` is appended as
  chex appends a custom message.

  Raises:
    CopiesUnverifiedError: the report is not verified.
    CopiesFoundError: copies of at least `min_bytes` were found; all are listed.
  """
  kind = CopiesFoundError if report.verified else CopiesUnverifiedError
  error = functools.partial(kind, report=report, copies=report.copies_over(min_bytes))
  _chex_no_copies(report, min_bytes, custom_message=msg, exception_type=error)
  return report


def assert_no_copies(fn: Callable[..., Any], *args: Any,
                     donate_argnums: int | Sequence[int] = (),
                     donate_argnames: str | Sequence[str] = (),
                     static_argnums: int | Sequence[int] = (),
                     static_argnames: str | Sequence[str] = (),
                     compiler_options: dict[str, Any] | None = None,
                     min_bytes: int = 1024,
                     msg: str | None = None,
                     **kwargs: Any) -> CopyReport:
  """Asserts that the compiled `fn` copies no buffer of at least `min_bytes` bytes.

  Takes the arguments of `check`, plus `min_bytes` (smaller copies, such as loop
  counters, are allowed) and `msg`, a message appended to the failure.

  Returns:
    The `CopyReport`, when the assertion holds.

  Raises:
    CopiesFoundError: listing every copy of at least `min_bytes` (size, type, role,
      what it copies and the source line), all at once.
    CopiesUnverifiedError: (a `CopiesFoundError`) the compiled text could not be
      fully read; the assertion never passes on text it did not understand.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> x = jax.ShapeDtypeStruct((1000, 1000), jnp.float32)
    >>> _ = inplace_jax.assert_no_copies(lambda x: x * 2, x, donate_argnums=0)
  """
  report = check(fn, *args, donate_argnums=donate_argnums,
                 donate_argnames=donate_argnames, static_argnums=static_argnums,
                 static_argnames=static_argnames, compiler_options=compiler_options,
                 **kwargs)
  return assert_report_no_copies(report, min_bytes=min_bytes, msg=msg)
