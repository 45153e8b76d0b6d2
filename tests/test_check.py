"""`check`, `check_compiled` and `assert_no_copies` on real CPU compiles.

Large arrays are `jax.ShapeDtypeStruct`s: only lowering and compilation run, nothing is
allocated. Expected copy counts and roles were measured with jax/jaxlib 0.10.2 on CPU.
"""

import inspect
import json
import os
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from inplace_jax import CopiesFoundError, CopyReport

S = jax.ShapeDtypeStruct
BIG = S((10000, 10000), jnp.float32)  # 400,000,000 bytes
MAT = S((256, 256), jnp.float32)
MAT_BYTES = 256 * 256 * 4

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _line_of(fn, snippet: str) -> int:
  """The line of `fn`'s source holding `snippet`."""
  lines, start = inspect.getsourcelines(fn)
  (offset,) = [i for i, line in enumerate(lines) if snippet in line]
  return start + offset


def _same_file(a: str, b: str) -> bool:
  return os.path.realpath(a) == os.path.realpath(b)


def _full(report: CopyReport, nbytes: int):
  return [c for c in report.copies if c.nbytes == nbytes]


# --------------------------------------------------------------------------- #20440


def xla_20440(x):
  y = x[0, 0]
  x = x.at[0, 0].add(1)
  return x, y


def test_20440_two_copies_with_their_source_lines():
  report = inplace_jax.check(xla_20440, BIG, donate_argnums=0)
  assert report.verified, report.problems
  assert report.backend == "cpu"
  big = report.copies_over(400_000_000)
  assert len(big) == 2 and len(report.copies) == 2
  lines = {_line_of(xla_20440, "y = x[0, 0]"), _line_of(xla_20440, "x.at[0, 0].add(1)")}
  for c in big:
    assert c.nbytes == 400_000_000 and c.shape == (10000, 10000) and c.dtype == "float32"
    assert c.role == "entry" and c.source == "parameter" and c.parameter == "x"
    assert c.location is not None and _same_file(c.location.file, __file__)
    assert c.location.function == "xla_20440"
  # One copy is there for the read, the other for the update.
  assert {c.location.line for c in big} == lines
  assert report.donations[0].donated and report.donations[0].aliased_output == (0,)


def test_20440_assert_no_copies_names_both():
  with pytest.raises(CopiesFoundError) as info:
    inplace_jax.assert_no_copies(xla_20440, BIG, donate_argnums=0, msg="see #20440")
  err = info.value
  text = str(err)
  assert text.startswith("[Chex] Assertion assert_no_copies failed:")
  assert text.endswith("[see #20440]")
  assert len(err.copies) == 2 and err.report is not None
  assert text.count("400,000,000 bytes") == 2
  for c in err.copies:
    assert f"{c.location.file}:{c.location.line}" in text
  # Usable like any assertion, next to chex's, and switched off with them.
  assert isinstance(err, AssertionError)
  import chex
  chex.disable_asserts()
  try:
    inplace_jax.assert_no_copies(xla_20440, BIG, donate_argnums=0)
  finally:
    chex.enable_asserts()


def test_compiler_options_reach_the_compile():
  # XLA's region analysis removes both copies of this example (openxla/xla#20440).
  opts = {"xla_cpu_copy_insertion_use_region_analysis": True}
  report = inplace_jax.assert_no_copies(xla_20440, MAT, donate_argnums=0,
                                        compiler_options=opts)
  assert report.verified and not report.copies_over(1024)


# --------------------------------------------------------------------------- donation


def set_corner(x):
  return x.at[0, 0].set(1.)


def test_donated_update_is_copy_free():
  report = inplace_jax.assert_no_copies(set_corner, BIG, donate_argnums=0, min_bytes=0)
  assert report.verified and report.copies == ()
  (d,) = report.donations
  assert d.donated and d.aliased_output == (0,) and d.parameter == 0
  assert (d.argument, d.shape, d.dtype, d.nbytes) == ("x", (10000, 10000), "float32",
                                                      400_000_000)
  assert "No copies." in str(report)
  assert report.alias_size_in_bytes == 400_000_000


