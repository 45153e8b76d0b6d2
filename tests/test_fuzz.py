"""Differential fuzzing, CI sample: inplace_jax.jit against jax.jit on random programs.

Every program of the fixed stream `fuzz.generate(CI_SEED, i)`, i < CI_COUNT, is
checked by the fuzzer's oracle (`inplace_jax.testing.fuzz.check_program`, on
`inplace_jax._harness.compare`). A test fails on a hard failure: outputs not
bit-for-bit equal ("value", or "inexact" when only rounding differs), an unverified
HLO report, more copy bytes under inplace_jax.jit, a crash, a dead or hung worker,
or a program jax.jit rejects (a generator bug). Residual copies (a buffer copy left
in an orderable program) and unexplained ones (no cause) are only reported: the
figures (status counts, copy-free rate of orderable programs overall and per
construct) are printed in the terminal summary. The stream is deterministic: a
failure names its seed and index, and
`python -m inplace_jax.testing.fuzz --seed 1000 --start i --count 1` reruns and
shrinks it.

Programs run in two worker processes (`fuzz.run_isolated`): with barriers kept,
XLA can abort the process while compiling, and that must fail one test, not end
the session. They start when collection ends (`conftest.background_batch`), beside
the tests that run first.
"""

import hashlib
import re

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import inplace_jax
from conftest import background_batch
from inplace_jax.testing import fuzz
from inplace_jax.testing.fuzz.shrink import candidates

CI_SEED = 1000
CI_COUNT = 160   # 200 before the matmul/SGD ops and orderable mode (~30% slower each)
WORKERS = 2

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _explain(p: fuzz.Program, o: fuzz.Outcome) -> str:
  return (f"{o.status}: inplace_jax.jit and jax.jit disagree on this program "
          f"(jax.jit copies {o.jax_bytes} bytes, inplace_jax {o.inplace_bytes}).\n"
          f"{fuzz.describe(p)}\n{o.detail}")


class _SampleFigures:
  """A plugin printing the sample's figures in pytest's terminal summary."""

  def __init__(self, results: dict[int, fuzz.Outcome]):
    self.results = results

  def pytest_terminal_summary(self, terminalreporter):
    tr = terminalreporter
    tr.section(f"fuzz sample figures (seed {CI_SEED}, {len(self.results)} programs)")
    for line in fuzz.format_figures(fuzz.figures(self.results.values())).splitlines():
      tr.write_line(line)
    for status in sorted(fuzz.REPORTED):
      idx = [i for i, o in sorted(self.results.items()) if o.status == status]
      if idx:
        tr.write_line(f"{status} (reported, not failed): indices "
                      f"{', '.join(map(str, idx))}")


def _sample_requests(items) -> list[dict]:
  wanted = sorted({item.callspec.params["index"] for item in items
                   if item.originalname == "test_fuzz_sample"})
  return [dict(op="run", seed=CI_SEED, index=i) for i in wanted]


# Run from the end of collection, beside the tests before this module
# (conftest.background_batch).
SAMPLE = background_batch(_sample_requests, WORKERS)


@pytest.fixture(scope="module")
def sample_results(request):
  """Outcomes of the selected sample programs, computed in one isolated batch."""
  results = {r["index"]: fuzz.Outcome.from_dict(r) for r in SAMPLE.results()}
  pm = request.config.pluginmanager
  if not pm.has_plugin("inplace_jax_fuzz_sample_figures"):
    pm.register(_SampleFigures(results), "inplace_jax_fuzz_sample_figures")
  return results


@pytest.fixture(scope="module")
def worker():
  w = fuzz.Worker()
  yield w
  w.close()


# The sample's programs that keep a copy where an in-place order exists
# (status "residual", reported, not failed), as of 2026-12-06 (28, 34 and 100 were
# copy-free before; 62 and 98 since 7aa59cd). Another one turning residual is a
# lost copy-free program (#105 did, at 1837a7d: a side conditional's read of a
# temporary computed from a buffer the loops update).
KNOWN_RESIDUAL = frozenset({143})


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's copies")
def test_no_sample_program_loses_copy_freedom(sample_results):
  lost = sorted(i for i, o in sample_results.items()
                if o.status == "residual" and i not in KNOWN_RESIDUAL)
  assert not lost, "\n\n".join(_explain(fuzz.generate(CI_SEED, i), sample_results[i])
                                for i in lost)


@pytest.mark.parametrize("index", range(CI_COUNT))
def test_fuzz_sample(index, sample_results):
  p = fuzz.generate(CI_SEED, index)
  o = sample_results[index]
  assert o.status != "invalid", (f"generator bug: jax.jit rejects\n{fuzz.describe(p)}\n"
                                 f"{o.detail}")
  assert not o.failed, _explain(p, o)


