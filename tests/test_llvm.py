"""The kernels' LLVM IR as the arbiter of elementwise arithmetic (`_llvm.py`), and
integer reductions as exact (`_fingerprint._order_free`).

Every end-to-end test compares with plain `jax.jit` bit for bit on real inputs and
counts copies from real compiles (`conftest.compare`).
"""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import inplace_jax
from inplace_jax import _compat as C
from inplace_jax import _fingerprint, _llvm
from inplace_jax._check import inspect_compiled

from conftest import ON_CPU, compare

pytestmark = pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's kernels and copies")


def _ir(body: str) -> str:
  return ("define void @k(ptr %0) {\n" + body + "\n}\n")


_IN_LOOP = _ir("""\
  %a = load ptr, ptr %0, align 8
  br label %loop
loop:
  %i = phi i64 [ 0, %1 ], [ %j, %loop ]
  %p = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %p, align 4, !alias.scope !1
  %m = fmul float %x, 1.000000e-01
  %s = fadd float %x, %m
  store float %s, ptr %p, align 4
  %j = add i64 %i, 1
  br label %loop""")

# The same arithmetic, the product hoisted out of the loop (LICM): LLVM selects
# instructions block by block, so this product is never contracted into the add.
_HOISTED = _ir("""\
  %a = load ptr, ptr %0, align 8
  %y = load float, ptr %a, align 4
  %m = fmul float %y, 1.000000e-01
  br label %loop
loop:
  %i = phi i64 [ 0, %1 ], [ %j, %loop ]
  %p = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %p, align 4
  %s = fadd float %x, %m
  store float %s, ptr %p, align 4
  %j = add i64 %i, 1
  br label %loop""")


def test_ir_fingerprint_counts_uses_and_values():
  """A product used twice is not contracted into either add; two adds of one
  expression count twice."""
  twice = _IN_LOOP.replace("  store float %s", "  %t = fadd float %x, %m\n  store float %t")
  assert _llvm.fingerprint([_IN_LOOP]) != _llvm.fingerprint([twice])


def test_ir_fingerprint_ignores_names_and_addresses_not_blocks():
  renamed = (_IN_LOOP.replace("%x", "%v7").replace("%m", "%q").replace("i64 %i", "i64 %k")
             .replace("%i =", "%k =").replace("align 4, !alias.scope !1", "align 16"))
  assert _llvm.fingerprint([_IN_LOOP]) == _llvm.fingerprint([renamed])
  assert _llvm.fingerprint([_IN_LOOP]) != _llvm.fingerprint([_HOISTED])
  assert _llvm.fingerprint(["; no function here\n"]) is None


def test_xla_writes_the_optimised_ir_inplace_jax_reads():
  """The compatibility assumption: a compile with `xla_dump_to` writes each kernel's
  optimised IR, and the fingerprint finds the program's multiply and add in it."""
  lowered = jax.jit(lambda a: a + a[3] * 0.1).lower(jnp.ones((64, 64)))
  texts = C.optimised_ir(
      lambda folder: lowered.compile(compiler_options={C.DUMP_OPTION: folder}))
  assert texts and all("define " in t for t in texts)
  fp = _llvm.fingerprint(texts)
  assert fp and any(v.startswith("fmul ") for v, _ in fp)
  assert any(v.startswith(("fadd ", "fsub ")) for v, _ in fp)


def _fresh(shape, dtype=jnp.float32, seed=0):
  x = jax.random.normal(jax.random.key(seed), shape) * 4
  return (x.astype(dtype) if dtype != jnp.int32
          else jax.random.randint(jax.random.key(seed), shape, -20, 21, jnp.int32))


def scaled_row_after_scatter(b):
  """A row picked by a data-dependent index, scaled and added to the whole buffer
  after a scatter (fuzz seed 2040 #224): the HLO shows the product over a
  dynamic-slice under jax.jit and over the tied row once sequenced; in both
  programs LLVM hoists the product out of the loop over the rows."""
  b = b.at[:, jnp.array([14, 6, 12])].mul(0.0)
  head = b[7:16, 0:7]
  v = b[jnp.argmin(b[:, 10]) % 16]
  return head, b + v * -0.1


