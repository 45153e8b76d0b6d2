"""The transform alone (`inplace_jax.sequence_jaxpr`) on generated programs.

A generated program threads three donated buffers through a long straight-line
sequence of the patterns real code has: a static read feeding an update of another
buffer (`y = x[i]; x = x.at[j].set(y * 2 + z)`), dynamic-index reads and
read-modify-writes, reads the user wrote *after* an update (which the analysis has to
move ahead), and calls of a few nested jits. It is traced once per size; only
`sequence_jaxpr` is timed (median of repeats). Sizes 1k, 2k, 5k and 10k equations
show how it scales; target: <= 1 s at 10k.

At the smallest size the transformed jaxpr is also compiled and run, and its values
compared exactly with the original's.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax import lax

import inplace_jax

from ._harness import same_values, target

GROUP = "transform"
FULL_SIZES = (1000, 2000, 5000, 10000)
QUICK_SIZES = (250, 500, 1000)
TARGET_EQNS = 10000
TARGET_S = 1.0
ROWS, COLS, NIDX = 64, 16, 8


@jax.jit
def _inner_shift(x, z):
  y = x[1]
  return x.at[0].set(y + z), z * 0.9


@jax.jit
def _inner_rmw(x, i):
  return x.at[i].add(1.0)


@jax.jit
def _inner_swap(x):
  r0, r1 = x[2], x[3]
  return x.at[2].set(r1).at[3].set(r0)


def program(iters: int):
  """A straight-line program of `iters` read/update patterns over three buffers."""
  def prog(a, b, c, z, idx):
    bufs = [a, b, c]
    for k in range(iters):
      s, d = k % 3, (k * 7 + 1) % 3
      i, j = (k * 13) % ROWS, (k * 29 + 5) % ROWS
      kind = k % 8
      if kind in (0, 1, 2):
        y = bufs[s][i]
        bufs[d] = bufs[d].at[j].set(y * 2.0 + z)
      elif kind == 3:
        y = lax.dynamic_index_in_dim(bufs[s], idx[k % NIDX], keepdims=False)
        bufs[d] = bufs[d].at[idx[(k + 1) % NIDX]].add(jnp.sin(y))
      elif kind == 4:
        old = bufs[d]
        bufs[d] = old.at[j].set(z)
        z = z + old[i] * 0.5              # a read of the old version, after the update
      elif kind == 5:
        bufs[d], z = _inner_shift(bufs[d], z)
      elif kind == 6:
        bufs[d] = _inner_rmw(bufs[d], idx[k % NIDX])
        bufs[s] = _inner_swap(bufs[s])
      else:
        m = jnp.maximum(bufs[s][i], bufs[d][j])
        z = jnp.tanh(z + m)
    return bufs[0], bufs[1], bufs[2], z
  return prog


def _args():
  a = jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS) % 7.0
  return (a, a + 1.0, a * 0.5, jnp.linspace(0.0, 1.0, COLS, dtype=jnp.float32),
          (jnp.arange(NIDX, dtype=jnp.int32) * 11) % ROWS)


def count_eqns(jaxpr) -> int:
  """Equations, counting each distinct sub-jaxpr once (as the memoised walker does)."""
  seen = set()
  def walk(j):
    if id(j) in seen:
      return 0
    seen.add(id(j))
    n = len(j.eqns)
    for e in j.eqns:
      for sub in jex.jaxprs_in_params(e.params):
        n += walk(sub)
    return n
  return walk(jaxpr)


def traced(n_eqns: int, args):
  """The closed jaxpr of a generated program with about `n_eqns` equations."""
  probe = jax.make_jaxpr(program(80))(*args)
  per_iter = len(probe.jaxpr.eqns) / 80
  iters = max(1, round(n_eqns / per_iter))
  return jax.make_jaxpr(program(iters))(*args), iters


def _time_transform(cj, donated, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    inplace_jax.sequence_jaxpr(cj, donated)
    out.append(time.perf_counter() - t0)
  return out


def _check_values(cj, new_cj, args) -> tuple[bool, str]:
  ref = jax.jit(jex.jaxpr_as_fun(cj))(*args)
  got = jax.jit(jex.jaxpr_as_fun(new_cj),
                compiler_options=inplace_jax.compiler_options())(*args)
  return same_values(ref, got)


def run(settings) -> list[dict]:
  sizes = QUICK_SIZES if settings.quick else FULL_SIZES
  repeats = 3 if settings.quick else 5
  args = _args()
  donated = [True, True, True, False, False]
  rows = []
  for n in sizes:
    t0 = time.perf_counter()
    cj, iters = traced(n, args)
    trace_s = time.perf_counter() - t0
    samples = _time_transform(cj, donated, repeats)
    new_cj, plan = inplace_jax.sequence_jaxpr(cj, donated)
    row = {"group": GROUP, "case": f"sequence_jaxpr {len(cj.jaxpr.eqns)} eqns",
           "params": {"target_eqns": n, "iters": iters,
                      "top_eqns": len(cj.jaxpr.eqns),
                      "eqns_with_subjaxprs": count_eqns(cj.jaxpr),
                      "out_eqns": len(new_cj.jaxpr.eqns)},
           "trace_s": trace_s, "median_s": statistics.median(samples),
           "samples_s": samples, "plan": plan.stats()}
    row["us_per_eqn"] = row["median_s"] / len(cj.jaxpr.eqns) * 1e6
    if n == sizes[0]:
      row["values_ok"], row["values"] = _check_values(cj, new_cj, args)
    rows.append(row)
  base = rows[0]
  for row in rows:
    row["scaling"] = row["us_per_eqn"] / base["us_per_eqn"]
  return rows


def targets(row) -> list[dict]:
  out = []
  if row["params"]["target_eqns"] == TARGET_EQNS:
    out.append(target("sequence_jaxpr at 10k eqns (s)", row["median_s"], "<=", TARGET_S))
  return out
