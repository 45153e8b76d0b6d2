"""A replay buffer that samples a batch, then inserts new transitions, in place.

The buffer is a dict of arrays with a leading `capacity` axis (observations,
actions, rewards), donated. Each step gathers a batch at random indices (a read of
the old buffer), then writes the new transitions at the ring position `ptr` (a
scatter into the same buffer). Under `jax.jit` on CPU the gather and the scatter
conflict and XLA copies the observation buffer; under `inplace_jax.jit` nothing is
copied::

  python examples/replay_buffer.py --size 100000
  python -m inplace_jax check examples/replay_buffer.py:sample_and_insert \\
      --args-factory examples/replay_buffer.py:make_args --donate 0
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp

from _example_common import compare, parser, print_result

OBS_DIM, BATCH = 64, 256


def sample_and_insert(buffer, ptr, step, new):
  """Samples `BATCH` transitions, then writes `new` at `ptr, ptr+1, ...` (mod capacity).

  Args:
    buffer: `{"obs": f32[C, OBS_DIM], "action": i32[C], "reward": f32[C]}`, donated.
    ptr: i32[], the ring position of the next write.
    step: i32[], seeds the sampling (`fold_in(key(0), step)`).
    new: transitions to insert, same structure with a leading axis of `BATCH`.

  Returns:
    `(buffer, ptr, batch)`: the updated buffer, the next ring position, and the
    sampled batch (read before the insert).
  """
  capacity = buffer["reward"].shape[0]
  key = jax.random.fold_in(jax.random.key(0), step)
  idx = jax.random.randint(key, (BATCH,), 0, capacity)
  batch = jax.tree.map(lambda b: b[idx], buffer)
  n = new["reward"].shape[0]
  slots = (ptr + jnp.arange(n)) % capacity
  buffer = jax.tree.map(lambda b, x: b.at[slots].set(x), buffer, new)
  return buffer, (ptr + n) % capacity, batch


@functools.partial(jax.jit, static_argnums=0)
def make_args(capacity: int = 100_000) -> tuple:
  """`(buffer, ptr, step, new)`: a full random buffer and one batch to insert."""
  k = jax.random.split(jax.random.key(1), 6)
  buffer = {"obs": jax.random.normal(k[0], (capacity, OBS_DIM)),
            "action": jax.random.randint(k[1], (capacity,), 0, 16),
            "reward": jax.random.normal(k[2], (capacity,))}
  new = {"obs": jax.random.normal(k[3], (BATCH, OBS_DIM)),
         "action": jax.random.randint(k[4], (BATCH,), 0, 16),
         "reward": jax.random.normal(k[5], (BATCH,))}
  return buffer, jnp.int32(capacity - 7), jnp.int32(0), new


def next_args(out, args):
  buffer, ptr, _ = out
  return buffer, ptr, args[2] + 1, args[3]


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 100_000).parse_args(argv)
  r = compare(f"replay_buffer.sample_and_insert, capacity {opts.size} donated",
              sample_and_insert, lambda: make_args(opts.size), donate=(0,),
              next_args=next_args, repeat=opts.repeat)
  print_result(r, results)
  return 0 if r["equal"] else 1


if __name__ == "__main__":
  sys.exit(main())
