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


def test_ir_too_deep_to_read_settles_nothing(monkeypatch):
  """Kernels whose expressions nest deeper than Python's recursion limit (the
  Diffrax solve's conditionals lowered to loops): the call runs, nothing is settled
  by the IR, and the HLO's verdict stands (the copy stays), values as jax.jit's."""
  def too_deep(*args, **kwargs):
    raise RecursionError("maximum recursion depth exceeded")
  monkeypatch.setattr(_llvm, "_read", too_deep)
  r = compare(scaled_row_after_scatter, _fresh((16, 16)))
  assert r.ref_report.buffer_copies(1024), "jax.jit's program copies the buffer"
  sig = r.fn.signatures[-1]
  assert not any(c.settled_by_ir for c in sig.candidates), sig.candidates
  assert sig.program == "jax.jit" and r.report.buffer_copies(1024), r.report


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
  """Fuzz seed 2044 #1799: the sequenced program was 1 ulp off in 4 elements; its
  multiply-adds differ from jax.jit's (an add of a negated square), so jax.jit's
  program runs. The kernels' IR told them apart first; since the fingerprint
  follows a product through a negation (fuzz seed 5500 #3283), the HLO does too,
  and either refusal names the difference."""
  import fuzz_regressions_programs as programs
  from inplace_jax.testing.fuzz import make_inputs
  case = next(c for c in programs.REGRESSIONS
              if c.fn is programs.row_add_of_negated_square)
  args = lambda: make_inputs(case.bufs, case.data_seed, case.data)
  compare(case.fn, *args(), donate_argnums=(0, 1))
  f = inplace_jax.jit(case.fn, donate_argnums=(0, 1), on_copy="ignore")
  f(*args())
  sig = f.signatures[-1]
  assert any(c.changed for c in sig.candidates[1:])
  assert sig.chosen.changed == ()


def _kernel(name: str, body: str) -> str:
  return f"define void @{name}(ptr %p, ptr %q) {{\n{body}\n  ret void\n}}\n"


# Kernel 1 stores s = x * 0.75 + -2 (one product, contracted into its add).
_STORES = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
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
  %m = fmul float %x, 7.500000e-01
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


# Kernel 1 stores a product; kernel 2 recomputes it next to the add it feeds.
_PRODUCT = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  store float %m, ptr %q, align 4""")
_FUSED = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  %z = fadd float %m, 1.000000e+00
  store float %z, ptr %p, align 4""")


def test_ir_recomputation_that_can_round_differently_is_not_matched():
  """Not matched where reading the value from memory can change how its consumer
  rounds: a stored product recomputed next to the add it feeds (LLVM contracts the
  pair into an FMA), a consumer that may reassociate, a recomputation in another
  form."""
  product, fused = _PRODUCT, _FUSED
  assert not _llvm.same_up_to_materialisation(_llvm.read([product, _READS_BACK]),
                                              _llvm.read([product, fused]))
  reassoc = [t.replace("%z = fadd float", "%z = fadd reassoc float")
             for t in (_READS_BACK, _RECOMPUTES)]
  assert not _llvm.same_up_to_materialisation(_llvm.read([_STORES, reassoc[0]]),
                                              _llvm.read([_STORES, reassoc[1]]))
  other = _RECOMPUTES.replace("7.500000e-01", "2.500000e-01")
  assert not _llvm.same_up_to_materialisation(_llvm.read([_STORES, _READS_BACK]),
                                              _llvm.read([_STORES, other]))


def test_ir_a_power_of_two_product_plus_a_constant_is_one_value():
  """`_llvm._exact_scalings`: a product by a power of two whose only uses are
  adds of a constant of magnitude 2^-100 or more rounds alike contracted (one
  use, two kernels) or not (two uses, one kernel). With a variable added, a
  constant under 2^-100, or a multiplier no power of two, it does not, and the
  forms stay different. A stored product keeps its form."""
  def programs(scale: str, c1: str, c2: str = "-3.000000e+00"):
    def one(name: str, c: str) -> str:
      return _kernel(name, f"""\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, {scale}
  %s = fadd float %m, {c}
  store float %s, ptr %q, align 4""")
    shared = _kernel("k1", f"""\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, {scale}
  %s = fadd float %m, {c1}
  %t = fadd float %m, {c2}
  store float %s, ptr %q, align 4
  store float %t, ptr %p, align 4""")
    return _llvm.read([one("k1", c1), one("k2", c2)]), _llvm.read([shared])

  for scale in ("5.000000e-01", "-2.500000e-01", "f0x3A800000"):      # 2^-10
    for c in ("1.000000e+00", "-7.000000e+00"):
      assert _llvm.same_semantics(*programs(scale, c))
  assert not _llvm.same_semantics(*programs("7.500000e-01", "1.000000e+00"))
  assert not _llvm.same_semantics(*programs("2.000000e+00", "1.000000e+00"))
  assert not _llvm.same_semantics(*programs("5.000000e-01", "f0x00800000"))
  assert not _llvm.same_semantics(*programs("5.000000e-01", "%x"))
  stored = _PRODUCT.replace("7.500000e-01", "5.000000e-01")
  assert "fmul" in str(_llvm._parsed([stored]))


def test_a_power_of_two_product_plus_a_constant_rounds_alike_fused_or_not():
  """The fact `_llvm._exact_scalings` rests on, measured on XLA:CPU: `x * m + c`
  for m a power of two and |c| >= 2^-100 gives the same bits computed in one
  kernel (where LLVM contracts it to an FMA) and with the product stored first
  (a barrier between them, kept by inplace_jax's compile options), on normal,
  tiny, subnormal and special inputs. With a variable added instead, the two
  differ where the product is subnormal: the contraction happens, and the test
  can tell."""
  import numpy as np
  rng = np.random.default_rng(0)
  normal = rng.standard_normal(4096).astype(np.float32)
  x = np.concatenate([
      normal, normal * np.float32(2.0 ** -122), normal * np.float32(2.0 ** -140),
      np.float32(2.0 ** -126) * np.arange(1, 65, dtype=np.float32),
      np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32)])
  opts = inplace_jax.compiler_options()

  def both(fused, split, *args):
    a = jax.jit(fused).lower(*args).compile()(*args)
    b = jax.jit(split).lower(*args).compile(compiler_options=opts)(*args)
    return np.asarray(a).view(np.int32), np.asarray(b).view(np.int32)

  for m in (0.5, -0.25, 2.0 ** -20):
    for c in (1.0, -3.0, 2.0 ** -100, 1e30):
      a, b = both(lambda x: x * m + c,
                  lambda x: lax.optimization_barrier(x * m) + c, x)
      np.testing.assert_array_equal(a, b, err_msg=f"x * {m} + {c}")
  y = np.float32(1.5 * 2.0 ** -126) * np.ones_like(x)
  a, b = both(lambda x, y: x * 0.5 + y,
              lambda x, y: lax.optimization_barrier(x * 0.5) + y, x, y)
  if (a == b).all():
    pytest.skip("no multiply-add contracted on this machine: the check has no power")


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
  monkeypatch.setattr(_llvm, "same_semantics", lambda a, b: False)
  g = inplace_jax.jit(argmin_over_an_update_picks_the_row_it_overwrites,
                      donate_argnums=0, on_copy="ignore")
  g(_fresh((64, 24)))
  assert g.signatures[-1].program == "jax.jit"


