"""Plan-level tests: what the analysis decides for a jaxpr, without compiling.

In the style of JAX's `assert_dce_result`: transform, `check_jaxpr`, compare
`eval_jaxpr` of the original and the transformed jaxpr on random inputs, and assert
the decisions (barriers, splits, moved reads, lowered conditionals, conflicts). Fast,
and a failure names the rule family that broke. One group per rule family of
`inplace_jax/_rules/`, plus the conflicts and the hints of the refinement rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from inplace_jax import _plan, _traits
from inplace_jax import _compat as C
from inplace_jax._rules import RULES, outputs_free_of

N = 32


def _x(k=0):
  return jnp.asarray(np.random.default_rng(k).normal(size=(N, N)), jnp.float32)


def assert_plan(fn, args, donated=None, *, hints=_plan.Hints(), **expected):
  """Sequences `fn`'s jaxpr, checks it, checks its values, returns the plan after
  asserting every `expected` stat (`barriers=1`, `splits=0`, ...) and conflict kind
  (`conflicts={"read_depends_on_update"}`)."""
  closed = jax.make_jaxpr(fn)(*args)
  donated = [True] * len(closed.jaxpr.invars) if donated is None else donated
  with jax.enable_checks(True):
    new, plan = inplace_jax.sequence_jaxpr(closed, donated, hints=hints)
  C.check_jaxpr(new.jaxpr)
  flat = jax.tree.leaves(args)
  want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat)
  got = jax.core.eval_jaxpr(new.jaxpr, new.consts, *flat)
  for a, b in zip(want, got, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  kinds = expected.pop("conflicts", None)
  stats = plan.stats()
  for k, v in expected.items():
    assert stats[k] == v, (k, stats, plan)
  if kinds is not None:
    assert {c.kind for c in plan.all_conflicts()} == set(kinds), plan
  return plan


# --------------------------------------------------------------------------- traits


def test_every_trait_entry_is_a_primitive_of_this_jax():
  assert _traits.UNRESOLVED == ()
  assert all(isinstance(p, C.Primitive) for p in _traits.TRAITS)


def test_every_rule_is_keyed_by_a_primitive():
  assert all(isinstance(p, C.Primitive) for p in RULES)
  for p in (C.dynamic_update_slice_p, C.scatter_add_p, C.jit_p, C.while_p, C.scan_p,
            C.cond_p, C.remat_p, C.custom_vjp_call_p, C.optimization_barrier_p):
    assert p in RULES


def test_dots_are_not_tie_points():
  """A barrier after a dot stops XLA folding a following transpose into it."""
  assert not _traits.has(C.primitive_by_name("dot_general"), _traits.Trait.CUT_SAFE)
  assert _traits.has(C.primitive_by_name("slice"), _traits.Trait.CUT_SAFE)


def test_sums_that_reduce_nothing_move_data():
  """A sum or product over no axis, or over axes of size 1 only, is a bitcast once
  XLA has compiled it (checked here on the installed XLA): no arithmetic, so it is
  data movement to the exactness checks; a real sum stays sensitive."""
  x = _x()
  moves = [lambda x: jnp.sum(x[0, 0]), lambda x: jnp.sum(x[0:1], axis=0),
           lambda x: jnp.prod(x[3:4, 2:3])]
  for f in moves:
    eqn = next(e for e in jax.make_jaxpr(f)(x).jaxpr.eqns
               if e.primitive.name in ("reduce_sum", "reduce_prod"))
    assert _traits.eqn_has(eqn, _traits.Trait.DATA_MOVEMENT)
    assert not _traits.eqn_has(eqn, _traits.Trait.SENSITIVE)
    hlo = jax.jit(f).lower(x).compile().as_text()
    assert " reduce(" not in hlo, hlo
  eqn = next(e for e in jax.make_jaxpr(lambda x: jnp.sum(x, axis=0))(x).jaxpr.eqns
             if e.primitive.name == "reduce_sum")
  assert _traits.eqn_has(eqn, _traits.Trait.SENSITIVE)
  assert " reduce(" in jax.jit(lambda x: jnp.sum(x, axis=0)).lower(x).compile().as_text()


def _divisions(f, *args) -> int:
  """The divisions of arrays in `f`'s compiled HLO."""
  hlo = jax.jit(f).lower(*args).compile().as_text()
  return sum(" divide(" in ln and not ln.split("=", 1)[1].strip().startswith("f32[]")
             for ln in hlo.splitlines())


