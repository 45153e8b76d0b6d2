"""Optax programs: the train step of the Optax "getting started" docs on an MLP params
dict (`jax.value_and_grad`, `tx.update`, `optax.apply_updates`), with plain Adam,
`optax.MultiSteps`, `optax.apply_if_finite` and a hand-written `lax.cond` NaN skip."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

from . import RealProgram

D_IN, HIDDEN, D_OUT, BATCH = 128, 1024, 10, 64   # w1: 128x1024, w2: 1024x128 f32


_SHAPES = {"w1": (D_IN, HIDDEN), "w2": (HIDDEN, 128), "w3": (128, D_OUT)}


@jax.jit
def init_params(key):
  # One normal draw cut into the weights (a jitted threefry draw costs ~0.6 s of XLA
  # compile on CPU; one draw instead of three keeps the fixture cheap).
  sizes = [a * b for a, b in _SHAPES.values()]
  flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
  params, start = {}, 0
  for (name, (fan_in, fan_out)), size in zip(_SHAPES.items(), sizes):
    w = flat[start:start + size].reshape(fan_in, fan_out) / jnp.sqrt(float(fan_in))
    params[name] = w
    params["b" + name[1:]] = jnp.zeros((fan_out,), jnp.float32)
    start += size
  return params


def mlp(params, x):
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  h = jax.nn.relu(h @ params["w2"] + params["b2"])
  return h @ params["w3"] + params["b3"]


def loss_fn(params, x, y):
  logits = mlp(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@jax.jit
def _batch():
  x = jax.random.normal(jax.random.key(1), (BATCH, D_IN), jnp.float32)
  return x, jnp.argmax(x[:, :D_OUT], axis=-1)   # labels: a function of the inputs


def _make_args(tx):
  init = jax.jit(tx.init)

  def make_args():
    params = init_params(jax.random.key(0))
    x, y = _batch()
    return params, init(params), x, y
  return make_args


def _next(args, out):
  _, _, x, y = args
  params, opt_state, _ = out
  return params, opt_state, x, y


def _next_with_nan(args, out):
  """Step 2 sees a batch with a NaN (loss and grads NaN: the update is skipped),
  step 3 a clean batch again."""
  _, _, x, y = args
  params, opt_state, _ = out
  if bool(jnp.isnan(x).any()):
    x = jnp.where(jnp.isnan(x), 0.0, x)
  else:
    x = x.at[0, 0].set(jnp.nan)
  return params, opt_state, x, y


def _train_step(tx):
  def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, loss
  return train_step


_ADAM = optax.adam(1e-3)
_MULTI = optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2)
_IF_FINITE = optax.apply_if_finite(optax.adam(1e-3), max_consecutive_errors=3)


def nan_skip_train_step(params, opt_state, x, y):
  """Skip the optimizer update when the loss is not finite (a common hand-written
  guard, the `lax.cond` form)."""
  loss, grads = jax.value_and_grad(loss_fn)(params, x, y)

  def apply_update(operand):
    params, opt_state, grads = operand
    updates, opt_state = _ADAM.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def skip(operand):
    params, opt_state, _ = operand
    return params, opt_state

  params, opt_state = lax.cond(jnp.isfinite(loss), apply_update, skip,
                               (params, opt_state, grads))
  return params, opt_state, loss


PROGRAMS = [
    RealProgram(
        name="optax_adam",
        library="optax",
        description="MLP params dict, jax.value_and_grad + optax.adam update + "
                    "apply_updates; params and opt_state donated",
        fn=_train_step(_ADAM),
        make_args=_make_args(_ADAM),
        donate_argnums=(0, 1),
        next_args=_next,
    ),
    RealProgram(
        name="optax_multisteps",
        library="optax",
        description="optax.MultiSteps(optax.adam, every_k_schedule=2) gradient "
                    "accumulation; params and opt_state (with grad acc) donated",
        fn=_train_step(_MULTI),
        make_args=_make_args(_MULTI),
        donate_argnums=(0, 1),
        next_args=_next,
        steps=4,
    ),
    RealProgram(
        name="optax_apply_if_finite",
        library="optax",
        description="optax.apply_if_finite(optax.adam, max_consecutive_errors=3), "
                    "step 2 has a NaN batch; params and opt_state donated",
        fn=_train_step(_IF_FINITE),
        make_args=_make_args(_IF_FINITE),
        donate_argnums=(0, 1),
        next_args=_next_with_nan,
    ),
    RealProgram(
        name="optax_nan_skip_cond",
        library="optax",
        description="hand-written lax.cond(jnp.isfinite(loss), apply_update, skip) "
                    "around optax.adam, step 2 has a NaN batch; params+opt_state donated",
        fn=nan_skip_train_step,
        make_args=_make_args(_ADAM),
        donate_argnums=(0, 1),
        next_args=_next_with_nan,
    ),
]
