"""Differential fuzzing of `inplace_jax.jit` against `jax.jit` on random programs.

* `program`: the program tree (`Program`, `Stmt`, `Block`, `Buf`), its source
  (`source`, `describe`) and the function it defines (`build`);
* `generate`: the generator (`generate(seed, index)`, the hypothesis strategy
  `programs()`, `Config`; orderable mode);
* `oracle`: the check (`check_program`, `check_function`, `Outcome`), built on
  `inplace_jax._harness.compare`, and the certificate that an exact in-place program
  of a residual one exists (`certify`, on `program.reference_source`);
* `shrink`: minimising a failing program;
* `pool`: worker processes (`Worker`, `run_isolated`): XLA may abort a process;
* `figures`: status counts and copy-free rates over a run;
* `python -m inplace_jax.testing.fuzz --count N --seed S`: the long run.
"""

from .figures import figures, format_figures
from .generate import Config, generate, programs
from .oracle import (HARD_FAILURES, ORACLE_MIN_BYTES, REPORTED, STATUSES, Outcome,
                     certify, check_function, check_program, classify_difference,
                     failure_kind, kind_of, make_inputs, pairs_buffers)
from .pool import Worker, run_isolated
from .program import (CONSTRUCTS, HEADER, Block, Buf, Program, Stmt, blocks, build,
                      describe, function_from_source, reference_source, source)
from .shrink import shrink

__all__ = [
    "CONSTRUCTS", "HARD_FAILURES", "HEADER", "ORACLE_MIN_BYTES", "REPORTED", "STATUSES",
    "Block", "Buf", "Config", "Outcome", "Program", "Stmt", "Worker", "blocks", "build",
    "certify", "check_function", "check_program", "classify_difference", "describe",
    "failure_kind", "figures", "format_figures", "function_from_source", "generate",
    "kind_of", "make_inputs", "pairs_buffers", "programs", "reference_source",
    "run_isolated", "shrink", "source",
]
