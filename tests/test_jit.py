"""inplace_jax.jit: the issue-3 acceptance programs, the jax.jit API, and errors."""

from __future__ import annotations

import inspect
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from conftest import ON_CPU, assert_tree_equal, compare, fresh
from inplace_jax._compat import BACKEND_COMPILE

N = 128
FULL = N * N * 4


def _x(n=N):
  return jnp.arange(n * n, dtype=jnp.float32).reshape(n, n) / 3.0


def example_20440(x):
  y = x[0, 0]
  x = x.at[0, 0].add(1)
  return x, y


def test_20440_has_no_copy_and_jax_jit_has_two():
  r = compare(example_20440, _x())
  assert len(r.ref_big_copies(FULL)) == 2 or not ON_CPU
  assert r.report.copies == ()
  d = r.report.donations[0]
  assert d.donated and d.aliased_output == (0,)


def test_20440_at_full_size_compiles_copy_free():
  f = inplace_jax.jit(example_20440, donate_argnums=0)
  report = inplace_jax.check(f, jax.ShapeDtypeStruct((10000, 10000), jnp.float32))
  assert report.verified and report.copies == (), report
  ref = inplace_jax.check(example_20440,
                          jax.ShapeDtypeStruct((10000, 10000), jnp.float32),
                          donate_argnums=0)
  if ON_CPU:   # a CPU fact (openxla/xla#20440); XLA:GPU has no copy here
    assert [c.nbytes for c in ref.copies] == [400_000_000] * 2


def test_update_then_read_old():
  def f(x):
    z = x.at[0, 0].add(1)
    y = x[0, 0]
    return z, y
  r = compare(f, _x())
  assert (r.ref_big_copies(FULL) or not ON_CPU) and not r.big_copies(FULL)
  assert r.fn.plan.stats()["moved"] == 1


def test_swap_two_rows():
  def f(x):
    a, b = x[3], x[7]
    return x.at[3].set(b).at[7].set(a)
  r = compare(f, _x())
  assert (r.ref_big_copies(FULL) or not ON_CPU) and not r.big_copies(FULL)


def test_two_buffers_exchange_rows():
  def f(x, y):
    a, b = x[0], y[5]
    return x.at[0].set(b), y.at[5].set(a)
  r = compare(f, _x(), _x() + 1, donate_argnums=(0, 1))
  assert (r.ref_big_copies(FULL) or not ON_CPU) and not r.big_copies(FULL)


def test_dict_of_donated_buffers():
  def f(state):
    k, v = state["k"], state["v"]
    old = k[2]
    return {"k": k.at[2].set(v[1]), "v": v.at[1].set(old)}
  r = compare(f, {"k": _x(), "v": _x() * 2})
  assert (r.ref_big_copies(FULL) or not ON_CPU) and not r.big_copies(FULL)


def test_two_buffers_of_one_type_each_updated_in_its_own_output():
  # Schedule-free's step: z's old value reaches output 0 elementwise, its update
  # is output 1, the output JAX gives z's buffer to. Sequenced there, the copy of
  # z jax.jit makes is gone (it was dropped as "the updated z is output 0").
  def f(p, z, u):
    z_new = z + u
    prev = p - jnp.abs(z)
    return prev + (z_new - prev) * 0.5, z_new
  r = compare(f, _x(), _x() + 1, _x() * 0.5, donate_argnums=(0, 1))
  assert r.ref_report.buffer_copies(FULL) or not ON_CPU
  assert not r.report.buffer_copies(FULL), r.report
  assert not any(f.kind == "donated_not_aliased" for f in r.report.findings)


def test_skip_branch_tells_each_buffer_its_output():
  # optax.MultiSteps' shape: `lax.cond(skip, pass_through, update, state)`, where
  # the accumulator's elementwise update also feeds the moments' updates and the
  # step. Analysed without knowing where the accumulator belongs, its chain went
  # to the first output it reached, and the report said its output "is not
  # computed by updating" it while XLA updated it in place. The skip branch
  # returns each buffer at its own output; the other branch's chains lead there.
  def f(p, mu, nu, acc, g, n, skip):
    def update(ops):
      mu, nu, acc = ops
      m = acc + (g - acc) / (n + 1)
      emit = n == 1
      mu2 = 0.1 * m + 0.9 * mu
      nu2 = 0.001 * m ** 2 + 0.999 * nu
      step = -0.001 * mu2 / (jnp.sqrt(nu2) + 1e-8)
      return (emit * step, jnp.where(emit, mu2, mu), jnp.where(emit, nu2, nu),
              (1 - emit) * m)
    def skip_it(ops):
      return (jnp.zeros_like(ops[0]),) + ops
    step, mu, nu, acc = lax.cond(skip, skip_it, update, (mu, nu, acc))
    return p + step, mu, nu, acc
  for n in (0, 1):
    r = compare(f, _x(), _x() * 0.1, jnp.abs(_x()) * 0.01, _x() * 0.5, _x(),
                jnp.int32(n), jnp.bool_(False), donate_argnums=(0, 1, 2, 3))
    assert not any(f.kind == "donated_not_aliased" for f in r.report.findings), \
        r.report.findings
    assert r.report.buffer_copy_bytes <= r.ref_report.buffer_copy_bytes