def test_undonated_update_copies_once_and_says_why():
  report = inplace_jax.check(set_corner, BIG)
  assert report.verified
  (c,) = report.copies
  assert c.nbytes == 400_000_000 and c.source == "parameter" and c.parameter == "x"
  assert c.location.line == _line_of(set_corner, "x.at[0, 0].set(1.)")
  (d,) = report.donations
  assert not d.donated and d.aliased_output is None and not report.wasted_donations()
  text = str(report)
  assert "not donated" in text
  assert f"{os.path.basename(__file__)}:{c.location.line} (set_corner)" in text
  with pytest.raises(CopiesFoundError, match="Not donated: x"):
    inplace_jax.assert_no_copies(set_corner, BIG)


def test_unused_donated_argument_is_a_wasted_donation():
  report = inplace_jax.check(lambda x, y: y * 2, S((4,), jnp.float32),
                             S((3,), jnp.float32), donate_argnums=0)
  assert report.verified
  x, y = report.donations
  # JAX prunes the unused argument: it has no HLO parameter at all.
  assert (x.argument, x.donated, x.parameter, x.aliased_output) == ("x", True, None, None)
  assert (y.argument, y.donated, y.parameter) == ("y", False, 0)
  assert report.wasted_donations() == (x,)
  assert "donation wasted" in str(report)


def test_used_but_unaliasable_donation_is_wasted():
  report = inplace_jax.check(lambda x, y: (x.sum(), y * 2), S((5,), jnp.float32),
                             S((3,), jnp.float32), donate_argnums=0)
  x, _ = report.donations
  assert x.donated and x.parameter == 0 and x.aliased_output is None
  assert report.wasted_donations() == (x,)


def test_pytree_arguments_are_named_as_jax_names_them():
  def step(state, q):
    cache = state["cache"].at[state["pos"]].set(q)
    return {"cache": cache, "pos": state["pos"] + 1}

  state = {"cache": S((64, 16), jnp.float32), "pos": S((), jnp.int32)}
  report = inplace_jax.check(step, state, S((16,), jnp.float32), donate_argnums=0)
  assert report.verified
  by_name = {d.argument: d for d in report.donations}
  assert set(by_name) == {"state['cache']", "state['pos']", "q"}
  cache = by_name["state['cache']"]
  assert cache.donated and cache.aliased_output is not None
  assert not by_name["q"].donated
  # The parameter's op_name in the HLO is the same string.
  assert "state['cache']" in str(report)


def test_pytree_pruned_leaf_keeps_its_name():
  report = inplace_jax.check(lambda st: st["cache"] * 2,
                             {"cache": S((8,), jnp.float32), "pos": S((), jnp.int32)},
                             donate_argnums=0)
  by_name = {d.argument: d for d in report.donations}
  assert by_name["st['pos']"].parameter is None and by_name["st['pos']"].donated
  assert by_name["st['cache']"].parameter == 0


def test_donate_argnames_and_keyword_arguments():
  report = inplace_jax.check(lambda a, *, b: b.at[0].set(a[0]), S((5,), jnp.float32),
                             b=S((5,), jnp.float32), donate_argnames="b")
  by_name = {d.argument: d for d in report.donations}
  assert by_name["b"].donated and by_name["b"].aliased_output == (0,)
  assert not by_name["a"].donated
  assert not report.copies_over(20)


def test_output_numbers_leave_out_ordered_effect_tokens():
  # An ordered effect gives the compiled module a token as its first parameter and
  # its first result; the report numbers the function's outputs (its flat output
  # leaves), as the buffers show: it said "output 1" for output 0.
  from jax.experimental import io_callback

  def step(p, n):
    lr = io_callback(lambda s: np.float32(0.5), jax.ShapeDtypeStruct((), jnp.float32),
                     n, ordered=True)
    a = p["a"].at[3].multiply(lr)
    return {"a": a, "b": p["b"] + lr}, a

  p = {"a": jnp.arange(64 * 512.0).reshape(64, 512), "b": jnp.ones((128, 128))}
  pointers = {f"p['{k}']": v.unsafe_buffer_pointer() for k, v in p.items()}
  f = inplace_jax.jit(step, donate_argnums=0, on_copy="ignore")
  leaves = jax.tree.leaves(f(p, jnp.int32(0)))
  report = f.last_report
  for d in report.donations:
    if d.donated:
      assert d.aliased_output == tuple(
          i for i, o in enumerate(leaves)
          if o.unsafe_buffer_pointer() == pointers[d.argument]), report
  (copy,) = report.buffer_copies(1024)   # `a` returned twice: outputs 0 and 2
  assert "output 0 and output 2" in copy.cause, report
  assert not report.problems, report.problems


