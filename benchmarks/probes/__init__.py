"""Probe programs: 132 more programs in the styles of the real libraries' users
(Flax linen and NNX, Optax, JAX Refs, Equinox, Diffrax, Flashbax, Gymnax), written
from those libraries' docs to look for what the real-library suite
(`inplace_jax.testing.realworld`, 19 programs, run in CI) does not cover: other
optimizers and chains, dropout and RNG state, `nnx.scan`/`nnx.vmap`, remat, Refs,
ordered callbacks, casts and reshapes of donated state, `eqx.nn.State`,
`eqx.internal.while_loop`, Diffrax adjoints, events and SDEs, Flashbax trajectory,
item and prioritised buffers, Gymnax and MinAtar rollouts.

`python -m benchmarks.probes [NAME ...]` runs each under `jax.jit` and
`inplace_jax.jit` over a chain of steps and checks what the real-library suite
checks: outputs bit-equal, never more bytes copied, a warning exactly when a
significant buffer copy remains, every remaining copy explained, no report
statement `_harness.untrue_statements` finds false. It is a measurement (about
25 minutes on 2 cores), not part of CI; results are in docs/measurements.md.
"""
