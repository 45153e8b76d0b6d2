"""`python -m benchmarks.probes [--module M] [NAME ...]`: the probe programs under
jax.jit and inplace_jax.jit, checked (see `benchmarks/probes/__init__.py`).

Prints one line per program (`ok` or `FAIL` with what failed) and a summary; exits
1 when any program fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback

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


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m benchmarks.probes")
  ap.add_argument("--module", choices=MODULES, action="append")
  ap.add_argument("names", nargs="*")
  a = ap.parse_args(argv)
  failed = ran = 0
  for m in a.module or MODULES:
    module = importlib.import_module(f"benchmarks.probes.{m}")
    for p in module.PROGRAMS:
      if a.names and p.name not in a.names:
        continue
      ran += 1
      start = time.perf_counter()
      try:
        problems, summary = problems_of(p)
      except Exception as e:  # noqa: BLE001 - a crash is a finding
        problems, summary = ["".join(traceback.format_exception(e))[-2000:]], "crashed"
      took = time.perf_counter() - start
      failed += bool(problems)
      print(f"{'FAIL' if problems else 'ok  '} {p.name} ({took:.1f} s): {summary}")
      for q in problems:
        print(f"    {q}")
      sys.stdout.flush()
  print(f"{ran} programs, {ran - failed} ok, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
