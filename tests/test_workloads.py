"""Realistic programs beyond the issue's list, each against plain `jax.jit`: values
equal bit for bit (`compare`), and no copy of 1 KiB or more left under
inplace_jax.jit (plain `jax.jit` copies in most of them; the copies it makes are
measured, not assumed, in `test_jax_jit_copies_in_most`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from conftest import ON_CPU, compare

_rng = np.random.default_rng(11)


def _f32(*shape):
  return jnp.asarray(_rng.normal(size=shape), jnp.float32)


def sum_tree_update(tree, idx, p):
  """Prioritised replay: set a leaf of a binary sum tree, then fix its ancestors."""
  n = (tree.shape[0] + 1) // 2
  i = idx + n - 1
  delta = p - tree[i]
  tree = tree.at[i].set(p)
  def body(c):
    t, i = c
    i = (i - 1) // 2
    return t.at[i].add(delta), i
  return lax.while_loop(lambda c: c[1] > 0, body, (tree, i))[0]


def sparse_embedding_step(emb, ids, grads, lr):
  """Rows gathered for the loss, then a sparse (repeated-index) gradient step."""
  old = emb[ids]
  return emb.at[ids].add(-lr * grads), old.sum()


def gauss_jordan(a):
  """In-place Gauss-Jordan elimination with partial pivoting."""
  n = a.shape[0]
  def body(k, a):
    p = jnp.argmax(jnp.abs(a[:, k]) * (jnp.arange(n) >= k))
    rk, rp = a[k], a[p]
    a = a.at[k].set(rp).at[p].set(rk)
    a = a.at[k].set(a[k] / a[k, k])
    f = a[:, k].at[k].set(0.0)
    return a - f[:, None] * a[k][None, :]
  return lax.fori_loop(0, n, body, a)


def bubble_sort(x):
  """Nested loops of compare-and-swap on neighbouring elements."""
  n = x.shape[0]
  def outer(i, x):
    def inner(j, x):
      a, b = x[j], x[j + 1]
      return x.at[j].set(jnp.minimum(a, b)).at[j + 1].set(jnp.maximum(a, b))
    return lax.fori_loop(0, n - 1 - i, inner, x)
  return lax.fori_loop(0, n - 1, outer, x)


def ring_buffer_pytree(buf, head, item):
  """A ring buffer of several fields: read the newest entry, insert at the head."""
  i = head % buf["obs"].shape[0]
  last = jax.tree.map(lambda b: b[(i - 1) % b.shape[0]], buf)
  buf = jax.tree.map(lambda b, v: b.at[i].set(v), buf, item)
  return buf, head + 1, last


def particles(state, dt):
  """Simulation state stepped in a while_loop, a reset under `cond` every 10 steps."""
  def step(c):
    pos, vel, t = c
    pos = pos + vel * dt
    hit = pos < 0
    vel = jnp.where(hit, -vel, vel)
    pos = jnp.where(hit, -pos, pos)
    pos = lax.cond(t % 10 == 0, lambda p: p.at[0].set(0.0), lambda p: p, pos)
    return pos, vel, t + 1
  pos, vel, _ = lax.while_loop(lambda c: c[2] < 50, step,
                               (state["pos"], state["vel"], 0))
  return {"pos": pos, "vel": vel}


def needleman_wunsch(score, a, b):
  """A dynamic-programming table filled cell by cell from three neighbours."""
  n, m = score.shape
  def row(i, s):
    def col(j, s):
      match = jnp.where(a[i - 1] == b[j - 1], 1.0, -1.0)
      v = jnp.maximum(jnp.maximum(s[i - 1, j - 1] + match, s[i - 1, j] - 1.0),
                      s[i, j - 1] - 1.0)
      return s.at[i, j].set(v)
    return lax.fori_loop(1, m, col, s)
  return lax.fori_loop(1, n, row, score)


def momentum_step(state, x, y):
  """Training state (params, momentum, step) as a donated pytree."""
  def loss(p):
    return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
  g = jax.grad(loss)(state["params"])
  m = jax.tree.map(lambda m, g: 0.9 * m + g, state["mom"], g)
  p = jax.tree.map(lambda p, m: p - 0.01 * m, state["params"], m)
  return {"params": p, "mom": m, "step": state["step"] + 1}


WORKLOADS = {
    "sum_tree_update": (sum_tree_update,
                        lambda: (jnp.abs(_f32(1023)), jnp.int32(100), jnp.float32(3.0))),
    "sparse_embedding_step": (sparse_embedding_step,
                              lambda: (_f32(1000, 16), jnp.array([3, 7, 3, 9]),
                                       _f32(4, 16), 0.1)),
    "gauss_jordan": (gauss_jordan, lambda: (_f32(32, 32) + 32 * jnp.eye(32),)),
    "bubble_sort": (bubble_sort, lambda: (_f32(300),)),
    "ring_buffer_pytree": (ring_buffer_pytree,
                           lambda: ({"obs": _f32(128, 8), "rew": _f32(128)},
                                    jnp.int32(130),
                                    {"obs": _f32(8), "rew": jnp.float32(1.0)})),
    "particles": (particles,
                  lambda: ({"pos": jnp.abs(_f32(512)), "vel": _f32(512)}, 0.1)),
    "needleman_wunsch": (needleman_wunsch,
                         lambda: (jnp.zeros((33, 33), jnp.float32),
                                  jnp.asarray(_rng.integers(0, 4, 32)),
                                  jnp.asarray(_rng.integers(0, 4, 32)))),
    "momentum_step": (momentum_step,
                      lambda: ({"params": {"w": _f32(64, 8), "b": _f32(8)},
                                "mom": {"w": _f32(64, 8), "b": _f32(8)},
                                "step": jnp.int32(0)}, _f32(32, 64), _f32(32, 8))),
}


# Workloads whose copy-free program would compute some operation differently (the
# copy kept and explained). None at present: Gauss-Jordan elimination was listed
# here (its row elimination's multiply-add over swapped rows) until the kernels'
# IR settled it; `assert_kept_for_arithmetic` now fails where no copy is kept, and
# it showed the workload copy-free and exact.
KEPT_FOR_ARITHMETIC: set[str] = set()


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload_values_exact_and_no_copy(name):
  fn, args = WORKLOADS[name]
  r = compare(fn, *args())
  if name in KEPT_FOR_ARITHMETIC:
    r.assert_kept_for_arithmetic(1024)
    return
  assert not r.report.copies_over(1024), r.report


def test_jax_jit_copies_in_most():
  """The programs are not trivially copy-free: plain jax.jit copies a buffer of
  1 KiB or more in most of them."""
  import inplace_jax
  copying = [name for name, (fn, args) in sorted(WORKLOADS.items())
             if inplace_jax.check(jax.jit(fn, donate_argnums=0), *args()).copies_over(1024)]
  assert len(copying) >= 5 or not ON_CPU, copying