def test_generator_is_deterministic():
  for i in range(20):
    assert (fuzz.source(fuzz.generate(CI_SEED, i))
            == fuzz.source(fuzz.generate(CI_SEED, i)))


def _key(p: fuzz.Program) -> bytes:
  return (fuzz.source(p) + repr((p.bufs, p.data, p.data_seed))).encode()


def test_legacy_stream_is_unchanged():
  """`Config.legacy()` reproduces the generator before the matmul/SGD ops and
  orderable mode (tests/fuzzgen.py at 1cfc314), so old reports still reproduce."""
  legacy = fuzz.Config.legacy()
  h = hashlib.sha256()
  for i in range(60):
    h.update(_key(fuzz.generate(CI_SEED, i, legacy)))
  assert h.hexdigest() == "d4b915cdc4034fc2f83f99b9d5900ed202bde0cb4273fcc5932619646218c5d1"
  assert hashlib.sha256(_key(fuzz.generate(7, 3003, legacy))).hexdigest() == (
      "0bd05e24dd8a7de70a81054370e01dc8c10e950e1e817662c5b589f4f11f9243")
  assert hashlib.sha256(_key(fuzz.generate(12, 547, legacy))).hexdigest() == (
      "0cbd9b1297134c3a4cca7d02726d2f0d61336f357218686aad3b0bb6f9be52ad")


def test_sample_covers_the_op_families():
  ps = [fuzz.generate(CI_SEED, i) for i in range(CI_COUNT)]
  text = "".join(fuzz.source(p) for p in ps)
  for needle in [".at[", ".set(", ".add(", ".mul(", ".min(", ".max(",
                 "lax.dynamic_update_slice(", "lax.dynamic_slice(", "jnp.array([",
                 "jnp.argmax(", "jnp.sum(", "lax.fori_loop(0, 2,", "lax.while_loop(",
                 "lax.scan(", "lax.cond(", "lax.switch(", "jax.jit(", "jax.checkpoint(",
                 "jax.custom_vjp(", "jax.custom_jvp(", "reverse=True", "unique_indices=True",
                 "jnp.bfloat16", "jnp.int32", "mode='clip'",
                 # matmul reads and SGD steps
                 "jax.vmap(lambda r: r @ ", "jnp.einsum('ij,jk->ik', ", "] @ (",
                 " - 0.1 * v", " * 0.99 - ", " * -0."]:
    assert needle in text, needle
  # an SGD step through a momentum buffer
  assert re.search(r"  (b\d) = \1 \* 0\.[59] \+ v\d+.*\n  (b\d) = \2 - 0\.\d+ \* \1\n",
                   text)
  blocks = [b for p in ps for b in fuzz.blocks(p.body)]
  # identity branches in first and in later positions, and updating branches
  assert any(b.kind == "cond" and b.bodies[0] is None for b in blocks)
  assert any(b.kind == "cond" and b.bodies[1] is None for b in blocks)
  assert any(b.kind == "switch" and None in b.bodies[1:] for b in blocks)
  assert any(b.kind == "cond" and None not in b.bodies for b in blocks)
  # about 80% orderable, every construct among them, old versions read after updates
  orderable = [p for p in ps if p.orderable]
  assert 0.65 * CI_COUNT <= len(orderable) <= 0.92 * CI_COUNT
  assert set().union(*(p.constructs for p in orderable)) == set(fuzz.CONSTRUCTS)
  assert any(re.search(r"\n  o\d+ = b\d\n(.*\n)*  b\d = .*\n(.*\n)*  v\d+ = .*o\d+",
                       fuzz.source(p)) for p in orderable)


def test_orderable_programs_follow_the_rules():
  """Orderable programs: every buffer returned once, no alias returned or updated,
  no output twice, and outputs that jax's donation aliasing pairs with their own
  buffers."""
  n = 0
  for i in range(80):
    p = fuzz.generate(CI_SEED, i)
    if not p.orderable:
      continue
    n += 1
    names = [b.name for b in p.bufs]
    assert sorted(r for r in p.returns if r in names) == names, fuzz.describe(p)
    assert not any(r.startswith("o") for r in p.returns), fuzz.describe(p)
    assert len(set(p.returns)) == len(p.returns), fuzz.describe(p)
    src = fuzz.source(p)
    assert not re.search(r"b\d = (lax\.\w+\()?o\d+", src), src
    out = jax.eval_shape(fuzz.build(p), *p.specs)
    assert fuzz.pairs_buffers(p.returns, p.bufs, out), src
    # shrinking keeps every buffer output
    for q in candidates(p):
      assert all(b in q.returns for b in names)
  assert n > 40


