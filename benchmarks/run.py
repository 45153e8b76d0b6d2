"""Command line: `python -m benchmarks` or `python benchmarks/run.py`.

Runs the groups (all, or those named by `--only`), prints one table per group with
the targets marked PASS/FAIL, and writes `results.json` and the #20440 plot to
`--out` (default `benchmarks/results/`). Exits 1 when a value check failed or a
variant raised, else 0: a missed speed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
  sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _harness as H  # noqa: E402
from benchmarks import _report as R  # noqa: E402
from benchmarks import (  # noqa: E402
    cases, compile_time, dispatch, loops, realworld, sweep, transform, traps)

# name: (module, title, how it runs, how it prints)
GROUPS = {
    "sweep": (sweep, "sweep: openxla/xla#20440 example (f32, x donated), median per call",
              "cases", R.print_case_table),
    "cases": (cases, "cases: realistic read-then-update steps", "cases",
              R.print_case_table),
    "loops": (loops, "loops: issue-4 loops and conditionals", "cases",
              R.print_case_table),
    "traps": (traps, "traps: the classic JAX copy traps", "cases",
              R.print_case_table),
    "dispatch": (dispatch, "", "custom", R.print_dispatch),
    "compile": (compile_time, "", "custom", R.print_compile),
    "transform": (transform, "", "custom", R.print_transform),
    "realworld": (realworld, "", "custom", R.print_realworld),
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv):
  p = argparse.ArgumentParser(
      prog="python -m benchmarks",
      description="inplace_jax benchmarks: jax.jit, jax.jit with region analysis, "
                  "inplace_jax.jit and the identity floor, side by side.")
  p.add_argument("--quick", action="store_true",
                 help="small sizes and few repeats: a smoke test (under a minute)")
  p.add_argument("--only", action="append", metavar="GROUP",
                 help=f"run only these groups (repeatable or comma-separated): "
                      f"{', '.join(GROUPS)}")
  p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                 help="directory for results.json and the plot "
                      "(default: benchmarks/results)")
  args = p.parse_args(argv)
  names = []
  for item in args.only or list(GROUPS):
    names += [n.strip() for n in item.split(",") if n.strip()]
  unknown = [n for n in names if n not in GROUPS]
  if unknown:
    p.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
  args.groups = [n for n in GROUPS if n in names]
  return args


def header(machine: dict, quick: bool) -> str:
  return (f"inplace_jax benchmarks ({'quick' if quick else 'full'}), "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
          f"machine: {machine['cpu']}, {machine['cores']} cores; jax {machine['jax']}, "
          f"jaxlib {machine['jaxlib']}, backend {machine['backend']}; inplace_jax "
          f"{machine['inplace_jax']}\n"
          "times: median per warm call (variants interleaved); copies j/r/i: buffer "
          "copies in the compiled HLO\nof jax.jit / +region analysis / inplace_jax.jit; "
          "temp: memory_analysis().temp_size_in_bytes")


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  settings = H.quick_settings() if args.quick else H.Settings()
  machine = H.machine_info()
  print(header(machine, args.quick), flush=True)
  t_start = time.perf_counter()
  results = {"machine": machine, "settings": vars(settings), "groups": {},
             "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
             "targets": [], "failed_values": [], "region_differs": [], "errors": []}
  for name in args.groups:
    module, title, kind, printer = GROUPS[name]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      if kind == "cases":
        rows = [H.run_case(c, settings) for c in module.cases(args.quick)]
      else:
        rows = module.run(settings)
    for row in rows:
      row["targets"] = module.targets(row)
      results["targets"] += row["targets"]
      if "values_ok" in row and not row["values_ok"]:
        results["failed_values"].append(f"{name}/{row['case']}")
      if row.get("region_values_ok") is False:
        results["region_differs"].append(f"{name}/{row['case']}")
      for v, err in row.get("errors", {}).items():
        results["errors"].append(f"{name}/{row['case']}/{v}: {err}")
    summary = getattr(module, "summary_targets", lambda rows: [])(rows)
    results["targets"] += summary
    results["groups"][name] = {"rows": rows, "wall_s": time.perf_counter() - t0,
                               "targets": summary}
    if kind == "cases":
      printer(title, rows, module.targets)
    else:
      printer(rows, module.targets)
    print(f"({name}: {time.perf_counter() - t0:.1f}s)", flush=True)
  results["wall_s"] = time.perf_counter() - t_start
  R.print_summary(results)
  if results["region_differs"]:
    print("note: jax.jit+region gave other values than jax.jit in: "
          + ", ".join(results["region_differs"]))
  for e in results["errors"]:
    print(f"error: {e}")
  if "sweep" in results["groups"]:
    print(R.plot_sweep(results["groups"]["sweep"]["rows"], args.out))
  print(f"json: {R.write_json(results, args.out)}")
  print(f"total: {results['wall_s']:.1f}s")
  return 1 if results["failed_values"] or results["errors"] else 0


if __name__ == "__main__":
  sys.exit(main())
