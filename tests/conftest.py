"""Shared test helpers: run a function under jax.jit and inplace_jax.jit, compare."""

from __future__ import annotations

import threading

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

  def again(self, *args):
    """Runs the same `jax.jit` and `inplace_jax.jit` objects on fresh copies of
    `args`, of the signature `compare` compiled for (another branch taken, say):
    no compile, the same programs, so the reports stand; values must match
    exactly, and inplace_jax must have run the program its report describes."""
    c = self.comparison
    report = self.fn.last_report
    ref = c.reference_fn(*fresh(args))
    out = self.fn(*fresh(args))
    assert self.fn.last_report is report, "another signature: use compare"
    assert_tree_equal(ref, out)
    return self

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


# --------------------------------------------------------------------------- batches


class Batch:
  """Requests for the fuzzer's worker processes (`fuzz.run_isolated`: XLA can
  abort a process while compiling a program with barriers kept), started when
  collection ends and run in the background while this process runs other
  tests, so that both cores work. `select(items)` builds the requests for the
  selected test items (none: nothing runs); `results()` waits for them."""

  def __init__(self, select, workers: int = 2, timeout: float = 600):
    self.select, self.workers, self.timeout = select, workers, timeout
    self.requests: list[dict] = []
    self._results: list[dict] = []
    self._error: BaseException | None = None
    self._done = threading.Event()

  def run(self) -> None:
    try:
      from inplace_jax.testing import fuzz
      self._results = list(fuzz.run_isolated(self.requests, self.workers, self.timeout))
    except BaseException as e:  # noqa: BLE001 - reported by results()
      self._error = e
    finally:
      self._done.set()

  def results(self) -> list[dict]:
    self._done.wait()
    if self._error is not None:
      raise RuntimeError("a background batch failed") from self._error
    return self._results


_BATCHES: list[Batch] = []


def background_batch(select, workers: int = 2, timeout: float = 600) -> Batch:
  """A `Batch` a test module declares at import; see `pytest_collection_finish`."""
  b = Batch(select, workers, timeout)
  _BATCHES.append(b)
  return b


def pytest_collection_finish(session):
  """Starts every declared batch that the selected tests need, one after the other
  on one thread (none where tests are only collected)."""
  for b in _BATCHES:
    b.requests = [] if session.config.option.collectonly else b.select(session.items)
  todo = [b for b in _BATCHES if b.requests]
  for b in _BATCHES:
    if not b.requests:
      b._done.set()

  def run_all():
    for b in todo:
      b.run()

  if todo:
    threading.Thread(target=run_all, daemon=True).start()
