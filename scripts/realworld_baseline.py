#!/usr/bin/env python
"""Baseline of inplace_jax against plain jax.jit on the real-world reference programs.

For every program of `inplace_jax.testing.realworld`:

1. the copies left by plain `jax.jit(fn, donate_argnums, static_argnums)`, from
   `inplace_jax.check` (count and bytes of copies >= 1 KiB, each with its size, type,
   role, parameter, whether it changes layout and whether it sits in a fusion);
2. the chain of `steps` steps under `jax.jit` and under `inplace_jax.jit(...,
   on_copy="warn")` on separately made arguments: every output leaf of every step
   compared bit for bit (NaN == NaN, sign of zeros compared), warnings caught, and
   the copies of `inplace_jax.jit`'s last report;
3. the first call (trace + compile + run) of each, timed, and the ratio.

Usage: python scripts/realworld_baseline.py [--only NAME[,NAME...]] [--library LIB]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
import warnings

import jax
import numpy as np

import inplace_jax
from inplace_jax._harness import host
from inplace_jax.testing import realworld

MIN_BYTES = 1024


# --------------------------------------------------------------------------- helpers


to_numpy = host


def leaves_equal(a, b) -> tuple[bool, float | None, str]:
  """Bit-for-bit comparison of two host leaves: (equal, max |a-b|, why)."""
  if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
    return (a == b), None, "" if a == b else f"non-array {a!r} != {b!r}"
  if a.shape != b.shape or a.dtype != b.dtype:
    return False, None, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
  inexact = np.issubdtype(a.dtype, np.inexact)
  if not np.array_equal(a, b, equal_nan=inexact):
    diff = None
    if a.dtype != np.bool_:
      with np.errstate(all="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
      diff = float(np.nanmax(d)) if d.size else 0.0
    return False, diff, "values differ"
  if inexact:
    zeros = a == 0
    if np.any(np.signbit(a[zeros]) != np.signbit(b[zeros])):
      return False, 0.0, "sign of zero differs"
  return True, None, ""


def compare_outputs(ref, got) -> tuple[bool, list[str]]:
  ref_l, ref_def = jax.tree_util.tree_flatten_with_path(ref)
  got_l, got_def = jax.tree_util.tree_flatten_with_path(got)
  if ref_def != got_def:
    return False, [f"tree structure differs: {ref_def} vs {got_def}"]
  notes = []
  for (path, a), (_, b) in zip(ref_l, got_l, strict=True):
    ok, diff, why = leaves_equal(a, b)
    if not ok:
      notes.append(f"{jax.tree_util.keystr(path)}: {why}"
                   + (f", max abs diff {diff:.3g}" if diff is not None else ""))
  return not notes, notes


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*(\S+)\s")
_LAYOUT = re.compile(r"\](\{[^}]*\})")


def shapes_by_name(hlo_text: str) -> dict[str, str]:
  """Instruction name -> its printed shape (`f32[8,4]{1,0}`), from compiled HLO."""
  out = {}
  for line in hlo_text.splitlines():
    m = _DEF.match(line)
    if m:
      out[m.group(1)] = m.group(2)
  return out


def layout_of(shape: str | None) -> str | None:
  if not shape:
    return None
  m = _LAYOUT.search(shape)
  return m.group(1) if m else None


def copy_layouts(c, shapes: dict[str, str]) -> tuple[str | None, str | None]:
  """(result layout, operand layout) of a copy, from its HLO line (and the operand's
  definition when the line does not print the operand's shape)."""
  m = re.search(r"=\s*(.+?)\s+copy(?:-start)?\((.*)\)", c.hlo)
  result = layout_of(m.group(1)) if m else None
  operand = None
  if m:
    inner = m.group(2).strip()
    typed = re.match(r"(\S+\[[^\]]*\](?:\{[^}]*\})?)\s+%", inner)
    if typed:
      operand = layout_of(typed.group(1))
  if operand is None:
    operand = layout_of(shapes.get(c.operand))
  return result, operand


def _first_line(e: BaseException) -> str:
  return (str(e).splitlines() or [""])[0][:300]


def human(n: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if n < 1024 or unit == "GiB":
      return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return str(n)


def donated_bytes(prog, args) -> int:
  return sum(x.nbytes for i in prog.donate_argnums
             for x in jax.tree.leaves(args[i]) if isinstance(x, jax.Array))


def run_chain(call, prog, args):
  """Runs `steps` steps; returns (host outputs per step, first-call seconds)."""
  outs, first = [], None
  for step in range(prog.steps):
    t0 = time.perf_counter()
    out = call(*args)
    jax.block_until_ready(out)
    if step == 0:
      first = time.perf_counter() - t0
    outs.append(to_numpy(out))    # before the next step donates these buffers
    if step + 1 < prog.steps:
      args = prog.next_args(args, out)
  return outs, first


# --------------------------------------------------------------------------- one program


def jax_copies(row, jitted, args) -> None:
  """Section 1: the copies >= MIN_BYTES plain jax.jit leaves, into `row`."""
  report = inplace_jax.check(jitted, *args)
  text = jitted.lower(*args).compile().as_text()
  shapes = shapes_by_name(text)
  big = report.copies_over(MIN_BYTES)
  row["copies"] = len(big)
  row["bytes"] = sum(c.nbytes for c in big)
  row["verified"] = report.verified
  row["layout"] = 0
  row["fusion"] = 0
  roles: dict[str, int] = {}
  print(f"  jax.jit: {len(big)} copies >= {MIN_BYTES} B, {human(row['bytes'])} "
        f"(all copies: {len(report.copies)}, verified={report.verified})")
  for c in big:
    res, opnd = copy_layouts(c, shapes)
    if res is None or opnd is None:
      lay = "layout ?"
    elif res != opnd:
      lay = f"LAYOUT {opnd}->{res}"
      row["layout"] += 1
    else:
      lay = f"same layout {res}"
    in_fusion = c.role == "fusion"
    row["fusion"] += in_fusion
    roles[c.role] = roles.get(c.role, 0) + 1
    param = c.parameter if c.source == "parameter" else f"(instruction {c.operand})"
    print(f"    {c.nbytes:>9,} B  {c.type_str:<22} role={c.role_str:<18} "
          f"param={param}  {lay}  fusion={'yes' if in_fusion else 'no'}")
    loc = f"{c.location}" if c.location else "?"
    print(f"               at {loc} [{c.op_name}]")
    print(f"               {c.hlo.strip()[:160]}")
  row["roles"] = ",".join(f"{k}:{v}" for k, v in sorted(roles.items())) or "-"
  wasted = [d for d in report.donations if d.wasted and d.nbytes >= MIN_BYTES]
  if wasted:
    print("  wasted donations: " + ", ".join(f"{d.argument} ({human(d.nbytes)})"
                                            for d in wasted))


def baseline(prog) -> dict:
  row = {"name": prog.name, "library": prog.library}
  print("=" * 100)
  print(f"{prog.name} [{prog.library}]: {prog.description}")
  print(f"  donate_argnums={prog.donate_argnums} static_argnums={prog.static_argnums} "
        f"steps={prog.steps}")

  def jitted_fn():
    return jax.jit(prog.fn, donate_argnums=prog.donate_argnums,
                   static_argnums=prog.static_argnums)

  # Warm the libraries' Python-side caches without compiling, then start both timed
  # first calls from empty JAX caches.
  warm_args = prog.make_args()
  row["donated"] = donated_bytes(prog, warm_args)
  print(f"  donated bytes: {human(row['donated'])}")
  jitted_fn().trace(*warm_args)
  del warm_args
  # All argument sets are made before the caches are cleared (jax.clear_caches also
  # drops the eager op caches make_args would otherwise recompile).
  ref_args, ij_args, check_args = (prog.make_args() for _ in range(3))

  # -- 2/3a: plain jax.jit chain
  jax.clear_caches()
  try:
    ref_outs, row["t_jax"] = run_chain(jitted_fn(), prog, ref_args)
  except Exception as e:  # noqa: BLE001
    row["jax_error"] = f"{type(e).__name__}: {e}"
    print(f"  jax.jit FAILED: {row['jax_error'][:500]}")
    traceback.print_exc()
    return row

  # -- 2/3b: inplace_jax.jit chain
  jax.clear_caches()
  ij = inplace_jax.jit(prog.fn, donate_argnums=prog.donate_argnums,
                       static_argnums=prog.static_argnums or None, on_copy="warn")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      ij_outs, row["t_ij"] = run_chain(ij, prog, ij_args)
    except Exception as e:  # noqa: BLE001
      row["ij_error"] = f"{type(e).__name__}: {_first_line(e)}"
      print(f"  inplace_jax.jit FAILED: {type(e).__name__}: {str(e)[:1500]}")
      traceback.print_exc(limit=6)
      ij_outs = None
  row["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]

  # -- 1: copies under plain jax.jit (compiled again, from the cache where possible)
  try:
    jax_copies(row, jitted_fn(), check_args)
  except Exception as e:  # noqa: BLE001 - an inplace_jax.check crash is a finding
    row["check_error"] = f"{type(e).__name__}: {_first_line(e)}"
    print(f"  inplace_jax.check FAILED: {type(e).__name__}: {str(e)[:1500]}")
    traceback.print_exc(limit=6)

  # -- comparison
  if ij_outs is not None:
    equal, notes = True, []
    for step, (r, g) in enumerate(zip(ref_outs, ij_outs, strict=True)):
      ok, why = compare_outputs(r, g)
      if not ok:
        equal = False
        notes += [f"step {step + 1}: {n}" for n in why]
    row["equal"] = equal
    print(f"  values inplace_jax.jit vs jax.jit over {prog.steps} steps: "
          f"{'EQUAL (bit for bit)' if equal else 'DIFFERENT'}")
    for n in notes[:10]:
      print(f"    {n}")
    if len(notes) > 10:
      print(f"    ... {len(notes) - 10} more")
  print(f"  warnings under inplace_jax.jit: {len(row['warnings'])}")
  for cat, msg in row["warnings"]:
    print(f"    {cat}: {msg[:200]!r}")
  try:
    last = ij.last_report
  except Exception as e:  # noqa: BLE001
    last = None
    print(f"  inplace_jax.jit last_report FAILED: {type(e).__name__}: {e}")
  if last is not None:
    lb = last.copies_over(MIN_BYTES)
    row["ij_copies"] = len(lb)
    row["ij_bytes"] = sum(c.nbytes for c in lb)
    print(f"  inplace_jax.jit last_report: {len(lb)} copies >= {MIN_BYTES} B, "
          f"{human(row['ij_bytes'])} (all: {len(last.copies)}, verified="
          f"{last.verified}, reports: {len(ij.reports)})")
    for c in lb:
      param = c.parameter if c.source == "parameter" else f"(instruction {c.operand})"
      print(f"    {c.nbytes:>9,} B  {c.type_str:<22} role={c.role_str:<18} "
            f"param={param}")
  # What inplace_jax.jit chose to run (attributes differ between versions).
  sigs = getattr(ij, "signatures", None)
  if sigs:
    row["ij_program"] = "/".join(str(getattr(sg, "program", "?")) for sg in sigs)
    for sg in sigs:
      print(f"  inplace_jax.jit signature runs {getattr(sg, 'program', '?')}: "
            f"{str(getattr(sg, 'reason', ''))[:200]}")
  fell_back = getattr(ij, "fell_back", None)
  if fell_back:
    row["ij_program"] = "jax.jit (fell back)"
    print(f"  fell back: {fell_back}")
  if "t_ij" in row:
    print(f"  first call: jax.jit {row['t_jax']:.2f} s, inplace_jax.jit "
          f"{row['t_ij']:.2f} s, ratio {row['t_ij'] / row['t_jax']:.2f}")
  return row


# --------------------------------------------------------------------------- table


def summary(rows) -> None:
  head = ["program", "donated", "jax copies", "jax bytes", "layout", "fusion", "roles",
          "equal", "IJ warnings", "IJ copies", "IJ bytes", "IJ runs", "t_jax s",
          "t_IJ s", "ratio"]
  table = [head]
  errors = []
  for r in rows:
    warn_cats: dict[str, int] = {}
    for cat, _ in r.get("warnings", []):
      warn_cats[cat] = warn_cats.get(cat, 0) + 1
    ws = ",".join(f"{k.replace('Inplace', '').replace('Warning', '')}x{v}"
                  for k, v in sorted(warn_cats.items())) or "-"
    eq = r.get("equal")
    t_jax, t_ij = r.get("t_jax"), r.get("t_ij")
    table.append([
        r["name"], human(r.get("donated", 0)),
        str(r.get("copies", "ERR")), human(r["bytes"]) if "bytes" in r else "ERR",
        str(r.get("layout", "-")), str(r.get("fusion", "-")), r.get("roles", "-"),
        "ERR" if "ij_error" in r or "jax_error" in r else ("yes" if eq else "NO"),
        ws, str(r.get("ij_copies", "-")),
        human(r["ij_bytes"]) if "ij_bytes" in r else "-", r.get("ij_program", "-"),
        f"{t_jax:.2f}" if t_jax is not None else "-",
        f"{t_ij:.2f}" if t_ij is not None else "-",
        f"{t_ij / t_jax:.2f}" if t_ij is not None and t_jax else "-",
    ])
    if "ij_error" in r:
      errors.append(f"{r['name']}: inplace_jax.jit raised {r['ij_error']}")
    if "check_error" in r:
      errors.append(f"{r['name']}: inplace_jax.check raised {r['check_error']}")
    if "jax_error" in r:
      errors.append(f"{r['name']}: jax.jit raised {r['jax_error'][:300]}")
  widths = [max(len(row[i]) for row in table) for i in range(len(head))]
  print("=" * 100)
  print("SUMMARY (copies >= 1 KiB; layout = copies changing layout; fusion = copies "
        "inside a fusion computation; IJ = inplace_jax.jit on_copy='warn')")
  for row in table:
    print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
  for e in errors:
    print(f"  ! {e}")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", action="append", default=[],
                  help="program name(s), comma separated; repeatable")
  ap.add_argument("--library", action="append", default=[],
                  help="only these libraries; repeatable")
  opts = ap.parse_args(argv)
  progs = realworld.programs(opts.library or None)
  for lib, err in realworld.import_errors.items():
    print(f"skipped library {lib}: {err}")
  names = {n for o in opts.only for n in o.split(",") if n}
  if names:
    unknown = names - {p.name for p in progs}
    if unknown:
      print(f"unknown program(s): {sorted(unknown)}")
      return 2
    progs = [p for p in progs if p.name in names]
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"inplace_jax {inplace_jax.__version__}, {len(progs)} programs")
  t0 = time.perf_counter()
  rows = []
  for prog in progs:
    try:
      rows.append(baseline(prog))
    except Exception as e:  # noqa: BLE001 - a crash is a finding: keep going
      traceback.print_exc()
      rows.append({"name": prog.name, "library": prog.library,
                   "ij_error": f"(harness) {type(e).__name__}: {str(e)[:200]}"})
  summary(rows)
  print(f"total {time.perf_counter() - t0:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