def lion_every_second_step(p, mu, acc, x, mini):
  """optax.MultiSteps(optax.lion), written out: mu's and acc's buffers are written
  by their own updates, p's by its own, and one line reads or updates each leaf."""
  g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w1"]) @ p["w2"]))(p)
  acc2 = jax.tree.map(lambda a, g: a + g, acc, g)
  emit = mini == 1
  upd = jax.tree.map(lambda m, a: -1e-3 * jnp.sign(0.9 * m + 0.1 * a), mu, acc2)
  mu = jax.tree.map(lambda m, a: jnp.where(emit, 0.99 * m + 0.01 * a, m), mu, acc2)
  acc = jax.tree.map(lambda a: (1 - emit) * a, acc2)
  p = jax.tree.map(lambda p, u: p + emit * u, p, upd)
  return p, mu, acc, mini + 1


def test_a_copy_names_its_own_update_and_its_own_conflicts():
  # XLA copies mu and acc under jax.jit, whose buffers their own updates write (the
  # where, the product), not p's update, which reads them. Since the rounds that
  # clone elementwise chains per reader (`Hints.clone`), inplace_jax removes those
  # copies; any copy that remains names its own update, and the conflicts its cause
  # adds are about its own buffer: not about the transposed matrix, or the other
  # buffer of its type, read on the same lines.
  src, start = inspect.getsourcelines(lion_every_second_step)
  line = {k: start + next(i for i, t in enumerate(src) if t.lstrip().startswith(k))
          for k in ("mu = ", "acc = ", "p = ")}
  tree = lambda k: {"w1": _x(64)[:, :32] + k, "w2": _x(64)[:32] - k}
  r = compare(lion_every_second_step, tree(0), tree(1), tree(2), _x(64)[:8],
              jnp.int32(1), donate_argnums=(0, 1, 2))
  copies = r.report.buffer_copies(1024)
  assert any(c.buffer.startswith("mu") for c in r.ref_report.buffer_copies(1024)) \
      or not ON_CPU, r.ref_report
  assert not copies or not ON_CPU, r.report
  for c in copies:
    want = line["mu = " if c.buffer.startswith("mu") else
                "acc = " if c.buffer.startswith("acc") else "p = "]
    assert c.writer is not None and c.writer.location.line == want, c
    assert set(re.findall(r"float32\[[0-9,]+\]", c.cause)) <= {c.type_str}, c.cause


def test_a_conflict_explains_only_copies_of_its_buffer():
  from inplace_jax._jit import _about
  from inplace_jax._plan import Conflict, FindingKind
  from inplace_jax._report import Access, CopyInfo, SourceLocation
  at = lambda line: Access("mul", SourceLocation("f.py", line))
  copy = CopyInfo("copy.1", "copy", None, (2, 3), "float32", 24, "m", "main", "entry",
                  None, "parameter", "mu", "mu.1", None, None, "", category="buffer",
                  buffer="mu", buffer_parameter=1, readers=(at(9),), writer=at(10))

  def conflict(**kw):
    kw = {"read": "f.py:9:3 (f)", "update": "f.py:10:5 (f)", **kw}
    return Conflict(FindingKind.WOULD_CHANGE_ARITHMETIC, "m", **kw)
  assert _about(conflict(), copy, None)
  assert _about(conflict(buffer_type="float32[2,3]", argument="mu"), copy, None)
  # A buffer of another type read and updated on the same lines.
  assert not _about(conflict(buffer_type="float32[3,2]"), copy, None)
  assert _about(conflict(buffer_type="float32[6]"), copy, "float32[6]")
  # Another argument of the same type, read and updated on the same lines.
  assert not _about(conflict(buffer_type="float32[2,3]", argument="acc"), copy, None)
  assert not _about(conflict(read="f.py:7:1 (f)", update="f.py:8:1 (f)"), copy, None)


