"""A masked update under `lax.cond`, in both branch orders.

Row `i` of the donated buffer is read; if its sum is below a threshold the row is
replaced by `v`, otherwise the buffer is left alone. `lax.cond(p, true_fn,
false_fn)` lowers to a conditional whose branches are ordered `(false_fn,
true_fn)`, and on CPU `jax.jit` copies the whole buffer when the *updating* branch
comes first: the same program is fast or slow depending on how the predicate is
written (jax#16661, jax#39449, jax#38145). Both spellings are here:

* `update_if(x, i, v)`: `cond(small, write, keep)`; the no-op branch is first.
* `update_unless(x, i, v)`: `cond(big, keep, write)`; the updating branch is first.

::

  python examples/masked_update.py --size 4000
  python -m inplace_jax check examples/masked_update.py:update_unless \\
      --arg 'f32[4000,4000]' --arg 'i32[]=3' --arg 'f32[4000]' --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax import lax

from _example_common import compare, parser, print_result

THRESHOLD = 0.0


def update_if(x, i, v):
  """Replaces row `i` by `v` if `x[i].sum() < THRESHOLD`; returns `(x, old_row)`."""
  old = x[i]
  small = old.sum() < THRESHOLD
  x = lax.cond(small, lambda x: x.at[i].set(v), lambda x: x, x)
  return x, old


def update_unless(x, i, v):
  """The same update, with the predicate negated and the branches swapped."""
  old = x[i]
  big = old.sum() >= THRESHOLD
  x = lax.cond(big, lambda x: x, lambda x: x.at[i].set(v), x)
  return x, old


@functools.partial(jax.jit, static_argnums=0)
def make_args(size: int = 4000) -> tuple:
  kx, kv = jax.random.split(jax.random.key(0))
  return (jax.random.normal(kx, (size, size)), jnp.int32(3),
          jax.random.normal(kv, (size,)))


def next_args(out, args):
  # Walk over the rows so that both branches are taken across calls.
  n = args[0].shape[0]
  return out[0], (args[1] + 1) % n, args[2]


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 4000).parse_args(argv)
  ok = True
  for fn in (update_if, update_unless):
    r = compare(f"masked_update.{fn.__name__}, x: f32[{opts.size},{opts.size}] donated",
                fn, lambda: make_args(opts.size), donate=(0,), next_args=next_args,
                repeat=opts.repeat)
    print_result(r, results)
    ok &= r["equal"]
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
