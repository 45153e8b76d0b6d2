"""The openxla/xla#20440 example at buffer sizes 10^4 .. 10^8 elements (f32).

`y = x[0, 0]; x = x.at[0, 0].add(1); return x, y` with `x` donated: `jax.jit` copies
the whole buffer twice per call, region analysis avoids the copies but still rewrites
the buffer (a fused read-modify-write), `inplace_jax.jit` should cost what the
identity function costs. Targets at 10^8: inplace/floor <= 2, jax.jit/inplace >= 1000.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._harness import Case, target

GROUP = "sweep"

# Square-ish shapes with exactly 10^k elements.
SHAPES = {4: (100, 100), 5: (250, 400), 6: (1000, 1000), 7: (2500, 4000),
          8: (10000, 10000)}
FULL = (4, 5, 6, 7, 8)
QUICK = (4, 5, 6)
TARGET_EXPONENT = 8


def step(x):
  y = x[0, 0]
  x = x.at[0, 0].add(1)
  return x, y


def floor(x):
  return x, x[0, 0]


def thread(out, args):
  return (out[0],)


def make(shape):
  @jax.jit
  def make_args():
    n = shape[0] * shape[1]
    return (jnp.arange(n, dtype=jnp.float32).reshape(shape) % 97.0,)
  return make_args


def cases(quick: bool) -> list[Case]:
  out = []
  for e in (QUICK if quick else FULL):
    shape = SHAPES[e]
    out.append(Case(
        name=f"20440 n=1e{e} {shape[0]}x{shape[1]}", group=GROUP, fn=step,
        floor=floor, make_args=make(shape), donate=(0,), thread=thread,
        params={"elements": shape[0] * shape[1], "shape": list(shape),
                "exponent": e},
        min_copy_bytes=min(64 * 1024, shape[0] * shape[1] * 4 // 2)))
  return out


def targets(row) -> list[dict]:
  if row["params"]["exponent"] != TARGET_EXPONENT:
    return []
  r = row["ratios"]
  return [target("inplace/floor at 1e8", r["inplace/floor"], "<=", 2.0),
          target("jax.jit/inplace at 1e8", r["jax/inplace"], ">=", 1000.0)]

