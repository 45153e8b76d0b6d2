"""JAX Refs (`jax.new_ref`, `r[i]`, `r[i] = v`, `r[i] += v`, `jax.ref.freeze`) under
`inplace_jax.jit`: values equal to `jax.jit`'s, copy-free wherever the functional
spelling of the same program is, and no finding that is false."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from inplace_jax._harness import compare

N = 256


def _x():
  return jnp.asarray(np.random.default_rng(3).normal(size=(N, N)), jnp.float32)


def straight(x):
  r = jax.new_ref(x)
  y = r[0, 0]
  r[0, 0] += 1.0
  return jax.ref.freeze(r), y


def straight_functional(x):
  y = x[0, 0]
  return x.at[0, 0].add(1.0), y


def loop(x):
  r = jax.new_ref(x)
  def body(i, acc):
    v = r[i + 1]
    r[i] = v * 0.5
    return acc + r[0].sum()
  s = lax.fori_loop(0, 10, body, jnp.float32(0))
  return jax.ref.freeze(r), s


def loop_functional(x):
  def body(i, c):
    x, acc = c
    x = x.at[i].set(x[i + 1] * 0.5)
    return x, acc + x[0].sum()
  x, s = lax.fori_loop(0, 10, body, (x, jnp.float32(0)))
  return x, s


def branch(x, p):
  r = jax.new_ref(x)
  y = r[3]
  def swap():
    r[3] = r[4]
    r[4] = y
  lax.cond(p, swap, lambda: None)
  return jax.ref.freeze(r), y.sum()


def branch_functional(x, p):
  y = x[3]
  x = lax.cond(p, lambda x: x.at[3].set(x[4]).at[4].set(y), lambda x: x, x)
  return x, y.sum()


def several(x, z):
  a, b = jax.new_ref(x), jax.new_ref(z)
  row = a[1]
  a[1] = b[2]
  b[2] = row
  return jax.ref.freeze(a), jax.ref.freeze(b)


def several_functional(x, z):
  row = x[1]
  return x.at[1].set(z[2]), z.at[2].set(row)


def pytree(state):
  refs = jax.tree.map(jax.new_ref, state)
  old = refs["k"][5]
  refs["k"][5] = refs["v"][5]
  refs["v"][5] += old
  return jax.tree.map(jax.ref.freeze, refs), old.sum()


def pytree_functional(state):
  k, v = state["k"], state["v"]
  old = k[5]
  return {"k": k.at[5].set(v[5]), "v": v.at[5].add(old)}, old.sum()


CASES = {
    "straight": (straight, straight_functional, lambda: (_x(),), (0,)),
    "loop": (loop, loop_functional, lambda: (_x(),), (0,)),
    "branch": (branch, branch_functional, lambda: (_x(), jnp.bool_(True)), (0,)),
    "several": (several, several_functional, lambda: (_x(), _x() * 2), (0, 1)),
    "pytree": (pytree, pytree_functional, lambda: ({"k": _x(), "v": _x() + 1},), (0,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ref_program_exact_and_copy_free_as_its_functional_spelling(name):
  fn, functional, make_args, donate = CASES[name]
  c = compare(fn, make_args, donate_argnums=donate, on_copy="ignore")
  assert c.equal, c.difference
  f = compare(functional, make_args, donate_argnums=donate, on_copy="ignore")
  assert f.equal, f.difference
  ours = c.candidate.report.buffer_copies(1024)
  functional_copies = f.candidate.report.buffer_copies(1024)
  assert len(ours) <= len(functional_copies), (c.candidate.report, f.candidate.report)
  assert c.copy_bytes()[1] <= c.copy_bytes()[0]
  # No finding says a returned buffer is not returned, or a copy that is not there.
  if not ours:
    assert c.candidate.report.findings == ()


def test_ref_argument_passed_in():
  """A Ref passed to the function is updated by JAX itself, as under jax.jit."""
  def h(r):
    y = r[0, 0]
    r[0, 0] += 1.0
    return y
  ref_r, our_r = jax.new_ref(_x()), jax.new_ref(_x())
  ref_y = jax.jit(h)(ref_r)
  our_y = inplace_jax.jit(h)(our_r)
  np.testing.assert_array_equal(np.asarray(ref_y), np.asarray(our_y))
  np.testing.assert_array_equal(np.asarray(ref_r[...]), np.asarray(our_r[...]))


@pytest.mark.parametrize("op", ["swap", "update", "after"])
def test_helper_ops_say_they_take_arrays(op):
  r = jax.new_ref(_x())
  call = {"swap": lambda: inplace_jax.swap(r, 0, jnp.ones(N)),
          "update": lambda: inplace_jax.update(r, 0, lambda v: v + 1),
          "after": lambda: inplace_jax.after(r, jnp.ones(3))}[op]
  with pytest.raises(TypeError, match="not a JAX Ref"):
    call()


def _escapes(x):
  r = jax.new_ref(x)
  y = r[...]
  r[0, 0] += 1.0      # the write the copy is blamed on
  return jax.ref.freeze(r), y


def _escapes_functional(x):
  y = x
  return x.at[0, 0].add(1.0), y


def test_remaining_copy_is_explained_in_ref_terms():
  """A copy no order removes (the old value is returned with the new one) names the
  Ref write that forces it, with its line; the functional spelling's report does not
  speak of Refs."""
  import inspect
  line = inspect.getsourcelines(_escapes)[1] + 3
  c = compare(_escapes, lambda: (_x(),), donate_argnums=(0,), on_copy="ignore")
  assert c.equal, c.difference
  copies = c.candidate.report.buffer_copies(1024)
  assert copies
  assert any(c_.writer is not None and "(a Ref write)" in (c_.writer.op or "")
             and c_.writer.location.line == line for c_ in copies), copies
  assert all(f"(a Ref write) at {__file__}:{line}" in (c_.cause or "")
             for c_ in copies if c_.writer is not None)
  f = compare(_escapes_functional, lambda: (_x(),), donate_argnums=(0,),
              on_copy="ignore")
  assert f.equal, f.difference
  assert "Ref" not in str(f.candidate.report)