def test_a_shared_scalar_divisor_keeps_its_divisions():
  """XLA multiplies by the reciprocal of a broadcast scalar only where nothing else
  divides by it (checked here on the installed XLA): the clone rounds keep a
  computed divisor shared and never clone a division by one (docs/xla_notes.md)."""
  from inplace_jax import _passes
  a, b, s = jnp.ones((64, 64)), jnp.ones((32,)), jnp.float32(0.5)

  def shared(a, b, s):          # Adam's bias correction over two leaves
    t = 1 - s
    return a / t, b / t

  def apart(a, b, s):           # what a clone of `t` per division compiles
    return a / (1 - s), b / (1 - s)

  assert _divisions(shared, a, b, s) == 2
  assert _divisions(apart, a, b, s) == 0

  def once(a, b, s):
    u = lax.div(a, lax.broadcast_in_dim(1 - s, a.shape, ()))
    return jnp.sin(u), u * 2

  def cloned(a, b, s):          # what a clone of the division per reader compiles
    d = lax.broadcast_in_dim(1 - s, a.shape, ())
    u, v = lax.div(a, d), lax.div(a, d)
    u, = lax.optimization_barrier((u,))
    return jnp.sin(u), v * 2

  assert _divisions(once, a, b, s) == 0
  assert _divisions(cloned, a, b, s) == 1
  # A weak-typed scalar reaches each division through a cast of its own: the
  # value cast is the divisor too.
  for f, scalar in ((shared, s), (once, s), (shared, 0.5), (once, 0.5)):
    jaxpr = jax.make_jaxpr(f)(a, b, scalar).jaxpr
    names = [e.primitive.name for e in jaxpr.eqns]
    for level in (1, 2):
      out = [e.primitive.name for e in _passes._cloned(jaxpr, level, {}).eqns]
      assert (out.count("sub"), out.count("div")) == (1, names.count("div")), (level, out)


# --------------------------------------------------------------------------- updates


def test_read_before_unique_rmw_is_tied_and_split():
  def f(x):
    y = x[0, 0]
    return x.at[0, 0].add(1.0), y
  assert_plan(f, (_x(),), barriers=1, splits=1, moved=0)


def test_read_only_feeding_its_update_is_not_tied():
  # Inside a loop nothing is split; the read feeds only the update: ordered by data.
  def f(x):
    return lax.fori_loop(0, 3, lambda i, x: x.at[i].set(x[i + 1] * 2.0), x)
  plan = assert_plan(f, (_x(),), barriers=0, splits=0)
  assert not plan.changed


def test_elementwise_update_continues_into_the_aliased_output():
  # `sin(x)` and `x + 0.1 * sin(x)` both have x's type; JAX aliases x to the
  # first output of its type, so the chain continues into that one: the findings
  # say why it is not in place (a tie after sin could change its arithmetic), not
  # that the updated x is output 1.
  def f(x):
    s = jnp.sin(x)
    return x + s * -0.1, s, s * s
  closed = jax.make_jaxpr(f)(_x())
  _, plan = inplace_jax.sequence_jaxpr(closed, donated=[True])
  kinds = {c.kind for c in plan.all_conflicts()}
  assert _plan.FindingKind.NOT_ALIASED not in kinds, plan.all_conflicts()
  assert _plan.FindingKind.WOULD_CHANGE_ARITHMETIC in kinds, plan.all_conflicts()


def test_elementwise_chains_end_in_the_output_each_buffer_is_aliased_to():
  # Two donated buffers of one type: JAX aliases p to output 0 and z to output 1.
  # Only z is sequenced (jax.jit copies only z), so z's old value reaches output 0
  # through elementwise ops (`0.1 * z`, then `p - 0.1 * z`); its update `z + u` is
  # output 1: z's chain ends there, not in the first output of its type.
  def f(p, z, u):
    z_new = z + u
    x = (p - 0.1 * z) / 0.9
    return p + (0.9 * x + 0.1 * z_new - p), z_new
  closed = jax.make_jaxpr(f)(_x(0), _x(1), _x(2))
  _, plan = inplace_jax.sequence_jaxpr(closed, donated=[True, True, False],
                                       buffers=[False, True, False])
  assert plan.flows[1] == 1, plan.flows
  kinds = {c.kind for c in plan.all_conflicts()}
  assert _plan.FindingKind.NOT_ALIASED not in kinds, plan.all_conflicts()


