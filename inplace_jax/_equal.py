"""Bit-for-bit comparison of output trees: what "the transform never changes a
value" means, in one place for the tests, the examples, the CLI and the benchmarks.

Floating-point leaves are compared as values with NaNs equal to NaNs, and with the
sign of zero checked too (-0.0 and 0.0 differ in the last bit that matters).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def tree_difference(a: Any, b: Any) -> str | None:
  """None when `a` and `b` are equal bit for bit, else what differs first."""
  la, ta = jax.tree_util.tree_flatten(a)
  lb, tb = jax.tree_util.tree_flatten(b)
  if str(ta) != str(tb):
    return f"output structures differ: {ta} vs {tb}"
  for i, (x, y) in enumerate(zip(la, lb, strict=True)):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype:
      return f"leaf {i}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
    if x.dtype.kind in "fc" or x.dtype == jax.numpy.bfloat16:
      xf, yf = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), \
          y.astype(np.complex128 if y.dtype.kind == "c" else np.float64)
      same = np.array_equal(xf, yf, equal_nan=True)
      if same and x.dtype.kind != "c":
        finite = ~np.isnan(xf)
        same = np.array_equal(np.signbit(xf[finite]), np.signbit(yf[finite]))
    else:
      same = np.array_equal(x, y)
    if not same:
      bad = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y)))))
      return f"leaf {i}: {bad or 'the signs of zeros'} of {x.size} elements differ"
  return None


def trees_equal(a: Any, b: Any) -> bool:
  """Whether `a` and `b` are equal bit for bit (see `tree_difference`)."""
  return tree_difference(a, b) is None
