"""Measuring one case under the four variants: values, copies, memory, time.

A `Case` is a program, the inputs it runs on and how one call's outputs become the
next call's inputs (the donated buffers are threaded through, as a training loop or a
decode loop would). `run_case` then, for each variant,

1. checks values: the first call of every variant runs on identical fresh inputs, and
   `inplace_jax.jit`'s outputs must equal `jax.jit`'s exactly, else the row is FAILED;
2. counts copies and temporary memory from a real compile (`inplace_jax.check`, or
   the report `inplace_jax.jit` made of its own compile), never from a table;
3. times warm calls, the variants interleaved round by round so that noise from other
   processes on the machine hits all of them alike, and keeps the median per call.

Inputs are created by jitted functions: on CPU `jax.device_put(numpy_array)` can alias
numpy memory, and donating such an array makes the runtime copy it silently, outside
the HLO (docs/xla_notes.md, "Harness pitfalls").
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

import inplace_jax
from inplace_jax._equal import tree_difference
from inplace_jax._harness import run_variant

REGION = {"xla_cpu_copy_insertion_use_region_analysis": True}

JAX = "jax.jit"
REGION_JIT = "jax.jit+region"
INPLACE = "inplace_jax.jit"
FLOOR = "floor"
VARIANTS = (JAX, REGION_JIT, INPLACE, FLOOR)
SHORT = {JAX: "jax", REGION_JIT: "region", INPLACE: "inplace", FLOOR: "floor"}

# Copies smaller than this (loop counters, a row moved by a swap) are listed in the
# JSON but not counted in the table: the table counts copies of buffers.
MIN_COPY_BYTES = 64 * 1024


@dataclasses.dataclass
class Case:
  """One program to measure.

  Attributes:
    name: the row label.
    group: the group it belongs to (`--only`).
    fn: the program.
    floor: a function of the same signature and output structure that does no work
      (returns its donated inputs): the fastest any variant can be.
    make_args: a jitted, deterministic function of no arguments returning the inputs.
    donate: `donate_argnums`.
    thread: `(outputs, args) -> next args`: feeds the donated outputs back in.
    params: what to record about the case (sizes, ...).
    min_copy_bytes: copies at least this big are counted in the table.
  """
  name: str
  group: str
  fn: Callable
  floor: Callable
  make_args: Callable[[], tuple]
  donate: tuple[int, ...]
  thread: Callable[[Any, tuple], tuple]
  params: dict = dataclasses.field(default_factory=dict)
  min_copy_bytes: int = MIN_COPY_BYTES


@dataclasses.dataclass
class Settings:
  """How long to measure: `--quick` shrinks all of it."""
  quick: bool = False
  case_budget_s: float = 3.0      # timed rounds of one case, all variants together
  batch_s: float = 0.004          # calls are batched up to this long, then divided
  min_rounds: int = 3
  max_rounds: int = 101
  max_batch: int = 2000


def quick_settings() -> Settings:
  return Settings(quick=True, case_budget_s=0.25, batch_s=0.002, min_rounds=3,
                  max_rounds=15, max_batch=500)


# --------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  import jaxlib
  return {
      "cpu": cpu, "cores": cores, "platform": platform.platform(),
      "python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "inplace_jax": inplace_jax.__version__,
  }


# --------------------------------------------------------------------------- variants


def build(case: Case, variant: str):
  """The callable for one variant of `case`: a fresh jit object each time."""
  if variant == JAX:
    return jax.jit(case.fn, donate_argnums=case.donate)
  if variant == REGION_JIT:
    return jax.jit(case.fn, donate_argnums=case.donate, compiler_options=REGION)
  if variant == INPLACE:
    return inplace_jax.jit(case.fn, donate_argnums=case.donate, on_copy="ignore")
  if variant == FLOOR:
    return jax.jit(case.floor, donate_argnums=case.donate)
  raise ValueError(f"unknown variant {variant!r}")


def pseudo_random(shape, seed: int = 0, dtype=None):
  """Deterministic values in [-1, 1) from cheap jnp ops (jax.random compiles slowly on
  CPU, and inputs are made many times). Call it inside the jitted `make_args`."""
  import jax.numpy as jnp
  n = math.prod(shape)
  i = jnp.arange(n, dtype=jnp.float32)
  x = jnp.sin(i * 12.9898 + (seed + 1) * 78.233) * 43758.5453
  return (2.0 * (x - jnp.floor(x)) - 1.0).reshape(shape).astype(dtype or jnp.float32)


def fresh_copy(args):
  """New device buffers with the same values (safe to donate)."""
  return jax.tree_util.tree_map(lambda a: a.copy(), args)


def specs(args) -> Any:
  return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)


def copy_summary(report, min_bytes: int) -> dict[str, Any]:
  """The copies of one compile, as counted in the table and listed in the JSON."""
  big = report.copies_over(min_bytes)
  per_call = 0
  for c in report.copies:
    per_call += c.nbytes * (c.trip_count or 1)
  return {
      "verified": report.verified,
      "copies": len(big) if report.verified else None,
      "buffer_copies": len(report.buffer_copies(min_bytes)) if report.verified else None,
      "copies_all": len(report.copies),
      "copy_bytes_static": sum(c.nbytes for c in report.copies),
      "copy_bytes_per_call": per_call,
      "temp_bytes": report.temp_size_in_bytes,
      "detail": [{"type": c.type_str, "nbytes": c.nbytes, "role": c.role_str,
                  "what": c.what_str, "location": str(c.location) if c.location else None}
                 for c in report.copies],
      "problems": list(report.problems),
  }


def same_values(a, b) -> tuple[bool, str]:
  """Exact equality of two output trees, bit for bit (`inplace_jax._equal`)."""
  diff = tree_difference(a, b)
  return diff is None, diff or "exact"


# --------------------------------------------------------------------------- timing


class Runner:
  """One variant's state: its own inputs, threaded from call to call."""

  def __init__(self, variant: str, fn, case: Case):
    self.variant, self.fn, self.case = variant, fn, case
    self.args = case.make_args()
    jax.block_until_ready(self.args)
    self.k = 1
    self.samples: list[float] = []

  def run(self, k: int) -> float:
    """Seconds per call over a batch of `k` chained calls."""
    fn, thread, args = self.fn, self.case.thread, self.args
    t0 = time.perf_counter()
    for _ in range(k):
      args = thread(fn(*args), args)
    jax.block_until_ready(args)
    dt = time.perf_counter() - t0
    self.args = args
    return dt / k


