"""What a buffer copy's cause says is true of the compiled program, in jax.jit's
report and in inplace_jax's: each statement tested on a program where it holds and
on one where it must not appear.

`compare` (conftest) also asserts, for both reports of every test that uses it, that
no cause names an argument as the operation reading or updating it, an optimization
barrier as an update, or an update without a name (`_harness.untrue_statements`).
"""

from __future__ import annotations

import inspect

import jax.numpy as jnp
from jax import lax
import pytest

from conftest import ON_CPU, compare

pytestmark = pytest.mark.skipif(not ON_CPU, reason="the copies are XLA:CPU's")


def _line(fn, text: str) -> int:
  src, start = inspect.getsourcelines(fn)
  return start + next(i for i, t in enumerate(src) if text in t)


def _state():
  return {"c": jnp.arange(64 * 512.0).reshape(64, 512)}, jnp.linspace(0, 1, 512)


def _returned_twice(s, x):
  c = s["c"].at[3].multiply(x[0] + 1)
  return {"c": c}, c


def _old_value_returned(s, x):
  c = s["c"].at[3].multiply(x[0] + 1)
  return {"c": c}, s["c"]


def _copies(r, buffer):
  out = {name: [c for c in report.buffer_copies(1024) if c.buffer == buffer]
         for name, report in (("jax.jit", r.ref_report), ("inplace_jax", r.report))}
  for name, copies in out.items():
    assert copies, (name, r.ref_report, r.report)
  return [c for copies in out.values() for c in copies]


def test_a_value_returned_twice_is_not_an_old_value_kept():
  # The updated buffer is output 0 (its donated buffer) and output 1: XLA copies the
  # new value into output 1's buffer. No old value is kept.
  r = compare(_returned_twice, *_state())
  for c in _copies(r, "s['c']"):
    assert "the same value of s['c'] is output 0 and output 1" in c.cause, c.cause
    assert "old value" not in c.cause, c.cause


def _new_value_returned_twice(s, x):
  sq = s["c"] * s["c"]
  c = s["c"].at[3].multiply(x[0] + 1)
  return {"c": c}, sq, sq


def test_a_new_value_returned_twice_is_no_buffer_copy():
  # `sq` is output 1 and output 2, neither a donated buffer's: XLA copies it into
  # one of them under any order. A copy of a new value, not of a buffer updated
  # in place (fuzz seed 7900 #120): no buffer copy says so, and nothing warns.
  r = compare(_new_value_returned_twice, *_state())
  for report in (r.ref_report, r.report):
    assert not any("the same value" in (c.cause or "") for c in report.buffer_copies()), report
    dup = [c for c in report.copies if c.nbytes == 64 * 512 * 4 and c.category == "temporary"]
    assert dup, report


def test_an_old_value_returned_is_kept_for_that_output():
  r = compare(_old_value_returned, *_state())
  line = _line(_old_value_returned, ".at[3].multiply")
  for c in _copies(r, "s['c']"):
    assert c.cause.startswith("XLA keeps the old value of s['c'] for output 1, "), c.cause
    assert c.writer is not None and c.writer.location.line == line, c
    assert "same value" not in c.cause, c.cause


def _grids():
  g = jnp.zeros((256, 256)).at[0].set(1.0)
  return g, g + 0, jnp.full((256, 256), 1e-3)


def _jacobi_swapped(src, dst, rhs):
  interior = 0.25 * (src[:-2, 1:-1] + src[2:, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:]
                     - rhs[1:-1, 1:-1])
  dst = dst.at[1:-1, 1:-1].set(interior)
  return dst, src, jnp.abs(dst - src).max()


def _jacobi_both_updated(src, dst, rhs):
  interior = 0.25 * (src[:-2, 1:-1] + src[2:, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:]
                     - rhs[1:-1, 1:-1])
  dst = dst.at[1:-1, 1:-1].set(interior)
  return dst, src.at[0, 0].set(1.0), jnp.abs(dst - src).max()


