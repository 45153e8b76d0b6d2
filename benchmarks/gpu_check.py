"""GPU readiness: the test corpus and the benchmarks on a GPU, one results table.

Run it on a machine with a GPU and jax's CUDA plugin installed:

    python benchmarks/gpu_check.py [--quick] [--out DIR]

It checks that JAX sees a GPU (and stops, with exit status 2, when it does not),
runs the test suite on it (values against plain `jax.jit`, copies from real GPU
compiles; the assertions that plain `jax.jit` copies are CPU facts and are skipped
off CPU), then the benchmarks, and prints one table: per case the copies under
`jax.jit` and `inplace_jax.jit` (GPU emits `copy-start`/`copy-done` pairs, which the
inspector counts), the median times and whether values matched. Paste the table into
the README's GPU section. Exit status: 0 when every test passed and every value
matched, 1 otherwise.

As of this writing no GPU machine has been lent to this project, so this script has
only been run on CPU (where it stops at the device check); its GPU output is
unverified.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _gpu_devices() -> list[str]:
  import jax
  try:
    return [str(d) for d in jax.devices("gpu")]
  except RuntimeError:
    return []


def _run_tests(out: Path) -> tuple[int, int, int, str]:
  """(passed, failed, skipped, tail of the log) of the test suite on the GPU."""
  log = out / "pytest.log"
  env = dict(os.environ, JAX_PLATFORMS="cuda,cpu")
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests")]
  with log.open("w") as f:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                          check=False)
  text = log.read_text()
  counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
  for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text):
    counts[k] = int(n)
  failed = counts["failed"] + counts["error"] + (proc.returncode not in (0, 1))
  return counts["passed"], failed, counts["skipped"], "\n".join(
      text.splitlines()[-15:])


def _run_benchmarks(out: Path, quick: bool) -> dict:
  cmd = [sys.executable, "-m", "benchmarks", "--out", str(out)]
  if quick:
    cmd.append("--quick")
  subprocess.run(cmd, cwd=ROOT, check=False)
  path = out / "results.json"
  return json.loads(path.read_text()) if path.exists() else {}


def _table(results: dict) -> list[str]:
  def t(v):
    s = v.get("median_s") if v else None
    if s is None:
      return "-"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"

  lines = ["| group | case | copies jax.jit / inplace | jax.jit | inplace_jax.jit "
           "| floor | values |", "|---|---|---|---|---|---|---|"]
  for group, g in results.get("groups", {}).items():
    for row in g.get("rows", []) if isinstance(g, dict) else []:
      v = row.get("variants", {})
      if not v:
        continue
      cj = v.get("jax.jit", {}).get("copies")
      ci = v.get("inplace_jax.jit", {}).get("copies")
      lines.append(
          f"| {group} | {row.get('case')} | {cj} / {ci} | {t(v.get('jax.jit'))} | "
          f"{t(v.get('inplace_jax.jit'))} | {t(v.get('floor'))} | "
          f"{'ok' if row.get('values_ok') else 'FAILED'} |")
  return lines


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="small benchmark sizes")
  ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu"))
  args = ap.parse_args(argv)
  gpus = _gpu_devices()
  if not gpus:
    print("gpu_check: JAX sees no GPU on this machine; nothing to check.")
    return 2
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  import jax
  print(f"gpu_check: {', '.join(gpus)}; jax {jax.__version__}")
  passed, failed, skipped, tail = _run_tests(out)
  print(f"tests on GPU: {passed} passed, {failed} failed, {skipped} skipped "
        f"(log: {out / 'pytest.log'})")
  if failed:
    print(tail)
  results = _run_benchmarks(out, args.quick)
  for line in _table(results):
    print(line)
  bad_values = results.get("failed_values", [])
  print(f"values: {'all exact' if not bad_values else 'FAILED: ' + str(bad_values)}")
  return 0 if not failed and not bad_values and results else 1


if __name__ == "__main__":
  sys.exit(main())