# Multiply-adds as LLVM forms them (`_llvm._lane_values`): an add or subtract takes
# the first of its operands that is a product computed in its block with that one
# use; where the others are computed no longer matters.
def _sub_of_products(first_hoisted: bool, second_hoisted: bool) -> str:
  pre, loop = [], []
  (pre if first_hoisted else loop).append("  %m = fmul float %x0, 9.900000e-01")
  (pre if second_hoisted else loop).append("  %n = fmul float %y0, 7.500000e-01")
  return _ir("\n".join([
      "  %a = load ptr, ptr %0, align 8",
      "  %x0 = load float, ptr %a, align 4",
      "  %y0 = load float, ptr %a, align 4", *pre,
      "  br label %loop",
      "loop:", *loop,
      "  %s = fsub float %m, %n",
      "  store float %s, ptr %a, align 4",
      "  br label %loop"]))


def test_ir_an_fma_is_formed_from_the_first_contractible_product():
  both = _llvm.read([_sub_of_products(False, False)])
  second_out = _llvm.read([_sub_of_products(False, True)])
  first_out = _llvm.read([_sub_of_products(True, False)])
  assert both.contractions != second_out.contractions   # the placements differ
  # x * 0.99 is contracted either way, y * 0.75 rounded either way: the same FMA.
  assert _llvm.contractions_match(both, second_out)
  # With x * 0.99 out of the loop, y * 0.75 is contracted instead: another FMA.
  assert not _llvm.contractions_match(both, first_out)


def test_ir_an_fma_matches_measured_xla_cpu():
  """What the model above rests on, measured on this machine's XLA:CPU: in
  `x * a - y * b` the first product is contracted (its result equals the FMA of x
  and a with y * b rounded), and `x * a + y` is one FMA."""
  import numpy as np
  x, y = (np.asarray(_fresh((64, 64), seed=s)) for s in (1, 2))
  a, b = np.float32(0.99), np.float32(0.5)
  got = np.asarray(jax.jit(lambda x, y: x * a - y * b)(x, y))
  first = (x.astype(np.float64) * np.float64(a) - (y * b).astype(np.float64)).astype(
      np.float32)
  assert (got == first).all()
  assert (got != x * a - y * b).any()       # rounded twice: not what XLA computes


def _lane_kernels(vector: bool) -> str:
  """Kernel 1 stores s = x * 0.99 - y * 0.25, 8 lanes wide or one element at a
  time; kernel 2 recomputes it, one element, to compare it."""
  if vector:
    k1 = _kernel("k1", """\
  %x = load <8 x float>, ptr %p, align 4
  %y = call <8 x float> @llvm.masked.load.v8f32.p0(ptr %q, i32 4, <8 x i1> %mask, <8 x float> poison)
  %m = fmul <8 x float> %x, splat (float 9.900000e-01)
  %n = fmul <8 x float> %y, <float 2.500000e-01, float 2.500000e-01, float 2.500000e-01, float 2.500000e-01, float 2.500000e-01, float 2.500000e-01, float 2.500000e-01, float 2.500000e-01>
  %s = fsub <8 x float> %m, %n
  store <8 x float> %s, ptr %p, align 4""")
  else:
    k1 = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  %m = fmul float %x, 9.900000e-01
  %n = fmul float %y, 2.500000e-01
  %s = fsub float %m, %n
  store float %s, ptr %p, align 4""")
  return k1


_RECOMPUTED_LANE = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  %m = fmul float %x, 9.900000e-01
  %n = fmul float %y, 2.500000e-01
  %s = fsub float %m, %n
  %c = fcmp ogt float %s, 0.000000e+00
  %z = select i1 %c, float %s, float 0.000000e+00
  store float %z, ptr %q, align 4""")
_READ_LANE = _kernel("k2", """\
  %s = load float, ptr %p, align 4
  %c = fcmp ogt float %s, 0.000000e+00
  %z = select i1 %c, float %s, float 0.000000e+00
  store float %z, ptr %q, align 4""")


def test_ir_vector_and_scalar_code_form_the_same_multiply_adds():
  """The multiply-add veto reads vector code and scalar code of one expression
  alike (`contractions_match`); the exact shares tell them apart."""
  a = _llvm.read([_lane_kernels(True), _READ_LANE])
  b = _llvm.read([_lane_kernels(False), _READ_LANE])
  assert a.contractions != b.contractions
  assert _llvm.contractions_match(a, b)


def test_ir_operand_order_matters_only_between_two_products():
  """IEEE addition commutes: `a + y` and `y + a` are one value, and so are `m + n`
  and `n + m` where the product m has another use (only n can be contracted). Of
  two contractible products, the first is contracted: another value."""
  def kernel(order: str, m_used_twice: bool) -> _llvm.Kernels:
    other = "%a = fadd float %m, 1.000000e+00" if m_used_twice else \
        "%a = fadd float %x, 1.000000e+00"
    k = _llvm.read([_kernel("k", f"""\
  %x = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  %m = fmul float %x, 7.500000e-01
  {other}
  %n = fmul float %y, 2.500000e-01
  %s = fadd float {order}
  store float %a, ptr %q, align 4
  store float %s, ptr %p, align 4""")])
    assert k is not None
    return k

  assert _llvm.contractions_match(kernel("%a, %y", True), kernel("%y, %a", True))
  assert _llvm.contractions_match(kernel("%m, %n", True), kernel("%n, %m", True))
  assert not _llvm.contractions_match(kernel("%m, %n", False), kernel("%n, %m", False))


def sgd_step_with_a_row_picked_by_argmax(b):
  """Fuzz seed 2040 #82, shrunk: a whole-buffer step that subtracts a row picked by
  an argmax, then a row set. Tied, the row's product is hoisted out of the loop
  over rows where jax.jit's kernel computes it in the loop; the FMA is formed from
  `b * 0.99` either way."""
  v = b[jnp.argmax(b[10]) % 24]
  b = b * 0.99 - 0.5 * v
  return b.at[21].set(b[9])


def sgd_step_whose_row_another_buffer_gets(b0, b1):
  """Seed 2040 #87, shrunk: jax.jit's program recomputes row 28 of the step, one
  element at a time, in the kernel that writes it into the other buffer; the
  sequenced one reads the row the 8-lane step stored."""
  b1 = b1 * 0.99 - 0.25 * b1[27]
  return b0.at[:, 18].set(jnp.resize(b1[28], (24,))), b1


def row_added_with_its_operands_swapped(b0):
  """Seed 2040 #205, shrunk: the sequenced kernel adds the same two values in the
  other order."""
  v = b0[jnp.arange(1) * 3 % 32, jnp.arange(1) * 3 % 32]
  return v, b0.at[21].add(jnp.resize(v, (32,)) * 0.5 + 1)


@pytest.mark.parametrize("fn, shapes, copy_free", [
    # Settled by the lane-free multiply-add veto.
    (row_added_with_its_operands_swapped, [(32, 32)], True),
    # Settled by the semantic forms (`_llvm.same_semantics`): one lane's rounding
    # operations, a stored row read where the other program recomputes it.
    (sgd_step_with_a_row_picked_by_argmax, [(24, 16)], True),
    (sgd_step_whose_row_another_buffer_gets, [(24, 24), (48, 32)], True),
], ids=lambda x: getattr(x, "__name__", ""))
def test_same_multiply_adds_in_other_code_are_exact(fn, shapes, copy_free):
  for seed in range(2):
    args = [_fresh(s, seed=seed + i) for i, s in enumerate(shapes)]
    r = compare(fn, *args, donate_argnums=tuple(range(len(shapes))))
    assert r.ref_report.buffer_copies(1024), "jax.jit's program copies a buffer"
    assert bool(r.report.buffer_copies(1024)) != copy_free


