"""The classic JAX copy traps, under each variant side by side.

`jax.vmap` of a `while_loop` whose trip count differs between batch elements (jax#13522):
JAX lowers it with a whole-buffer select per step and XLA copies the buffer each
step; inplace_jax predicates each write at its own size. Target where jax.jit copies:
jax/inplace >= 10 per call. The same loop with one trip count for every element (no
batched predicate, no copy under jax.jit): inplace/jax <= 1.2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._harness import INPLACE, JAX, Case, buffer_copy_count, target

GROUP = "traps"
SPEEDUP = 10.0
NO_COPY_SLOWDOWN = 1.2


def _solve_and_save(y0, buf, tend):
  def cond(c):
    return c[0] < tend
  def body(c):
    t, y, buf, i = c
    y = y * 0.9 + 0.1
    return t + 0.1, y, lax.dynamic_update_slice(buf, y[None], (i, 0)), i + 1
  _, y, buf, _ = lax.while_loop(cond, body, (jnp.float32(0), y0, buf, jnp.int32(0)))
  return y, buf


def batched_trip_counts(buf, y0, tend):
  """vmap of a solve-and-save loop, each element with its own end time."""
  y, buf = jax.vmap(_solve_and_save)(y0, buf, tend)
  return buf, y, tend


def shared_trip_count(buf, y0, tend):
  """The same loop, every element stopping at the first end time: no batched
  predicate, no copy under jax.jit."""
  y, buf = jax.vmap(_solve_and_save, in_axes=(0, 0, None))(y0, buf, tend[0])
  return buf, y, tend


def floor(buf, y0, tend):
  return buf, y0, tend


def make(b, t, d):
  @jax.jit
  def make_args():
    buf = jnp.zeros((b, t, d), jnp.float32)
    y0 = (jnp.arange(b * d, dtype=jnp.float32).reshape(b, d) % 7.0) * 0.125
    tend = jnp.linspace(0.35, 0.95, b, dtype=jnp.float32)
    return buf, y0, tend
  return make_args


PROGRAMS = (
    ("vmap while, batched trip counts", batched_trip_counts),
    ("vmap while, one trip count", shared_trip_count),
)


def cases(quick: bool) -> list[Case]:
  b, t, d = (4, 16, 256) if quick else (16, 16, 16384)
  return [Case(name=name, group=GROUP, fn=fn, floor=floor, make_args=make(b, t, d),
               donate=(0,), thread=lambda o, a: (o[0], a[1], a[2]),
               params={"shape": [b, t, d]})
          for name, fn in PROGRAMS]


def targets(row) -> list[dict]:
  jax_copies, ours = buffer_copy_count(row, JAX), buffer_copy_count(row, INPLACE)
  if jax_copies is None or ours is None:
    return []
  if jax_copies:
    return [target("trap speedup jax/inplace", row["ratios"]["jax/inplace"], ">=",
                   SPEEDUP)]
  return [target("no-copy slowdown inplace/jax", row["ratios"]["inplace/jax"], "<=",
                 NO_COPY_SLOWDOWN)]
