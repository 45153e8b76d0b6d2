"""Warm-call dispatch overhead: `inplace_jax.jit` against `jax.jit` on a tiny function.

A warm call of `inplace_jax.jit` goes straight to `jax.jit`'s C++ dispatch (the
object's `__call__` is the dispatcher); the target is within 1.05x of `jax.jit`. The function is the #20440 step on a 4x4 buffer,
so the work is negligible and the time is dispatch. Two numbers per variant, each the
median over interleaved rounds:

* pipelined: a batch of chained calls (each takes the previous call's donated output),
  blocked once at the end, divided by the batch size: the throughput a loop sees;
* blocking: each call waited for, one at a time: the latency of one call.

The target is the median over rounds of each round's ratio (inplace_jax's sample
over jax.jit's, taken moments apart); the ratio of the overall medians is printed
too.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

import inplace_jax

from ._harness import FLOOR, INPLACE, JAX, target
from .sweep import floor, step

GROUP = "dispatch"
TARGET = 1.05


@jax.jit
def _make():
  return jnp.arange(16, dtype=jnp.float32).reshape(4, 4)


def _variants():
  return {JAX: jax.jit(step, donate_argnums=0),
          INPLACE: inplace_jax.jit(step, donate_argnums=0, on_copy="ignore"),
          FLOOR: jax.jit(floor, donate_argnums=0)}


def _pipelined(fn, state, k):
  x = state[0]
  t0 = time.perf_counter()
  for _ in range(k):
    x, _ = fn(x)
  x.block_until_ready()
  dt = time.perf_counter() - t0
  state[0] = x
  return dt / k


def _blocking(fn, state, k):
  x = state[0]
  total = 0.0
  for _ in range(k):
    t0 = time.perf_counter()
    x, y = fn(x)
    x.block_until_ready()
    total += time.perf_counter() - t0
  state[0] = x
  return total / k


def run(settings) -> list[dict]:
  rounds, k = (31, 100) if settings.quick else (301, 100)
  fns = _variants()
  states = {v: [_make()] for v in fns}
  for v, fn in fns.items():         # compile, verify, warm up
    _pipelined(fn, states[v], 50)
    _blocking(fn, states[v], 50)
  samples = {(v, m): [] for v in fns for m in ("pipelined", "blocking")}
  names = list(fns)
  for i in range(rounds):
    for j in range(len(names)):
      v = names[(i + j) % len(names)]
      samples[(v, "pipelined")].append(_pipelined(fns[v], states[v], k))
      samples[(v, "blocking")].append(_blocking(fns[v], states[v], k // 4))
  ok = bool(jnp.array_equal(states[JAX][0], states[INPLACE][0]))
  row = {"group": GROUP, "case": "tiny donated step f32[4,4]",
         "params": {"rounds": rounds, "batch": k, "blocking_batch": k // 4},
         "values_ok": ok, "values": "exact" if ok else "final states differ",
         "variants": {}}
  for v in names:
    row["variants"][v] = {m: {"median_us": statistics.median(samples[(v, m)]) * 1e6,
                              "samples_us": [s * 1e6 for s in samples[(v, m)]]}
                          for m in ("pipelined", "blocking")}
  for m in ("pipelined", "blocking"):
    row[f"ratio_{m}"] = (row["variants"][INPLACE][m]["median_us"]
                         / row["variants"][JAX][m]["median_us"])
    # The same, round by round (samples taken moments apart): insensitive to load
    # that drifts over the run (a 2-core machine's medians moved by 13% between
    # variants in one run of five while the paired ratio stayed at 1.04). The
    # target uses this one; both are printed.
    row[f"paired_ratio_{m}"] = statistics.median(
        a / b for a, b in zip(samples[(INPLACE, m)], samples[(JAX, m)], strict=True))
  return [row]


def targets(row) -> list[dict]:
  return [target("warm call inplace/jax (pipelined, paired rounds)",
                 row["paired_ratio_pipelined"], "<=", TARGET),
          target("warm call inplace/jax (blocking, paired rounds)",
                 row["paired_ratio_blocking"], "<=", TARGET)]