def test_ir_multiply_add_shares_compare_hoisted_with_in_loop():
  """One expression hoisted in one kernel and contracted in the loop in three,
  against the other way round: the same expressions, other elements contracted.
  Both views compare the shares of hoisted and in-loop instances in one group."""
  a = _llvm.read([_HOISTED, _IN_LOOP, _IN_LOOP, _IN_LOOP])
  b = _llvm.read([_HOISTED, _HOISTED, _HOISTED, _IN_LOOP])
  assert a.contractions != b.contractions
  assert not _llvm.contractions_match(a, b)
  assert _llvm.contractions_match(a, _llvm.read([_IN_LOOP, _HOISTED, _IN_LOOP, _IN_LOOP]))


# The semantic forms (`_llvm.same_semantics`): each value as one lane's operations
# that round, multiply-adds written out, stored values read as loads.


def test_semantics_read_vector_and_scalar_code_alike():
  """Vector code of an expression (masked loads, splats, lane-wide constants)
  computes each lane as the scalar code does; a consumer that recomputes the
  stored value is the consumer that loads it."""
  vector = _llvm.read([_lane_kernels(True), _READ_LANE])
  scalar = _llvm.read([_lane_kernels(False), _RECOMPUTED_LANE])
  assert vector.values != scalar.values
  assert _llvm.same_semantics(vector, scalar)
  assert _llvm.same_semantics(scalar, vector)
  stored = _llvm.read([_STORES, _READS_BACK])
  assert _llvm.same_semantics(stored, _llvm.read([_STORES, _RECOMPUTES]))


def test_semantics_tell_where_a_product_is_contracted():
  """A product contracted into its add in one program and hoisted (rounded on its
  own) in the other; or stored by one kernel and contracted by another where the
  other program loads it (fuzz seed 2063 #8875): different."""
  assert not _llvm.same_semantics(_llvm.read([_IN_LOOP]), _llvm.read([_HOISTED]))
  product, fused = _PRODUCT, _FUSED
  loads = _kernel("k2", """\
  %m = load float, ptr %q, align 4
  %z = fadd float %m, 1.000000e+00
  store float %z, ptr %p, align 4""")
  assert not _llvm.same_semantics(_llvm.read([product, fused]),
                                  _llvm.read([product, loads]))
  # The same stored product, loaded in both, or contracted in neither: alike.
  assert _llvm.same_semantics(_llvm.read([product, loads]),
                              _llvm.read([product, loads.replace("k2", "k3")]))


def test_semantics_read_a_shared_product_as_a_load():
  """A stored product recomputed where an add or subtract shares it with another
  use (`v - v` for `v = x * 0.75`) rounds on its own: x86 forms an FMA only from a
  product with one use, so the recomputation is the stored value (fuzz seed 5800
  #237). With one use, it is not (the add may contract it)."""
  shared = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  %z = fsub float %m, %m
  store float %z, ptr %p, align 4""")
  loads = _kernel("k2", """\
  %m = load float, ptr %q, align 4
  %z = fsub float %m, %m
  store float %z, ptr %p, align 4""")
  assert _llvm.same_semantics(_llvm.read([_PRODUCT, shared]),
                              _llvm.read([_PRODUCT, loads]))
  assert not _llvm.recomputes_unloadably(_llvm.read([_PRODUCT, shared]),
                                         _llvm.read([_PRODUCT, loads]))
  single = shared.replace("%z = fsub float %m, %m", "%z = fsub float %m, %x")
  single_loads = loads.replace("%z = fsub float %m, %m",
                               "%x = load float, ptr %p, align 4\n  %z = fsub float %m, %x")
  assert not _llvm.same_semantics(_llvm.read([_PRODUCT, single]),
                                  _llvm.read([_PRODUCT, single_loads]))


def _bounded(kernel: str, trips: int) -> str:
  """`kernel`'s loop run `trips` times (its last branch made a compare and exit)."""
  head, _, _ = kernel.rpartition("  br label %loop")
  return head + (f"  %c = icmp eq i64 %j, {trips}\n  br i1 %c, label %exit, label %loop\n"
                 "exit:\n  ret void\n}\n")


# `_IN_LOOP` unrolled twice: two instances of the contracted form per iteration.
_IN_LOOP_TWICE = _ir("""\
  %a = load ptr, ptr %0, align 8
  br label %loop
loop:
  %i = phi i64 [ 0, %1 ], [ %j, %loop ]
  %p = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %p, align 4, !alias.scope !1
  %m = fmul float %x, 1.000000e-01
  %s = fadd float %x, %m
  store float %s, ptr %p, align 4
  %k = add i64 %i, 1
  %p2 = getelementptr float, ptr %a, i64 %k
  %x2 = load float, ptr %p2, align 4, !alias.scope !1
  %m2 = fmul float %x2, 1.000000e-01
  %s2 = fadd float %x2, %m2
  store float %s2, ptr %p2, align 4
  %j = add i64 %i, 2
  br label %loop""")


def _straight(n: int) -> str:
  """`_IN_LOOP`'s arithmetic as straight-line code over `n` elements."""
  rows = "".join(f"""\
  %p{i} = getelementptr float, ptr %a, i64 {i}
  %x{i} = load float, ptr %p{i}, align 4
  %m{i} = fmul float %x{i}, 1.000000e-01
  %s{i} = fadd float %x{i}, %m{i}
  store float %s{i}, ptr %p{i}, align 4
""" for i in range(n))
  return _ir(f"  %a = load ptr, ptr %0, align 8\n{rows}  ret void")


def test_semantics_want_each_form_over_the_same_loops():
  """An expression contracted in one kernel and not in another (a product left in
  the loop for some elements, hoisted for others: fuzz regression #3030) is the
  same in two programs only where each computes each form in kernels over the same
  loops (`_llvm._form_table`): which element takes which form is known only
  through the kernels. How often a loop's text holds its one form (unrolled six
  times in one program, vectorized in the other: fuzz seed 6500 #4846) says
  nothing about which elements take it; in straight-line code each instance is an
  element, and in a kernel holding two forms their order is which element takes
  which (`kernels_of_ambiguous_forms_differ`)."""
  mixed = _llvm.read([_bounded(_IN_LOOP, 48), _bounded(_HOISTED.replace("@k", "@h"), 16)])
  unrolled = _llvm.read([_bounded(_IN_LOOP_TWICE, 48),
                         _bounded(_HOISTED.replace("@k", "@h"), 16)])
  assert _llvm.same_semantics(mixed, unrolled)
  assert not _llvm.kernels_of_ambiguous_forms_differ(mixed, unrolled)
  # The forms' loops swapped: the contracted form now computes the other kernel's
  # elements.
  swapped = _llvm.read([_bounded(_IN_LOOP, 16), _bounded(_HOISTED.replace("@k", "@h"), 48)])
  assert not _llvm.same_semantics(mixed, swapped)
  assert _llvm.kernels_of_ambiguous_forms_differ(mixed, swapped)
  # Straight-line code: one instance more is one element more of that form.
  hoisted = _ir("""\
  %a = load ptr, ptr %0, align 8
  %y = load float, ptr %a, align 4
  %m = fmul float %y, 1.000000e-01
  br label %next
next:
  %s = fadd float %y, %m
  store float %s, ptr %a, align 4
  ret void""").replace("@k", "@h")
  one, two = (_llvm.read([_straight(1), hoisted]), _llvm.read([_straight(2), hoisted]))
  assert not _llvm.same_semantics(one, two)
  assert _llvm.kernels_of_ambiguous_forms_differ(one, two)


