"""`jax.vmap` of a `while_loop` whose trip count differs between batch elements (a
batched predicate, jax#13522): JAX lowers it with a whole-buffer select per step, and
XLA copies each buffer the body writes, every step. inplace_jax writes the loop out
with each write predicated at its own size (`_rules/loops.scalar_predicate_while`):
copy-free, values (and forward-mode derivatives) bit-equal to `jax.jit`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from conftest import ON_CPU, compare

B, T, D = 8, 32, 256


def solve_and_save(y0, buf, tend):
  """Steps an ODE-like update until `tend`, saving each state in row i."""
  def cond(c):
    t, _, _, _ = c
    return t < tend
  def body(c):
    t, y, buf, i = c
    y = y * 0.9 + 0.1
    buf = lax.dynamic_update_slice(buf, y[None], (i, 0))
    return t + 0.1, y, buf, i + 1
  return lax.while_loop(cond, body, (0.0, y0, buf, 0))[1:3]


def two_buffers_and_a_read(y0, buf, log, tend):
  """Two buffers written per step, one read back (the previous row) first."""
  def cond(c):
    return c[0] < tend
  def body(c):
    t, y, buf, log, i = c
    prev = buf[jnp.maximum(i - 1, 0)]
    y = 0.5 * (y + prev) + 0.25
    buf = buf.at[i].set(y)
    log = log.at[i, 0].set(t)
    return t + 0.2, y, buf, log, i + 1
  return lax.while_loop(cond, body, (0.0, y0, buf, log, 0))[1:4]


def nested_in_fori(y0, buf, tend):
  """The batched-predicate loop inside a fori_loop of two sweeps."""
  def sweep(k, c):
    y, buf = c
    return solve_and_save(y + k, buf, tend)
  return lax.fori_loop(0, 2, sweep, (y0, buf))


def scatter_add_write(y0, buf, tend):
  """A write that accumulates (`.at[i].add`): selected whole, as JAX does."""
  def cond(c):
    return c[0] < tend
  def body(c):
    t, y, buf, i = c
    y = y * 0.5 + 1.0
    return t + 0.25, y, buf.at[i % T].add(y), i + 1
  return lax.while_loop(cond, body, (0.0, y0, buf, 0))[1:3]


def _args(*extra):
  rng = np.random.default_rng(0)
  y0 = jnp.asarray(rng.normal(size=(B, D)), jnp.float32)
  buf = jnp.zeros((B, T, D), jnp.float32)
  tend = jnp.linspace(0.5, 2.5, B, dtype=jnp.float32)
  return (y0, buf, *extra, tend)


CASES = {
    "solve_and_save": (solve_and_save, lambda: _args(), (1,)),
    "two_buffers_and_a_read": (two_buffers_and_a_read,
                               lambda: _args(jnp.zeros((B, T, 4), jnp.float32)), (1, 2)),
    "nested_in_fori": (nested_in_fori, lambda: _args(), (1,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batched_loop_copy_free_and_exact(name):
  fn, make_args, donate = CASES[name]
  r = compare(jax.vmap(fn), *make_args(), donate_argnums=donate)
  full = B * T * D * 4
  if ON_CPU:
    assert r.ref_report.buffer_copies(full), "jax.jit should copy the buffer here"
  assert r.report.buffer_copies(1024) == (), r.report


def test_accumulating_write_is_exact_and_no_worse():
  compare(jax.vmap(scatter_add_write), *_args(), donate_argnums=(1,))


def test_forward_derivative_equal():
  """jvp through the rewritten loop equals jax.jit's, bit for bit."""
  y0, buf, tend = _args()
  def f(y0):
    return jax.vmap(solve_and_save)(y0, buf, tend)
  tangent = jnp.ones_like(y0)
  ref = jax.jit(lambda y: jax.jvp(f, (y,), (tangent,)))(y0)
  ours = inplace_jax.jit(lambda y: jax.jvp(f, (y,), (tangent,)), on_copy="ignore")(y0)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(ours), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_plan_says_the_loop_was_predicated():
  """Plan level: the batched loop is restructured, the scalar one is not."""
  y0, buf, tend = _args()
  closed = jax.make_jaxpr(jax.vmap(solve_and_save))(y0, buf, tend)
  _, plan = inplace_jax.sequence_jaxpr(closed, [False, True, False])
  assert plan.stats()["predicated_loops"] == 1
  assert "batched loop(s) predicated" in str(plan)
  closed = jax.make_jaxpr(solve_and_save)(y0[0], buf[0], tend[0])
  _, plan = inplace_jax.sequence_jaxpr(closed, [False, True, False])
  assert plan.stats()["predicated_loops"] == 0