def square_set_then_two_row_steps_in_custom_vjp(b0):
  """Fuzz seed 8800 #269 (as generated, dead code left out). This test used seed
  7000 #1940 until its program ran copy-free (2026-12-07, e08ad5e), and before
  that seed 6500 #2434, seed 6000 #617 and seed 4400 #549, which run copy-free
  too."""
  v3 = b0 * b0
  b0 = b0.at[4:32, 4:26].set(-jnp.resize(v3, (28, 22)))

  def fn6(b0):
    a6 = jnp.float32(0)
    v7 = b0[27]
    b0 = b0 + v7 * -0.1
    v8 = b0[jnp.argmax(b0[26]) % 32]
    b0 = b0 + v8 * -0.25
    a6 = a6 + jnp.max(v7).astype(jnp.float32)
    return (b0, a6)
  fn6c = jax.custom_vjp(fn6)
  fn6c.defvjp(lambda *a: (fn6(*a), None), lambda _, g: g[:1])
  (b0, v6) = fn6c(b0)
  return (v6, b0, v3,)


def test_a_kept_copy_says_which_program_runs_and_which_candidate_copies_less():
  # A sequenced program runs and still copies b0; another candidate copies less of
  # b0 but computes the step differently. The cause said "the sequenced program
  # that removes it ..., so jax.jit's program runs": false on both counts.
  from inplace_jax.testing.fuzz import Buf, make_inputs
  (x,) = make_inputs((Buf("b0", (32, 33), "float32"),), 393833670, "normal")
  r = compare(square_set_then_two_row_steps_in_custom_vjp, jnp.asarray(x))
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  sig = r.fn.signatures[-1]
  kept = r.report.buffer_copies(1024)
  assert sig.program == "sequenced" and kept, r.report
  mine = sum(c.nbytes for c in kept)
  fewer = [k for k in sig.candidates if k.changed and k.report.verified
           and sum(c.nbytes for c in k.report.buffer_copies(1024)) < mine]
  said = [c for c in kept if "differently from jax.jit" in c.cause]
  assert fewer and said, (sig.candidates, r.report)
  for c in said:
    assert "so a sequenced program that keeps this copy runs" in c.cause, c.cause
    assert "jax.jit's program runs" not in c.cause and "removes it" not in c.cause


def test_the_decision_names_the_size_below_which_copies_are_left():
  # jax.jit copies the small donated y (openxla/xla#20440), under 1% of the donated
  # bytes: listed in the report, not warned about, and jax.jit's program runs. The
  # decision says it copies no buffer of the threshold's size, not "no buffer".
  f = inplace_jax.jit(lambda x, y: (x * 2.0, *example_20440(y)), donate_argnums=(0, 1),
                      on_copy="ignore")
  f(_x(), _x(8))
  sig = f.signatures[-1]
  small = sig.report.buffer_copies()
  assert small or not ON_CPU, sig.report
  assert all(c.nbytes < sig.threshold for c in small), sig.report
  assert sig.program == "jax.jit"
  if small:
    assert sig.report.decision == (f"jax.jit's program copies no buffer of "
                                   f"{sig.threshold:,} bytes or more"), sig.report
  assert "copies no buffer" in str(sig.report)


def test_nested_jit_custom_vjp_and_checkpoint_bodies():
  def body(x):
    y = x[0, 0]
    return x.at[0, 0].add(1.0), y

  @jax.custom_vjp
  def cv(x):
    return body(x)
  cv.defvjp(lambda x: (body(x), None), lambda _, g: (g[0],))

  for wrap in (jax.jit(body), cv, jax.checkpoint(body)):
    r = compare(wrap, _x())
    assert (r.ref_big_copies(FULL) or not ON_CPU) and not r.big_copies(FULL), r.report


def test_jit_of_vmap_and_grad():
  xs = jnp.stack([_x(), _x() + 1])
  compare(jax.vmap(example_20440), xs)

  def loss(x):
    x, y = example_20440(x)
    return jnp.sum(x * x) + y
  compare(jax.grad(loss), _x())


