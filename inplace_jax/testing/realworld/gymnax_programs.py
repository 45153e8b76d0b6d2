"""Gymnax program: a CartPole-v1 rollout (`gymnax.make`, `env.reset`/`env.step` under
`jax.vmap` over environments, `lax.fori_loop` over time, as in the Gymnax README and
PureJaxRL-style collectors) writing every step into a preallocated, donated buffer."""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
from jax import lax

from . import RealProgram

NUM_ENVS = 256
NUM_STEPS = 256        # obs buffer: 256 x 256 x 4 f32 = 1 MiB

_ENV, _ENV_PARAMS = gymnax.make("CartPole-v1")
_OBS_DIM = _ENV.observation_space(_ENV_PARAMS).shape[0]


def _policy(w, obs):
  """A linear policy: push right when obs . w > 0."""
  return (obs @ w > 0).astype(jnp.int32)


def rollout(buffer, runner, w):
  """Runs NUM_STEPS steps of NUM_ENVS CartPoles from `runner` = (obs, env_state, key),
  writes obs/action/reward/done of step t to `buffer[...][t]`, returns both."""
  step_env = jax.vmap(_ENV.step, in_axes=(0, 0, 0, None))

  def body(t, carry):
    buffer, (obs, env_state, key) = carry
    key, k_step = jax.random.split(key)
    action = _policy(w, obs)
    # gymnax 1.x: Gymnasium-style (obs, state, reward, terminated, truncated, info).
    next_obs, env_state, reward, terminated, truncated, _ = step_env(
        jax.random.split(k_step, NUM_ENVS), env_state, action, _ENV_PARAMS)
    done = jnp.logical_or(terminated, truncated)
    buffer = {
        "obs": buffer["obs"].at[t].set(obs),
        "action": buffer["action"].at[t].set(action),
        "reward": buffer["reward"].at[t].set(reward),
        "done": buffer["done"].at[t].set(done),
    }
    return buffer, (next_obs, env_state, key)

  return lax.fori_loop(0, NUM_STEPS, body, (buffer, runner))


@jax.jit
def _args():
  key = jax.random.key(0)
  key, k_reset = jax.random.split(key)
  obs, env_state = jax.vmap(_ENV.reset, in_axes=(0, None))(
      jax.random.split(k_reset, NUM_ENVS), _ENV_PARAMS)
  buffer = {
      "obs": jnp.zeros((NUM_STEPS, NUM_ENVS, _OBS_DIM), jnp.float32),
      "action": jnp.zeros((NUM_STEPS, NUM_ENVS), jnp.int32),
      "reward": jnp.zeros((NUM_STEPS, NUM_ENVS), jnp.float32),
      "done": jnp.zeros((NUM_STEPS, NUM_ENVS), jnp.bool_),
  }
  # The classic CartPole controller: push towards the side the pole falls to
  # (obs = [x, x_dot, theta, theta_dot]).
  w = jnp.array([0.0, 0.0, 1.0, 1.0], jnp.float32)
  return buffer, (obs, env_state, key), w


def _next(args, out):
  _, _, w = args
  buffer, runner = out
  return buffer, runner, w


PROGRAMS = [
    RealProgram(
        name="gymnax_rollout_buffer",
        library="gymnax",
        description="gymnax CartPole-v1, linear policy, vmap(env.step) over 256 envs, "
                    "fori_loop of 256 steps writing buffer[k].at[t].set(...); buffer "
                    "and runner donated",
        fn=rollout,
        make_args=_args,
        donate_argnums=(0, 1),
        next_args=_next,
    ),
]
