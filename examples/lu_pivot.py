"""LU factorization with partial pivoting, in place, in a `fori_loop`.

Step `k` picks the pivot row `p` (largest `|a[i, k]|`, `i >= k`), swaps rows `k`
and `p` (two reads, two writes of the same buffer), computes the multipliers
`l = a[k+1:, k] / a[k, k]`, applies the rank-1 update `a - outer(l, u)` to the
trailing block, and writes `l` into column `k`. The matrix is donated and the
result is packed as LAPACK does (`L` strictly below the diagonal, unit diagonal
implied, `U` on and above it), with the row permutation. Under `jax.jit` on CPU the
row swap and the column write copy the matrix every iteration::

  python examples/lu_pivot.py --size 512
  python -m inplace_jax check examples/lu_pivot.py:lu --arg 'f32[512,512]' --donate 0

`main` checks the result against `jax.lax.linalg.lu` (same permutation, factors
within float32 rounding) and by reconstruction: `a[perm] == L @ U`.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _example_common import compare, parser, print_result


def lu(a):
  """`(packed_lu, perm)` with `a[perm] == L @ U` (L unit lower, U upper, packed)."""
  n = a.shape[0]

  def body(k, carry):
    a, perm = carry
    # An iota per step, not one closed over: the loop would otherwise keep the
    # initial `perm` (the same iota) alive next to the carry, and copy it.
    rows = jnp.arange(n)
    p = jnp.argmax(jnp.where(rows >= k, jnp.abs(a[:, k]), -1.0))
    row_k, row_p = a[k], a[p]
    a = a.at[k].set(row_p).at[p].set(row_k)
    perm_k, perm_p = perm[k], perm[p]
    perm = perm.at[k].set(perm_p).at[p].set(perm_k)
    below = rows > k
    l = jnp.where(below, a[:, k] / a[k, k], 0.0)
    u = jnp.where(below, a[k], 0.0)
    a = a - jnp.outer(l, u)
    a = a.at[:, k].set(jnp.where(below, l, a[:, k]))
    return a, perm

  return lax.fori_loop(0, n, body, (a, jnp.arange(n)))


def unpack(packed):
  """`(L, U)` from the packed factor."""
  n = packed.shape[0]
  return jnp.tril(packed, -1) + jnp.eye(n, dtype=packed.dtype), jnp.triu(packed)


@functools.partial(jax.jit, static_argnums=0)
def make_args(size: int = 512) -> tuple:
  return (jax.random.normal(jax.random.key(0), (size, size)),)


def next_args(out, args):
  # Factorizing the packed factor again keeps the values finite and the pivots
  # meaningful; the time per call does not depend on the values.
  return (out[0],)


def verify(a, packed, perm) -> list[str]:
  """Problems with `(packed, perm)` as an LU factorization of `a`; [] if none."""
  a, packed, perm = np.asarray(a, np.float64), np.asarray(packed), np.asarray(perm)
  problems = []
  if sorted(perm.tolist()) != list(range(a.shape[0])):
    problems.append("perm is not a permutation")
  lower, upper = (np.asarray(m, np.float64) for m in unpack(packed))
  # float32 elimination: the residual grows like n * eps * |L| |U|.
  err = np.abs(a[perm] - lower @ upper).max() / np.abs(a).max()
  if not err < a.shape[0] * 1e-6:
    problems.append(f"a[perm] != L @ U: relative error {err:.2e}")
  ref_lu, _, ref_perm = lax.linalg.lu(jnp.asarray(a, jnp.float32))
  if not np.array_equal(np.asarray(ref_perm), perm):
    problems.append("permutation differs from jax.lax.linalg.lu's")
  elif not np.allclose(np.asarray(ref_lu), packed, rtol=1e-3, atol=1e-3):
    problems.append("factors differ from jax.lax.linalg.lu's beyond float32 rounding")
  return problems


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 512).parse_args(argv)
  r = compare(f"lu_pivot.lu, a: f32[{opts.size},{opts.size}] donated", lu,
              lambda: make_args(opts.size), donate=(0,), next_args=next_args,
              repeat=opts.repeat)
  print_result(r, results)
  problems = verify(make_args(opts.size)[0], *r["inplace_jax.jit"]["output"])
  print("  a[perm] == L @ U and matches jax.lax.linalg.lu: "
        + ("yes" if not problems else "NO: " + "; ".join(problems)))
  return 0 if r["equal"] and not problems else 1


if __name__ == "__main__":
  sys.exit(main())