def scaled_row_after_row_max(b):
  """The same shape of step, where the sequenced program's kernel subtracts a
  hoisted product and jax.jit's computes it in the loop (fuzz seed 2040 #285)."""
  v = b[jnp.argmin(b[:, 2]) % 24]
  b = b.at[17].max(v)
  return v, b - 0.01 * jnp.resize(v, (24, 16))


def test_elementwise_difference_settled_by_ir_is_copy_free_and_exact():
  r = compare(scaled_row_after_scatter, _fresh((16, 16)))
  assert r.ref_report.buffer_copies(1024), "jax.jit's program copies the buffer"
  assert not r.report.buffer_copies(1024)
  f = inplace_jax.jit(scaled_row_after_scatter, donate_argnums=0, on_copy="ignore")
  f(_fresh((16, 16)))
  sig = f.signatures[-1]
  assert sig.program == "sequenced"
  assert sig.chosen.settled_by_ir and not sig.chosen.changed
  assert all(_fingerprint.elementwise(o) for o in sig.chosen.settled_by_ir)


def test_elementwise_difference_the_ir_confirms_keeps_jax_jits_program():
  r = compare(scaled_row_after_row_max, _fresh((24, 16)))
  r.assert_kept_for_arithmetic()
  f = inplace_jax.jit(scaled_row_after_row_max, donate_argnums=0, on_copy="ignore")
  f(_fresh((24, 16)))
  sig = f.signatures[-1]
  assert sig.program == "jax.jit"
  assert any(c.changed and not c.settled_by_ir for c in sig.candidates[1:])


def test_user_dump_options_leave_the_hlo_fingerprint_in_charge(tmp_path):
  """With the user's own `xla_dump_to`, no IR is read: the HLO's verdict stands
  (the copy stays), values as jax.jit's."""
  opts = {C.DUMP_OPTION: str(tmp_path)}
  r = compare(scaled_row_after_scatter, _fresh((16, 16)), compiler_options=opts)
  r.assert_kept_for_arithmetic()


def _sum_form(fn, x):
  _, modules = inspect_compiled(jax.jit(fn).lower(x).compile())
  return [o for o in _fingerprint.fingerprint(modules[0]) if o.form[0] == "reduce"]


def test_integer_reductions_are_order_free():
  pick = lambda b: jnp.sum(lax.dynamic_slice(b, (jnp.argmin(b[:, 8]) % 5, 1), (28, 10)))
  assert not _sum_form(pick, _fresh((32, 16), jnp.int32))
  assert _sum_form(pick, _fresh((32, 16)))


def sum_of_old_block_then_update(b):
  """An integer sum over a block of the old buffer, read after an update
  (fuzz seed 2040 #453's shape)."""
  v = lax.dynamic_slice(b, (jnp.argmin(b[:, 8]) % 5, jnp.argmin(b[:, 6]) % 7), (28, 10))
  b = lax.dynamic_update_slice(b, jnp.resize(b[3] // 2, (31, 6)),
                               (jnp.int32(0), jnp.argmax(b[8]) % 11))
  return b.at[0, 0].set(jnp.sum(v))


def test_integer_sum_over_old_block_is_copy_free_and_exact():
  r = compare(sum_of_old_block_then_update, _fresh((32, 16), jnp.int32))
  assert r.ref_report.buffer_copies(1024)
  assert not r.report.buffer_copies(1024)


def test_multiply_adds_that_differ_in_the_ir_keep_jax_jits_program():
  """Fuzz seed 2044 #1799: the HLO fingerprints are equal, the sequenced program was
  1 ulp off in 4 elements; its kernels' multiply-adds differ from jax.jit's, so
  jax.jit's program runs."""
  import fuzz_regressions_programs as programs
  from inplace_jax.testing.fuzz import make_inputs
  case = next(c for c in programs.REGRESSIONS
              if c.fn is programs.row_add_of_negated_square)
  args = lambda: make_inputs(case.bufs, case.data_seed, case.data)
  compare(case.fn, *args(), donate_argnums=(0, 1))
  f = inplace_jax.jit(case.fn, donate_argnums=(0, 1), on_copy="ignore")
  f(*args())
  sig = f.signatures[-1]
  assert any(c.changed == (_llvm.CONTRACTIONS,) for c in sig.candidates[1:])
  assert sig.chosen.changed == ()


def _kernel(name: str, body: str) -> str:
  return f"define void @{name}(ptr %p, ptr %q) {{\n{body}\n  ret void\n}}\n"


# Kernel 1 stores s = x * 0.5 + -2 (one product, contracted into its add).
_STORES = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 5.000000e-01
  %s = fadd float %m, -2.000000e+00
  store float %s, ptr %q, align 4""")
# Kernel 2 reads s back from memory ...
_READS_BACK = _kernel("k2", """\
  %y = load float, ptr %q, align 4
  %z = fadd float %y, 1.000000e+00
  store float %z, ptr %p, align 4""")
# ... or recomputes it, as XLA does where it duplicates a cheap producer into a
# consumer's fusion.
_RECOMPUTES = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 5.000000e-01
  %s = fadd float %m, -2.000000e+00
  %z = fadd float %s, 1.000000e+00
  store float %z, ptr %p, align 4""")