def test_repeated_index_scatter_add_is_not_split():
  def f(x):
    idx = jnp.array([1, 1, 2])
    return x.at[idx].add(jnp.ones((3, N))), x[5]
  assert_plan(f, (_x(),), splits=0)


def test_read_written_after_its_update_is_moved():
  def f(x):
    z = x.at[0, 0].add(1.0)
    return z, x[0, 0]
  assert_plan(f, (_x(),), moved=1)


# --------------------------------------------------------------------------- calls


def test_nested_jit_body_is_sequenced():
  body = jax.jit(lambda x: (x.at[0, 0].add(1.0), x[0, 0]))
  plan = assert_plan(body, (_x(),), barriers=1)
  assert any(sub.changed for info in plan.infos for _, sub in info.subplans)


def test_custom_vjp_and_checkpoint_bodies():
  def body(x):
    return x.at[3].set(x[4]), x[3].sum()

  @jax.custom_vjp
  def cv(x):
    return body(x)
  cv.defvjp(lambda x: (body(x), None), lambda _, g: (g[0],))
  for wrap in (cv, jax.checkpoint(body)):
    assert_plan(wrap, (_x(),))


# --------------------------------------------------------------------------- loops


def test_while_carry_updated_in_place():
  def f(x):
    return lax.while_loop(lambda c: c[1] < 3,
                          lambda c: (c[0].at[c[1]].set(c[0][c[1] + 1]), c[1] + 1),
                          (x, 0))[0]
  plan = assert_plan(f, (_x(),), conflicts=set())
  loop = next(i for e, i in zip(plan.jaxpr.eqns, plan.infos) if e.primitive is C.while_p)
  assert loop.uses and loop.uses[0].strong


def test_unrolled_scan_gets_an_entry_barrier():
  def f(x):
    def body(x, t):
      return x.at[t + 1].set(x[t] * 0.5), None
    return lax.scan(body, x, jnp.arange(8), unroll=4)[0]
  from inplace_jax._rules.loops import EntryBarrier
  plan = assert_plan(f, (_x(),))
  assert any(isinstance(i.action, EntryBarrier) for i in plan.infos)


def test_scanned_buffer_is_carried():
  def f(stack, h):
    def layer(h, k):
      k = k.at[0].set(h)
      return jnp.tanh(k[1] + h), k
    return lax.scan(layer, h, stack)
  stack = jnp.zeros((4, 8, N))
  closed = jax.make_jaxpr(f)(stack, jnp.ones(N))
  new, _ = inplace_jax.sequence_jaxpr(closed, [True, False])
  scan = next(e for e in new.jaxpr.eqns if e.primitive is C.scan_p)
  assert scan.params["num_carry"] > 1     # the stack rides the carry


def test_elementwise_carry_chain_ends_in_its_own_carry():
  # p's old value reaches carry 0 through `p * 0.1` (the first operand of the add,
  # so a weak update of p); its own update `p - 1` is carry 1, where it stays.
  def f(x, p):
    return lax.while_loop(lambda c: c[2] < 3,
                          lambda c: (c[1] * 0.1 + c[0] * 0.9, c[1] - 1.0, c[2] + 1),
                          (x, p, 0))
  plan = assert_plan(f, (_x(), _x(1)))
  (body,) = [sub for info in plan.infos for key, sub in info.subplans
             if key == ("body_jaxpr", None)]
  assert body.flows[-2] == 1, body.flows
  assert not any("loop carry 1" in c.message for c in plan.all_conflicts()), plan


def test_carry_not_returned_in_place_is_a_conflict():
  def f(x, y):
    return lax.fori_loop(0, 3, lambda i, c: (c[1], c[0].at[i].set(1.0)), (x, y))
  plan = assert_plan(f, (_x(), _x(1)))
  assert "carry_not_in_place" in {c.kind for c in plan.all_conflicts()}


# --------------------------------------------------------------------------- conditionals