def test_true_conflict_raises_with_both_lines():
  def f(x):
    z = x.at[0, 0].set(3.0)                      # the update
    y = x[z[0, 0].astype(jnp.int32)]             # a read of old x that needs new x
    return z, y
  lines = inspect.getsourcelines(f)[1]
  g = inplace_jax.jit(f, donate_argnums=0, on_copy="raise")
  with pytest.raises(inplace_jax.ConflictError) as e:
    g(_x())
  msg = str(e.value)
  assert f"test_jit.py:{lines + 1}" in msg and f"test_jit.py:{lines + 2}" in msg
  # The same function under on_copy="warn" runs, equals jax.jit, and warns.
  with pytest.warns(inplace_jax.InplaceCopyWarning, match="test_jit.py"):
    out = inplace_jax.jit(f, donate_argnums=0)(_x())
  assert_tree_equal(out, jax.jit(f)(_x()))


def test_copy_of_non_donated_argument_is_reported_not_warned():
  """Updating an argument that is not donated needs one copy: the report lists it
  as a copy of an argument, and nothing is warned (the user did not ask for the
  buffer to be updated in place)."""
  f = inplace_jax.jit(lambda x: x.at[0].set(1.0))
  with warnings.catch_warnings():
    warnings.simplefilter("error", inplace_jax.InplaceCopyWarning)
    f(_x())
  copies = f.last_report.copies_over(FULL)
  assert len(copies) == 1 and copies[0].category == "argument"
  assert f.last_report.buffer_copies() == ()
  assert not f.last_report.donations[0].donated
  assert "argument" in str(f.last_report)


def test_decorator_forms_static_args_kwargs_and_api():
  @inplace_jax.jit
  def bare(x):
    return x * 2

  @inplace_jax.jit(donate_argnames="x", static_argnames="k")
  def step(x, k, *, scale):
    y = x[k]
    return x.at[k].set(y * scale), y

  assert_tree_equal(bare(jnp.ones(3)), jnp.ones(3) * 2)
  out = step(_x(), 3, scale=2.0)
  assert_tree_equal(out, jax.jit(step.__wrapped__, static_argnames="k")(
      _x(), 3, scale=2.0))
  assert step.last_report.buffer_copies() == ()
  assert step.__name__ == "step"
  lowered = step.lower(_x(), 3, scale=2.0)
  # .lower() gives the program the call runs.
  assert ("optimization_barrier" in lowered.as_text()) == (
      step.last_report.program == "sequenced")
  assert step.trace(_x(), 3, scale=2.0).jaxpr is not None
  shapes = step.eval_shape(_x(), 3, scale=2.0)
  assert shapes[0].shape == (N, N)


def test_warm_calls_do_not_retrace_or_reverify():
  traces = []

  @inplace_jax.jit(donate_argnums=0)
  def f(x):
    traces.append(1)
    y = x[1]
    return x.at[1].set(y + 1), y

  x = fresh(_x())
  for _ in range(5):
    x, _ = f(x)
  assert len(traces) == 1 and len(f.reports) == 1
  x, _ = f(fresh(_x(64)))   # a new signature: one more trace, one more check
  assert len(traces) == 2 and len(f.reports) == 2


def test_each_signature_keeps_its_own_program_and_lower_gives_it():
  """The decision belongs to one signature: a small buffer, whose copy is under the
  size that matters, runs jax.jit's program, a large one the sequenced program,
  whatever order they come in; `.lower()` before the first call and after it gives
  the program that call runs."""
  @inplace_jax.jit(donate_argnums=0)
  def f(x):
    y = x[1]
    return x.at[1].set(y + 1), y

  small, large = 4, 256
  before = f.lower(_x(large))
  assert f.last_report.program == "sequenced"
  # Each signature's first call reaches Python (`last_report`); the third is warm.
  for k, n in enumerate((small, large, small)):
    out = f(fresh(_x(n)))
    assert_tree_equal(out, jax.jit(f.__wrapped__, donate_argnums=0)(fresh(_x(n))))
    if k < 2:
      assert f.last_report.program == ("jax.jit" if n == small else "sequenced")
      assert f.last_report is f.reports[0 if n == large else 1]
  assert len(f.reports) == 2
  if ON_CPU:
    assert f.reports[0].buffer_copies() == () and f.reports[1].buffer_copies()
  after = f.lower(_x(large))
  assert before.as_text() == after.as_text()
  assert "optimization_barrier" in after.as_text()
  assert "optimization_barrier" not in f.lower(_x(small)).as_text()


