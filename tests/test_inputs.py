"""Issue 6: bad or unusual input gives a clear error or a correct result."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from conftest import assert_tree_equal, compare, fresh


def _x(dtype=jnp.float32, n=64):
  return (jnp.arange(n * n).reshape(n, n) % 7).astype(dtype)


def test_python_scalar_argument():
  f = lambda x, s: (x.at[0].set(s), x[1] * s)
  r = compare(f, _x(), 3.0)
  assert not r.big_copies()


def test_non_array_argument_is_a_clear_error():
  g = inplace_jax.jit(lambda x, s: x, donate_argnums=0)
  with pytest.raises(TypeError, match="non-array argument"):
    g(_x(), "abc")


def test_same_array_donated_twice_is_a_clear_error():
  g = inplace_jax.jit(lambda x, y: (x.at[0].set(1.0), y.at[1].set(2.0)),
                      donate_argnums=(0, 1))
  a = fresh(_x())
  with pytest.raises(Exception, match="donate the same buffer twice"):
    g(a, a)


def test_argument_donated_twice_in_the_spec():
  with pytest.raises(ValueError, match="more than once"):
    inplace_jax.jit(lambda x: x, donate_argnums=[0, 0])


def test_donated_argument_never_used_warns():
  g = inplace_jax.jit(lambda x, y: y * 2, donate_argnums=0)
  with pytest.warns(inplace_jax.InplaceDonationWarning, match="donated argument"):
    out = g(_x(), jnp.ones(3))
  assert_tree_equal(out, jnp.ones(3) * 2)


def test_donated_argument_returned_unchanged_is_fine():
  r = compare(lambda x: (x, x.sum()), _x())
  assert r.report.copies == ()
  assert r.report.donations[0].aliased_output == (0,)


def test_static_arguments():
  def f(x, k, names):
    y = x[k]
    return x.at[k + 1].set(y * len(names)), y
  r = compare(f, _x(), 3, ("a", "b"), static_argnums=(1, 2))
  assert not r.big_copies()


def test_unhashable_static_argument_is_a_clear_error():
  g = inplace_jax.jit(lambda x, s: x * len(s), static_argnums=1)
  with pytest.raises(ValueError, match="Non-hashable static arguments"):
    g(_x(), [1, 2])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_, jnp.complex64,
                                   jnp.bfloat16, jnp.float16, jnp.uint8])
def test_dtypes(dtype):
  def f(x):
    y = x[0, 0]
    return x.at[0, 0].set(x[1, 1]).at[2].set(x[3]), y
  r = compare(f, _x(dtype))
  assert not r.big_copies(), r.report


def test_zero_size_and_zero_d():
  compare(lambda x: (x.at[0:0].set(1.0), x.sum()), jnp.zeros((0, 5)))
  compare(lambda x: (x + 1.0, x * 2.0), jnp.float32(3.0))


def test_update_of_non_donated_argument_costs_exactly_one_copy():
  f = lambda x: (x.at[0].set(1.0), x[1])
  r = compare(f, _x(), donate_argnums=())
  copies = r.big_copies()
  assert len(copies) == 1 and copies[0].parameter == "x", r.report
  assert not r.report.donations[0].donated


def test_mutable_refs_inside_the_function():
  def f(x):
    r = jax.new_ref(jnp.zeros_like(x))
    r[0] = x[0]
    r[1] = x[1] * 2
    y = x[2]
    return x.at[2].set(r[...][0]), y, r[...]
  r = compare(f, _x(jnp.float32))
  assert not r.big_copies(64 * 64 * 4), r.report


def test_effects_keep_their_order(capfd):
  def f(x):
    jax.debug.print("first {}", x[0, 0])
    y = x[0, 0]
    x = x.at[0, 0].add(1.0)
    jax.debug.print("second {}", x[0, 0])
    return x, y
  inplace_jax.jit(f, donate_argnums=0)(fresh(_x()))
  jax.effects_barrier()
  out = capfd.readouterr().out
  assert out.index("first 0.0") < out.index("second 1.0")


def test_io_callback_order():
  from jax.experimental import io_callback
  seen = []

  def f(x):
    y = x[0, 0]
    io_callback(lambda v: seen.append(("a", float(v))), None, y, ordered=True)
    x = x.at[0, 0].add(1.0)
    io_callback(lambda v: seen.append(("b", float(v))), None, x[0, 0],
                ordered=True)
    return x, y
  r = compare(f, _x())
  jax.effects_barrier()
  assert seen == [("a", 0.0), ("b", 1.0)] * 2   # jax.jit, then inplace_jax.jit


def test_function_raising_during_tracing():
  def f(x):
    raise ValueError("boom in user code")
  with pytest.raises(ValueError, match="boom in user code"):
    inplace_jax.jit(f, donate_argnums=0)(_x())
