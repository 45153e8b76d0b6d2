"""Flashbax programs: flat and prioritised replay buffers (`fbx.make_flat_buffer`,
`fbx.make_prioritised_flat_buffer`) in the add/sample step of the Flashbax README and
DQN examples, the buffer state donated."""

from __future__ import annotations

import flashbax as fbx
import jax
import jax.numpy as jnp
from jax import lax

from . import RealProgram

OBS_DIM = 16
MAX_LENGTH = 32768      # experience: 32768 x 16 f32 obs = 2 MiB (plus action/reward/done)
ADD_BATCH = 8           # transitions added per step (one per parallel environment)
SAMPLE_BATCH = 256
PREFILL = 64            # adds done in make_args, so sampling sees a warm buffer

_FLAT = fbx.make_flat_buffer(max_length=MAX_LENGTH, min_length=64,
                             sample_batch_size=SAMPLE_BATCH, add_batch_size=ADD_BATCH)
_PRIO = fbx.make_prioritised_flat_buffer(max_length=MAX_LENGTH, min_length=64,
                                         sample_batch_size=SAMPLE_BATCH,
                                         add_batch_size=ADD_BATCH,
                                         priority_exponent=0.6)


def _transitions(key):
  z = jax.random.normal(key, (ADD_BATCH, OBS_DIM + 1), jnp.float32)   # one draw
  return {
      "obs": z[:, :OBS_DIM],
      "action": jnp.argmax(z[:, :4], axis=-1).astype(jnp.int32),
      "reward": jax.nn.sigmoid(z[:, OBS_DIM]),
      "done": jnp.zeros((ADD_BATCH,), jnp.bool_),
  }


_transitions_jit = jax.jit(_transitions)


def _strong(x):
  """Flashbax 0.1.3's prioritised `init` makes `max_recorded_priority` a weakly typed
  f32 scalar, and the first `set_priorities` returns it strongly typed: the step would
  compile twice (steps 1 and 2). Start from the strong type, as after step 1."""
  return x.astype(x.dtype) if jax.typeof(x).weak_type else x


def _make_args(buffer):
  @jax.jit
  def warm_state():
    """`buffer.init`, then PREFILL adds (in one compiled loop), so that sampling
    sees a warm buffer."""
    example = jax.tree.map(lambda x: x[0], _transitions(jax.random.key(0)))
    state = buffer.init(example)

    def add(i, state):
      return buffer.add(state, _transitions(jax.random.fold_in(jax.random.key(100), i)))
    return lax.fori_loop(0, PREFILL, add, state)

  def make_args():
    state = jax.tree.map(_strong, warm_state())
    return state, _transitions_jit(jax.random.key(1)), jax.random.key(2)
  return make_args


def _next(args, out):
  _, _, key = args
  state = out[0]
  key, k_data = jax.random.split(key)
  return state, _transitions_jit(k_data), key


_FLAT_ARGS = _make_args(_FLAT)
_PRIO_ARGS = _make_args(_PRIO)


# --------------------------------------------------------------------------- flat


def flat_add_sample(state, transitions, key):
  state = _FLAT.add(state, transitions)
  batch = _FLAT.sample(state, key)
  return state, batch.experience


def flat_sample_add(state, transitions, key):
  batch = _FLAT.sample(state, key)
  state = _FLAT.add(state, transitions)
  return state, batch.experience


# --------------------------------------------------------------------------- prioritised


def _td_priorities(experience):
  """A stand-in for |TD error| from the sampled transitions."""
  first, second = experience.first, experience.second
  td = first["reward"] + 0.99 * jnp.mean(second["obs"], -1) - jnp.mean(first["obs"], -1)
  return jnp.abs(td) + 1e-3


def prioritised_add_sample(state, transitions, key):
  state = _PRIO.add(state, transitions)
  batch = _PRIO.sample(state, key)
  state = _PRIO.set_priorities(state, batch.indices, _td_priorities(batch.experience))
  return state, batch.experience, batch.probabilities


def prioritised_sample_add(state, transitions, key):
  batch = _PRIO.sample(state, key)
  state = _PRIO.set_priorities(state, batch.indices, _td_priorities(batch.experience))
  state = _PRIO.add(state, transitions)
  return state, batch.experience, batch.probabilities


PROGRAMS = [
    RealProgram(
        name="flashbax_flat_add_sample",
        library="flashbax",
        description="fbx.make_flat_buffer (32768 transitions), add a batch of 8 then "
                    "sample 256; buffer state donated",
        fn=flat_add_sample,
        make_args=_FLAT_ARGS,
        donate_argnums=(0,),
        next_args=_next,
    ),
    RealProgram(
        name="flashbax_flat_sample_add",
        library="flashbax",
        description="fbx.make_flat_buffer (32768 transitions), sample 256 then add a "
                    "batch of 8; buffer state donated",
        fn=flat_sample_add,
        make_args=_FLAT_ARGS,
        donate_argnums=(0,),
        next_args=_next,
    ),
    RealProgram(
        name="flashbax_prioritised_add_sample",
        library="flashbax",
        description="fbx.make_prioritised_flat_buffer, add then sample then "
                    "set_priorities(|td|); buffer state (with sum tree) donated",
        fn=prioritised_add_sample,
        make_args=_PRIO_ARGS,
        donate_argnums=(0,),
        next_args=_next,
    ),
    RealProgram(
        name="flashbax_prioritised_sample_add",
        library="flashbax",
        description="fbx.make_prioritised_flat_buffer, sample, set_priorities(|td|), "
                    "then add; buffer state (with sum tree) donated",
        fn=prioritised_sample_add,
        make_args=_PRIO_ARGS,
        donate_argnums=(0,),
        next_args=_next,
    ),
]