def _backend_compiles():
  """A list that grows by one for every XLA compile from now on."""
  seen: list[float] = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: seen.append(secs) if event == BACKEND_COMPILE else None)
  return seen


@pytest.mark.parametrize("copies", [True, False])
def test_first_call_compiles_each_program_once_and_runs_the_one_inspected(copies):
  # jax.jit's program is compiled once (its kernels' IR dumped then, where
  # anything is donated), each sequenced candidate once, and the call runs the
  # executable inspected: no compile of jax.jit's program for the comparison, none
  # of the chosen program to run it; warm calls compile nothing.
  def f(x):
    y = x[0, 0] if copies else 1.0
    return x.at[0, 0].add(1), y

  compiles = _backend_compiles()
  g = inplace_jax.jit(f, donate_argnums=0, on_copy="ignore")
  x = fresh(_x())
  expect_x, expect_y = jax.jit(f)(x)
  before = len(compiles)
  out = g(fresh(_x()))
  first = len(compiles) - before
  sig = g.signatures[-1]
  assert_tree_equal((expect_x, expect_y), out)
  assert first == len(sig.candidates), (first, sig.candidates)
  assert sig.program == ("sequenced" if copies and ON_CPU else "jax.jit")
  assert all(c.kernels is None for c in sig.candidates)   # the IR is not kept
  assert [c.compiled is not None for c in sig.candidates] == [
      c is sig.chosen for c in sig.candidates]
  before = len(compiles)
  for _ in range(3):
    out = g(out[0])
  assert len(compiles) == before
  # `.lower().compile()` gives the executable that runs, compiling nothing again.
  compiled = g.lower(fresh(_x())).compile()
  assert len(compiles) == before
  assert compiled.as_text() == sig.chosen.compiled.as_text()
  assert_tree_equal((expect_x, expect_y), compiled(fresh(_x())))
  # A new object lowers before any call: one decision, then the same executable.
  h = inplace_jax.jit(f, donate_argnums=0, on_copy="ignore")
  before = len(compiles)
  compiled = h.lower(fresh(_x())).compile()
  assert len(compiles) - before == len(h.signatures[-1].candidates)
  assert_tree_equal((expect_x, expect_y), compiled(fresh(_x())))


def _update_then_min(b0, b1):
  # Fuzz seed 5900 #64: no read of an old version, so the first plan ties
  # nothing; XLA still copies b0 (it computes the min over the update fused),
  # and the refinement round ties the min's read behind that copy.
  b0 = lax.dynamic_update_slice(b0, jnp.full((1, 31), 1.5, jnp.float32),
                                (jnp.int32(9), jnp.argmax(b1[8]) % 2))
  return b0, b1, jnp.min(b0, axis=1)


@pytest.mark.parametrize("case", ["no tie", "tie", "a later round ties"])
def test_jax_jits_ir_is_dumped_where_a_candidate_may_follow(case, monkeypatch):
  # Dumping jax.jit's kernels' IR costs about a third of its compile: it is
  # dumped with that compile only where the first plan over the donated buffers
  # places a tie. Where none is placed but a later round compiles a candidate
  # all the same, jax.jit's program is compiled once more for its IR, and the
  # candidate is judged as any other.
  import inplace_jax._jit as J
  dumps = []
  real = J.InplaceJitted._compiled_with_kernels
  monkeypatch.setattr(J.InplaceJitted, "_compiled_with_kernels",
                      lambda self, *a: dumps.append(a[2]) or real(self, *a))
  if case == "a later round ties":
    f, args, donate = _update_then_min, lambda: (
        jnp.arange(512.0).reshape(16, 32) % 7,
        (jnp.arange(512.0).reshape(16, 32) % 5).astype(jnp.bfloat16)), (0, 1)
  else:
    def f(x, v):
      y = x[0, 0] if case == "tie" else 1.0
      return x.at[3].set(v), y
    args, donate = lambda: (_x(), jnp.ones(_x().shape[1])), 0
  compiles = _backend_compiles()
  expect = jax.jit(f)(*args())
  g = inplace_jax.jit(f, donate_argnums=donate, on_copy="ignore")
  before = len(compiles)
  assert_tree_equal(expect, g(*args()))
  sig = g.signatures[-1]
  n = len(sig.candidates)
  if case == "no tie":
    assert (dumps, n, len(compiles) - before) == ([], 1, 1)
  elif case == "tie":
    # jax.jit's program with its dump, then the candidate with its own.
    assert len(dumps) == n == len(compiles) - before == 2
  else:
    assert n >= 2 and len(dumps) == n and len(compiles) - before == n + 1
  if ON_CPU and case != "no tie":
    assert sig.program == "sequenced" and not sig.report.buffer_copies(1024)


