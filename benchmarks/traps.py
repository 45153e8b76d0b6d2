"""The classic JAX copy traps, under each variant side by side.

* `jax.vmap` of a `while_loop` whose trip count differs between batch elements
  (jax#13522): JAX lowers it with a whole-buffer select per step and XLA copies the
  buffer each step; inplace_jax predicates each write at its own size.
* A conditional whose first branch rewrites the buffer (elementwise, or afresh)
  and whose other branch passes it through (jax#16661): XLA copies the buffer
  whichever branch runs; inplace_jax lowers it to zero-or-one-trip loops.

* Gradients through a `scan` that writes `ys.at[t].set(h)` into a preallocated
  buffer (jax#15906): the backward scan reads row t of the buffer's cotangent and
  zeroes it, and XLA copies the whole cotangent twice per step (a temporary, not a
  donated buffer); inplace_jax ties the step's results before the write. The row
  with `.at[t].add` has no such copy under jax.jit.

Target where jax.jit copies a buffer (or, for the scan gradient, a loop temporary): jax/inplace >= 10 per call where the copy
dominates (the pass-through branch taken), reported otherwise; where jax.jit has no
buffer copy (one trip count for every element; the branches in the other order):
inplace/jax <= 1.2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._harness import INPLACE, JAX, Case, buffer_copy_count, copy_count, target

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


def _rewrite_first(buf, y0, tend, rewrite: bool):
  """`cond` whose first branch (the false one) rewrites the buffer and whose other
  passes it through; `rewrite` says which runs (`tend` is below 10)."""
  passes = tend[0] > 10.0 if rewrite else tend[0] < 10.0
  buf = lax.cond(passes, lambda b: b, lambda b: b * 0.5 + 1.0, buf)
  return buf, y0, tend


def cond_rewrite_first_passed(buf, y0, tend):
  """The pass-through branch runs."""
  return _rewrite_first(buf, y0, tend, rewrite=False)


def cond_rewrite_first_taken(buf, y0, tend):
  """The rewriting branch runs."""
  return _rewrite_first(buf, y0, tend, rewrite=True)


def cond_rewrite_second(buf, y0, tend):
  """The branches in the other order: no copy under jax.jit."""
  buf = lax.cond(tend[0] < 10.0, lambda b: b * 0.5 + 1.0, lambda b: b, buf)
  return buf, y0, tend


def make(b, t, d):
  @jax.jit
  def make_args():
    buf = jnp.zeros((b, t, d), jnp.float32)
    y0 = (jnp.arange(b * d, dtype=jnp.float32).reshape(b, d) % 7.0) * 0.125
    tend = jnp.linspace(0.35, 0.95, b, dtype=jnp.float32)
    return buf, y0, tend
  return make_args


def _rnn_loss(w, xs, accumulate: bool):
  t, d = xs.shape
  def step(carry, i):
    h, ys = carry
    h = jnp.tanh(w @ h + xs[i])
    return (h, ys.at[i].add(h) if accumulate else ys.at[i].set(h)), None
  ys = jnp.zeros((t, d), jnp.float32)
  (_, ys), _ = lax.scan(step, (jnp.zeros((d,), jnp.float32), ys), jnp.arange(t))
  return jnp.sum(ys * ys)


def scan_grad_set(w, xs):
  """An SGD step through a scan writing each step's state into a buffer."""
  loss, g = jax.value_and_grad(_rnn_loss)(w, xs, False)
  return w - 0.01 * g, loss


def scan_grad_add(w, xs):
  """The same, accumulating into the buffer: no copy under jax.jit."""
  loss, g = jax.value_and_grad(_rnn_loss)(w, xs, True)
  return w - 0.01 * g, loss


def scan_floor(w, xs):
  return w, xs[0, 0]


def make_rnn(t, d):
  @jax.jit
  def make_args():
    w = (jnp.arange(d * d, dtype=jnp.float32).reshape(d, d) % 7.0 - 3.0) * 0.01
    xs = (jnp.arange(t * d, dtype=jnp.float32).reshape(t, d) % 5.0) * 0.1
    return w, xs
  return make_args


SCAN_GRAD = (
    ("scan grad, write ys[t]", scan_grad_set),
    ("scan grad, add to ys[t]", scan_grad_add),
)


PROGRAMS = (
    ("vmap while, batched trip counts", batched_trip_counts),
    ("vmap while, one trip count", shared_trip_count),
    ("cond rewrite first, pass taken", cond_rewrite_first_passed),
    ("cond rewrite first, rewrite taken", cond_rewrite_first_taken),
    ("cond rewrite second", cond_rewrite_second),
)
# Rows where the copy need not dominate: the speedup is reported, not targeted.
REPORTED_ONLY = ("cond rewrite first, rewrite taken",)


def cases(quick: bool) -> list[Case]:
  b, t, d = (4, 16, 256) if quick else (16, 32, 16384)
  out = [Case(name=name, group=GROUP, fn=fn, floor=floor, make_args=make(b, t, d),
              donate=(0,), thread=lambda o, a: (o[0], a[1], a[2]),
              params={"shape": [b, t, d]})
         for name, fn in PROGRAMS]
  steps, width = (64, 256) if quick else (4096, 64)
  out += [Case(name=name, group=GROUP, fn=fn, floor=scan_floor,
               make_args=make_rnn(steps, width), donate=(0,),
               thread=lambda o, a: (o[0], a[1]),
               params={"steps": steps, "width": width})
          for name, fn in SCAN_GRAD]
  return out


def targets(row) -> list[dict]:
  jax_copies, ours = buffer_copy_count(row, JAX), buffer_copy_count(row, INPLACE)
  if jax_copies is None or ours is None:
    return []
  if row["case"] in dict(SCAN_GRAD):
    # The copies are loop temporaries, not buffer copies: compare all copies.
    jax_copies, ours = copy_count(row, JAX), copy_count(row, INPLACE)
    jax_copies = (jax_copies or 0) > (ours or 0)
  if jax_copies:
    if row["case"] in REPORTED_ONLY:
      return []
    return [target("trap speedup jax/inplace", row["ratios"]["jax/inplace"], ">=",
                   SPEEDUP)]
  return [target("no-copy slowdown inplace/jax", row["ratios"]["inplace/jax"], "<=",
                 NO_COPY_SLOWDOWN)]