# --------------------------------------------------------------------------- control flow


def swap_rows_loop(x, n):
  def body(i, x):
    y = x[0]
    x = x.at[0].set(x[1])
    return x.at[1].set(y)
  return lax.fori_loop(0, n, body, x)


def test_copies_in_a_loop_body():
  report = inplace_jax.check(swap_rows_loop, MAT, S((), jnp.int32), donate_argnums=0)
  assert report.verified
  full = _full(report, MAT_BYTES)
  assert full  # measured: 2 per iteration on CPU
  for c in full:
    assert c.role == "while_body" and c.trip_count is None  # dynamic trip count
    assert c.category == "buffer" and c.buffer == "x"       # the carry that holds x
    assert c.location.function == "swap_rows_loop.<locals>.body"
  # The loop counter's copies are small; min_bytes lets them pass.
  small = [c for c in report.copies if c.nbytes < 1024]
  assert all(c.dtype == "int32" and c.shape == () for c in small)
  with pytest.raises(CopiesFoundError) as info:
    inplace_jax.assert_no_copies(swap_rows_loop, MAT, S((), jnp.int32), donate_argnums=0)
  assert set(info.value.copies) == set(full)
  assert "while_body" in str(info.value)


def test_known_trip_count_of_a_static_loop():
  def f(x):
    return lax.fori_loop(0, 5, lambda i, x: x.at[0].set(x[1]).at[1].set(x[0]), x)
  report = inplace_jax.check(f, MAT, donate_argnums=0)
  full = _full(report, MAT_BYTES)
  assert full and all(c.role == "while_body" and c.trip_count == 5 for c in full)
  assert "while_body x5" in str(report)


def cond_update(x, p):
  y = x[5]
  x = lax.cond(p, lambda x: x.at[0].set(1.), lambda x: x.at[1].set(2.), x)
  return x, y


def test_copy_in_a_conditional_branch():
  report = inplace_jax.check(cond_update, MAT, S((), jnp.bool_), donate_argnums=0)
  assert report.verified
  branch = [c for c in _full(report, MAT_BYTES) if c.role == "branch"]
  assert branch  # a copy survives in a branch (docs/xla_notes.md)
  for c in branch:
    # Traced out of the branch, through the conditional, to the argument.
    assert c.source == "parameter" and c.parameter == "x"
    assert c.location.line in (_line_of(cond_update, "lax.cond("),)
  assert "branch" in str(report)


def cg_start(x, A, b):
  r = b - A @ x
  p = r
  def body(c):
    x, r, p, k = c
    return x + 0.1 * p, r * 0.5, p + r, k + 1
  x, r, p, _ = lax.while_loop(lambda c: c[3] < 3, body, (x, r, p, 0))
  return x, r.sum() + p.sum()


def test_values_computed_from_a_donated_buffer_are_not_its_copies():
  # Only x is donated. `b - A @ x` is a new buffer (the dot reads x other than
  # element by element), and r and p ride carries of their own: XLA's copies of
  # them (measured: one in the entry, two in the body) are temporaries, not copies
  # of x, and nothing is to warn about.
  vec = S((256, 64), jnp.float32)
  report = inplace_jax.check(cg_start, vec, MAT, vec, donate_argnums=0)
  assert report.verified, report.problems
  big = _full(report, 256 * 64 * 4)
  assert {c.role for c in big} == {"entry", "while_body"}, report
  assert all(c.category == "temporary" and c.buffer is None for c in big), report
  assert report.buffer_copies() == (), report


