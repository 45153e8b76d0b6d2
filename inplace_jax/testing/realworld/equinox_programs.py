"""Equinox programs, written as the Equinox docs write them: models called under
`jax.vmap` over the batch, `eqx.filter_value_and_grad`, `eqx.apply_updates`, and the
stateful (`eqx.nn.BatchNorm` + `eqx.nn.State`) training step.

For plain `jax.jit` (rather than `eqx.filter_jit`) the model is split with
`eqx.partition(model, eqx.is_array)`: the arrays are the donated argument and the rest
(activation functions, hyperparameters) a hashable static argument, recombined with
`eqx.combine` inside the step, as in the Equinox FAQ.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from . import RealProgram

D_IN, WIDTH, D_OUT, BATCH = 128, 1024, 128, 64   # weights 1024x128 and 128x1024 f32
LR = 1e-2


@eqx.filter_jit   # creation under filter_jit: one compile instead of many eager ops
def _mlp():
  return eqx.nn.MLP(in_size=D_IN, out_size=D_OUT, width_size=WIDTH, depth=1,
                    key=jax.random.key(0))


@jax.jit
def _batch():
  x = jax.random.normal(jax.random.key(1), (BATCH, D_IN), jnp.float32)
  return x, jnp.tanh(x[:, ::-1][:, :D_OUT])     # targets: a function of the inputs


def loss_fn(model, x, y):
  pred = jax.vmap(model)(x)
  return jnp.mean((pred - y) ** 2)


# --------------------------------------------------------------------------- SGD


def _sgd_args():
  params, static = eqx.partition(_mlp(), eqx.is_array)
  x, y = _batch()
  return params, static, x, y


def sgd_step(params, static, x, y):
  model = eqx.combine(params, static)
  loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
  # `params` and `grads` both hold None where the model holds non-arrays.
  params = jax.tree.map(lambda p, g: p - LR * g, params, grads)
  return params, loss


def _sgd_next(args, out):
  _, static, x, y = args
  params, _ = out
  return params, static, x, y


# --------------------------------------------------------------------------- Adam

_OPTIM = optax.adam(1e-3)


_OPTIM_INIT = jax.jit(_OPTIM.init)


def _adam_args():
  model = _mlp()
  params, static = eqx.partition(model, eqx.is_array)
  opt_state = _OPTIM_INIT(params)
  x, y = _batch()
  return params, static, opt_state, x, y


def adam_step(params, static, opt_state, x, y):
  model = eqx.combine(params, static)
  loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
  updates, opt_state = _OPTIM.update(grads, opt_state, eqx.filter(model, eqx.is_array))
  model = eqx.apply_updates(model, updates)
  params, _ = eqx.partition(model, eqx.is_array)
  return params, opt_state, loss


def _adam_next(args, out):
  _, static, _, x, y = args
  params, opt_state, _ = out
  return params, static, opt_state, x, y


# --------------------------------------------------------------------------- BatchNorm
# The Equinox "stateful operations" example, with larger layers.


class BNModel(eqx.Module):
  linear1: eqx.nn.Linear
  norm: eqx.nn.BatchNorm
  linear2: eqx.nn.Linear

  def __init__(self, key):
    key1, key2 = jax.random.split(key)
    self.linear1 = eqx.nn.Linear(D_IN, WIDTH, key=key1)
    self.norm = eqx.nn.BatchNorm(input_size=WIDTH, axis_name="batch", mode="ema")
    self.linear2 = eqx.nn.Linear(WIDTH, D_OUT, key=key2)

  def __call__(self, x, state):
    x = self.linear1(x)
    x, state = self.norm(x, state)
    x = jax.nn.relu(x)
    x = self.linear2(x)
    return x, state


def bn_compute_loss(model, state, xs, ys):
  batch_model = jax.vmap(model, axis_name="batch", in_axes=(0, None),
                         out_axes=(0, None))
  pred_ys, state = batch_model(xs, state)
  loss = jnp.mean((pred_ys - ys) ** 2)
  return loss, state


@eqx.filter_jit
def _bn_model_and_state():
  return eqx.nn.make_with_state(BNModel)(jax.random.key(0))


def _bn_args():
  model, state = _bn_model_and_state()
  params, static = eqx.partition(model, eqx.is_array)
  opt_state = _OPTIM_INIT(params)
  x, y = _batch()
  return params, static, state, opt_state, x, y


def bn_step(params, static, state, opt_state, xs, ys):
  model = eqx.combine(params, static)
  (loss, state), grads = eqx.filter_value_and_grad(bn_compute_loss, has_aux=True)(
      model, state, xs, ys)
  updates, opt_state = _OPTIM.update(grads, opt_state, eqx.filter(model, eqx.is_array))
  model = eqx.apply_updates(model, updates)
  params, _ = eqx.partition(model, eqx.is_array)
  return params, state, opt_state, loss


def _bn_next(args, out):
  _, static, _, _, x, y = args
  params, state, opt_state, _ = out
  return params, static, state, opt_state, x, y


# An ensemble, as the Equinox FAQ builds one: `eqx.filter_vmap` over keys makes
# stacked members, each trained by its own `optax.lion` step under `jax.vmap`.
ENSEMBLE = 8
_LION = optax.lion(1e-4, weight_decay=1e-3)


@eqx.filter_jit
def _ensemble():
  make = lambda k: eqx.nn.MLP(32, 4, 256, 2, key=k)
  return eqx.filter_vmap(make)(jax.random.split(jax.random.key(0), ENSEMBLE))


@jax.jit
def _ensemble_data():
  x = jax.random.normal(jax.random.key(1), (128, 32), jnp.float32)
  return x, jnp.sin(x[:, :4])


def _ensemble_args():
  params, static = eqx.partition(_ensemble(), eqx.is_array)
  return (params, static, jax.jit(jax.vmap(_LION.init))(params), *_ensemble_data())


def _member_loss(model, x, y):
  return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def ensemble_step(params, static, opt_state, x, y):
  models = eqx.combine(params, static)

  @eqx.filter_vmap(in_axes=(eqx.if_array(0), None, None))
  def losses_and_grads(model, x, y):
    return eqx.filter_value_and_grad(_member_loss)(model, x, y)

  losses, grads = losses_and_grads(models, x, y)
  updates, opt_state = jax.vmap(_LION.update)(grads, opt_state, params)
  params = eqx.apply_updates(params, updates)
  return params, opt_state, losses


def _ensemble_next(args, out):
  _, static, _, x, y = args
  params, opt_state, _ = out
  return params, static, opt_state, x, y


PROGRAMS = [
    RealProgram(
        name="eqx_mlp_sgd",
        library="equinox",
        description="eqx.nn.MLP(128->1024->128) under jax.vmap, eqx.filter_value_and_grad, "
                    "SGD via jax.tree.map(p - lr*g); partitioned params donated",
        fn=sgd_step,
        make_args=_sgd_args,
        donate_argnums=(0,),
        static_argnums=(1,),
        next_args=_sgd_next,
    ),
    RealProgram(
        name="eqx_mlp_adam",
        library="equinox",
        description="eqx.nn.MLP under jax.vmap, filter_value_and_grad, optax.adam + "
                    "eqx.apply_updates; params and opt_state donated",
        fn=adam_step,
        make_args=_adam_args,
        donate_argnums=(0, 2),
        static_argnums=(1,),
        next_args=_adam_next,
    ),
    RealProgram(
        name="eqx_batchnorm_state",
        library="equinox",
        description="eqx.nn.BatchNorm + eqx.nn.State (make_with_state), vmap(axis_name="
                    "'batch'), adam; params, state and opt_state donated",
        fn=bn_step,
        make_args=_bn_args,
        donate_argnums=(0, 2, 3),
        static_argnums=(1,),
        next_args=_bn_next,
    ),
    RealProgram(
        name="eqx_ensemble_lion",
        library="equinox",
        description="an ensemble of 8 eqx.nn.MLPs made by eqx.filter_vmap, each trained "
                    "by optax.lion under jax.vmap; stacked params and opt_state donated",
        fn=ensemble_step,
        make_args=_ensemble_args,
        donate_argnums=(0, 2),
        static_argnums=(1,),
        next_args=_ensemble_next,
    ),
]