def test_semantics_keep_reductions_and_unmeasured_transcendentals_placed():
  """A reduction's adds may reassociate (machine combiner), so a value it reads
  from memory and one it recomputes are not matched; `tan`, whose vector and
  scalar code differ (`test_lane_transcendentals_match_scalar_code`), keeps its
  width; `sin` does not."""
  reassoc = [t.replace("%z = fadd float", "%z = fadd reassoc float")
             for t in (_READS_BACK, _RECOMPUTES)]
  assert not _llvm.same_semantics(_llvm.read([_STORES, reassoc[0]]),
                                  _llvm.read([_STORES, reassoc[1]]))

  def transcendental(name: str, vector: bool) -> str:
    ty, suffix = ("<8 x float>", "v8f32") if vector else ("float", "f32")
    return _kernel("k1", f"""\
  %x = load {ty}, ptr %p, align 4
  %t = call {ty} @llvm.{name}.{suffix}({ty} %x)
  %z = fmul {ty} %t, {'splat (float 2.500000e-01)' if vector else '2.500000e-01'}
  store {ty} %z, ptr %q, align 4""")

  assert _llvm.same_semantics(_llvm.read([transcendental("sin", True)]),
                              _llvm.read([transcendental("sin", False)]))
  assert not _llvm.same_semantics(_llvm.read([transcendental("tan", True)]),
                                  _llvm.read([transcendental("tan", False)]))


def test_semantics_read_a_pick_of_memory_and_constants_as_a_load():
  """A dynamic-update-slice fused into arithmetic picks the update or the loaded
  element (a phi of a load and a constant, or a select): that rounds nothing, and
  reads as the load of the other program, whose update wrote the buffer in place
  (fuzz seed 3300 #668). A phi that carries arithmetic round a loop (a sum's
  accumulator) is no pick."""
  def affine(head: str, value: str) -> str:
    return _kernel("k1", f"""\
{head}
  %m = fmul float {value}, 7.500000e-01
  %s = fadd float %m, -2.000000e+00
  store float %s, ptr %q, align 4""")

  loaded = _llvm.read([affine("  %x = load float, ptr %p, align 4", "%x")])
  phi = _llvm.read([affine("""\
  %x = load float, ptr %p, align 4
  br label %b
b:
  %v = phi float [ %x, %0 ], [ 0.000000e+00, %b ]""", "%v")])
  select = _llvm.read([affine("""\
  %x = load float, ptr %p, align 4
  %c = load i1, ptr %q, align 1
  %v = select i1 %c, float 0.000000e+00, float %x""", "%v")])
  assert _llvm.same_semantics(phi, loaded) and _llvm.same_semantics(select, loaded)
  carried = _llvm.read([affine("""\
  %x = load float, ptr %p, align 4
  br label %b
b:
  %v = phi float [ %x, %0 ], [ %w, %b ]
  %w = fadd float %v, 1.000000e+00""", "%v")])
  carried_loaded = _llvm.read([affine("""\
  %x = load float, ptr %p, align 4
  br label %b
b:
  %v = phi float [ %x, %0 ], [ %w, %b ]
  %w = fadd float %v, 1.000000e+00""", "%x")])
  assert not _llvm.same_semantics(carried, carried_loaded)


def test_semantics_read_a_computed_integer_as_a_stored_one():
  """Integer arithmetic is exact: `float(-n)` computed from the buffer rounds as
  `float(m)` for the stored `m = -n` (fuzz seed 1000 #62). A float conversion
  still reads as a conversion: loaded floats are not taken for it."""
  def scaled(head: str, value: str) -> str:
    return _kernel("k1", f"""\
{head}
  %f = sitofp i32 {value} to float
  %m = fmul float %f, 2.500000e-01
  store float %m, ptr %q, align 4""")

  loaded = _llvm.read([scaled("  %n = load i32, ptr %p, align 4", "%n")])
  negated = _llvm.read([scaled("""\
  %n = load i32, ptr %p, align 4
  %k = sub i32 0, %n""", "%k")])
  assert loaded.values != negated.values
  assert _llvm.same_semantics(negated, loaded) and _llvm.same_semantics(loaded, negated)
  as_float = _llvm.read([_kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 2.500000e-01
  store float %m, ptr %q, align 4""")])
  assert not _llvm.same_semantics(negated, as_float)


def test_semantics_read_a_constant_some_kernel_stores_as_a_load():
  """A window set to -2.0 in place and loaded by the step's kernel, against a
  kernel that fuses the set into the step and subtracts from the constant (fuzz
  seed 7400 #2611): alike where some kernel stores -2.0, not otherwise."""
  step = _kernel("k2", """\
  %y = load float, ptr %q, align 4
  %p = fmul float %y, 2.500000e-01
  %z = fsub float CONSTANT, %p
  store float %z, ptr %p, align 4""")
  sets = _kernel("k1", """\
  store float -2.000000e+00, ptr %q, align 4""")
  other = _kernel("k1", """\
  store float -3.000000e+00, ptr %q, align 4""")
  loads = step.replace("CONSTANT", "%x").replace(
      "  %y", "  %x = load float, ptr %p, align 4\n  %y")
  fused = step.replace("CONSTANT", "-2.000000e+00")
  assert _llvm.same_semantics(_llvm.read([sets, loads]), _llvm.read([fused]))
  assert not _llvm.same_semantics(_llvm.read([other, loads]), _llvm.read([fused]))


def _maximum_of(body: str, result: str) -> str:
  return _kernel("k1", f"""\
  %v = load <4 x float>, ptr %p, align 16
  %w = fmul <4 x float> %v, %v
{body}
  %s = fmul float {result}, 7.500000e-01
  store float %s, ptr %q, align 4""")


def test_semantics_read_nests_of_maximums_as_one_pick():
  """An IEEE maximum picks one of its operands whatever the order and grouping:
  a vector reduction by maximum and a tree of shuffles and lane maximums over the
  same products pick alike (fuzz seed 1000 #98). A `maxnum` tree (either zero
  where two compare equal) is left as written, and so is a maximum over other
  operands."""
  reduced = _llvm.read([_maximum_of("""\
  %r = tail call reassoc float @llvm.vector.reduce.fmaximum.v4f32(<4 x float> %w)""",
                                    "%r")])

  def shuffled(fn: str, operand: str = "%w") -> _llvm.Kernels:
    return _llvm.read([_maximum_of(f"""\
  %h = shufflevector <4 x float> {operand}, <4 x float> poison, <4 x i32> <i32 2, i32 3, i32 poison, i32 poison>
  %a = tail call <4 x float> @llvm.{fn}.v4f32(<4 x float> {operand}, <4 x float> %h)
  %g = shufflevector <4 x float> %a, <4 x float> poison, <4 x i32> <i32 1, i32 poison, i32 poison, i32 poison>
  %b = tail call <4 x float> @llvm.{fn}.v4f32(<4 x float> %a, <4 x float> %g)
  %r = extractelement <4 x float> %b, i64 0""", "%r")])

  assert reduced.values != shuffled("maximum").values
  assert _llvm.same_semantics(reduced, shuffled("maximum"))
  assert not _llvm.same_semantics(reduced, shuffled("maxnum"))
  assert not _llvm.same_semantics(reduced, shuffled("maximum", "%v"))


def test_semantics_read_a_subtracted_product_as_an_added_negated_one():
  """`1 - x * 0.75`, where LLVM folded the negation of a stored `-x` into the
  subtraction, is `(-x) * 0.75 + 1` bit for bit, fused or not: alike with the
  kernel that loads the stored `-x` (fuzz seed 3300 #673). Without `-x` stored
  anywhere, the two are different expressions."""
  stores_neg = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %n = fneg float %x
  store float %n, ptr %q, align 4""")
  loads_neg = _kernel("k2", """\
  %y = load float, ptr %q, align 4
  %m = fmul float %y, 7.500000e-01
  %s = fadd float %m, 1.000000e+00
  store float %s, ptr %p, align 4""")
  folded = _kernel("k2", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  %s = fsub float 1.000000e+00, %m
  store float %s, ptr %q, align 4""")
  assert _llvm.same_semantics(_llvm.read([stores_neg, loads_neg]),
                              _llvm.read([stores_neg, folded]))
  assert not _llvm.same_semantics(_llvm.read([loads_neg]), _llvm.read([folded]))


def _scalar_elementwise(fn):
  """`fn` applied one element at a time (a loop of dynamic slices: XLA:CPU emits
  it as scalar code), to compare with XLA:CPU's vector code of `jax.jit(fn)`."""
  def g(x):
    def body(i, y):
      return lax.dynamic_update_index_in_dim(
          y, fn(lax.dynamic_index_in_dim(x, i, keepdims=False)), i, 0)
    return lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(x))
  return jax.jit(g)


@pytest.mark.parametrize("name", ["sin", "cos", "exp", "log", "tan"])
def test_lane_transcendentals_match_scalar_code(name):
  """Measured, what `_llvm._LANE_CALLS` rests on: XLA:CPU's vector and scalar code
  of sin, cos, exp and log give the same bits (random bit patterns and normal
  values over 20 binades: 0 of 2^24 differed per function, 2026-12-02, with AVX-512
  and with `--xla_cpu_max_isa=AVX2`); tan differs in about a quarter of them, so
  it is not read lane-wise."""
  import numpy as np
  fn = getattr(jnp, name)
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.integers(0, 1 << 32, 1 << 15, dtype=np.uint64)
                      .astype(np.uint32).view(np.float32),
                      (rng.standard_normal(1 << 15) * 10.0 ** rng.integers(-4, 5, 1 << 15))
                      .astype(np.float32)])
  xs = jnp.asarray(x)
  vector = np.asarray(jax.jit(fn)(xs))
  scalar = np.asarray(_scalar_elementwise(fn)(xs))
  same = (vector.view(np.uint32) == scalar.view(np.uint32)) | (
      np.isnan(vector) & np.isnan(scalar))
  assert same.all() == (name != "tan"), int((~same).sum())


