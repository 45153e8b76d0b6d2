"""Minimised programs from the differential fuzzer, one parametrised test.

The programs, each with a docstring saying where it was found, which oracle failed
and what was measured then, are in tests/fuzz_regressions_programs.py
(`REGRESSIONS`). Each runs under `jax.jit` and `inplace_jax.jit` (every argument
donated) through the fuzzer's oracle (`inplace_jax.testing.fuzz.check_function`, on
`inplace_jax._harness.compare`), in two worker processes (`fuzz.run_isolated`,
started when collection ends: `conftest.background_batch`) because some of them
aborted the process inside XLA's compiler, and must not fail: bit-for-bit equal
outputs, verified HLO reports on both sides and no more copy bytes under
inplace_jax.jit. A copy left without a cause ("unexplained") is reported by the
fuzz sample, not failed here.

`test_switch_zeroes_buffer_in_one_trip_scan` asserts more than the oracle does.
"""

import inspect
import textwrap

import jax
import jax.numpy as jnp
import pytest

import fuzz_regressions_programs as programs
from conftest import background_batch
from fuzz_regressions_programs import REGRESSIONS, Regression
from inplace_jax.testing import fuzz

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


@pytest.fixture(scope="module")
def worker():
  w = fuzz.Worker(timeout=300)
  yield w
  w.close()


def _source(case: Regression) -> str:
  return textwrap.dedent(inspect.getsource(case.fn))


def _requests(items) -> list[dict]:
  wanted = {item.callspec.params["case"].name for item in items
            if item.originalname == "test_fuzz_regression"}
  return [dict(op="source", source=_source(c), name=c.name, data=c.data,
               data_seed=c.data_seed, index=k,
               bufs=[[b.name, list(b.shape), b.dtype] for b in c.bufs])
          for k, c in enumerate(REGRESSIONS) if c.name in wanted]


# Checked on two worker processes from the end of collection, beside the tests
# before this module (conftest.background_batch).
BATCH = background_batch(_requests, workers=2, timeout=300)


@pytest.fixture(scope="module")
def outcomes():
  """The oracle's outcome for each selected case, by the case's name."""
  return {REGRESSIONS[r["index"]].name: fuzz.Outcome.from_dict(r)
          for r in BATCH.results()}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=c.known_failure))
    if c.known_failure else c for c in REGRESSIONS], ids=lambda c: c.name)
def test_fuzz_regression(outcomes, case: Regression):
  o = outcomes[case.name]
  assert not o.failed, (f"{o.status} (jax.jit copies {o.jax_bytes} bytes, inplace_jax "
                        f"{o.inplace_bytes}):\n{_source(case)}\n{o.detail}")


def test_every_program_is_tested():
  """Each function of the programs module is in REGRESSIONS or has a test here."""
  listed = {c.name for c in REGRESSIONS}
  own = {"switch_zeroes_buffer_in_one_trip_scan"}
  defined = {n for n, f in vars(programs).items()
             if inspect.isfunction(f) and f.__module__ == programs.__name__
             and not n.startswith("_") and n != "f32"}
  assert defined == listed | own
  assert len(listed) == len(REGRESSIONS)


def test_switch_zeroes_buffer_in_one_trip_scan():
  """The documented divergence, and where it no longer shows. jax.jit's program
  copies no buffer here, so inplace_jax.jit runs it: equal to jax.jit bit for bit.
  The sequenced program (what runs where jax.jit's copies a buffer) equals eager
  evaluation; jax.jit differs from both only in the sign of the zeros."""
  import inplace_jax
  import numpy as np
  from inplace_jax._equal import tree_difference

  def args():
    b2 = jnp.asarray(np.random.default_rng(0).normal(size=(24, 32)), jnp.float32)
    return jnp.ones((24, 32), jnp.float32), b2.at[::3].set(-0.0)

  fn = programs.switch_zeroes_buffer_in_one_trip_scan
  with jax.disable_jit():
    eager = fn(*args())
  f = inplace_jax.jit(fn, donate_argnums=(0, 1))
  ours = f(*args())
  ref = jax.jit(fn, donate_argnums=(0, 1))(*args())
  assert f.last_report.program == "jax.jit"
  assert tree_difference(ours, ref) is None
  sequenced = jax.jit(inplace_jax.sequence(fn), donate_argnums=(0, 1),
                      compiler_options=inplace_jax.compiler_options())(*args())
  assert tree_difference(sequenced, eager) is None
  zeros = np.asarray(eager[1])[np.asarray(eager[1]) == 0]
  assert zeros.size == 8 * 32 and not np.signbit(zeros).any()  # -0.0 + 0.0 is +0.0
  assert all(np.array_equal(np.asarray(r), np.asarray(o))     # equal as numbers
             for r, o in zip(ref, sequenced))
  assert tree_difference(ref, sequenced) is not None, (
      "jax.jit now agrees with the sequenced program: move this case to REGRESSIONS")


def test_jax_jit_is_wrong_here(worker):
  """Fuzz seed 5300 #3749: XLA:CPU miscompiles jax.jit's program, and
  inplace_jax's outputs are the eager ones bit for bit. If this starts to fail
  with "ok", XLA fixed it; with "value", inplace_jax now runs the wrong program
  or another one."""
  case = next(c for c in REGRESSIONS
              if c.name == "column_tiled_into_where_after_pass_through_loop")
  src = textwrap.dedent(inspect.getsource(case.fn))
  o = worker.check_source(src, case.name, case.bufs, data=case.data,
                          data_seed=case.data_seed)
  assert o.status == "jax_jit_wrong", (o.status, o.detail)


def test_a_candidate_xla_rejects_is_skipped(worker):
  """Fuzz seed 5300 #8012 (as generated): XLA:CPU fails to compile a clone round's
  candidate ("Unhandled opcode for elemental IR emission: opt-barrier"), which
  crashed the call. Such a candidate is skipped and the rounds go on."""
  o = worker.check(fuzz.generate(5300, 8012))
  assert not o.failed, (o.status, o.detail)
