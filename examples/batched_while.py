"""`jax.vmap` of a `while_loop` whose trip count differs between batch elements.

Each element steps a state until its own end time and saves every state in a row of
a donated buffer (a solve-and-save written with a plain `while_loop`). Under `vmap`
the loop predicate is batched: JAX runs the loop while any element is active and,
after each step, selects the whole new buffer where an element is active and the old
one elsewhere (jax#13522), so XLA copies the buffer every step. `inplace_jax.jit`
predicates each write at its own size instead (the written row keeps its old value
where its element is done): no copy, the same bits.

::

  python examples/batched_while.py --size 16384
  python -m inplace_jax check examples/batched_while.py:solve_batch \\
      --args-factory examples/batched_while.py:make_args --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax import lax

from _example_common import compare, parser, print_result

BATCH, STEPS = 16, 16


def solve_and_save(buf, y0, tend):
  """One element: `y <- 0.9 y + 0.1` every 0.1 time units until `tend`, row i of
  `buf` holding the state after step i."""
  def cond(c):
    return c[0] < tend
  def body(c):
    t, y, buf, i = c
    y = y * 0.9 + 0.1
    return t + 0.1, y, lax.dynamic_update_slice(buf, y[None], (i, 0)), i + 1
  _, y, buf, _ = lax.while_loop(cond, body, (jnp.float32(0), y0, buf, jnp.int32(0)))
  return buf, y


def solve_batch(buf, y0, tend):
  """The batch: `buf` f32[batch, steps, size] (donated), `y0` f32[batch, size],
  `tend` f32[batch], each element with its own end time."""
  return jax.vmap(solve_and_save)(buf, y0, tend)


@functools.partial(jax.jit, static_argnums=0)
def make_args(size: int = 16384) -> tuple:
  buf = jnp.zeros((BATCH, STEPS, size), jnp.float32)
  y0 = jax.random.normal(jax.random.key(0), (BATCH, size))
  tend = jnp.linspace(0.35, 1.45, BATCH, dtype=jnp.float32)
  return buf, y0, tend


def next_args(out, args):
  return out[0], args[1], args[2]


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 16384).parse_args(argv)
  r = compare(f"batched_while.solve_batch, buf: f32[{BATCH},{STEPS},{opts.size}] "
              "donated", solve_batch, lambda: make_args(opts.size), donate=(0,),
              next_args=next_args, repeat=opts.repeat)
  print_result(r, results)
  return 0 if r["equal"] else 1


if __name__ == "__main__":
  sys.exit(main())
