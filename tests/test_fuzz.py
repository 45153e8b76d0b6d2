"""Differential fuzzing, CI sample: inplace_jax.jit against jax.jit on random programs.

Every program of the fixed stream `fuzzgen.generate(CI_SEED, i)`, i < CI_COUNT, must
give bit-for-bit the same outputs under both, with both compiled programs verified by
the HLO inspector and no more copy bytes under inplace_jax.jit (see tests/fuzzgen.py).
The stream is deterministic: a failure names its seed and index, and
`scripts/fuzz_long.py --seed 1000 --start i --count 1` reruns and shrinks it.

Programs run in two worker processes (`fuzzgen.run_isolated`): with barriers kept,
XLA can abort the process while compiling, and that must fail one test, not end
the session.
"""

import pytest
from hypothesis import HealthCheck, given, settings

import fuzzgen

CI_SEED = 1000
CI_COUNT = 200
WORKERS = 2

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _explain(p: fuzzgen.Program, o: fuzzgen.Outcome) -> str:
  return (f"{o.status}: inplace_jax.jit and jax.jit disagree on this program "
          f"(jax.jit copies {o.jax_bytes} bytes, inplace_jax {o.inplace_bytes}).\n"
          f"{fuzzgen.describe(p)}\n{o.detail}")


@pytest.fixture(scope="module")
def sample_results(request):
  """Outcomes of the selected sample programs, computed in one isolated batch."""
  wanted = sorted({item.callspec.params["index"] for item in request.session.items
                   if item.originalname == "test_fuzz_sample"})
  reqs = [dict(op="run", seed=CI_SEED, index=i) for i in wanted]
  results = {}
  for r in fuzzgen.run_isolated(reqs, WORKERS):
    results[r["index"]] = fuzzgen.Outcome(
        **{k: r[k] for k in ("status", "detail", "jax_bytes", "inplace_bytes", "error")})
  return results


@pytest.fixture(scope="module")
def worker():
  w = fuzzgen.Worker()
  yield w
  w.close()


@pytest.mark.parametrize("index", range(CI_COUNT))
def test_fuzz_sample(index, sample_results):
  p = fuzzgen.generate(CI_SEED, index)
  o = sample_results[index]
  assert o.status != "invalid", f"generator bug: jax.jit rejects\n{fuzzgen.describe(p)}\n{o.detail}"
  assert o.ok, _explain(p, o)


def test_generator_is_deterministic():
  for i in range(20):
    assert (fuzzgen.source(fuzzgen.generate(CI_SEED, i))
            == fuzzgen.source(fuzzgen.generate(CI_SEED, i)))


def test_sample_covers_the_op_families():
  text = "".join(fuzzgen.source(fuzzgen.generate(CI_SEED, i)) for i in range(CI_COUNT))
  for needle in [".at[", ".set(", ".add(", ".mul(", ".min(", ".max(",
                 "lax.dynamic_update_slice(", "lax.dynamic_slice(", "jnp.array([",
                 "jnp.argmax(", "jnp.sum(", "lax.fori_loop(0, 2,", "lax.while_loop(",
                 "lax.scan(", "lax.cond(", "lax.switch(", "jax.jit(", "jax.checkpoint(",
                 "jax.custom_vjp(", "jax.custom_jvp(", "reverse=True", "unique_indices=True",
                 "jnp.bfloat16", "jnp.int32", "mode='clip'"]:
    assert needle in text, needle
  blocks = [n for i in range(CI_COUNT) for n in _blocks(fuzzgen.generate(CI_SEED, i).body)]
  # identity branches in first and in later positions, and updating branches
  assert any(b.kind == "cond" and b.bodies[0] is None for b in blocks)
  assert any(b.kind == "cond" and b.bodies[1] is None for b in blocks)
  assert any(b.kind == "switch" and None in b.bodies[1:] for b in blocks)
  assert any(b.kind == "cond" and None not in b.bodies for b in blocks)


def _blocks(body):
  for n in body:
    if isinstance(n, fuzzgen.Block):
      yield n
      for sub in n.bodies:
        yield from _blocks(sub or [])


@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(p=fuzzgen.programs())
def test_fuzz_hypothesis(worker, p):
  o = worker.check(p)
  assert o.status != "invalid", f"generator bug:\n{fuzzgen.describe(p)}\n{o.detail}"
  assert o.ok, _explain(p, o)


def test_oracle_is_exact():
  """The value oracle: NaN equals NaN, but -0.0 is not 0.0 and one ulp is a failure."""
  import numpy as np
  import jax.numpy as jnp
  a = np.array([1.0, np.nan, 0.0], np.float32)
  assert fuzzgen._leaves_equal((a,), (a.copy(),)) is None
  assert fuzzgen._leaves_equal((a,), (np.array([1.0, np.nan, -0.0], np.float32),))
  assert fuzzgen._leaves_equal((a,), (np.nextafter(a, 2).astype(np.float32),))
  assert fuzzgen._leaves_equal((a,), (a.astype(jnp.bfloat16),))    # dtype
  assert fuzzgen._leaves_equal((a,), (a, a))                        # structure
