"""Gradients through a `scan` that writes each step's state into a buffer.

An RNN-style loss saves `h` into a preallocated buffer with `ys.at[t].set(h)`
(jax#15906, #10197). Its backward scan carries the buffer's cotangent, reads row t
of it and zeroes that row; under `jax.jit` on CPU, XLA copies the whole cotangent
buffer twice per step (a temporary, so no warning names it). `inplace_jax.jit`
sequences the loop: the row is read and the step's arithmetic runs, fused as under
jax.jit, before the row is written. Values and gradients bit-equal.

::

  python examples/scan_grad.py --size 1024
  python -m inplace_jax check examples/scan_grad.py:train_step \\
      --args-factory examples/scan_grad.py:make_args --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax import lax

from _example_common import compare, parser, print_result

WIDTH = 128


def loss(w, xs):
  """`h <- tanh(w h + x_t)` for every row of `xs`, each `h` saved in row t of a
  buffer; the loss is the buffer's squared norm."""
  steps, width = xs.shape
  def step(carry, t):
    h, ys = carry
    h = jnp.tanh(w @ h + xs[t])
    return (h, ys.at[t].set(h)), None
  ys = jnp.zeros((steps, width), jnp.float32)
  (_, ys), _ = lax.scan(step, (jnp.zeros((width,), jnp.float32), ys), jnp.arange(steps))
  return jnp.sum(ys * ys)


def train_step(w, xs):
  """One SGD step: `w` f32[width, width] (donated), `xs` f32[steps, width]."""
  value, grad = jax.value_and_grad(loss)(w, xs)
  return w - 0.01 * grad, value


@functools.partial(jax.jit, static_argnums=0)
def make_args(steps: int = 1024) -> tuple:
  w = jax.random.normal(jax.random.key(0), (WIDTH, WIDTH)) * 0.05
  xs = jax.random.normal(jax.random.key(1), (steps, WIDTH))
  return w, xs


def next_args(out, args):
  return out[0], args[1]


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 1024).parse_args(argv)
  r = compare(f"scan_grad.train_step, {opts.size} steps of width {WIDTH}, w donated",
              train_step, lambda: make_args(opts.size), donate=(0,),
              next_args=next_args, repeat=opts.repeat)
  print_result(r, results)
  return 0 if r["equal"] else 1


if __name__ == "__main__":
  sys.exit(main())
