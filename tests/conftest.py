"""Shared test helpers: run a function under jax.jit and inplace_jax.jit, compare."""

from __future__ import annotations

import warnings

import jax

# Eight CPU devices for the sharding tests; set before any backend starts.
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
import numpy as np
import pytest

import inplace_jax
from inplace_jax._equal import tree_difference

# Whether copies that plain jax.jit makes are expected: they are CPU facts (XLA:GPU
# keeps barriers and orders reads by its schedule, FINDINGS.md).
ON_CPU = jax.default_backend() == "cpu"


def fresh(tree):
  """Device copies of `tree` made by XLA (donation consumes its inputs, and
  `jax.device_put(numpy)` can alias host memory that the runtime then copies)."""
  return jax.tree.map(lambda a: jnp.array(a, copy=True) + 0 if hasattr(a, "dtype")
                      else a, tree)


def assert_tree_equal(a, b):
  diff = tree_difference(a, b)
  assert diff is None, f"{diff}\n  jax.jit:     {a!r}\n  inplace_jax: {b!r}"


class Compared:
  def __init__(self, ref, out, ref_report, report, fn):
    self.ref, self.out = ref, out
    self.ref_report, self.report = ref_report, report
    self.fn = fn

  def big_copies(self, min_bytes=1024):
    return self.report.copies_over(min_bytes)

  def ref_big_copies(self, min_bytes=1024):
    return self.ref_report.copies_over(min_bytes)


def compare(f, *args, donate_argnums=(0,), static_argnums=(), **jit_kwargs):
  """Runs `f` under jax.jit and inplace_jax.jit on equal inputs; values must match
  exactly and the inplace_jax program must not copy more bytes (in copies of 1 KiB
  or more) than jax.jit's."""
  ref_fn = jax.jit(f, donate_argnums=donate_argnums, static_argnums=static_argnums)
  new_fn = inplace_jax.jit(f, donate_argnums=donate_argnums,
                           static_argnums=static_argnums, on_copy="ignore",
                           **jit_kwargs)
  ref_report = inplace_jax.check(ref_fn, *args)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    ref = ref_fn(*fresh(args))
    out = new_fn(*fresh(args))
  report = new_fn.last_report
  assert report is not None and report.verified, report
  assert ref_report.verified
  assert_tree_equal(ref, out)
  # Copies under 1 KiB (loop counters, scalars) are noise for this comparison.
  ours = sum(c.nbytes for c in report.copies_over(1024))
  theirs = sum(c.nbytes for c in ref_report.copies_over(1024))
  assert ours <= theirs, (ref_report, report)
  return Compared(ref, out, ref_report, report, new_fn)


@pytest.fixture
def cmp():
  return compare
