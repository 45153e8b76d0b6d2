"""Shared test helpers: run a function under jax.jit and inplace_jax.jit, compare."""

from __future__ import annotations

import jax

# Eight CPU devices for the sharding tests; set before any backend starts.
jax.config.update("jax_num_cpu_devices", 8)
import jax.numpy as jnp
import numpy as np
import pytest

import inplace_jax
from inplace_jax._equal import tree_difference
from inplace_jax._harness import compare as harness_compare
from inplace_jax._harness import untrue_statements

# Whether copies that plain jax.jit makes are expected: they are CPU facts (XLA:GPU
# keeps barriers and orders reads by its schedule, docs/xla_notes.md).
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
  """What `compare` measured, named as the tests read it."""

  def __init__(self, c):
    self.comparison = c
    self.ref, self.out = c.reference.output, c.candidate.output
    self.ref_report, self.report = c.reference.report, c.candidate.report
    self.fn = c.fn

  def big_copies(self, min_bytes=1024):
    return self.report.copies_over(min_bytes)

  def ref_big_copies(self, min_bytes=1024):
    return self.ref_report.copies_over(min_bytes)

  def assert_kept_for_arithmetic(self, min_bytes=1024):
    """Every copy of at least `min_bytes` left is a buffer copy that jax.jit's
    program has too, kept because the program without it computes some operation
    differently (XLA:CPU's FMA contraction moved with the fused expression), and
    the report says so."""
    theirs = {(c.shape, c.dtype, c.role) for c in self.ref_report.buffer_copies(min_bytes)}
    # Not vacuous: a program that became copy-free belongs with the copy-free tests.
    assert self.report.copies_over(min_bytes), ("no copy is kept", self.report)
    for c in self.report.copies_over(min_bytes):
      assert c.category == "buffer", c
      assert (c.shape, c.dtype, c.role) in theirs, c
      assert ("differently from jax.jit" in (c.cause or "")
              or "could change" in (c.cause or "")), c


def compare(f, *args, donate_argnums=(0,), static_argnums=(), **jit_kwargs):
  """Runs `f` under jax.jit and inplace_jax.jit on equal inputs (the one comparison
  harness, `inplace_jax._harness.compare`); values must match exactly and the
  inplace_jax program must not copy more bytes (in copies of 1 KiB or more) than
  jax.jit's."""
  c = harness_compare(f, args, donate_argnums=donate_argnums,
                      static_argnums=static_argnums, on_copy="ignore", **jit_kwargs)
  assert c.candidate.report is not None and c.candidate.report.verified, c.candidate
  assert c.reference.report.verified
  assert c.difference is None, (f"{c.difference}\n  jax.jit:     {c.reference.output!r}"
                                f"\n  inplace_jax: {c.candidate.output!r}")
  theirs, ours = c.copy_bytes(1024)
  assert ours <= theirs, (c.reference.report, c.candidate.report)
  for report in (c.reference.report, c.candidate.report):
    assert not untrue_statements(report), untrue_statements(report)
  return Compared(c)


@pytest.fixture
def cmp():
  return compare