def _row_set_then_tanh_step(b, c, v):
  b = lax.dynamic_update_index_in_dim(b, v, 3, 0)
  return b * 0.9 + jnp.tanh(c)


def test_a_select_llvm_branches_ends_a_block():
  """Measured on this machine's XLA:CPU: `b.at[3].set(v) * 0.9 + tanh(c)` with `b`
  donated is one kernel of scalar code, where LLVM turns tanh's select of a
  division into a branch: the product is rounded before the add. Not donated, the
  kernel is vector code and computes one FMA. The IR's reading tells the two
  apart (`_llvm._selects_branched`; fuzz seed 4900 #2723)."""
  import numpy as np
  b, c = (np.asarray(_fresh((24, 24), seed=s)) for s in (1, 2))
  v = np.asarray(_fresh((24,), seed=3))
  row_set = b.copy()
  row_set[3] = v
  t = np.asarray(jax.jit(jnp.tanh)(c))
  fused = (row_set.astype(np.float64) * np.float64(np.float32(0.9)) + t).astype(np.float32)
  rounded = row_set * np.float32(0.9) + t
  assert (fused != rounded).any()
  kernels = {}
  for donate in ((), (0,)):
    fn = jax.jit(_row_set_then_tanh_step, donate_argnums=donate)
    got = np.asarray(fn(jnp.asarray(b), jnp.asarray(c), jnp.asarray(v)))
    assert (got == (rounded if donate else fused)).all()
    lowered = fn.lower(jnp.asarray(b), jnp.asarray(c), jnp.asarray(v))
    kernels[donate] = _llvm.read(C.optimised_ir(
        lambda folder, lowered=lowered: lowered.compile(
            compiler_options={C.DUMP_OPTION: folder})))
  scalar, vector = kernels[(0,)], kernels[()]
  assert not _llvm.same_semantics(scalar, vector)
  assert not _llvm.same_semantics(vector, scalar)


def _row_set_then_sqrt_step(b, c, v):
  b = lax.dynamic_update_index_in_dim(b, v, 3, 0)
  return b * 0.9 + jnp.where(c < 0.5, c, jnp.sqrt(jnp.abs(c)))


def test_a_select_of_a_sqrt_is_not_branched():
  """The other side of `_llvm._selects_branched`, measured: with a `sqrt` in place
  of the division, scalar code (donated) and vector code (not) give the same bits,
  so LLVM keeps the select and the multiply-add in one block, and the reading
  does not split there."""
  import numpy as np
  b, c = (_fresh((24, 24), seed=s) for s in (1, 2))
  v = _fresh((24,), seed=3)
  got = [np.asarray(jax.jit(_row_set_then_sqrt_step, donate_argnums=d)(
      jnp.array(b), c, v)) for d in ((), (0,))]
  assert (got[0] == got[1]).all()
  assert not _llvm._EXPENSIVE.match("call float @llvm.sqrt.f32(float %x)")


def _frame_kernel(name: str, body: str) -> str:
  """A kernel as XLA:CPU's kernel API writes it: the call frame's field at byte
  24 points to the arguments, 16 bytes each, `%a0` ... their data pointers."""
  return f"""define ptr @{name}(ptr %0) {{
  %f = getelementptr inbounds nuw i8, ptr %0, i64 24
  %t = load ptr, ptr %f, align 8
  %a0 = load ptr, ptr %t, align 8
  %g1 = getelementptr inbounds nuw i8, ptr %t, i64 16
  %a1 = load ptr, ptr %g1, align 8
  %g2 = getelementptr inbounds nuw i8, ptr %t, i64 32
  %a2 = load ptr, ptr %g2, align 8
{body}
  ret ptr null
}}
"""


# jax.jit's fused kernel holds the constant: `1 / x`.
_RECIPROCAL = _frame_kernel("slice_divide_fusion", """\
  %x = load float, ptr %a0, align 4
  %r = fdiv float 1.000000e+00, %x
  store float %r, ptr %a1, align 4""")
# A sequenced program's kernel of one division: XLA passes the constant {1} as
# its first operand and the kernel loads it.
_LOADED = _frame_kernel("wrapped_divide", """\
  %c = load <1 x float>, ptr %a0, align 1
  %x = load <1 x float>, ptr %a1, align 1
  %c0 = extractelement <1 x float> %c, i64 0
  %x0 = extractelement <1 x float> %x, i64 0
  %r = fdiv float %c0, %x0
  store float %r, ptr %a2, align 1""")
_HLO = """\
ENTRY %main (p: f32[1]) -> f32[1] {
  %constant.7 = f32[1]{0} constant({1})
  %p = f32[1]{0} parameter(0)
  ROOT %wrapped_divide = f32[1]{0} fusion(%constant.7, %p), kind=kLoop, calls=%w
}"""


