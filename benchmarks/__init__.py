"""Benchmarks of inplace_jax against jax.jit (GitHub issue 7, and parts of issues 3, 4).

Every case runs under four variants, side by side: `jax.jit`, `jax.jit` with XLA's
region-analysis copy insertion (the openxla/xla#20440 workaround), `inplace_jax.jit`,
and the floor (a donated identity function of the same signature). Every case checks
values (`inplace_jax.jit` must equal `jax.jit` exactly) and counts copies from real
compiles. Run `python -m benchmarks` (or `--quick`, `--only GROUP`, `--out DIR`).

Modules: `_harness` (variants, timing, value and copy checks), `_report` (tables,
JSON, plot), one module per group: `sweep`, `cases`, `loops`, `dispatch`,
`compile_time`, `transform`; `run` is the command line.
"""
