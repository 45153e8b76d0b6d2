"""The real-library programs (`inplace_jax.testing.realworld`): first call and warm
call of `inplace_jax.jit` against `jax.jit`, side by side.

* first call: trace, compile, every check and the call itself, each repeat cold
  (`jax.clear_caches()`, a fresh copy of the function, a new jit object), the two
  variants alternating. Target: the geometric mean over the programs of
  inplace/jax <= 1.3.
* warm call: a chain of steps after the first, each variant on its own state, the
  variants interleaved round by round; the median per call. Listed, no target (a
  program inplace_jax changes is faster; one it leaves is jax.jit's program).
* copies: buffer copies and all copies of 1 KiB and more, from the compiled
  programs; which program inplace_jax.jit runs.
"""

from __future__ import annotations

import math
import statistics
import time
import types
import warnings

import jax

import inplace_jax
from inplace_jax._harness import host
from inplace_jax._equal import tree_difference

from ._harness import INPLACE, JAX, target

GROUP = "realworld"
TARGET = 1.3


def _fresh(fn):
  """A new function object with the same code: no cache keyed on `fn` can hit."""
  if not isinstance(fn, types.FunctionType):
    return fn
  new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                           fn.__closure__)
  new.__kwdefaults__ = fn.__kwdefaults__
  return new


def _build(variant, p):
  kw = dict(donate_argnums=p.donate_argnums, static_argnums=p.static_argnums)
  if variant == JAX:
    return jax.jit(_fresh(p.fn), **kw)
  return inplace_jax.jit(_fresh(p.fn), on_copy="ignore", **kw)


def _first_call(variant, p):
  jax.clear_caches()
  f = _build(variant, p)
  args = p.make_args()
  jax.block_until_ready(args)
  t0 = time.perf_counter()
  out = jax.block_until_ready(f(*args))
  return time.perf_counter() - t0, f, args, out


def _warm(fns, states, p, rounds):
  samples = {v: [] for v in fns}
  for i in range(rounds):
    for v in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
      args, out = states[v]
      args = p.next_args(args, out)
      t0 = time.perf_counter()
      out = jax.block_until_ready(fns[v](*args))
      samples[v].append(time.perf_counter() - t0)
      states[v] = (args, out)
  return samples


def _copies(report):
  return {"buffer_copies": len(report.buffer_copies(1024)),
          "buffer_bytes": sum(c.nbytes for c in report.buffer_copies(1024)),
          "copy_bytes": sum(c.nbytes for c in report.copies_over(1024)),
          "program": report.program}


def run(settings) -> list[dict]:
  from inplace_jax.testing import realworld
  repeats = 1 if settings.quick else 3
  rounds = 3 if settings.quick else 15
  rows = []
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for p in realworld.programs():
      first = {JAX: [], INPLACE: []}
      for r in range(repeats):
        for v in ((JAX, INPLACE) if r % 2 == 0 else (INPLACE, JAX)):
          t, f, args, out = _first_call(v, p)
          first[v].append(t)
      fns, states, outs = {}, {}, {}
      for v in (JAX, INPLACE):
        _, fns[v], args, out = _first_call(v, p)
        outs[v] = host(out)
        states[v] = (args, out)
      diff = tree_difference(outs[JAX], outs[INPLACE])
      warm = _warm(fns, states, p, rounds)
      reports = {JAX: inplace_jax.check(fns[JAX], *p.make_args()),
                 INPLACE: fns[INPLACE].last_report}
      row = {"group": GROUP, "case": p.name, "params": {"library": p.library,
                                                        "repeats": repeats},
             "values_ok": diff is None, "values": diff or "exact", "variants": {}}
      for v in (JAX, INPLACE):
        row["variants"][v] = {"first_call_s": statistics.median(first[v]),
                              "first_call_samples_s": first[v],
                              "median_s": statistics.median(warm[v]),
                              **_copies(reports[v])}
      row["ratio_first_call"] = (row["variants"][INPLACE]["first_call_s"]
                                 / row["variants"][JAX]["first_call_s"])
      row["ratio_warm"] = (row["variants"][INPLACE]["median_s"]
                           / row["variants"][JAX]["median_s"])
      rows.append(row)
  if rows:
    geo = math.exp(statistics.mean(math.log(r["ratio_first_call"]) for r in rows))
    for r in rows:
      r["geomean_first_call"] = geo
  jax.clear_caches()
  return rows


def targets(row) -> list[dict]:
  return []


def summary_targets(rows) -> list[dict]:
  if not rows:
    return []
  return [target("first call inplace/jax, geometric mean over the programs",
                 rows[0]["geomean_first_call"], "<=", TARGET)]
