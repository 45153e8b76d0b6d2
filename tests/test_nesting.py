"""An `inplace_jax.jit` function called under another transformation behaves as a
nested `jax.jit`: values equal to the same program with `jax.jit` in its place
(gradients too), and an `InplaceNestingWarning` exactly where the outermost
compilation erases barriers (CPU, a plain `jax.jit` or no jit at all)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import inplace_jax
from conftest import ON_CPU, assert_tree_equal, fresh

N = 64


def _x():
  return jnp.asarray(np.random.default_rng(0).normal(size=(N, N)), jnp.float32)


def _step(x):
  y = x[1] * 2.0
  return x.at[0].add(1.0).at[3].set(x[5]), y


STEP = inplace_jax.jit(_step, donate_argnums=0)
PLAIN = jax.jit(_step, donate_argnums=0)


def _contexts(step):
  """Programs calling `step` inside each context a user writes."""
  def scan_body(x):
    return lax.scan(lambda c, _: (step(c)[0], None), x, length=3)[0]

  def fori_body(x):
    return lax.fori_loop(0, 3, lambda i, c: step(c)[0], x)

  def while_body(x):
    return lax.while_loop(lambda c: c[1] < 2, lambda c: (step(c[0])[0], c[1] + 1),
                          (x, 0))[0]

  def cond_branch(x):
    return lax.cond(x[0, 0] > 0, lambda x: step(x)[0], lambda x: x * 1.0, x)

  @jax.custom_vjp
  def cvjp(x):
    return step(x)[0]
  cvjp.defvjp(lambda x: (step(x)[0], None), lambda _, g: (g,))

  def loss(x):
    x, y = step(x)
    return jnp.sum(x * x) + jnp.sum(y)

  return {
      "jit": jax.jit(lambda x: step(x)),
      "grad": jax.grad(loss),
      "jit_grad": jax.jit(jax.grad(loss)),
      "vjp": lambda x: jax.vjp(lambda x: step(x)[0], x)[1](jnp.ones((N, N))),
      "jvp": lambda x: jax.jvp(lambda x: step(x)[0], (x,), (jnp.ones((N, N)),)),
      "vmap": jax.vmap(lambda x: step(x)),
      "scan": jax.jit(scan_body),
      "fori": jax.jit(fori_body),
      "while": jax.jit(while_body),
      "cond": jax.jit(cond_branch),
      "checkpoint": jax.jit(jax.checkpoint(lambda x: step(x)[0])),
      "custom_vjp": jax.jit(jax.grad(lambda x: cvjp(x).sum())),
  }


@pytest.mark.parametrize("context", sorted(_contexts(STEP)))
def test_nested_call_equals_nested_jax_jit(context):
  ours = _contexts(STEP)[context]
  theirs = _contexts(PLAIN)[context]
  args = (jnp.stack([_x(), _x() + 1]),) if context == "vmap" else (_x(),)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", inplace_jax.InplaceNestingWarning)
    assert_tree_equal(theirs(*fresh(args)), ours(*fresh(args)))


def test_shard_map_body():
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
  def f(step):
    return jax.jit(jax.shard_map(lambda x: step(x)[0], mesh=mesh, in_specs=P("d"),
                                 out_specs=P("d")))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", inplace_jax.InplaceNestingWarning)
    assert_tree_equal(f(PLAIN)(fresh(_x())), f(STEP)(fresh(_x())))


def _warned(fn, *args) -> bool:
  step = inplace_jax.jit(_step, donate_argnums=0)   # a fresh object warns once
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn(step)(*fresh(args))
  return any(issubclass(w.category, inplace_jax.InplaceNestingWarning) for w in caught)


def test_warning_exactly_where_barriers_are_erased():
  x = _x()
  erased = ON_CPU
  assert _warned(lambda s: jax.jit(lambda x: s(x)), x) == erased
  assert _warned(lambda s: jax.grad(lambda x: s(x)[0].sum()), x) == erased
  assert not _warned(lambda s: jax.jit(lambda x: s(x),
                                       compiler_options=inplace_jax.compiler_options()), x)
  assert not _warned(lambda s: inplace_jax.jit(lambda x: s(x), donate_argnums=0), x)


def test_nested_in_inplace_jit_is_copy_free_and_exact():
  """Inside an outer inplace_jax.jit the inner program's reads are ordered too."""
  outer = inplace_jax.jit(lambda x: STEP(STEP(x)[0]), donate_argnums=0)
  ref = jax.jit(lambda x: PLAIN(PLAIN(x)[0]), donate_argnums=0)
  assert_tree_equal(ref(fresh(_x())), outer(fresh(_x())))
  assert outer.last_report.buffer_copies(1024) == ()


def test_sequence_inside_plain_jit_warns_where_erased():
  f = inplace_jax.sequence(_step, donate_argnums=0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.jit(f)(fresh(_x()))
  assert_tree_equal(PLAIN(fresh(_x())), out)
  warned = any(issubclass(w.category, inplace_jax.InplaceNestingWarning)
               for w in caught)
  assert warned == ON_CPU


def test_jit_api_attributes():
  f = inplace_jax.jit(_step, donate_argnums=0)
  assert f.__wrapped__ is _step and f.__name__ == "_step"
  assert f.eval_shape(_x())[0].shape == (N, N)
  lowered = f.lower(_x())
  out = f(fresh(_x()))
  assert f.lower(_x()).as_text() == lowered.as_text()   # the program the call runs
  assert_tree_equal(PLAIN(fresh(_x())), out)
  f.clear_cache()
  assert f.signatures == ()
  assert_tree_equal(PLAIN(fresh(_x())), f(fresh(_x())))

  class Model:
    scale = 2.0

    @inplace_jax.jit
    def apply(self, x):
      return x * self.scale

  with pytest.raises(TypeError):
    Model().apply(_x())      # `self` is not a JAX type, as with jax.jit



def _peek_body(b):
  return b, jnp.sum(b[0, 0])


_peek = jax.custom_jvp(_peek_body)
# Not the true derivative, on purpose: a rule dropped would change the gradient.
_peek.defjvp(lambda p, t: (_peek_body(*p), (t[0] * 3.0, jnp.sum(t[0][0, 0]) * 5.0)))


def _peek_then_scatter(x, peek=_peek):
  x = x * 0.5 + 1.5
  x, s = peek(x)
  return x.at[27, jnp.array([2, 11, 7])].add(-s)


def _loss(step):
  return lambda x: jnp.sum(step(x) ** 2)


@pytest.mark.parametrize("outer", ["grad", "jit_grad", "jvp"])
def test_custom_rules_kept_where_differentiated(outer):
  """The compiled program splices `custom_jvp` bodies into their callers
  (`_passes.inline_calls`); differentiated, the custom rule still applies."""
  ours = inplace_jax.jit(_peek_then_scatter)
  plain = jax.jit(_peek_then_scatter)
  wrap = {"grad": lambda s: jax.grad(_loss(s)),
          "jit_grad": lambda s: jax.jit(jax.grad(_loss(s))),
          "jvp": lambda s: lambda x: jax.jvp(s, (x,), (jnp.ones_like(x),))}[outer]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", inplace_jax.InplaceNestingWarning)
    assert_tree_equal(wrap(plain)(_x()), wrap(ours)(_x()))
  # The rule is not the true derivative: without it the gradient differs.
  true = jax.grad(_loss(lambda x: _peek_then_scatter(x, _peek_body)))(_x())
  assert not np.array_equal(np.asarray(true), np.asarray(jax.grad(_loss(ours))(_x())))
