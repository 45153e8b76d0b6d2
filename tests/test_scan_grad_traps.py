"""Gradients through a `scan` that writes `ys.at[t].set(h)` into a preallocated
buffer (jax#15906, #10197). The backward scan carries the buffer's cotangent, reads
row t of it and zeroes (or keeps) it; under `jax.jit` on CPU XLA copies the whole
cotangent buffer every step (twice), a temporary no donated buffer flows into.
`inplace_jax.jit` sequences the loop: the row is read, the step's arithmetic runs
as XLA fuses it under jax.jit, and the results are tied before the row is written.
Values and gradients bit-equal to `jax.jit`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from conftest import ON_CPU, compare
from inplace_jax._jit import LOOP_TEMPORARY_BYTES

T, D = 64, 512


def _w(k=0):
  return jnp.asarray(np.random.default_rng(k).normal(size=(D, D)) * 0.04, jnp.float32)


def _xs(k=1):
  return jnp.asarray(np.random.default_rng(k).normal(size=(T, D)), jnp.float32)


def _rnn_into(w, xs, ys, write):
  """The RNN's scan, each step's `h` written into row t of `ys` by `write`."""
  def step(carry, t):
    h, ys = carry
    h = jnp.tanh(w @ h + xs[t])
    return (h, write(ys.at[t], h)), None
  (_, ys), _ = lax.scan(step, (jnp.zeros((D,), jnp.float32), ys), jnp.arange(T))
  return ys


def rnn_set(w, xs):
  ys = _rnn_into(w, xs, jnp.zeros((T, D), jnp.float32), lambda at, h: at.set(h))
  return jnp.sum(ys * ys)


def rnn_add(w, xs):
  """The buffer accumulated into (`.at[t].add`): its cotangent passes through."""
  ys = _rnn_into(w, xs, jnp.ones((T, D), jnp.float32), lambda at, h: at.add(h))
  return jnp.sum(jnp.sin(ys))


def rnn_two_buffers(w, xs):
  hs = jnp.zeros((T, D), jnp.float32)
  zs = jnp.zeros((T, D), jnp.float32)
  def step(carry, t):
    h, hs, zs = carry
    z = w @ h + xs[t]
    h = jnp.tanh(z)
    return (h, hs.at[t].set(h), zs.at[t].set(z)), None
  (_, hs, zs), _ = lax.scan(step, (jnp.zeros((D,), jnp.float32), hs, zs),
                            jnp.arange(T))
  return jnp.sum(hs * zs)


def rnn_fori(w, xs):
  ys = jnp.zeros((T, D), jnp.float32)
  def body(t, carry):
    h, ys = carry
    h = jnp.tanh(w @ h + xs[t])
    return h, ys.at[t].set(h)
  _, ys = lax.fori_loop(0, T, body, (jnp.zeros((D,), jnp.float32), ys))
  return jnp.mean(ys ** 2)


def sgd(loss):
  def train(w, xs):
    l, g = jax.value_and_grad(loss)(w, xs)
    return w - 0.01 * g, l
  return train


def grads_both(loss):
  return jax.grad(loss, argnums=(0, 1))


def _fill_copies(report):
  """Copies of a buffer-sized fill (a broadcast of a constant)."""
  return [c for c in report.copies
          if c.nbytes >= T * D * 4 and "broadcast" in (c.operand or "")]


LOSSES = {"set": rnn_set, "two_buffers": rnn_two_buffers, "fori": rnn_fori}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_backward_scan_updates_cotangent_in_place(name):
  r = compare(sgd(LOSSES[name]), _w(), _xs(), donate_argnums=(0,))
  if ON_CPU:
    assert r.ref_report.loop_temporaries(LOOP_TEMPORARY_BYTES), \
        "jax.jit should copy the cotangent buffer in its backward loop"
    assert r.report.loop_temporaries(LOOP_TEMPORARY_BYTES) == (), r.report
    assert "in loop bodies" in r.report.decision, r.report.decision
    # The forward loop's zero-filled starts (the buffer, the residuals it stacks)
    # are separate fills: no entry copy of a buffer-sized fill (jax.jit merges them).
    assert _fill_copies(r.ref_report), r.ref_report
    assert not _fill_copies(r.report), r.report


def test_accumulated_buffer_has_no_copy_to_remove():
  # `.at[t].add` passes the cotangent through unchanged: jax.jit copies nothing in
  # the loop, and its program runs.
  r = compare(sgd(rnn_add), _w(), _xs(), donate_argnums=(0,))
  if ON_CPU:
    assert not r.ref_report.loop_temporaries(LOOP_TEMPORARY_BYTES)
    assert r.report.program == "jax.jit", r.report.decision


def test_gradient_wrt_inputs_too_is_exact():
  # Gradients with respect to both arguments, nothing donated.
  r = compare(grads_both(rnn_set), _w(), _xs(), donate_argnums=())
  if ON_CPU:
    assert len(r.report.loop_temporaries(LOOP_TEMPORARY_BYTES)) <= len(
        r.ref_report.loop_temporaries(LOOP_TEMPORARY_BYTES))


def test_small_loop_copies_are_left_alone():
  # Below LOOP_TEMPORARY_BYTES a loop's copy is not worth a second compile.
  n = 8
  def loss(w, xs):
    ys = jnp.zeros((n, 16), jnp.float32)
    def step(carry, t):
      h, ys = carry
      h = jnp.tanh(w @ h + xs[t])
      return (h, ys.at[t].set(h)), None
    (_, ys), _ = lax.scan(step, (jnp.zeros((16,), jnp.float32), ys), jnp.arange(n))
    return jnp.sum(ys * ys)
  w = jnp.asarray(np.random.default_rng(0).normal(size=(16, 16)), jnp.float32)
  xs = jnp.asarray(np.random.default_rng(1).normal(size=(n, 16)), jnp.float32)
  r = compare(sgd(loss), w, xs, donate_argnums=(0,))
  assert r.report.program == "jax.jit", r.report.decision


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32])
def test_scans_start_from_fills_of_their_own(reverse, dtype):
  # Two scans whose stacked outputs and zero-filled carries share one type: XLA
  # merges the fills and copies one per loop on entry. The transform gives each
  # its own; values equal jax.jit's, reversed scans and integer fills included.
  import inplace_jax
  from inplace_jax._equal import tree_difference
  n, d = 64, 512
  def f(w, xs):
    def step(carry, x):
      acc, ys = carry
      acc = acc + x.astype(dtype)
      return (acc, ys.at[0].set(acc)), (acc, acc * 2)
    init = (jnp.zeros((d,), dtype), jnp.zeros((n, d), dtype))
    (acc, ys), (a, b) = lax.scan(step, init, xs, reverse=reverse)
    (_, zs), (c, _) = lax.scan(step, init, xs[::-1], reverse=not reverse)
    return w + 1, acc, ys, a, b, zs, c
  xs = jnp.asarray(np.random.default_rng(0).integers(-3, 4, size=(n, d)), jnp.float32)
  plain = jax.jit(f, donate_argnums=(0,))
  ours = jax.jit(inplace_jax.sequence(f, donate_argnums=(0,)), donate_argnums=(0,),
                 compiler_options=inplace_jax.compiler_options())
  assert tree_difference(ours(_w(), xs), plain(_w(), xs)) is None
  if ON_CPU:
    size = n * d * 4
    def fills(fn):
      report = inplace_jax.check_compiled(fn.lower(_w(), xs).compile())
      return [c for c in report.copies
              if c.nbytes >= size and "broadcast" in (c.operand or "")]
    assert fills(plain), "jax.jit should copy a merged fill here"
    assert not fills(ours)