def test_small_loops_jax_jit_hoists_are_hoisted_in_the_sequenced_program():
  # XLA:CPU emits a loop that touches little memory as one kernel
  # (`xla_cpu_small_call`); the sequenced program compiles such loops as jax.jit's
  # does where jax.jit's did (else a loop of kernels: slower warm calls), and keeps
  # the pass off where jax.jit's program hoisted none.
  def f(x, k):
    s = lax.fori_loop(0, k, lambda i, c: c * 1.5 + i.astype(jnp.float32), jnp.zeros(4))
    y = x[0, 0]
    return x.at[0, 0].add(s.sum()), y

  r = compare(f, _x(), 10, static_argnums=())
  sig = r.fn.signatures[-1]
  small = 'xla_cpu_small_call="true"'
  theirs = jax.jit(f, donate_argnums=0).lower(_x(), 10).compile().as_text()
  ours = r.fn.lower(_x(), 10).compile().as_text()
  assert (small in ours) == (small in theirs)
  if ON_CPU:
    assert small in theirs and sig.program == "sequenced" and not r.big_copies(FULL)
    assert "small-while-loop-hoisting" not in str(dict(sig.chosen.options))
  r = compare(example_20440, _x())
  if ON_CPU:
    assert "small-while-loop-hoisting" in str(dict(r.fn.signatures[-1].chosen.options))


def test_user_compiler_options_are_merged():
  f = inplace_jax.jit(example_20440, donate_argnums=0,
                      compiler_options={"xla_disable_hlo_passes": "algsimp"})
  assert "cse_barrier_expander" in f._compiler_options["xla_disable_hlo_passes"]
  assert "algsimp" in f._compiler_options["xla_disable_hlo_passes"]
  compare(example_20440, _x(),
          compiler_options={"xla_cpu_copy_insertion_use_region_analysis": True})


@pytest.mark.parametrize("kwargs,match", [
    (dict(donate_argnums=(0, 0)), "more than once"),
    (dict(on_copy="sometimes"), "on_copy"),
    (dict(min_bytes=-1), "min_bytes"),
    (dict(donate_argnames="nope"), "nope"),
])
def test_bad_configuration(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    inplace_jax.jit(example_20440, **kwargs)


def test_not_callable():
  with pytest.raises(TypeError, match="callable"):
    inplace_jax.jit(3)


def test_sequence_jaxpr_checks_and_plan():
  cj = jax.make_jaxpr(example_20440)(_x())
  with jax.enable_checks(True):
    new, plan = inplace_jax.sequence_jaxpr(cj, [True])
  assert plan.stats() == {"barriers": 1, "splits": 1, "moved": 0,
                          "lowered_conds": 0, "predicated_loops": 0}
  assert "optimization_barrier" in str(new)
  out = jax.core.eval_jaxpr(new.jaxpr, new.consts, _x())
  assert_tree_equal(tuple(out), example_20440(_x()))
  with pytest.raises(ValueError, match="entries"):
    inplace_jax.sequence_jaxpr(cj, [True, False])


def test_compiler_options_helper():
  assert inplace_jax.compiler_options("cpu") == {
      "xla_disable_hlo_passes": "cse_barrier_expander,small-while-loop-hoisting"}
  assert inplace_jax.compiler_options("gpu") == {}


def test_raise_mode_checks_before_anything_runs():
  # The old value is returned with the new one: a copy no ordering removes.
  f = inplace_jax.jit(lambda x, k: (x.at[k].set(1.0), x * 1.0), static_argnums=1,
                      donate_argnums=0, on_copy="raise")
  x = fresh(_x())
  with pytest.raises((inplace_jax.ConflictError, inplace_jax.CopiesFoundError)):
    f(x, 2)
  assert float(x[0, 1]) == float(_x()[0, 1])     # the input is untouched
  with pytest.raises((inplace_jax.ConflictError, inplace_jax.CopiesFoundError)):
    f.lower(x, 2)                                # the same answer, before a call
  g = inplace_jax.jit(example_20440, donate_argnums=0, on_copy="raise")
  out = g(fresh(_x()))
  assert_tree_equal(out, jax.jit(example_20440)(_x()))