def test_cond_updating_first_branch_is_lowered():
  def f(x, p):
    return lax.cond(p, lambda x: x, lambda x: x.at[3].set(x[4]), x)
  plan = assert_plan(f, (_x(), jnp.bool_(True)), [True, False], lowered_conds=1)
  from inplace_jax._rules.conditionals import LowerCond
  assert any(isinstance(i.action, LowerCond) for i in plan.infos)


def test_cond_with_identity_first_is_kept():
  def f(x, p):
    return lax.cond(p, lambda x: x.at[3].set(1.0), lambda x: x, x)
  assert_plan(f, (_x(), jnp.bool_(True)), [True, False], lowered_conds=0)


# --------------------------------------------------------------------------- conflicts


def _read_needs_new(x):
  z = x.at[0, 0].set(3.0)
  return z, x[z[0, 0].astype(jnp.int32)]


@pytest.mark.parametrize("fn,kind", [
    (_read_needs_new, "read_depends_on_update"),
    (lambda x: (x.at[0].set(1.0), x.at[1].set(2.0)), "two_live_updates"),
    (lambda x: (x.at[0].set(1.0), x), "old_version_escapes"),
])
def test_conflicts(fn, kind):
  plan = assert_plan(fn, (_x(),))
  assert kind in {c.kind for c in plan.all_conflicts()}


def test_untied_read_says_why():
  """A read whose result comes from a dot is left untied, and the plan says so."""
  def f(x, w):
    h = x @ w
    return x - 0.1 * h, h.sum()
  plan = assert_plan(f, (_x(), _x(1)), [True, False])
  assert all(c.kind != "tie_would_change_arithmetic" or "dot" in c.message
             for c in plan.all_conflicts())


# --------------------------------------------------------------------------- hints


def _swap_then_read(x):
  a, b = x[1], x[14]
  x = x.at[1].set(b).at[14].set(a)
  return x, x[3].sum()


def test_swap_then_read_needs_the_refinement_hints():
  # Without hints the read feeding the second update reaches a sum through it.
  assert_plan(_swap_then_read, (_x(),), barriers=0)
  hints = _plan.Hints(through_updates=True)
  assert_plan(_swap_then_read, (_x(),), hints=hints, barriers=2)


def test_avoid_keeps_barriers_away_from_an_operation():
  closed = jax.make_jaxpr(_swap_then_read)(_x())
  scatter = [e for e in closed.jaxpr.eqns if e.primitive is C.scatter_p][-1]
  frame = C.user_frame(scatter)
  avoid = frozenset({(frame.file_name, frame.start_line, "scatter")})
  hints = _plan.Hints(through_updates=True, avoid=avoid)
  assert_plan(_swap_then_read, (_x(),), hints=hints, barriers=0)


def test_tie_hint_ties_a_private_read():
  def f(x):
    return x.at[3].set(x[5] * 2.0)
  closed = jax.make_jaxpr(f)(_x())
  sl = next(e for e in closed.jaxpr.eqns if e.primitive is C.slice_p)
  frame = C.user_frame(sl)
  assert_plan(f, (_x(),), barriers=0)
  hints = _plan.Hints(tie=frozenset({(frame.file_name, frame.start_line, "slice")}))
  assert_plan(f, (_x(),), hints=hints, barriers=1)


def test_a_spliced_helper_call_is_named_by_its_call_site():
  # `lax.dynamic_index_in_dim` is a jitted jax helper whose body jax traces with no
  # user frame; spliced into the caller (`_passes.inline_calls`), its operations
  # are named by the line that calls it, as jax.jit's lowering of the call names
  # them (fuzz seed 6800 #1358).
  from inplace_jax import _passes

  def f(x):
    return lax.dynamic_index_in_dim(x, 5, 1, keepdims=False) * 2.0
  closed = jax.make_jaxpr(f)(_x())
  call = next(e for e in closed.jaxpr.eqns if e.primitive is C.jit_p)
  inner = call.params["jaxpr"].jaxpr
  assert all(C.user_frame(e) is None for e in inner.eqns)   # what makes it matter
  ctx = _passes.PassContext(donated=(True,), in_loop=False, erase_remat_barriers=True,
                            analyze=None, inline_calls=True)
  spliced, _ = _passes.inline_calls(closed.jaxpr, closed.consts, ctx)
  sl = next(e for e in spliced.eqns if e.primitive is C.dynamic_slice_p)
  frame, site = C.user_frame(sl), C.user_frame(call)
  assert frame is not None and site is not None
  assert (frame.file_name, frame.start_line) == (site.file_name, site.start_line)