def test_semantics_read_a_constant_operand_as_the_constant():
  """A constant that XLA passes to a kernel of one operation (a division whose
  other operand comes through a barrier) reads as the literal jax.jit's fused
  kernel holds, where it is the dividend of a division or a comparison's operand:
  those compute the same bits from a literal and a load (measured,
  docs/xla_notes.md). As a divisor, or used by anything else, it stays a load
  (flashbax's prioritised sample-then-add: `1 / total` of the sum tree)."""
  constants = _llvm.constant_arguments(_HLO)
  assert constants == {"wrapped_divide": {0: "1.000000e+00"}}
  theirs = _llvm.read([_RECIPROCAL])
  assert _llvm.same_semantics(_llvm.read([_LOADED], constants), theirs)
  assert not _llvm.same_semantics(_llvm.read([_LOADED]), theirs)
  # As a divisor: `x / c`, which XLA computes as a product with a literal.
  divisor = _LOADED.replace("fdiv float %c0, %x0", "fdiv float %x0, %c0")
  by_literal = _RECIPROCAL.replace("fdiv float 1.000000e+00, %x", "fdiv float %x, 1.000000e+00")
  assert not _llvm.same_semantics(_llvm.read([divisor], constants),
                                  _llvm.read([by_literal]))
  # Any other use keeps the load: here a product an add may contract.
  other = _LOADED.replace("store float %r", "%m = fmul float %c0, %x0\n  store float %m")
  assert "fdiv float %c0" in "\n".join(_llvm.read([other], constants).functions[0][""])
  # A tuple operand before it passes one argument per array: not mapped.
  assert _llvm.constant_arguments(
      _HLO.replace("fusion(%constant.7, %p)", "fusion(%t, %constant.7)")
      + "\n  %t = (f32[1]{0}, f32[1]{0}) tuple(%p, %p)") == {}
  # Every float32 constant as LLVM writes it: `%e` where exact, else hex.
  assert _llvm._llvm_float("0.1") == "0x3FB99999A0000000"
  assert _llvm._llvm_float("-2.5") == "-2.500000e+00"
  assert _llvm._llvm_float("inf") is None



# jax.jit's fused kernel sums a column starting from the literal 0.0.
_SUM_FROM_LITERAL = _frame_kernel("reduce_fusion", """\
  %x = load <8 x float>, ptr %a0, align 4
  %g = getelementptr i8, ptr %a0, i64 96
  %y = load <8 x float>, ptr %g, align 4
  %s0 = fadd reassoc <8 x float> %x, zeroinitializer
  %s1 = fadd reassoc <8 x float> %s0, %y
  store <8 x float> %s1, ptr %a1, align 4""")
# A kernel of the reduction alone: XLA passes the initial value as an operand,
# and the kernel loads it and splats it into a vector.
_SUM_FROM_LOAD = _frame_kernel("wrapped_reduce", """\
  %c = load float, ptr %a1, align 4
  %i = insertelement <8 x float> poison, float %c, i64 0
  %v = shufflevector <8 x float> %i, <8 x float> poison, <8 x i32> zeroinitializer
  %x = load <8 x float>, ptr %a0, align 4
  %g = getelementptr i8, ptr %a0, i64 96
  %y = load <8 x float>, ptr %g, align 4
  %s0 = fadd reassoc <8 x float> %v, %x
  %s1 = fadd reassoc <8 x float> %s0, %y
  store <8 x float> %s1, ptr %a2, align 4""")
_SUM_HLO = """\
ENTRY %main (p: f32[2,8]) -> f32[8] {
  %p = f32[2,8]{1,0} parameter(0)
  %constant.8 = f32[] constant(0)
  ROOT %wrapped_reduce = f32[8]{0} fusion(%p, %constant.8), kind=kLoop, calls=%w
}"""


def test_semantics_read_a_reductions_loaded_initial_value_as_the_constant():
  """A reduction XLA leaves alone in its kernel (`wrapped_reduce`) gets its
  initial value as an operand and loads it, where jax.jit's fused kernel adds
  the literal (fuzz seed 6700 #7609, `jnp.mean` over a buffer updated in place).
  An add of a constant that no flag lets LLVM fold computes the same bits from
  the loaded value, so the load reads as the constant, on the right as LLVM
  writes a literal. Not where a flag allows folding `x + 0.0` (`nsz`), not for
  -0.0 (`x + -0.0` is `x` to LLVM), nor with another constant."""
  constants = _llvm.constant_arguments(_SUM_HLO)
  assert constants == {"wrapped_reduce": {1: "0.000000e+00"}}
  theirs = _llvm.read([_SUM_FROM_LITERAL])
  assert _llvm.same_semantics(_llvm.read([_SUM_FROM_LOAD], constants), theirs)
  assert not _llvm.same_semantics(_llvm.read([_SUM_FROM_LOAD]), theirs)
  nsz = _SUM_FROM_LOAD.replace("%s0 = fadd reassoc", "%s0 = fadd reassoc nsz")
  assert "%v, %x" in "\n".join(_llvm.read([nsz], constants).functions[0][""])
  negative_zero = {"wrapped_reduce": {1: "-0.000000e+00"}}
  assert "%v, %x" in "\n".join(
      _llvm.read([_SUM_FROM_LOAD], negative_zero).functions[0][""])
  one = {"wrapped_reduce": {1: "1.000000e+00"}}
  assert not _llvm.same_semantics(_llvm.read([_SUM_FROM_LOAD], one), theirs)
  # A copy of the constant (XLA copies one a loop's initial carries share) holds it.
  copied = _SUM_HLO.replace("fusion(%p, %constant.8)", "fusion(%p, %copy.2)").replace(
      "  ROOT", "  %copy.2 = f32[] copy(%constant.8)\n  ROOT")
  assert _llvm.constant_arguments(copied) == constants


def test_a_refusing_kernel_both_programs_compile_alike_tells_nothing_apart():
  """`recomputes_unloadably` and `same_semantics` read past a refusing kernel the
  two programs share: one compiled alike in both (the same interned text)
  computes the same forms in both, so its recomputing a stored product next to an
  add marks no element where the programs could differ (fuzz seed 6300 #50: the same branch kernel in jax.jit's
  program and the candidate refused, and the candidate that only moved a slice
  into its own buffer was never run). Where only one program has it, it refuses."""
  shared_a = _llvm.read([_PRODUCT, _FUSED, _READS_BACK])
  shared_b = _llvm.read([_PRODUCT, _FUSED,
                         _READS_BACK.replace("k2", "k3").replace("1.000000e+00", "3.0")])
  assert _llvm._Semantics(shared_a.functions[1],
                          _llvm._materialised(shared_a, shared_b)).refusing()
  assert not _llvm.recomputes_unloadably(shared_a, shared_b)
  one_side = _llvm.read([_PRODUCT, _READS_BACK])
  assert _llvm.recomputes_unloadably(shared_a, one_side)
  assert _llvm.recomputes_unloadably(one_side, shared_a)
  # Nor does it stop the semantic comparison (fuzz seed 6600 #337: the kernel of
  # a vmapped matmul's scaled result added into a slice, the same in both
  # programs): its forms are compared as any other's. Where one program alone
  # has it, the comparison refuses.
  renamed = _llvm.read([_PRODUCT, _FUSED.replace("k2", "k4"), _READS_BACK])
  assert _llvm.same_semantics(shared_a, renamed)
  assert not _llvm.same_semantics(shared_a, one_side)
  assert not _llvm.same_semantics(one_side, shared_a)


def test_semantics_read_a_maximum_reduction_as_exact():
  """A vector reduction by `fmaximum` or `fminimum` picks one of its operands in
  any order (NaN propagates, -0 is below +0), so its `reassoc` flag reorders
  nothing: a stored value it recomputes reads as a load, and the reduction is no
  value that rounds (fuzz seed 6500 #100: `jnp.max(jnp.abs(b0))` after a step,
  the step recomputed in jax.jit's reduction loop, loaded by the candidate's).
  `fmax`/`fmin` (either zero where they compare equal) and sums stay placed."""
  def reduction(body: str, combiner: str = "fmaximum") -> str:
    return _kernel("k2", body + f"""
  %r = tail call reassoc float @llvm.vector.reduce.{combiner}.v8f32(<8 x float> %s)
  store float %r, ptr %p, align 4""")
  recomputes = """\
  %x = load <8 x float>, ptr %p, align 4
  %m = fmul <8 x float> %x, splat (float 7.500000e-01)
  %s = fadd <8 x float> %m, splat (float -2.000000e+00)"""
  loads = "  %s = load <8 x float>, ptr %q, align 4"
  assert _llvm.same_semantics(_llvm.read([_STORES, reduction(recomputes)]),
                              _llvm.read([_STORES, reduction(loads)]))
  for combiner in ("fmax", "fadd"):
    other = (lambda body: reduction(body, combiner)) if combiner == "fmax" else (
        lambda body: reduction(body).replace(
            "@llvm.vector.reduce.fmaximum.v8f32(<8 x float> %s)",
            "@llvm.vector.reduce.fadd.v8f32(float 0.000000e+00, <8 x float> %s)"))
    assert not _llvm.same_semantics(_llvm.read([_STORES, other(recomputes)]),
                                    _llvm.read([_STORES, other(loads)]))


