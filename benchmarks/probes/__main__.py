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

from benchmarks.probes import MODULES, problems_of


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