def test_pairing_follows_jax():
  """`pairs_buffers` agrees with jax's donation aliasing on a swap of two buffers of
  one type (jax pairs output 0 with argument 0) and on a value of a buffer's type
  returned first."""
  bufs = [fuzz.Buf("b0", (16, 16), "float32"), fuzz.Buf("b1", (16, 16), "float32")]
  out = (jax.ShapeDtypeStruct((16, 16), np.float32),) * 2
  assert fuzz.pairs_buffers(["b0", "b1"], bufs, out)
  assert not fuzz.pairs_buffers(["b1", "b0"], bufs, out)
  assert not fuzz.pairs_buffers(["v1", "b0", "b1"], bufs, out + out[:1])
  assert fuzz.pairs_buffers(["b0", "b1", "v1"], bufs, out + out[:1])
  assert not fuzz.pairs_buffers(["b0", "b0"], bufs, out)


@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(p=fuzz.programs())
def test_fuzz_hypothesis(worker, p):
  o = worker.check(p)
  assert o.status != "invalid", f"generator bug:\n{fuzz.describe(p)}\n{o.detail}"
  assert not o.failed, _explain(p, o)


def test_oracle_is_exact():
  """The value oracle: NaN equals NaN; the sign of zero and a few ulps are "inexact"
  (still failures); larger differences, integers, dtypes and structure are "value"."""
  import jax.numpy as jnp
  a = np.array([1.0, np.nan, 0.0, 100.0], np.float32)
  assert fuzz.classify_difference((a,), (a.copy(),)) is None
  status, detail = fuzz.classify_difference(
      (a,), (np.array([1.0, np.nan, -0.0, 100.0], np.float32),))
  assert status == "inexact" and "sign of zeros only" in detail
  assert fuzz.classify_difference((a,), (np.nextafter(a, 2).astype(np.float32),))[0] == \
      "inexact"
  assert fuzz.classify_difference((a,), (a + np.float32(0.01),))[0] == "value"
  assert fuzz.classify_difference((a,), (np.where(np.isnan(a), 1, a),))[0] == "value"
  assert fuzz.classify_difference((a,), (a.astype(jnp.bfloat16),))[0] == "value"
  assert fuzz.classify_difference((a,), (a, a))[0] == "value"
  i = np.arange(4, dtype=np.int32)
  assert fuzz.classify_difference((i,), (i + 1,))[0] == "value"
  b = np.array([1.0, 3.0], jnp.bfloat16)
  b1 = np.array([1.0078125, 3.015625], jnp.bfloat16)                # one bf16 ulp
  assert fuzz.classify_difference((b,), (b1,))[0] == "inexact"


def test_figures():
  O = fuzz.Outcome
  outcomes = [
      O("ok", orderable=True, constructs=("straight",), jax_buffer_bytes=4096,
        inplace_buffer_bytes=0, program="sequenced"),
      O("residual", orderable=True, constructs=("loop", "matmul"), jax_buffer_bytes=4096,
        inplace_buffer_bytes=4096, program="jax.jit", residual=True, unexplained=1,
        certified=False),
      O("residual", orderable=True, constructs=("straight",), jax_buffer_bytes=4096,
        inplace_buffer_bytes=2048, program="jax.jit", residual=True, certified=True),
      O("ok", orderable=True, constructs=("straight",), jax_buffer_bytes=0,
        inplace_buffer_bytes=0, program="jax.jit"),
      O("value", orderable=False, constructs=("straight",), jax_buffer_bytes=2048,
        inplace_buffer_bytes=0, program="sequenced"),
      O("inexact", orderable=True, constructs=("matmul", "straight"),
        jax_buffer_bytes=1024, inplace_buffer_bytes=0, program="sequenced"),
      O("died"),
  ]
  f = fuzz.figures(outcomes)
  assert f["programs"] == 7
  assert f["status"] == {"ok": 2, "value": 1, "inexact": 1, "residual": 2, "died": 1}
  assert (f["orderable"], f["orderable_with_jax_jit_copy"], f["copy_free"]) == (5, 4, 2)
  assert f["copy_free_rate"] == 0.5
  # Certified: the two copy-free programs and the residual one with a certificate.
  assert (f["certified"], f["residual_certified"]) == (3, 1)
  assert f["certified_copy_free_rate"] == round(2 / 3, 4)
  assert f["per_construct"]["loop"] == dict(programs=1, copy_free=0, rate=0.0,
                                            certified=0, certified_rate=None)
  assert f["per_construct"]["straight"] == dict(programs=3, copy_free=2,
                                                rate=round(2 / 3, 4), certified=3,
                                                certified_rate=round(2 / 3, 4))
  assert f["per_construct"]["conditional"]["rate"] is None
  assert (f["value"], f["inexact"], f["copies_more"], f["residual"],
          f["unexplained"]) == (1, 1, 0, 2, 1)
  text = fuzz.format_figures(f)
  assert "copy-free under inplace_jax: 2 (50.0%)" in text
  assert "copy-free among them: 2 (66.7%); residual yet certified: 1" in text