def test_ir_recomputing_a_stored_value_is_the_same_arithmetic():
  """`same_up_to_materialisation`: a kernel that recomputes a value another kernel
  stores, the same expression, computes what one loading it computes; the plain
  fingerprint says "different"."""
  a, b = _llvm.read([_STORES, _READS_BACK]), _llvm.read([_STORES, _RECOMPUTES])
  assert a.values != b.values
  assert _llvm.same_up_to_materialisation(a, b)
  assert _llvm.same_up_to_materialisation(b, a)


def test_ir_recomputation_that_can_round_differently_is_not_matched():
  """Not matched where reading the value from memory can change how its consumer
  rounds: a stored product recomputed next to the add it feeds (LLVM contracts the
  pair into an FMA), a consumer that may reassociate, a recomputation in another
  form."""
  product = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 5.000000e-01
  store float %m, ptr %q, align 4""")
  fused = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 5.000000e-01
  %z = fadd float %m, 1.000000e+00
  store float %z, ptr %p, align 4""")
  assert not _llvm.same_up_to_materialisation(_llvm.read([product, _READS_BACK]),
                                              _llvm.read([product, fused]))
  reassoc = [t.replace("%z = fadd float", "%z = fadd reassoc float")
             for t in (_READS_BACK, _RECOMPUTES)]
  assert not _llvm.same_up_to_materialisation(_llvm.read([_STORES, reassoc[0]]),
                                              _llvm.read([_STORES, reassoc[1]]))
  other = _RECOMPUTES.replace("5.000000e-01", "2.500000e-01")
  assert not _llvm.same_up_to_materialisation(_llvm.read([_STORES, _READS_BACK]),
                                              _llvm.read([_STORES, other]))


def argmin_over_an_update_picks_the_row_it_overwrites(b):
  """A whole-buffer update whose argmin and argmax pick where to write into it
  (fuzz seed 2040 #73): jax.jit's program recomputes `b * 0.5 - 2` inside the
  argmin's and argmax's loops, reading the old buffer, so it copies it; the
  sequenced one orders them before the write and reads the stored update back.
  The same bits: the recomputation is the stored expression."""
  b = b * 0.5 + -2.0
  return lax.dynamic_update_slice(
      b, jnp.resize(b[2:25, 19:24], (2, 21)),
      (jnp.argmin(b[:, 16]) % 63, jnp.argmax(b[58]) % 4))


def test_update_recomputed_in_its_readers_is_copy_free_and_exact(monkeypatch):
  r = compare(argmin_over_an_update_picks_the_row_it_overwrites, _fresh((64, 24)))
  assert r.ref_report.buffer_copies(1024), "jax.jit's program copies the buffer"
  assert not r.report.buffer_copies(1024)
  f = inplace_jax.jit(argmin_over_an_update_picks_the_row_it_overwrites,
                      donate_argnums=0, on_copy="ignore")
  f(_fresh((64, 24)))
  sig = f.signatures[-1]
  assert sig.program == "sequenced" and sig.chosen.settled_by_ir
  # The plain IR fingerprint alone keeps jax.jit's program.
  monkeypatch.setattr(_llvm, "same_up_to_materialisation", lambda a, b: False)
  g = inplace_jax.jit(argmin_over_an_update_picks_the_row_it_overwrites,
                      donate_argnums=0, on_copy="ignore")
  g(_fresh((64, 24)))
  assert g.signatures[-1].program == "jax.jit"