def test_barriers_that_close_a_cycle_are_dropped_one_by_one():
  # A generated program whose barriers cannot all be honoured together (fuzz seed
  # 2040 #883: loops and switches over three buffers; #174, a switch reading both
  # buffers and then rows swapped between them, was one until a read that a tied
  # value is computed from stayed before the barrier). The update whose barrier
  # would close the cycle is left to XLA and named; the others stay (before, the
  # whole jaxpr was left unchanged).
  from inplace_jax.testing import fuzz
  p = fuzz.generate(2040, 883)
  args = fuzz.make_inputs(p.bufs, p.data_seed, p.data)
  closed = jax.make_jaxpr(fuzz.build(p))(*args)
  new, plan = inplace_jax.sequence_jaxpr(closed, donated=[True] * len(args))
  dropped = [c for c in plan.all_conflicts() if c.kind is _plan.FindingKind.UNSEQUENCED]
  assert dropped and all(c.update for c in dropped), plan.all_conflicts()
  # One buffer or several, the message names what was found: the other updates
  # whose reads were ordered first, or a cycle of the update's own reads.
  assert all(("together with the reads ordered before" in c.message) !=
             ("closes a cycle" in c.message) for c in dropped), dropped
  assert "other buffers" not in " ".join(c.message for c in dropped)
  assert plan.changed
  C.check_jaxpr(new.jaxpr)
  want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
  got = jax.core.eval_jaxpr(new.jaxpr, new.consts, *args)
  for a, b in zip(want, got, strict=True):
    np.testing.assert_array_equal(a, b)



