"""Trace + transform + compile time of `inplace_jax.jit` against `jax.jit`.

Each repeat starts cold: `jax.clear_caches()`, a fresh copy of the Python function
and a new jit object, so nothing traced or compiled before is reused. Two numbers
per variant, medians over repeats that alternate the variants:

* `lower().compile()`: trace, (for inplace_jax) analyse and rewrite, lower, compile.
  Target: inplace/jax <= 1.5.
* first call: what a user waits for on the first call, including running the program
  and, for `inplace_jax.jit`, the one-time inspection of the compiled HLO.

The first call's outputs are also compared exactly with `jax.jit`'s.
"""

from __future__ import annotations

import statistics
import time
import types

import jax
import jax.numpy as jnp

import inplace_jax

from . import cases as _cases
from . import loops as _loops
from . import sweep as _sweep
from ._harness import (
    INPLACE, JAX, fresh_copy, pseudo_random, same_values, specs, target)

GROUP = "compile"
TARGET = 1.5


def mlp_adam_step(params, opt, x, y):
  """A training step: MLP loss, its gradient, an Adam update of donated state."""
  def loss(p):
    h = x
    for w, b in p[:-1]:
      h = jnp.tanh(h @ w + b)
    w, b = p[-1]
    return jnp.mean((h @ w + b - y) ** 2)
  value, grads = jax.value_and_grad(loss)(params)
  m, v, t = opt
  t = t + 1
  m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
  v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
  scale = jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
  params = jax.tree_util.tree_map(
      lambda p, m, v: p - 1e-3 * scale * m / (jnp.sqrt(v) + 1e-8), params, m, v)
  return params, (m, v, t), value


def make_mlp(sizes, batch):
  @jax.jit
  def make_args():
    params = [(pseudo_random((a, b), i) * (3.0 / a) ** 0.5, jnp.zeros((b,), jnp.float32))
              for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    x = pseudo_random((batch, sizes[0]), 99)
    return params, (zeros, zeros, jnp.int32(0)), x, jnp.ones((batch, sizes[-1]))
  return make_args


def functions(quick: bool):
  """(name, function, make_args, donate_argnums)."""
  n_sweep = (1000, 1000)
  n_lu, (h, t, d) = 256, (8, 4096, 128)
  sizes = (64, 128, 128, 8) if quick else (256, 512, 512, 512, 16)
  out = [
      ("20440 step", _sweep.step, _sweep.make(n_sweep), (0,)),
      (f"MLP+Adam step {len(sizes) - 1} layers", mlp_adam_step,
       make_mlp(sizes, 64), (0, 1)),
  ]
  if not quick:
    out += [
        (f"LU factor n={n_lu}", _cases.lu_factor, _cases.make_lu(n_lu), (0,)),
        ("KV decode attend->write", _cases.kv_attend_then_write,
         _cases.make_kv(h, t, d), (0, 1)),
        ("cond inside scan", _loops.cond_in_scan, _loops.make(512, 512), (0,)),
    ]
  return out


def _fresh(fn):
  """A new function object with the same code: no cache keyed on `fn` can hit."""
  new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                           fn.__closure__)
  new.__kwdefaults__ = fn.__kwdefaults__
  return new


def _build(variant, fn, donate):
  if variant == JAX:
    return jax.jit(_fresh(fn), donate_argnums=donate)
  return inplace_jax.jit(_fresh(fn), donate_argnums=donate, on_copy="ignore")


def run(settings) -> list[dict]:
  repeats = 1 if settings.quick else 5
  rows = []
  for name, fn, make_args, donate in functions(settings.quick):
    master = make_args()   # made once: clear_caches() would recompile make_args
    jax.block_until_ready(master)
    arg_specs = specs(master)
    lc = {JAX: [], INPLACE: []}
    first = {JAX: [], INPLACE: []}
    outs = {}
    for r in range(repeats):
      order = (JAX, INPLACE) if r % 2 == 0 else (INPLACE, JAX)
      for v in order:
        jax.clear_caches()
        f = _build(v, fn, donate)
        t0 = time.perf_counter()
        f.lower(*arg_specs).compile()
        lc[v].append(time.perf_counter() - t0)
      for v in order:
        jax.clear_caches()
        f = _build(v, fn, donate)
        args = jax.block_until_ready(fresh_copy(master))
        t0 = time.perf_counter()
        out = jax.block_until_ready(f(*args))
        first[v].append(time.perf_counter() - t0)
        if r == 0:
          outs[v] = out
    ok, why = same_values(outs[JAX], outs[INPLACE])
    row = {"group": GROUP, "case": name, "params": {"repeats": repeats},
           "values_ok": ok, "values": why, "variants": {}}
    for v in (JAX, INPLACE):
      row["variants"][v] = {
          "lower_compile_s": statistics.median(lc[v]), "lower_compile_samples_s": lc[v],
          "first_call_s": statistics.median(first[v]), "first_call_samples_s": first[v]}
    row["ratio_lower_compile"] = (row["variants"][INPLACE]["lower_compile_s"]
                                  / row["variants"][JAX]["lower_compile_s"])
    row["ratio_first_call"] = (row["variants"][INPLACE]["first_call_s"]
                               / row["variants"][JAX]["first_call_s"])
    rows.append(row)
    del outs, master
  jax.clear_caches()
  return rows


def targets(row) -> list[dict]:
  return [target(f"compile inplace/jax: {row['case']}", row["ratio_lower_compile"],
                 "<=", TARGET)]
