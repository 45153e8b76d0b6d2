"""Probe programs: 131 more programs in the styles of the real libraries' users
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

from __future__ import annotations

import inplace_jax
from inplace_jax._harness import compare, untrue_statements
from inplace_jax._jit import significant_bytes

MODULES = ("flax_optax", "equinox_diffrax_flashbax_gymnax")


def problems_of(p) -> tuple[list[str], str]:
  """What fails for program `p`, and a summary of what ran."""
  c = compare(p.fn, p.make_args, donate_argnums=p.donate_argnums,
              static_argnums=p.static_argnums, steps=p.steps, next_args=p.next_args)
  out = []
  if not c.equal:
    out.append(f"values differ: {c.difference}")
  ours, theirs = c.candidate.report, c.reference.report
  jax_bytes = sum(k.nbytes for k in theirs.buffer_copies(1024))
  our_bytes = sum(k.nbytes for k in ours.buffer_copies(1024))
  if our_bytes > jax_bytes:
    out.append(f"more buffer bytes copied: {our_bytes} > {jax_bytes}")
  threshold = significant_bytes(ours, 1024)
  warned = [w for w in c.inplace_warnings
            if issubclass(w.category, inplace_jax.InplaceCopyWarning)]
  copies = ours.buffer_copies(threshold)
  if bool(warned) != bool(copies):
    out.append(f"{len(warned)} warning(s) for {len(copies)} significant buffer copies")
  if not all(k.cause for k in copies):
    out.append("a buffer copy without a cause")
  for name, r in (("inplace_jax", ours), ("jax.jit", theirs)):
    for u in untrue_statements(r):
      out.append(f"untrue in {name}'s report: {u}")
  runs = c.fn.signatures[-1].chosen.program
  return out, f"runs {runs}, buffer bytes jax.jit {jax_bytes} / inplace_jax {our_bytes}"
