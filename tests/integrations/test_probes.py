"""A sample of the probe programs (`benchmarks/probes`, 131 programs in the styles
of Flax, Optax, JAX Refs, Equinox, Diffrax, Flashbax and Gymnax users), checked as
`python -m benchmarks.probes` checks them: values bit-equal to jax.jit's over a
chain of steps, never more buffer bytes copied, a warning exactly when a
significant buffer copy remains, every copy explained, no statement found false.

The sample: programs whose sequenced program runs (Refs, an ordered callback, a
switch, `eqx.nn.State` reset in a `cond`, `eqx.error_if`, a Flashbax sample then
add, a Gymnax `switch` in a `scan`) and two whose donated buffers XLA reuses as
donors for outputs of another shape or type.
"""

from __future__ import annotations

import importlib

import pytest

from benchmarks.probes import MODULES, problems_of

SAMPLE = ("optax_ref_sgd_momentum", "optax_io_callback_lr", "flax_ref_switch",
          "flax_ref_while_early_exit", "flax_nnx_cond_update", "eqx_state_cond_reset",
          "eqx_error_if_buffer", "gymnax_switch_in_scan_log",
          "flashbax_item_sample_then_add", "flax_reshape_cache_return",
          "flax_cast_params_bf16")

PROGRAMS = {p.name: p for m in MODULES
            for p in importlib.import_module(f"benchmarks.probes.{m}").PROGRAMS}


def test_the_sample_exists():
  assert set(SAMPLE) <= set(PROGRAMS)


@pytest.mark.parametrize("name", SAMPLE)
def test_probe_program(name):
  problems, summary = problems_of(PROGRAMS[name])
  assert not problems, (summary, problems)
