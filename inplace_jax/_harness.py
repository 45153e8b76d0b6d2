"""One comparison harness: a function under `jax.jit` and under `inplace_jax.jit`,
on equal inputs, over a chain of steps; outputs compared bit for bit, copies counted
from both real compiles.

The tests, the fuzzer, the command line, the benchmarks and the examples all compare
through `compare`, so "equal" and "copies" mean one thing everywhere:

* equal: every output leaf of every step has the same structure, shape and dtype and
  the same bits (NaNs equal NaNs; the sign of zero counts), `_equal.tree_difference`;
* copies: the `CopyReport` of each compiled program (`check` for jax.jit's, the
  report of the program `inplace_jax.jit` runs for ours), verified or not.

Inputs are made by `make_args()` once per variant, so each chain starts from equal
fresh buffers that the runtime owns (never `jax.device_put` of NumPy memory: on CPU a
donated buffer aliasing host memory is copied silently, outside the HLO).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from ._check import check
from ._equal import tree_difference
from ._report import CopyReport


@dataclasses.dataclass(frozen=True)
class Run:
  """One variant's chain: the outputs of every step, the report of its program and
  the time of its first call (trace, compile, checks and the call itself)."""
  outputs: tuple[Any, ...]
  report: CopyReport | None
  first_call_s: float
  warnings: tuple[warnings.WarningMessage, ...] = ()
  final: Any = None        # the last step's outputs as device arrays (not donated on)

  @property
  def output(self) -> Any:
    """The first step's outputs."""
    return self.outputs[0]


@dataclasses.dataclass(frozen=True)
class Comparison:
  """`jax.jit` (`reference`) against `inplace_jax.jit` (`candidate`)."""
  reference: Run
  candidate: Run
  difference: str | None
  fn: Any = None          # the inplace_jax.jit object that ran
  reference_fn: Any = None   # the jax.jit object that ran

  @property
  def equal(self) -> bool:
    """Whether every step's outputs are equal bit for bit."""
    return self.difference is None

  def buffer_bytes(self, min_bytes: int = 1024) -> tuple[int, int]:
    """Bytes of buffer copies of at least `min_bytes`: (jax.jit, inplace_jax.jit)."""
    a, b = (_report(r).buffer_copies(min_bytes) for r in (self.reference, self.candidate))
    return sum(c.nbytes for c in a), sum(c.nbytes for c in b)

  def copy_bytes(self, min_bytes: int = 1024) -> tuple[int, int]:
    """Bytes of all copies of at least `min_bytes`: (jax.jit, inplace_jax.jit)."""
    a, b = (_report(r).copies_over(min_bytes) for r in (self.reference, self.candidate))
    return sum(c.nbytes for c in a), sum(c.nbytes for c in b)

  @property
  def inplace_warnings(self) -> tuple[warnings.WarningMessage, ...]:
    return self.candidate.warnings


def untrue_statements(report: CopyReport) -> list[str]:
  """What the causes of `report`'s buffer copies say that the report itself shows
  to be false or empty: an argument named as the operation that reads or updates
  it, an optimization barrier named as an update (a barrier writes nothing), an
  update said to overwrite the buffer without naming any operation; a donated
  buffer said to be reused by no output where the compiled program aliases it to one."""
  arguments = {d.argument for d in report.donations}
  out = []
  said = [c.cause or "" for c in report.copies] + [f.message for f in report.findings]
  for d in report.donations:
    claim = f"no output reuses the buffer of donated {d.argument} "
    if d.aliased_output is not None and any(claim in t for t in said):
      out.append(f"{d.argument} is said to be reused by no output, yet output "
                 f"{d.aliased_output} is aliased to it")
  for c in report.buffer_copies():
    accesses = c.readers + ((c.writer,) if c.writer is not None else ())
    named = [a.op for a in accesses if a.op in arguments]
    if named:
      out.append(f"{c.name}: the argument {named[0]} named as an operation: {c.cause}")
    if c.writer is not None and c.writer.op == "optimization_barrier":
      out.append(f"{c.name}: a barrier named as the update: {c.cause}")
    if c.writer is not None and c.writer.op is None and c.writer.location is None:
      out.append(f"{c.name}: an update without a name: {c.cause}")
  return out


