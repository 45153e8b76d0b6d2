"""What every example's `main()` does: run a workload under `jax.jit` and
`inplace_jax.jit`, compare the outputs bit for bit, count copies, time warm calls.

Inputs come from a jitted `make_args` (never `jax.device_put` of NumPy memory: a
donated buffer aliasing host memory is copied silently by the runtime, outside the
HLO). The donated buffers are consumed by each call, so each timed call is given
the previous call's outputs through `next_args(outputs, args)`, as a training or
decoding loop would; `next_args` runs outside the timed region.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from inplace_jax._harness import compare as harness_compare
from inplace_jax._report import format_copy, human_bytes, human_time


def _time(fn: Callable, make_args: Callable[[], tuple],
          next_args: Callable[[Any, tuple], tuple], repeat: int) -> list[float]:
  args = make_args()
  out = jax.block_until_ready(fn(*args))        # warm: compiled already, one more run
  times = []
  for _ in range(repeat):
    args = jax.block_until_ready(next_args(out, args))
    del out
    start = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - start)
  return times


def compare(name: str, fn: Callable, make_args: Callable[[], tuple], *,
            donate: Sequence[int], next_args: Callable[[Any, tuple], tuple],
            repeat: int = 20, static: Sequence[int] = ()) -> dict[str, Any]:
  """Runs `fn` under `jax.jit` and `inplace_jax.jit` (the one comparison harness,
  `inplace_jax._harness.compare`), then times warm calls of each.

  Returns:
    A dict with, per variant (`"jax.jit"`, `"inplace_jax.jit"`): `"copies"` (every
    copy in the compiled HLO), `"copy_bytes"`, `"median_s"`, `"report"` (the
    `CopyReport`), `"output"` (the outputs of the first call on `make_args()`); and
    `"equal"`: whether the two outputs are equal bit for bit.
  """
  donate, static = tuple(donate), tuple(static)
  c = harness_compare(fn, make_args, donate_argnums=donate, static_argnums=static,
                      on_copy="ignore")
  jitted = {"jax.jit": jax.jit(fn, donate_argnums=donate, static_argnums=static),
            "inplace_jax.jit": c.fn}
  result: dict[str, Any] = {"name": name, "equal": c.equal}
  for label, run in (("jax.jit", c.reference), ("inplace_jax.jit", c.candidate)):
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
      times = _time(jitted[label], make_args, next_args, repeat) if repeat else []
    result[label] = {
        "copies": run.report.copies, "copy_bytes": run.report.total_copy_bytes,
        "median_s": statistics.median(times) if times else None,
        "report": run.report, "output": run.output,
    }
  return result


def print_result(r: dict[str, Any], results: list | None = None,
                 min_bytes: int = 1024) -> None:
  """Before/after lines, the ratio, and any copy left under inplace_jax.jit.

  `r` is also appended to `results` when given.
  """
  if results is not None:
    results.append(r)
  print(f"{r['name']}:")
  for label in ("jax.jit", "inplace_jax.jit"):
    v = r[label]
    print(f"  {label:16s} {len(v['copies'])} copies ({human_bytes(v['copy_bytes'])}), "
          f"{human_time(v['median_s'], 'not timed')} per call")
  before, after = r["jax.jit"]["median_s"], r["inplace_jax.jit"]["median_s"]
  if before and after:
    print(f"  time ratio jax.jit / inplace_jax.jit: {before / after:,.1f}x")
  print(f"  outputs equal bit for bit: {'yes' if r['equal'] else 'NO'}")
  report = r["inplace_jax.jit"]["report"]
  if not report.verified:
    print("  inplace_jax.jit: the compiled program could NOT be verified: "
          + "; ".join(report.problems))
  left = report.copies_over(min_bytes)
  if left:
    print(f"  copies of at least {min_bytes} bytes left under inplace_jax.jit:")
    for c in left:
      print(f"    - {format_copy(c)}")
      print(f"      {c.hlo}")
    for f in report.findings:
      print(f"    why: {f.kind}: {f.message}")


def parser(description: str, default_size: int) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--size", type=int, default=default_size,
                 help=f"problem size (default {default_size})")
  p.add_argument("--repeat", type=int, default=20, help="timed warm calls (default 20)")
  return p