def test_ping_pong_buffers_returned_swapped():
  # src is returned unchanged as output 1; JAX gives src's buffer to output 0 (dst's
  # update) and dst's to output 1. No cause may call src updated, or dst's update
  # src's new value.
  r = compare(_jacobi_swapped, *_grids(), donate_argnums=(0, 1))
  scatter = _line(_jacobi_swapped, "dst.at[")
  copies = _copies(r, "src") + _copies(r, "dst")
  for c in copies:
    assert "the updated src" not in c.cause and "new value of src" not in c.cause, c.cause
    assert "an operation" not in c.cause, c.cause
  src = [c for c in copies if c.buffer == "src"]
  assert any(f"which output 0 (scatter at " in c.cause and
             "written into the buffer of src" in c.cause for c in src), src
  assert any(c.cause.startswith("output 0 (scatter at ") and
             "is an update of dst, not of src" in c.cause and
             c.writer.location.line == scatter for c in src), src
  assert any("output 1 is src, returned unchanged, but its buffer is that of donated dst"
             in c.cause for c in copies if c.buffer == "dst"), copies
  # What the analysis adds (inplace_jax's report): src is returned, not updated.
  assert any("src is returned unchanged as output 1" in c.cause
             for c in r.report.buffer_copies(1024)), r.report


def test_ping_pong_buffers_both_updated_and_swapped():
  # Here src is updated: saying so is true.
  r = compare(_jacobi_both_updated, *_grids(), donate_argnums=(0, 1))
  copies = _copies(r, "src")
  assert any("the updated src is output 1" in c.cause
             for c in r.report.buffer_copies(1024)), r.report
  assert not any("returned unchanged" in c.cause for c in copies), copies


T, H, D = 256, 4, 32


def _quantise(x):
  scale = jnp.max(jnp.abs(x), -1, keepdims=True) / 127.0 + 1e-8
  return jnp.round(x / scale).astype(jnp.int8), scale.astype(jnp.bfloat16)


def _int8_decode(cache, q, k_new, pos):
  k = cache["k"].astype(jnp.bfloat16) * cache["ks"]
  s = jnp.einsum("hd,thd->ht", q, k, preferred_element_type=jnp.float32)
  s = jnp.where(jnp.arange(T)[None] < pos, s, -1e9)
  kq, ks = _quantise(k_new.astype(jnp.float32))
  return {"k": cache["k"].at[pos].set(kq), "ks": cache["ks"].at[pos].set(ks)}, s


def test_bfloat16_reads_and_updates_are_named_through_xlas_converts():
  # XLA:CPU computes bfloat16 in float32: the scales' reader (the dequantising
  # multiply) and their update (the scatter) sit behind converts it adds, which
  # carry no operation name. The cause names both.
  import jax
  z = jax.random.normal(jax.random.key(0), (T, H, D))
  kq, ks = _quantise(z)
  q = jax.random.normal(jax.random.key(1), (H, D)).astype(jnp.bfloat16)
  r = compare(_int8_decode, {"k": kq, "ks": ks}, q, q * 2, jnp.int32(100))
  mul, scatter = _line(_int8_decode, "* cache["), _line(_int8_decode, "return {")
  for c in _copies(r, "cache['ks']"):
    assert [(a.op, a.location.line) for a in c.readers] == [("mul", mul)], c
    assert (c.writer.op, c.writer.location.line) == ("scatter", scatter), c
    assert "a later use" not in c.cause and "an operation" not in c.cause, c.cause


def _loop_beside_the_argument(x, n):
  y = lax.fori_loop(0, n, lambda i, y: y.at[i].add(1.0), x)
  return y.sum(), x