def _program(*lines: str, returns=("b0",), shape=(16, 512)) -> fuzz.Program:
  return fuzz.Program((fuzz.Buf("b0", shape, "float32"),),
                      [fuzz.Stmt(line) for line in lines], list(returns), 7, "normal",
                      "fuzz_test", True)


def test_reference_ties_each_read_and_certifies_an_in_place_order():
  """The certificate (`oracle.certify`): the program with its reads tied by hand,
  compiled with barriers kept, is copy-free and bit-equal to jax.jit's; jax.jit's
  own program copies the buffer (a swap, then a read: the issue's first example;
  the read after the swap needs the tie after the updates, or XLA forwards it to
  the buffer before them)."""
  p = _program("v1 = b0[1]", "v2 = b0[14]", "b0 = b0.at[1].set(v2)",
               "b0 = b0.at[14].set(v1)", "v3 = b0[3].sum()", returns=("b0", "v3"))
  src = fuzz.reference_source(p)
  # The reads of a version, tied with it before its update; none after the last.
  assert "(v1, v2, b0) = lax.optimization_barrier((v1, v2, b0))" in src
  assert src.count("optimization_barrier") == 1
  assert fuzz.reference_source(p, after_updates=True).count(
      "b0 = lax.optimization_barrier(b0)") == 2
  x = fuzz.make_inputs(p.bufs, p.data_seed, p.data)[0]
  assert inplace_jax.check(fuzz.build(p), x, donate_argnums=0).buffer_copies(1024)
  ok, why = fuzz.certify(p)
  assert ok, why


@pytest.mark.parametrize("kind,params", [("fori", {"trips": 2}), ("while", {"trips": 2}),
                                         ("scan", {"length": 2})])
def test_reference_ties_the_reads_inside_a_loop_body(kind, params):
  """A loop body unpacks its buffers from the carry: they are its own, and its reads
  are tied there too (the swap then read of the issue, in a loop). Before, only a
  body's arguments were its buffers, so no read in a loop body was tied and the
  certificate failed where an in-place order exists (fuzz seed 6000 #44, #875)."""
  body = [fuzz.Stmt(line) for line in (
      "v1 = b0[1]", "v2 = b0[14]", "b0 = b0.at[1].set(v2)", "b0 = b0.at[14].set(v1)",
      "a1 = a1 + b0[3].sum()")]
  p = fuzz.Program((fuzz.Buf("b0", (16, 512), "float32"),),
                   [fuzz.Block(kind, 1, ("b0",), [body], "v9", params)],
                   ["b0", "v9"], 7, "normal", "fuzz_test", True)
  src = fuzz.reference_source(p)
  assert "\n    (v1, v2, b0) = lax.optimization_barrier((v1, v2, b0))" in src, src
  x = fuzz.make_inputs(p.bufs, p.data_seed, p.data)[0]
  assert inplace_jax.check(fuzz.build(p), x, donate_argnums=0).buffer_copies(1024)
  ok, why = fuzz.certify(p)
  assert ok, why


def test_certificate_refused_where_the_tied_program_copies():
  """An old version returned with the new one: no tie removes that copy."""
  p = _program("o1 = b0", "b0 = b0.at[0].set(1.0)", returns=("b0", "o1"))
  ok, why = fuzz.certify(p)
  assert not ok and "copies" in why


def test_shrinking_keeps_casts_to_int32():
  """A shrunk program keeps the cast that makes an integer buffer's update value
  an integer (dropped, JAX converts the whole buffer to add a float: a copy that is
  no residual); other casts go."""
  import importlib
  # The package re-exports the function `shrink` under the module's name.
  simpler = importlib.import_module("inplace_jax.testing.fuzz.shrink")._simpler
  assert all(".astype(jnp.int32)" in v
             for v in simpler("b0 = b0.at[1].add(jnp.max(v4).astype(jnp.int32) * 2 + 1)"))
  assert "a = a + jnp.sum(v)" in list(simpler("a = a + jnp.sum(v).astype(jnp.float32)"))


def test_certificate_checks_tiny_data():
  # Fuzz seed 7400 #7: the program with its reads tied by hand computes jax.jit's
  # outputs on the program's own and on normal data, but rounds a multiply-add by
  # 0.5 unfused (`b + v * -0.5`, the row's product hoisted out of the loop), which
  # differs where XLA:CPU flushes the product to zero. It is no certificate.
  from inplace_jax.testing.fuzz import oracle
  ok, why = oracle.certify(fuzz.generate(7400, 7))
  assert not ok and "tiny" in why and "normal" not in why, why