def _picking(name: str, choice: str, use: str) -> str:
  """A kernel that picks the loaded element or `choice` of it (a fused update of
  one element), then `use`s the pick `%v`."""
  return _kernel(name, f"""\
  %c = load i1, ptr %q, align 1
  br i1 %c, label %old, label %new
old:
  %x = load float, ptr %p, align 4
  br label %meet
new:
  %y = load float, ptr %p, align 4
  %z = {choice}
  br label %meet
meet:
  %v = phi float [ %x, %old ], [ %z, %new ]
{use}""")


def test_semantics_read_a_stored_picks_choices_as_stored():
  """A kernel that stores a pick (the update fused into the kernel writing the
  buffer) stores each choice for the elements that take it: where the other
  program's kernel picks the same update and computes on it, the pick reads as a
  load (fuzz seed 6700 #770: `jnp.sin(b.at[:, 53].add(0.5))`, the sine taken of
  the recomputed column in jax.jit's kernel, of the updated buffer loaded in the
  candidate's)."""
  add = "fadd float %y, 7.500000e-01"
  update = _picking("k1", add, "  store float %v, ptr %p, align 4")
  sine = "  %s = tail call float @llvm.sin.f32(float %v)\n  store float %s, ptr %q, align 4"
  recomputes = _picking("k2", add, sine)
  loads = _kernel("k2", "  %v = load float, ptr %p, align 4\n" + sine)
  assert _llvm.same_semantics(_llvm.read([update, recomputes]), _llvm.read([update, loads]))
  # An update that stores another choice: the recomputed one is no stored value.
  other = _picking("k1", "fmul float %y, 7.500000e-01", "  store float %v, ptr %p, align 4")
  assert not _llvm.same_semantics(_llvm.read([other, recomputes]),
                                  _llvm.read([other, loads]))


def test_semantics_read_a_stored_value_of_stored_operands_as_a_load():
  """A value computed from values some kernel stores, and itself stored in terms
  of their loads, reads as a load where another kernel recomputes it (fuzz seed
  7000 #5372: `b1.at[4:7].max(v)` for `v = b1 * 0.5 + 1`, then `b1 - 0.5 * c`.
  The candidate stores `v`, then the maximum of a row and loaded `v`; jax.jit's
  subtract recomputes both. The maximum's form with `v` read as a load is the
  stored one). Where the stored value is another (a minimum), it is not."""
  stores_v = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  %v = fadd float %m, 1.000000e+00
  store float %v, ptr %q, align 4""")

  def stores_pick(call: str) -> str:
    return _kernel("k2", f"""\
  %r = load float, ptr %p, align 4
  %v = load float, ptr %q, align 4
  %u = tail call float @llvm.{call}.f32(float %r, float %v)
  store float %u, ptr %p, align 4""")
  subtract_loaded = _kernel("k3", """\
  %u = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  %n = fmul float %y, 7.500000e-01
  %z = fsub float %u, %n
  store float %z, ptr %q, align 4""")
  subtract_recomputed = _kernel("k3", """\
  %r = load float, ptr %p, align 4
  %x = load float, ptr %p, align 4
  %m = fmul float %x, 7.500000e-01
  %v = fadd float %m, 1.000000e+00
  %u = tail call float @llvm.maximum.f32(float %r, float %v)
  %y = load float, ptr %q, align 4
  %n = fmul float %y, 7.500000e-01
  %z = fsub float %u, %n
  store float %z, ptr %q, align 4""")
  candidate = _llvm.read([stores_v, stores_pick("maximum"), subtract_loaded])
  plain = _llvm.read([stores_v, subtract_recomputed])
  assert _llvm.same_semantics(candidate, plain)
  assert _llvm.same_semantics(plain, candidate)
  other = _llvm.read([stores_v, stores_pick("minimum"), subtract_loaded])
  assert not _llvm.same_semantics(other, plain)


def test_semantics_read_a_zero_vector_as_each_lanes_zero():
  """`<8 x float> zeroinitializer` is +0.0 in every lane, as scalar code writes
  `float 0.000000e+00` (fuzz seed 7000 #8052: `b1 + maximum(v, 0)`, vectorized
  in the candidate's kernel and scalar in jax.jit's, read as two expressions).
  Another constant is another value."""
  def kernel(vector: bool, zero: str) -> str:
    t = "<8 x float>" if vector else "float"
    return _kernel("k1", f"""\
  %x = load {t}, ptr %p, align 4
  %y = load {t}, ptr %q, align 4
  %m = tail call {t} @llvm.maximum.{'v8f32' if vector else 'f32'}({t} %x, {t} {zero})
  %z = fadd {t} %y, %m
  store {t} %z, ptr %p, align 4""")
  vector = _llvm.read([kernel(True, "zeroinitializer")])
  scalar = _llvm.read([kernel(False, "0.000000e+00")])
  assert _llvm.same_semantics(vector, scalar)
  assert _llvm.same_semantics(scalar, vector)
  assert not _llvm.same_semantics(vector, _llvm.read([kernel(False, "1.000000e+00")]))


def test_semantics_negate_a_phi_of_one_product_as_that_product():
  """`x * 0.99 - m` for `m = y * 0.75` computed on each path into the block they
  meet (a phi LLVM sinks, `merged`) is keyed as `x * 0.99 + (-y) * 0.75`, as where
  `m` is computed beside the subtract (fuzz seed 7000 #2240): negation is exact,
  so the two round alike. Products that differ by path stay a phi."""
  def sunk(other: str) -> str:
    return _kernel("k1", f"""\
  %c = load i1, ptr %q, align 1
  %x = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  br i1 %c, label %a, label %b
a:
  %m1 = fmul float %y, 7.500000e-01
  br label %meet
b:
  %m2 = fmul float %y, {other}
  br label %meet
meet:
  %m = phi float [ %m1, %a ], [ %m2, %b ]
  %n = fmul float %x, 9.900000e-01
  %z = fsub float %n, %m
  store float %z, ptr %p, align 4""")
  beside = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %y = load float, ptr %q, align 4
  %m = fmul float %y, 7.500000e-01
  %n = fmul float %x, 9.900000e-01
  %z = fsub float %n, %m
  store float %z, ptr %p, align 4""")
  assert _llvm.same_semantics(_llvm.read([sunk("7.500000e-01")]), _llvm.read([beside]))
  assert not _llvm.same_semantics(_llvm.read([sunk("2.500000e-01")]), _llvm.read([beside]))


