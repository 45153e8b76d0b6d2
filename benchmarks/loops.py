"""The loop and conditional programs of issue 4, under each variant side by side.

Where plain `jax.jit` already compiles a program without a buffer copy, the
barriers `inplace_jax.jit` adds must not slow it down: target inplace/jax <= 1.2.
Where `jax.jit` copies, the row shows what removing the copies buys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._harness import INPLACE, JAX, Case, copy_count, target

GROUP = "loops"
NO_COPY_SLOWDOWN = 1.2


# Every program takes a donated matrix `x` [n, m] and a step counter `t` (threaded,
# so conditionals alternate their branch from call to call) and returns both.


def roll_rows(x, t):
  """The in-place `roll` of openxla/xla#20440: read the last row, shift, write row 0."""
  n = x.shape[0]
  last = x[n - 1]
  def body(k, x):
    j = n - 1 - k
    return x.at[j].set(x[j - 1])
  x = lax.fori_loop(0, n - 1, body, x)
  return x.at[0].set(last), t + 1


def scan_prev_row(x, t):
  """A scan whose body reads row t-1 and writes row t."""
  def body(x, i):
    prev = x[i - 1]
    x = x.at[i].set(prev * 0.5 + 1.0)
    return x, prev[0]
  x, firsts = lax.scan(body, x, jnp.arange(1, x.shape[0]))
  return x.at[0, 0].set(firsts[-1]), t + 1


def while_dp(x, t):
  """A while_loop filling a DP table row by row from its neighbours in the row above."""
  n = x.shape[0]
  def cond(c):
    return c[0] < n
  def body(c):
    i, x = c
    up = x[i - 1]
    left = jnp.concatenate([up[:1], up[:-1]])
    right = jnp.concatenate([up[1:], up[-1:]])
    x = x.at[i].set(jnp.minimum(jnp.minimum(left, right), up) + x[i] * 0.5)
    return i + 1, x
  _, x = lax.while_loop(cond, body, (jnp.int32(1), x))
  return x, t + 1


def scan_prev_row_unrolled(x, t):
  """`scan_prev_row` with `unroll=4`: steps side by side in one XLA loop body."""
  def body(x, i):
    prev = x[i - 1]
    return x.at[i].set(prev * 0.5 + 1.0), prev[0]
  x, firsts = lax.scan(body, x, jnp.arange(1, x.shape[0]), unroll=4)
  return x.at[0, 0].set(firsts[-1]), t + 1


def nested_loops(x, t):
  """Two nested fori_loops: x[i, j] = x[i-1, j] + x[i, j-1], cell by cell."""
  rows, cols = min(x.shape[0], 32), min(x.shape[1], 32)
  def outer(i, x):
    def inner(j, x):
      return x.at[i, j].set(x[i - 1, j] * 0.5 + x[i, j - 1] * 0.25)
    return lax.fori_loop(1, cols, inner, x)
  return lax.fori_loop(1, rows, outer, x), t + 1


def cond_two_rows(x, t):
  """A cond whose two branches update different rows."""
  y = x[2]
  x = lax.cond(t % 2 == 0, lambda x: x.at[0].set(y + 1.0),
               lambda x: x.at[1].set(y * 2.0), x)
  return x, t + 1


def switch_three(x, t):
  """A switch with three branches, one the identity."""
  y = x[3]
  x = lax.switch(t % 3, [lambda x: x.at[0].set(y), lambda x: x,
                         lambda x: x.at[1].add(y)], x)
  return x, t + 1


def cond_in_scan(x, t):
  """A cond that updates inside a scan: even steps write row i from row i-1."""
  def body(x, i):
    prev = x[i - 1]
    x = lax.cond(i % 2 == 0, lambda x: x.at[i].set(prev + 1.0), lambda x: x, x)
    return x, None
  x, _ = lax.scan(body, x, jnp.arange(1, x.shape[0]))
  return x, t + 1


def cond_swap(x, t):
  """A cond whose branch swaps two rows."""
  def swap(x):
    r0, r1 = x[0], x[1]
    return x.at[0].set(r1).at[1].set(r0)
  return lax.cond(t % 2 == 0, swap, lambda x: x, x), t + 1


def cond_chain(x, t):
  """A cond whose branch chains updates, including a scatter-add with repeated indices."""
  idx = jnp.array([0, 2, 2, 5, 0], jnp.int32)
  def chain(x):
    r = x[4]
    x = x.at[1].set(r * 2.0)
    x = x.at[3].set(x[1] + 1.0)
    return x.at[idx].add(jnp.ones((idx.shape[0], x.shape[1]), x.dtype))
  return lax.cond(t % 2 == 0, chain, lambda x: x, x), t + 1


def swap_rows_fori(x, t):
  """fori_loop swapping rows i and p (p derived from i) each iteration."""
  n = x.shape[0]
  def body(i, x):
    p = (i * 7 + 3) % n
    ri, rp = x[i], x[p]
    return x.at[i].set(rp).at[p].set(ri)
  return lax.fori_loop(0, n, body, x), t + 1


def floor(x, t):
  return x, t + 1


def make(n, m):
  @jax.jit
  def make_args():
    x = (jnp.arange(n * m, dtype=jnp.float32).reshape(n, m) % 31.0) * 0.125
    return x, jnp.int32(0)
  return make_args


PROGRAMS = (
    ("fori swap rows i,p", swap_rows_fori),
    ("in-place roll (fori)", roll_rows),
    ("scan reads t-1 writes t", scan_prev_row),
    ("same scan, unroll=4", scan_prev_row_unrolled),
    ("while DP table", while_dp),
    ("nested fori 2-level", nested_loops),
    ("cond two rows", cond_two_rows),
    ("switch 3 (one identity)", switch_three),
    ("cond inside scan", cond_in_scan),
    ("cond branch swaps rows", cond_swap),
    ("cond chain + scatter-add", cond_chain),
)


def cases(quick: bool) -> list[Case]:
  n, m = (128, 128) if quick else (512, 512)
  out = []
  for name, fn in PROGRAMS:
    out.append(Case(
        name=name, group=GROUP, fn=fn, floor=floor, make_args=make(n, m),
        donate=(0,), thread=lambda o, a: (o[0], o[1]), params={"shape": [n, m]}))
  return out


def targets(row) -> list[dict]:
  """inplace/jax <= 1.2 where jax.jit had no buffer copy."""
  if copy_count(row, JAX) != 0 or copy_count(row, INPLACE) is None:
    return []
  return [target("no-copy slowdown inplace/jax", row["ratios"]["inplace/jax"], "<=",
                 NO_COPY_SLOWDOWN)]