def test_dead_while_carries_removed_as_xla_removes_them():
  # XLA's while-loop simplifier drops carries nothing live reads; the analysis must
  # not count reads that only feed them (fuzz seed 4500 #3828). The loop keeps its
  # live carries, values unchanged, and the dead argmax of a row is gone.
  from inplace_jax import _compat as C
  from inplace_jax import _passes

  def f(b, n):
    def body(i, c):
      b, a, z = c
      b = b.at[1].add(1.0)
      return b + 1.0, a + jnp.argmax(b[1]), z * 2
    b, _, z = lax.fori_loop(0, n, body, (b, 0, 1.0))
    return b, z
  x = jnp.arange(16.0).reshape(4, 4)
  cj = jax.make_jaxpr(f)(x, 3)
  new, _ = _passes.dead_code(cj.jaxpr, cj.consts, None)
  C.check_jaxpr(new)
  (before,) = [e for e in cj.jaxpr.eqns if e.primitive is C.while_p]
  (loop,) = [e for e in new.eqns if e.primitive is C.while_p]
  assert len(loop.outvars) == len(before.outvars) - 1
  body = loop.params["body_jaxpr"].jaxpr
  assert not any(e.primitive.name == "argmax" for e in body.eqns)
  out = C.jaxpr_as_fun(C.ClosedJaxpr(new, cj.consts))(x, 3)
  for a, b in zip(out, jax.jit(f)(x, 3), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("lo, hi, free", [(0, 0, True), (0, 2, False), (None, 0, False)])
def test_a_loop_of_no_trips_returns_its_initial_carries(lo, hi, free):
  # A loop whose condition is false on its literal initial carries makes no trip:
  # its results are those carries, whatever its body reads. A constant one must
  # stay visible to XLA's simplifier (fuzz seed 6700 #8878: -0.0 + a zero-trip sum).
  # Not when the loop makes trips, nor when the condition reads an operand.
  def f(b, n):
    start = jnp.int32(0) if lo is not None else n
    body = lambda i, s: s + jnp.argmax(b[1]).astype(jnp.float32)
    return lax.fori_loop(start, hi, body, jnp.float32(0))
  cj = jax.make_jaxpr(f)(_x(), jnp.int32(0))
  (loop,) = [e for e in cj.jaxpr.eqns if e.primitive is C.while_p]
  ops = [i for i, v in enumerate(loop.invars) if not C.is_literal(v)]
  total = len(loop.outvars) - 1
  assert (total in outputs_free_of(loop, ops)) == free


def test_a_loop_of_no_trips_with_a_key_carry_compiles_and_matches_jax_jit():
  # The condition is evaluated on the literals it reads alone: a carry it does
  # not read may have a dtype NumPy cannot make (a PRNG key), which crashed the
  # first version of the rule.
  def f(b, key):
    def body(c):
      i, k, s = c
      k, sub = jax.random.split(k)
      return i + 1, k, s + jax.random.normal(sub) + b[0, 0]
    _, key, s = lax.while_loop(lambda c: c[0] < 0, body, (0, key, 0.0))
    r = b[3].sum()
    return b.at[:, 2].add(s).at[3].set(r), key
  cj = jax.make_jaxpr(f)(_x(), jax.random.key(0))
  (loop,) = [e for e in cj.jaxpr.eqns if e.primitive is C.while_p]
  ops = [i for i, v in enumerate(loop.invars) if not C.is_literal(v)]
  assert outputs_free_of(loop, ops) == {0, 2}
  want = jax.jit(f)(_x(), jax.random.key(0))
  got = inplace_jax.jit(f, donate_argnums=0)(_x(), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
  np.testing.assert_array_equal(jax.random.key_data(got[1]), jax.random.key_data(want[1]))


def _sink_round(f, *args):
  """`f`'s jaxpr through the sink round's passes (`_passes.clone_shared` at
  `SINK_LEVEL`), and both evaluated equation by equation (no fusion, so any
  difference is the pass's)."""
  from inplace_jax import _passes
  closed = jax.make_jaxpr(f)(*args)
  ctx = _passes.PassContext(donated=(True,) * len(args), in_loop=False,
                            erase_remat_barriers=True, analyze=None,
                            clone=_passes.SINK_LEVEL, inline_calls=True)
  new, consts = _passes.inline_calls(closed.jaxpr, closed.consts, ctx)
  new, consts = _passes.clone_shared(new, consts, ctx)
  C.check_jaxpr(new)
  want = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
  got = jax.core.eval_jaxpr(new, consts, *args)
  for a, b in zip(want, got, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  return new


def _prims(jaxpr):
  return [e.primitive.name for e in jaxpr.eqns]


def test_sink_round_slices_a_buffer_before_the_arithmetic_it_feeds():
  # `jnp.resize(b * b, (32,))` is a reshape, a tile and a slice of the product:
  # moved above the multiply, they read the buffer, and the product is computed
  # on the 32 values read (`_passes._moves_sunk`).
  def f(b, c):
    v = b * b + 0.5
    return c.at[0].add(jnp.resize(v, (32,))), v[3, :4] * 2.0

  b = jnp.asarray(np.random.default_rng(0).normal(size=(32, 32)), jnp.float32)
  c = jnp.asarray(np.random.default_rng(1).normal(size=(16, 32)), jnp.float32)
  new = _sink_round(f, b, c)
  muls = [e for e in new.eqns if e.primitive.name == "mul" and
          e.outvars[0].aval.shape != ()]
  assert muls and all(e.outvars[0].aval.size <= 32 for e in muls), new
  assert all(e.outvars[0].aval.shape != (32, 32) for e in new.eqns
             if e.primitive.name == "add"), new


def test_sink_round_leaves_moves_of_other_operations():
  # A slice of a sum over rows, a division and an integer product: none is a cheap
  # elementwise float operation the slice may move above.
  def f(b, n):
    return (b.sum(0)[:4], (b / b[0])[1:3], (n * n)[:2])

  b = jnp.asarray(np.random.default_rng(0).normal(size=(8, 8)), jnp.float32)
  n = jnp.arange(8, dtype=jnp.int32)
  closed = jax.make_jaxpr(f)(b, n)
  new = _sink_round(f, b, n)
  assert _prims(new) == _prims(closed.jaxpr)


def test_ancestor_search_bounded_by_an_order_the_edges_follow():
  # `tie_derived_reads` asks which of a few equations a tied read depends on; the
  # search stops below the earliest of them in an order every edge follows,
  # read-before-update edges against program order included. On random graphs
  # with such edges it finds exactly the ones the unbounded search finds.
  import types

  from inplace_jax._analysis import _ancestors, _edge_order
  rng = np.random.default_rng(0)
  for _ in range(200):
    n = int(rng.integers(2, 30))
    place = rng.permutation(n)         # the order the edges follow
    edges: list[set[int]] = [set() for _ in range(n)]
    for _ in range(int(rng.integers(0, 3 * n))):
      a, b = (int(x) for x in rng.integers(0, n, 2))
      if place[a] < place[b]:
        edges[a].add(b)
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, bs in enumerate(edges):
      for b in bs:
        preds[b].append(a)
    order = _edge_order(types.SimpleNamespace(n=n, edges=edges))
    assert order is not None
    assert all(order[a] < order[b] for a, bs in enumerate(edges) for b in bs)
    eqns = {int(x) for x in rng.integers(0, n, int(rng.integers(1, 4)))}
    among = {int(x) for x in rng.integers(0, n, int(rng.integers(1, 5)))}
    full = _ancestors(preds, eqns)
    assert _ancestors(preds, eqns, order, among) & among == full & among
  # Edges that close a cycle give no order (the unbounded search is used).
  cycle = [{1}, {0}]
  assert _edge_order(types.SimpleNamespace(n=2, edges=cycle)) is None


def test_normalise_skips_only_passes_with_nothing_to_change():
  # `normalise` leaves out the passes that change only conditionals, loops or
  # remat where the program holds none (a walk over every equation each). On
  # programs with and without each, it gives the jaxpr that every pass run in
  # turn gives, and the sequenced program computes jax.jit's values.
  from inplace_jax import _passes
  from inplace_jax._analysis import Analyzer

  def straight(x, i):
    y = x[3] * 2.0
    return x.at[i].set(y), y.sum()

  def with_cond(x, i):
    x = lax.cond(i > 2, lambda x: x.at[0].set(x[1]), lambda x: x, x)
    return x.at[i].add(1.0)

  def with_known_cond(x, i):
    x = lax.switch(jnp.int32(1), [lambda x: x * 2.0, lambda x: x.at[2].set(x[5])], x)
    return x, x[0]

  def with_loop(x, i):
    def body(k, x):
      return x.at[k].set(x[k + 1] * 0.5)
    return lax.fori_loop(0, 4, body, x), x[0]

  def with_while(x, i):
    def body(c):
      k, x, unused, kept = c
      return k + 1, x.at[k].add(x[0]), unused * 2.0, kept
    # The condition reads `kept`, which the body passes through: JAX keeps it a
    # carry (`forward_passed_carries`).
    _, x, _, kept = lax.while_loop(lambda c: c[0] < i + (c[3][0] > 1e9), body,
                                   (0, x, x[1], x[2] * 3.0))
    return x, kept

  def with_batched_while(x, i):
    def solve(row):
      def body(c):
        return c[0] + 1, c[1].at[c[0]].add(1.0)
      trips = jnp.abs(row[0]).astype(jnp.int32) % 3 + 1
      return lax.while_loop(lambda c: c[0] < trips, body, (0, row))[1]
    return jax.vmap(solve)(x), x[0]

  def with_cond_outputs(x, i):
    # A small output one branch gives as an operand; `x` taken as an operand and
    # closed over.
    x, s = lax.cond(i > 2, lambda y, s: (y.at[0].set(x[1]), s),
                    lambda y, s: (y * 2.0, s * 2.0), x, x[0, 0])
    return x, s

  def with_remat(x, i):
    f = jax.checkpoint(lambda x: jnp.sin(x) * x[0])
    return x.at[i].set(f(x)[1])

  x, i = _x(3), jnp.int32(4)
  for fn in (straight, with_cond, with_known_cond, with_loop, with_while,
             with_batched_while, with_cond_outputs, with_remat):
    closed = jax.make_jaxpr(fn)(x, i)
    for erase in (False, True):
      def ctx():
        return _passes.PassContext(donated=(True, False), in_loop=False,
                                   erase_remat_barriers=erase, analyze=Analyzer())
      got, _ = _passes.normalise(closed.jaxpr, closed.consts, ctx())
      want, consts = closed.jaxpr, closed.consts
      every = ctx()
      for p in _passes.PASSES:
        want, consts = p(want, consts, every)
      assert str(got) == str(want), fn.__name__
    new, _ = inplace_jax.sequence_jaxpr(closed, [True, False])
    ref = jax.jit(C.jaxpr_as_fun(closed))(x, i)
    out = jax.jit(C.jaxpr_as_fun(new),
                  compiler_options=inplace_jax.compiler_options())(x, i)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