def _report(run: Run) -> CopyReport:
  if run.report is None:
    raise ValueError("this run made no report")
  return run.report


def fresh_arrays(tree: Any) -> Any:
  """Device copies of the array leaves of `tree`, made by XLA (safe to donate)."""
  return jax.tree.map(lambda a: a.copy() if isinstance(a, jax.Array) else a, tree)


def host(tree: Any) -> Any:
  """Host copies of the array leaves of `tree` (typed PRNG keys as their key data):
  what a step returned, kept before the next step donates those buffers."""
  def leaf(x):
    if isinstance(x, jax.Array):
      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
      return np.asarray(x)
    return x
  return jax.tree.map(leaf, tree)


def _chain(fn, make_args, steps: int, next_args) -> tuple[tuple[Any, ...], float, Any]:
  args = make_args()
  jax.block_until_ready(args)
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  outs = [host(out)]
  for _ in range(steps - 1):
    args = next_args(args, out)
    out = jax.block_until_ready(fn(*args))
    outs.append(host(out))
  return tuple(outs), first, out


def run_variant(fn: Callable, make_args: Callable[[], tuple], *, steps: int = 1,
                next_args: Callable[[tuple, Any], tuple] | None = None,
                report: Callable[[], CopyReport | None] | None = None) -> Run:
  """Runs one jitted `fn` over a chain of `steps` calls and reports on it."""
  if steps > 1 and next_args is None:
    raise ValueError("a chain of steps needs next_args(args, outputs)")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    outs, first, final = _chain(fn, make_args, steps, next_args)
    rep = report() if report is not None else None
  return Run(outs, rep, first, tuple(caught), final)


def compare(fn: Callable, make_args: Callable[[], tuple] | Sequence[Any], *,
            donate_argnums: int | Sequence[int] = (),
            static_argnums: int | Sequence[int] = (), steps: int = 1,
            next_args: Callable[[tuple, Any], tuple] | None = None,
            jit_kwargs: dict | None = None, on_copy: Any = "warn",
            min_bytes: int = 1024, **inplace_kwargs) -> Comparison:
  """`fn` under `jax.jit` and under `inplace_jax.jit`, compared.

  Args:
    fn: the function (not jitted).
    make_args: a function of no arguments returning fresh positional arguments, or
      the arguments themselves (copied afresh for each variant).
    donate_argnums, static_argnums: as for `jax.jit`, for both variants.
    steps: how many chained calls; step k+1 gets `next_args(args_k, outputs_k)`.
    jit_kwargs: more `jax.jit` arguments, for both variants.
    on_copy, min_bytes, **inplace_kwargs: for `inplace_jax.jit`.

  Returns:
    A `Comparison`: the outputs, reports, first-call times and warnings of both.
  """
  from ._jit import jit as inplace_jit
  if not callable(make_args):
    template = tuple(make_args)
    make_args = lambda: fresh_arrays(template)  # noqa: E731
  kw = dict(donate_argnums=donate_argnums, static_argnums=static_argnums,
            **(jit_kwargs or {}))
  ref_fn = jax.jit(fn, **kw)
  ours = inplace_jit(fn, on_copy=on_copy, min_bytes=min_bytes, **kw, **inplace_kwargs)
  reference = run_variant(ref_fn, make_args, steps=steps, next_args=next_args,
                          report=lambda: check(ref_fn, *make_args()))
  candidate = run_variant(ours, make_args, steps=steps, next_args=next_args,
                          report=lambda: ours.last_report)
  diff = None
  for k, (a, b) in enumerate(zip(reference.outputs, candidate.outputs, strict=True)):
    d = tree_difference(a, b)
    if d is not None:
      diff = d if steps == 1 else f"step {k + 1}: {d}"
      break
  return Comparison(reference, candidate, diff, ours, ref_fn)