def interleave(runners: Sequence[Runner], settings: Settings,
               budget_s: float | None = None) -> None:
  """Times the runners round by round, each round in a rotated order."""
  budget_s = settings.case_budget_s if budget_s is None else budget_s
  for r in runners:        # calibration: one more warm call, also a sample
    t = r.run(1)
    r.k = max(1, min(settings.max_batch, int(settings.batch_s / max(t, 1e-7))))
    if r.k > 1:
      t = r.run(r.k)       # a batch: per-call time without the blocking overhead
    r.samples.append(t)
  round_s = sum(r.k * r.samples[-1] for r in runners)
  rounds = int(budget_s / max(round_s, 1e-9))
  rounds = max(settings.min_rounds, min(settings.max_rounds, rounds)) - 1
  for i in range(rounds):
    for j in range(len(runners)):
      r = runners[(i + j) % len(runners)]
      r.samples.append(r.run(r.k))


def summary(samples: Sequence[float]) -> dict[str, Any]:
  s = sorted(samples)
  q = lambda p: s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]
  return {"median_s": statistics.median(s), "q25_s": q(0.25), "q75_s": q(0.75),
          "min_s": s[0], "rounds": len(s)}


# --------------------------------------------------------------------------- a case


def run_case(case: Case, settings: Settings,
             variants: Sequence[str] = VARIANTS) -> dict[str, Any]:
  """Values, copies, memory and time of `case` under each variant."""
  t_start = time.perf_counter()
  fns = {v: build(case, v) for v in variants}
  row: dict[str, Any] = {"group": case.group, "case": case.name,
                         "params": case.params, "variants": {}}
  # 1. Values: the first call of each variant on identical fresh inputs.
  outs = {}
  errors = {}
  for v in variants:
    try:
      outs[v] = run_variant(fns[v], case.make_args).output
    except Exception as e:  # noqa: BLE001 - a failing variant is a result to report
      errors[v] = f"{type(e).__name__}: {e}"
  ok, why = (False, errors.get(INPLACE) or errors.get(JAX) or "not run")
  if JAX in outs and INPLACE in outs:
    ok, why = same_values(outs[JAX], outs[INPLACE])
  row["values_ok"], row["values"] = ok, why
  if JAX in outs and REGION_JIT in outs:
    row["region_values_ok"] = same_values(outs[JAX], outs[REGION_JIT])[0]
  row["errors"] = errors
  args = case.make_args()
  arg_specs = specs(args)
  donated = jax.tree_util.tree_leaves([a for i, a in enumerate(args) if i in case.donate])
  biggest = max((a.nbytes for a in donated), default=0)
  min_copy = min(case.min_copy_bytes, max(1, biggest // 2))
  row["min_copy_bytes"] = min_copy
  del args, donated, outs
  gc.collect()
  # 2. Copies and temporary memory, from real compiles.
  for v in variants:
    if v in errors:
      row["variants"][v] = {"error": errors[v]}
      continue
    if v == INPLACE and fns[v].last_report is not None:
      report = fns[v].last_report     # the report of the compile that ran
    else:
      report = inplace_jax.check(fns[v], *arg_specs)
    row["variants"][v] = copy_summary(report, min_copy)
  if INPLACE not in errors:
    plan = fns[INPLACE].plan
    row["plan"] = plan.stats() if plan is not None else None
  # 3. Time, interleaved.
  runners = [Runner(v, fns[v], case) for v in variants if v not in errors]
  interleave(runners, settings)
  for r in runners:
    row["variants"][r.variant].update(summary(r.samples), batch=r.k,
                                      samples_s=r.samples)
  del runners, fns
  gc.collect()
  row["ratios"] = ratios(row)
  row["wall_s"] = time.perf_counter() - t_start
  return row


def median_of(row, v) -> float | None:
  return row["variants"].get(v, {}).get("median_s")


def ratios(row) -> dict[str, float | None]:
  def r(a, b):
    ta, tb = median_of(row, a), median_of(row, b)
    return None if ta is None or tb is None or tb == 0 else ta / tb
  out = {"inplace/jax": r(INPLACE, JAX), "jax/inplace": r(JAX, INPLACE),
         "region/inplace": r(REGION_JIT, INPLACE), "inplace/floor": r(INPLACE, FLOOR)}
  # Round by round (samples taken moments apart), for reference: less sensitive to
  # load that drifts during the run. Targets use the ratio of medians above.
  a = row["variants"].get(INPLACE, {}).get("samples_s")
  b = row["variants"].get(JAX, {}).get("samples_s")
  if a and b and len(a) == len(b):
    out["paired inplace/jax"] = statistics.median(
        x / y for x, y in zip(a, b, strict=True))
  return out


def target(name: str, value: float | None, op: str, bound: float) -> dict[str, Any]:
  """A target and whether `value` meets it (`op` is "<=" or ">=")."""
  if value is None or math.isnan(value):
    ok = None
  else:
    ok = value <= bound if op == "<=" else value >= bound
  return {"name": name, "value": value, "op": op, "bound": bound, "pass": ok}


def copy_count(row, v) -> int | None:
  return row["variants"].get(v, {}).get("copies")


def buffer_copy_count(row, v) -> int | None:
  """Copies of a donated buffer (or a carry of one) in variant `v`'s program."""
  return row["variants"].get(v, {}).get("buffer_copies")