# --------------------------------------------------------------------------- API


def test_check_accepts_jitted_functions_and_compiled_objects():
  jitted = jax.jit(xla_20440, donate_argnums=0)
  via_jit = inplace_jax.check(jitted, MAT)
  compiled = jitted.lower(MAT).compile()
  via_compiled = inplace_jax.check_compiled(compiled)
  plain = inplace_jax.check(xla_20440, MAT, donate_argnums=0)
  keys = lambda r: [(c.name, c.nbytes, c.location) for c in r.copies]  # noqa: E731
  assert keys(via_jit) == keys(via_compiled) == keys(plain)
  assert via_compiled.donations == plain.donations
  with pytest.raises(TypeError, match="jax.jit"):
    inplace_jax.check(jitted, MAT, donate_argnums=0)


def test_static_arguments():
  def f(x, k):
    return x.at[k].set(0.)
  report = inplace_jax.check(f, MAT, 3, static_argnums=1, donate_argnums=0)
  assert report.verified and not report.copies
  assert [d.argument for d in report.donations] == ["x"]


def test_inplace_check_hook_is_dispatched():
  calls = []

  class Fake:
    def _inplace_check(self, *args, compiler_options=None, **kwargs):
      calls.append((args, compiler_options, kwargs))
      return "report"

    def lower(self, *args, **kwargs):
      raise AssertionError("the hook must win over .lower")

  assert inplace_jax.check(Fake(), 1, compiler_options={"o": 1}, k=2) == "report"
  assert calls == [((1,), {"o": 1}, {"k": 2})]
  with pytest.raises(TypeError):
    inplace_jax.check(Fake(), 1, static_argnums=0)


def test_report_helpers():
  report = inplace_jax.check(swap_rows_loop, MAT, S((), jnp.int32), donate_argnums=0)
  d = report.to_dict()
  assert json.loads(json.dumps(d))["copies"][0]["name"] == report.copies[0].name
  assert d["total_copy_bytes"] == report.total_copy_bytes == sum(
      c.nbytes for c in report.copies)
  assert report.copies_over(MAT_BYTES) == tuple(_full(report, MAT_BYTES))
  assert report.copies_over(0) == report.copies
  assert report.copies_over(MAT_BYTES + 1) == ()
  c = report.copies_over(MAT_BYTES)[0]
  assert f"{os.path.basename(__file__)}:{c.location.line}" in str(report)


def test_alongside_chex():
  x = jnp.zeros((8, 8))
  chex.assert_shape(x, (8, 8))
  report = inplace_jax.assert_no_copies(lambda x: x * 2, x, donate_argnums=0)
  assert report.verified
  with pytest.raises(AssertionError):
    inplace_jax.assert_no_copies(set_corner, x, min_bytes=0)  # 256 bytes


class _Garbled:
  """A compiled program whose text came back cut off or unavailable."""

  def __init__(self, compiled, text):
    self._compiled, self._text = compiled, text

  def as_text(self):
    if isinstance(self._text, Exception):
      raise self._text
    return self._text

  def __getattr__(self, name):
    return getattr(self._compiled, name)


@pytest.mark.parametrize("cut", ["half", "none", "raises", "garbage"])
def test_unreadable_compiled_text_is_never_verified(cut):
  compiled = jax.jit(set_corner, donate_argnums=0).lower(MAT).compile()
  text = compiled.as_text()
  bad = {"half": text[:len(text) // 2], "none": None,
         "raises": RuntimeError("no text"), "garbage": "no HLO here"}[cut]
  report = inplace_jax.check_compiled(_Garbled(compiled, bad))
  assert not report.verified and report.problems
  assert "UNVERIFIED" in str(report)
  with pytest.raises(CopiesFoundError, match="could not be fully read"):
    inplace_jax._check.assert_report_no_copies(report, min_bytes=0)


# --------------------------------------------------------------------------- corpus
# Real programs of many shapes: the parser must understand all of their text.


@jax.custom_vjp
def _cvjp(x):
  return jnp.sin(x)


_cvjp.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))


