"""Real-library programs (Flax, Optax, Equinox, Diffrax, Flashbax, Gymnax), written as
those libraries' docs write them (`inplace_jax.testing.realworld`), under `jax.jit`
and `inplace_jax.jit` over a chain of steps:

* every output of every step bit-equal to jax.jit's;
* never more bytes copied than jax.jit's program (copies of 1 KiB and more);
* an `InplaceCopyWarning` exactly when the program that runs copies a buffer the
  user asked to update in place (a donated argument or a loop or branch carry of
  one) of a size that matters (`significant_bytes`), and every such copy explained.
"""

from __future__ import annotations

import pytest

import inplace_jax
from inplace_jax._harness import compare, untrue_statements
from inplace_jax._jit import significant_bytes
from inplace_jax.testing import realworld

PROGRAMS = realworld.programs()


def test_every_library_is_installed():
  """The suite runs on all six libraries (the `test` extra installs them)."""
  assert not realworld.import_errors, realworld.import_errors
  assert {p.library for p in PROGRAMS} == set(realworld.LIBRARIES)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_realworld_program(program):
  p = program
  c = compare(p.fn, p.make_args, donate_argnums=p.donate_argnums,
              static_argnums=p.static_argnums, steps=p.steps, next_args=p.next_args)
  assert c.equal, f"{p.name}: {c.difference}"
  ours, theirs = c.candidate.report, c.reference.report
  assert ours.verified and theirs.verified
  ref_bytes, our_bytes = c.copy_bytes(1024)
  assert our_bytes <= ref_bytes, (theirs, ours)
  threshold = significant_bytes(ours, 1024)
  warned = [w for w in c.inplace_warnings
            if issubclass(w.category, inplace_jax.InplaceCopyWarning)]
  copies = ours.buffer_copies(threshold)
  assert bool(warned) == bool(copies), (warned, ours)
  assert all(k.cause for k in copies), ours
  for report in (ours, theirs):
    assert not untrue_statements(report), untrue_statements(report)
  # Nothing said twice in one cause (conflicts that differ only in a read's line).
  for k in ours.buffer_copies():
    sentences = [x for x in (k.cause or "").split("; ") if " " in x]
    assert len(sentences) == len(set(sentences)), k.cause
  # The signature's report describes the program that ran.
  sig = c.fn.signatures[-1]
  assert sig.report is ours and sig.chosen.report.copies == ours.copies or \
      [k.name for k in sig.chosen.report.copies] == [k.name for k in ours.copies]


@pytest.mark.parametrize("name", ["eqx_mlp_sgd", "eqx_batchnorm_state"])
def test_a_vmapped_linear_step_runs_copy_free_with_jax_jits_dots(name):
  # The gradient of a vmapped Linear transposes dot results and feeds transposes
  # to dots; XLA folds those transposes into the dots, and a barrier between them
  # made a dot run in another operand order (values changed). No tie goes there:
  # the weight's backward product is tied (eqx_batchnorm_state, the bold round)
  # or the ReLU's mask over it (eqx_mlp_sgd, a clone round), and its forward
  # product, which those are computed from, runs before the tie by data. The
  # program that runs copies no significant buffer and computes every dot,
  # reduction and multiply-add as jax.jit's (equal fingerprints and kernels), its
  # values bit-equal over the chain.
  p = next(q for q in PROGRAMS if q.name == name)
  c = compare(p.fn, p.make_args, donate_argnums=p.donate_argnums,
              static_argnums=p.static_argnums, steps=p.steps, next_args=p.next_args)
  assert c.equal, c.difference
  sig = c.fn.signatures[-1]
  assert sig.program == "sequenced" and sig.chosen.changed == (), sig.reason
  assert c.reference.report.buffer_copies(1024), c.reference.report
  assert sig.report.buffer_copies(significant_bytes(sig.report, 1024)) == (), sig.report


def test_prioritised_sample_then_add_is_copy_free():
  # The sum tree's total is read (sampling) before `set_priorities` and `add`
  # update the tree: the tie after that read leaves `1 / total` a kernel of its
  # own, to which XLA passes the constant 1 that jax.jit's fused kernel holds. The
  # kernels' IR reads that constant as the literal (a dividend computes the same
  # bits either way), so the sequenced program runs: no buffer copy, exact over
  # the chain (`test_realworld_program`).
  p = next(q for q in PROGRAMS if q.name == "flashbax_prioritised_sample_add")
  c = compare(p.fn, p.make_args, donate_argnums=p.donate_argnums,
              static_argnums=p.static_argnums, steps=p.steps, next_args=p.next_args)
  assert c.equal, c.difference
  sig = c.fn.signatures[-1]
  assert sig.program == "sequenced", sig.reason
  assert not c.candidate.report.buffer_copies(1024), c.candidate.report
  assert c.reference.report.buffer_copies(1024)


def _one_step_signature(name: str):
  """The signature program `name` ran for one step, its values checked against
  jax.jit's."""
  p = next(q for q in PROGRAMS if q.name == name)
  c = compare(p.fn, p.make_args, donate_argnums=p.donate_argnums,
              static_argnums=p.static_argnums, steps=1, next_args=p.next_args)
  assert c.equal
  return c.fn.signatures[-1]


def test_a_loop_carrying_a_copy_costs_no_compile():
  # Diffrax's solve carries a copy of y0 in its loop; the cause names that loop as
  # the update. A loop is no update to materialise: no round compiles a
  # candidate for it, and jax.jit's program is the only one compiled.
  sig = _one_step_signature("diffrax_vmap_saveat")
  assert [k.program for k in sig.candidates] == ["jax.jit"], sig.reason
  copies = sig.report.buffer_copies(1024)
  assert copies and all(k.writer is not None and k.writer.op == "while"
                        for k in copies), sig.report


def test_no_candidate_without_a_barrier_is_compiled():
  # optax.MultiSteps: a refinement round that withdrew every tie left jax.jit's
  # program, only restructured as XLA restructures it (calls inlined), and compiled
  # it again with the same copies and arithmetic. Every candidate compiled now
  # holds a barrier (or lowers a conditional).
  from inplace_jax import _compat as C
  from inplace_jax._rewrite import holds
  sig = _one_step_signature("optax_multisteps")
  assert len(sig.candidates) > 1, sig.reason
  assert all(holds(k.jaxpr.jaxpr, C.optimization_barrier_p)
             for k in sig.candidates[1:]), [k.program for k in sig.candidates]
