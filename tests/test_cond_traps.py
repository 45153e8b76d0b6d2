"""Conditionals whose branches pass a buffer through or replace it (elementwise, or
with a fresh value), in either branch order, at the top level and inside loops, and
`switch` with several branches. Under `jax.jit` on CPU a branch that rewrites the
buffer ahead of the pass-through branch copies it (jax#16661, #39449); under
`inplace_jax.jit` they are copy-free and bit-equal, gradients too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from conftest import ON_CPU, compare

SHAPE = (512, 512)
FULL = SHAPE[0] * SHAPE[1] * 4


def _x():
  return jnp.asarray(np.random.default_rng(0).normal(size=SHAPE), jnp.float32)


def elementwise_first(x, p):
  return lax.cond(p, lambda x: x, lambda x: x * 0.5 + 1.0, x)


def fresh_first(x, p):
  return lax.cond(p, lambda x: x, lambda x: jnp.zeros_like(x), x)


def elementwise_both(x, p):
  return lax.cond(p, lambda x: x * 2.0, lambda x: x - 1.0, x)


def elementwise_first_then_read(x, p):
  y = lax.cond(p, lambda x: x, lambda x: x * 0.5 + 1.0, x)
  return y, y[3].sum()


def elementwise_first_in_fori(x, p):
  def body(i, x):
    return lax.cond(x[0, 0] > i, lambda x: x, lambda x: x * 0.5 + 1.0, x)
  return lax.fori_loop(0, 4, body, x)


def switch_three(x, k):
  return lax.switch(k, [lambda x: x, lambda x: x * 2.0, lambda x: x.at[1].add(1.0)],
                    x)


def switch_in_scan(x, k):
  def body(x, i):
    x = lax.switch((i + k) % 3, [lambda x: x * 0.9, lambda x: x,
                                 lambda x: x.at[i].set(2.0)], x)
    return x, x[0, 0]
  return lax.scan(body, x, jnp.arange(5))


CASES = {
    "elementwise_first_taken": (elementwise_first, lambda: (_x(), jnp.bool_(False))),
    "elementwise_first_passed": (elementwise_first, lambda: (_x(), jnp.bool_(True))),
    "fresh_first_taken": (fresh_first, lambda: (_x(), jnp.bool_(False))),
    "fresh_first_passed": (fresh_first, lambda: (_x(), jnp.bool_(True))),
    "elementwise_both": (elementwise_both, lambda: (_x(), jnp.bool_(True))),
    "elementwise_first_then_read": (elementwise_first_then_read,
                                    lambda: (_x(), jnp.bool_(False))),
    "elementwise_first_in_fori": (elementwise_first_in_fori,
                                  lambda: (_x(), jnp.bool_(True))),
    "switch_three": (switch_three, lambda: (_x(), jnp.int32(1))),
    "switch_three_identity": (switch_three, lambda: (_x(), jnp.int32(0))),
    "switch_in_scan": (switch_in_scan, lambda: (_x(), jnp.int32(0))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conditional_copy_free_and_exact(name):
  fn, make_args = CASES[name]
  r = compare(fn, *make_args(), donate_argnums=(0,))
  if ON_CPU:
    assert r.ref_report.buffer_copies(FULL), "jax.jit should copy the buffer here"
  assert r.report.buffer_copies(FULL) == (), r.report


@pytest.mark.parametrize("name", ["elementwise_first_taken", "fresh_first_passed",
                                  "switch_in_scan"])
def test_gradient_equal(name):
  fn, make_args = CASES[name]
  x, arg = make_args()
  def loss(x):
    return sum(jnp.sum(o) for o in jax.tree.leaves(fn(x, arg)))
  ref = jax.jit(jax.grad(loss))(x)
  ours = inplace_jax.jit(jax.grad(loss), on_copy="ignore")(x)
  np.testing.assert_array_equal(np.asarray(ref), np.asarray(ours))


def scatter_other_buffer_in_branch(x, y, p):
  """Branch 0 updates x at gathered columns and y (which jax.jit updates in place in
  the branch), branch 1 updates rows of x; both read a row of x taken before. The
  lowered conditional carries y too: passed into its loops as a constant, y was
  copied to be updated (fuzz seed 2035 #148)."""
  row = x[28, 13:16]
  def update_both(x, y):
    x = x.at[:, jnp.array([9, 7, 19])].set(jnp.resize(row, (x.shape[0], 3)))
    y = y.at[jnp.array([28, 4])].min(jnp.resize(row, (2, y.shape[1])),
                                      unique_indices=True)
    return x, y
  def update_rows(x, y):
    x = x.at[22:24].set(jnp.resize(row, (2, x.shape[1])))
    return x.at[8].add(jnp.resize(row, (x.shape[1],))), y
  x, y = lax.cond(p, update_both, update_rows, x, y)
  return x, y, row


@pytest.mark.parametrize("taken", [True, False])
def test_branch_updating_another_buffer_is_carried(taken):
  rng = np.random.default_rng(0)
  x, y = (jnp.asarray(rng.normal(size=(32, 24)), jnp.float32) for _ in range(2))
  r = compare(scatter_other_buffer_in_branch, x, y, jnp.bool_(taken),
              donate_argnums=(0, 1))
  if ON_CPU:
    assert {c.buffer for c in r.ref_report.buffer_copies(1024)} == {"x"}, r.ref_report
    assert r.report.buffer_copies(1024) == (), r.report


def switch_reads_closed_over_buffer(x, i):
  """A branch sets rows of x, then reads the x it closed over (the old value):
  the conditional takes x twice, as its operand and as a closed-over value. Taken
  once, the branch's read is a read of the buffer it updates, and is ordered
  before the update (fuzz seed 2035 #235)."""
  old = x
  def set_rows(x):
    x = x.at[jnp.array([6, 11])].set(-2.0, indices_are_sorted=True)
    return x, jnp.max(old * old)
  def keep(x):
    return x, jnp.float32(0)
  def add_row(x):
    return x.at[3].add(1.0), jnp.float32(1)
  x, m = lax.switch(i, [set_rows, keep, add_row], x)
  return x, m


@pytest.mark.parametrize("index", [0, 1, 2])
def test_closed_over_operand_is_the_buffer(index):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(32, 24)), jnp.float32)
  r = compare(switch_reads_closed_over_buffer, x, jnp.int32(index), donate_argnums=(0,))
  if ON_CPU:
    assert r.ref_report.buffer_copies(1024), "jax.jit should copy x here"
    assert r.report.buffer_copies(1024) == (), r.report


def test_pass_through_branch_copy_names_the_branch():
  # Under jax.jit the branch that returns the buffer unchanged copies it; its
  # cause says so (it said "for a later use", naming no read).
  def f(x, p):
    def update(x):
      x = lax.dynamic_update_slice(x, jnp.full((11, 5), 2.0, x.dtype),
                                   (jnp.argmin(x[:, 14]) % 6, jnp.int32(12)))
      return x, jnp.sum(jnp.abs(x))
    return lax.cond(p, lambda x: (x, jnp.float32(0)), update, x)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 33)), jnp.float32)
  r = compare(f, x, jnp.bool_(True), donate_argnums=(0,))
  if not ON_CPU:
    pytest.skip("the copy is XLA:CPU's")
  passed = [c for c in r.ref_report.buffer_copies(1024) if c.role == "branch"
            and "returns x unchanged" in (c.cause or "")]
  assert passed, r.ref_report
  assert all(c.readers == () and c.writer is None for c in passed)
  assert not r.report.buffer_copies(1024), r.report
