"""openxla/xla#20440: a read and an update of one donated buffer.

Under `jax.jit` on CPU this step copies the whole buffer twice (fusion re-reads
`x[0, 0]` after the in-place add, so copy insertion must preserve the old buffer),
and an `optimization_barrier` between the read and the update changes nothing,
because CPU erases barriers before copy insertion. `inplace_jax.jit` orders the
read first, keeps the barrier, and splits the add into read, barrier, write::

  python examples/xla_20440.py --size 4000
  python -m inplace_jax check examples/xla_20440.py:step --arg 'f32[4000,4000]' --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from _example_common import compare, parser, print_result


def step(x):
  y = x[0, 0]
  x = x.at[0, 0].add(1.0)
  return x, y


@functools.partial(jax.jit, static_argnums=0)
def make_args(size: int = 4000) -> tuple:
  """`(x,)`: a zero f32[size, size], made by XLA so that donating it is free."""
  return (jnp.zeros((size, size), jnp.float32),)


def next_args(out, args):
  return (out[0],)


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 4000).parse_args(argv)
  r = compare(f"xla_20440.step, x: f32[{opts.size},{opts.size}] donated", step,
              lambda: make_args(opts.size), donate=(0,), next_args=next_args,
              repeat=opts.repeat)
  print_result(r, results)
  return 0 if r["equal"] else 1


if __name__ == "__main__":
  sys.exit(main())