def test_a_loop_updating_a_copy_is_the_update():
  # x is returned unchanged (its buffer is its own output); the loop updates a
  # copy of it, in place. The cause names the loop as the update and output 1 as
  # what keeps the old value.
  r = compare(_loop_beside_the_argument, jnp.ones((64, 512)), jnp.int32(3))
  line = _line(_loop_beside_the_argument, "fori_loop")
  for c in _copies(r, "x"):
    assert c.cause.startswith("XLA keeps the old value of x for output 1, "), c.cause
    assert (c.writer.op, c.writer.location.line) == ("while", line), c


def _bf16_swapped(a, b, i):
  b = b.at[i % 24, jnp.array([3, 7, 3])].add(jnp.bfloat16(1.5))
  return b, a[2:5].sum(), a


def test_an_update_behind_a_conversion_is_named():
  # b's update (a bfloat16 scatter-add, computed in float32 and converted back by
  # a fusion of its own) is output 0, written into a's buffer.
  a = jnp.arange(24 * 48, dtype=jnp.bfloat16).reshape(24, 48)
  r = compare(_bf16_swapped, a, a + 1, jnp.int32(5), donate_argnums=(0, 1))
  line = _line(_bf16_swapped, "b = b.at")
  writers = {(c.writer.op, c.writer.location.line) for c in _copies(r, "a")
             if c.writer is not None and c.writer.location is not None}
  assert ("scatter-add", line) in writers, r.report


def _cast_to_half(p):
  # A mixed-precision copy of the params: no output has the shape and dtype of
  # p["a"], so JAX gives its buffer to XLA as a donor, and XLA writes the bf16
  # f32[512,512]-sized output over it (as many bytes).
  return {"a": p["a"].astype(jnp.bfloat16), "b": p["b"].astype(jnp.bfloat16)}


def _reshaped_cache(cache, new, pos):
  c = lax.dynamic_update_slice(cache, new[:, None, :], (0, pos, 0))
  return c.reshape(c.shape[0], c.shape[1], 8, -1)


@pytest.mark.parametrize("fn, args", [
    (_cast_to_half, lambda: ({"a": jnp.linspace(0, 1, 256 * 512).reshape(256, 512),
                              "b": jnp.linspace(1, 2, 512 * 512).reshape(512, 512)},)),
    (_reshaped_cache, lambda: (jnp.linspace(0, 1, 4 * 256 * 512).reshape(4, 256, 512),
                               jnp.ones((4, 512)), jnp.int32(3))),
], ids=["cast", "reshape"])
def test_a_buffer_donor_is_not_said_to_be_reused_by_no_output(fn, args):
  # JAX aliases a donated input to an output of its shape and dtype; where there is
  # none but an output has its number of elements, it gives the buffer to XLA as a
  # donor, and XLA may write an output of the same size over it. The reports said
  # "no output reuses the buffer" where the donations showed it aliased.
  r = compare(fn, *args(), donate_argnums=(0,))
  for report in (r.ref_report, r.report):
    aliased = {d.argument for d in report.donations if d.aliased_output is not None}
    assert aliased, report
    said = [c.cause or "" for c in report.copies] + [f.message for f in report.findings]
    for name in aliased:
      assert not any(f"no output reuses the buffer of donated {name}" in t
                     for t in said), report


def test_an_update_fused_with_a_reshape_runs_on_a_copy():
  # Nothing reads the old cache: XLA fuses the update with the reshape into the
  # output's shape, and runs that fusion on a copy. The cause said "XLA keeps the
  # old value of cache for a later use" (there is none). inplace_jax ties the
  # update's result before the reshape (`_passes.tie_reshaped_outputs`): no copy.
  r = compare(_reshaped_cache, jnp.linspace(0, 1, 4 * 256 * 512).reshape(4, 256, 512),
              jnp.ones((4, 512)), jnp.int32(3), donate_argnums=(0,))
  (c,) = [c for c in r.ref_report.buffer_copies(1024) if c.buffer == "cache"]
  assert "fused with a reshape of its result to f32[4,256,8,64]" in c.cause, c.cause
  assert "later use" not in c.cause, c.cause
  assert not r.report.buffer_copies(1024), r.report