@jax.jit
def _inner(x):
  return x.at[3].set(0.)


V = S((16, 8), jnp.float32)
_CORPUS = {
    "scan": (lambda x, xs: lax.scan(lambda c, v: (c.at[0].add(v.sum()), c[1]), x, xs),
             (V, S((6, 3), jnp.float32)), 0),
    "switch": (lambda x, i: lax.switch(i, [lambda x: x + 1, lambda x: x.at[0].set(3.)], x),
               (V, S((), jnp.int32)), 0),
    "nested_jit": (lambda x: _inner(x) + 1, (V,), 0),
    "custom_vjp": (jax.grad(lambda x: _cvjp(x).sum()), (V,), ()),
    "vmap": (jax.vmap(lambda v: v.at[0].set(v[1])), (V,), 0),
    "grad_remat": (jax.grad(lambda x: jax.checkpoint(jnp.sin)(x).sum()), (V,), ()),
    "vmap_while": (jax.vmap(lambda b, n: lax.while_loop(
        lambda c: c[0] < n, lambda c: (c[0] + 1, c[1].at[c[0]].set(1.)), (0, b))[1]),
                   (V, S((16,), jnp.int32)), ()),
    "nested_loops": (lambda x: lax.fori_loop(0, 3, lambda i, x: lax.fori_loop(
        0, 4, lambda j, x: x.at[j].set(x[i]), x), x), (V,), 0),
    "cond_in_loop": (lambda x, n: lax.fori_loop(0, n, lambda i, x: lax.cond(
        i % 2 == 0, lambda x: x.at[0].add(1.), lambda x: x, x), x),
                     (V, S((), jnp.int32)), 0),
    "bf16": (lambda x: x.at[0].set(x[1]), (S((16, 8), jnp.bfloat16),), ()),
    "int": (lambda x: x.at[0].add(x[1]), (S((16, 8), jnp.int32),), ()),
    "bool": (lambda x: x.at[0].set(~x[1]), (S((16, 8), jnp.bool_),), ()),
    "complex": (lambda x: x.at[0].set(x[1] * 1j), (S((16, 8), jnp.complex64),), ()),
    "uint8_f16": (lambda a, b: (a.astype(jnp.float32), b), (S((8,), jnp.float16),
                                                          S((8,), jnp.uint8)), ()),
    "scalar": (lambda x: x + 1, (S((), jnp.float32),), 0),
    "zero_size": (lambda x: x.at[:].set(1.), (S((0, 5), jnp.float32),), 0),
    "dict_pytree": (lambda st: {"a": st["a"].at[st["i"]].set(1.), "i": st["i"] + 1},
                    ({"a": V, "i": S((), jnp.int32)},), 0),
    "rng": (lambda k: jax.random.normal(k, (16, 8)), (S((2,), jnp.uint32),), ()),
    "sort_reduce": (lambda x: (jnp.sort(x, axis=0), x.sum(), jnp.argmax(x)), (V,), ()),
    "cumsum_transpose": (lambda x: jnp.cumsum(x.T, axis=0), (V,), ()),
    "constant": (lambda x: x + np.arange(128, dtype=np.float32).reshape(16, 8), (V,), ()),
    "gather_scatter": (lambda x, idx: x.at[idx].add(x[idx[::-1]]),
                       (V, S((5,), jnp.int32)), 0),
}


@pytest.mark.parametrize("name", sorted(_CORPUS))
def test_real_programs_are_understood(name):
  fn, args, donate = _CORPUS[name]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    report = inplace_jax.check(fn, *args, donate_argnums=donate)
  assert report.verified, report.problems
  assert report.problems == ()
  assert report.modules and report.backend == "cpu"
  assert len(report.donations) == len(jax.tree_util.tree_leaves(args))
  for c in report.copies:
    assert c.role in ("entry", "while_body", "while_condition", "branch", "fusion",
                      "other")
    assert c.nbytes == int(np.prod(c.shape)) * jnp.dtype(c.dtype).itemsize
  json.dumps(report.to_dict())
  str(report)