def test_semantics_count_the_elements_a_kernel_of_one_form_computes():
  """A kernel that computes an expression in one form is compared by how many
  elements it computes: in straight-line code each instance's lanes, in a loop
  counted from 0 by a constant step to a constant bound, the trips times the
  instances' lanes (fuzz seed 7000 #9936: a column of a step, contracted in
  jax.jit's argmin loop over 32 rows unrolled four times, and in the
  candidate's straight-line kernel of 32 instances). A loop over as many rows
  as the straight-line code has instances, but with more instances per trip,
  computes more elements (fuzz seed 5100 #6690's kind): not the same."""
  hoisted = _bounded(_HOISTED.replace("@k", "@h"), 16)
  loop = _llvm.read([_bounded(_IN_LOOP, 48), hoisted])
  unrolled = _llvm.read([_bounded(_IN_LOOP_TWICE, 48), hoisted])
  k = _llvm.read([_straight(48), hoisted])
  assert _llvm.same_semantics(loop, k) and _llvm.same_semantics(unrolled, k)
  assert not _llvm.kernels_of_ambiguous_forms_differ(loop, k)
  fewer = _llvm.read([_straight(47), hoisted])
  assert not _llvm.same_semantics(loop, fewer)
  assert _llvm.kernels_of_ambiguous_forms_differ(loop, fewer)
  # Two instances per trip, stepping by one: 96 elements, not 48.
  wider = _llvm.read([_bounded(_IN_LOOP_TWICE.replace("%j = add i64 %i, 2",
                                                      "%j = add i64 %i, 1"), 48), hoisted])
  assert not _llvm.same_semantics(wider, _llvm.read([_straight(48), hoisted]))
  assert _llvm.kernels_of_ambiguous_forms_differ(wider, _llvm.read([_straight(48), hoisted]))
  # An instance in a block the loop branches to runs on some trips: not counted.
  branchy = _llvm.read([_ir("""\
  %a = load ptr, ptr %0, align 8
  br label %loop
loop:
  %i = phi i64 [ 0, %1 ], [ %j, %latch ]
  %j = add i64 %i, 1
  %e = icmp eq i64 %j, 48
  %p = getelementptr float, ptr %a, i64 %i
  %x = load float, ptr %p, align 4
  %c = fcmp olt float %x, 0.000000e+00
  br i1 %c, label %body, label %latch
body:
  %m = fmul float %x, 1.000000e-01
  %s = fadd float %x, %m
  store float %s, ptr %p, align 4
  br label %latch
latch:
  br i1 %e, label %exit, label %loop
exit:
  ret void"""), hoisted])
  assert not _llvm.same_semantics(branchy, _llvm.read([_straight(1), hoisted]))


def test_semantics_read_a_select_a_constant_operation_was_folded_into():
  """`where(b > 0, b, 1.5) * 0.25`: a program that stores the `where` loads it
  and multiplies; one that computes it from the buffer has the multiply folded
  into the select by InstCombine, `b > 0 ? b * 0.25 : 0.375` (fuzz seed 7200
  #17). Both are `load * 0.25` for every element where 0.375 is the product of
  the stored pick's constant, rounded to float; with another constant, or no
  pick stored, the select is read as written."""
  stores = _kernel("k1", """\
  %x = load float, ptr %p, align 4
  %c = fcmp ogt float %x, 0.000000e+00
  %w = select i1 %c, float %x, float 1.500000e+00
  store float %w, ptr %q, align 4""")
  loads = _kernel("k2", """\
  %v = load float, ptr %q, align 4
  %y = load float, ptr %p, align 4
  %m = fmul float %v, 2.500000e-01
  %z = fmul float %y, %m
  store float %z, ptr %p, align 4""")

  def folded(constant: str) -> str:
    return _kernel("k2", f"""\
  %x = load float, ptr %q, align 4
  %c = fcmp ogt float %x, 0.000000e+00
  %m = fmul float %x, 2.500000e-01
  %s = select i1 %c, float %m, float {constant}
  %y = load float, ptr %p, align 4
  %z = fmul float %y, %s
  store float %z, ptr %p, align 4""")

  candidate = _llvm.read([stores, loads])
  assert _llvm.same_semantics(candidate, _llvm.read([stores, folded("3.750000e-01")]))
  assert _llvm.same_semantics(_llvm.read([stores, folded("3.750000e-01")]), candidate)
  assert not _llvm.same_semantics(candidate, _llvm.read([stores, folded("3.760000e-01")]))
  unstored = stores.replace("store float %w", "store float %x")
  assert not _llvm.same_semantics(_llvm.read([unstored, loads]),
                                  _llvm.read([unstored, folded("3.750000e-01")]))


def test_refusing_kernels_that_round_alike_pair_up():
  """A refusing kernel (a stored product recomputed next to the add it feeds) in
  each program, the same values rounded in the same forms over the same loops,
  tells the programs apart nowhere, though their texts differ (fuzz seed 7200
  #695): it pairs up as a shared one does. Where the forms differ, or one
  program alone has it, the comparison refuses."""
  a = _llvm.read([_PRODUCT, _FUSED, _READS_BACK])
  realigned = _llvm.read([_PRODUCT, _FUSED.replace("ptr %p, align 4\n  ret",
                                                   "ptr %p, align 16\n  ret"),
                          _READS_BACK])
  assert a.functions[1] is not realigned.functions[1]
  assert _llvm.same_semantics(a, realigned)
  assert _llvm.same_semantics(realigned, a)
  other = _llvm.read([_PRODUCT, _FUSED.replace("1.000000e+00", "2.000000e+00")
                      .replace("align 4\n  ret", "align 16\n  ret"), _READS_BACK])
  assert not _llvm.same_semantics(a, other)
  assert not _llvm.same_semantics(_llvm.read([_PRODUCT, _READS_BACK]), realigned)


def test_products_of_the_same_operands_in_one_block_share_their_uses():
  """Instruction selection merges two products of the same operands in one block
  into one node of two uses, which x86 does not contract (fuzz seed 7300 #7235:
  `b + v * -0.1` in place, `v` loaded once for two columns and reloaded for the
  third). Products of two loads of `v` are two products, each contracted."""
  def kernel(reload: bool) -> str:
    second = "%w = load float, ptr %q, align 4\n  %m2 = fmul float %w, 1.000000e-01" \
        if reload else "%m2 = fmul float %v, 1.000000e-01"
    return _kernel("k1", f"""\
  %v = load float, ptr %q, align 4
  %x = load float, ptr %p, align 4
  %m1 = fmul float %v, 1.000000e-01
  %s1 = fsub float %x, %m1
  store float %s1, ptr %p, align 4
  %y = load float, ptr %p, align 4
  {second}
  %s2 = fsub float %y, %m2
  store float %s2, ptr %p, align 4""")
  merged, apart = _llvm.read([kernel(False)]), _llvm.read([kernel(True)])
  assert not _llvm.same_semantics(merged, apart)
  assert not _llvm.same_semantics(apart, merged)
  assert merged.values != apart.values
  assert _llvm.same_semantics(merged, _llvm.read([kernel(False)]))


@pytest.mark.parametrize("data", ["tiny", "normal"])
def test_a_maximum_llvm_folds_in_jax_jits_kernel_keeps_jax_jits_program(data):
  """Fuzz seed 8800 #4642: jax.jit's kernel stores row 21 of `maximum(b, v)` as
  loaded (LLVM folds `maximum(x, x)`), which keeps a subnormal that a computed
  maximum flushes. No candidate without that kernel runs, and each copy it keeps
  says why: the folded elements, not a multiply-add."""
  import fuzz_regressions_programs as programs
  from inplace_jax.testing import fuzz
  case = next(c for c in programs.REGRESSIONS
              if c.fn is programs.max_of_a_swapped_row_and_itself_in_branches)
  r = compare(case.fn, *fuzz.make_inputs(case.bufs, case.data_seed, data),
              donate_argnums=(0, 1, 2))
  if not ON_CPU:
    pytest.skip("XLA:CPU's kernels")
  copies = r.report.buffer_copies(1024)
  assert copies and any(_llvm.FOLDS in (c.cause or "") for c in copies), r.report
  assert not any(_llvm.CONTRACTIONS in (c.cause or "") for c in copies), r.report
