"""The in-place roll from openxla/xla#20440: read the last row, shift, write row 0.

`roll(x)` equals `jnp.roll(x, 1, axis=0)`, computed in place: the last row is read
first, a `fori_loop` moves every row one down (`x[i] = x[i - 1]`, from the bottom
up), and the saved row is written at the top. Under `jax.jit` on CPU, even with an
`optimization_barrier` after the read and with
`xla_cpu_copy_insertion_use_region_analysis` (the workaround suggested in the
issue), XLA copies the buffer; `inplace_jax.jit` keeps the barrier alive::

  python examples/roll.py --size 4000
  python -m inplace_jax check examples/roll.py:roll --arg 'f32[4000,4000]' --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax import lax

from _example_common import compare, parser, print_result


def roll(x):
  """`jnp.roll(x, 1, axis=0)`, in place."""
  n = x.shape[0]
  last = x[n - 1]
  x = lax.fori_loop(1, n, lambda i, x: x.at[n - i].set(x[n - 1 - i]), x)
  return x.at[0].set(last)


@functools.partial(jax.jit, static_argnums=0)
def make_args(size: int = 4000) -> tuple:
  return (jax.random.normal(jax.random.key(0), (size, size)),)


def next_args(out, args):
  return (out,)


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 4000).parse_args(argv)
  r = compare(f"roll.roll, x: f32[{opts.size},{opts.size}] donated", roll,
              lambda: make_args(opts.size), donate=(0,), next_args=next_args,
              repeat=opts.repeat)
  print_result(r, results)
  expected = jnp.roll(make_args(opts.size)[0], 1, axis=0)
  rolled = bool(jnp.array_equal(r["inplace_jax.jit"]["output"], expected))
  print(f"  equals jnp.roll(x, 1, axis=0): {'yes' if rolled else 'NO'}")
  return 0 if r["equal"] and rolled else 1


if __name__ == "__main__":
  sys.exit(main())
