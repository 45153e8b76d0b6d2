"""Printing the tables, writing the JSON and drawing the #20440 plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inplace_jax._report import human_time

from ._harness import FLOOR, INPLACE, JAX, REGION_JIT, VARIANTS, copy_count

WIDTH = 118


def fmt_bytes(n: int | None) -> str:
  if n is None:
    return "?"
  for unit, size in (("G", 2 ** 30), ("M", 2 ** 20), ("K", 2 ** 10)):
    if n >= size:
      return f"{n / size:.3g}{unit}"
  return str(n)


def fmt_ratio(r: float | None) -> str:
  if r is None:
    return "-"
  if r >= 100:
    return f"{r:,.0f}x"
  return f"{r:.3g}x"


def mark(t: dict) -> str:
  return {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]


def fmt_target(t: dict, short: str | None = None) -> str:
  v = t["value"]
  val = "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.3f}")
  return f"{short or t['name']} {val} {t['op']} {t['bound']:g} {mark(t)}"


def _values(row) -> str:
  return "ok" if row.get("values_ok") else "FAILED"


def _copies(row) -> str:
  def c(v):
    n = copy_count(row, v)
    if n is None:
      return "?" if "error" not in row["variants"].get(v, {"error": 1}) else "E"
    return str(n)
  return "/".join(c(v) for v in (JAX, REGION_JIT, INPLACE))


def _temps(row) -> str:
  return "/".join(fmt_bytes(row["variants"].get(v, {}).get("temp_bytes"))
                  for v in (JAX, REGION_JIT, INPLACE))


CASE_HEADER = (f"{'case':<27} {'jax.jit':>8} {'+region':>8} {'inplace':>8} {'floor':>8}"
               f" {'copies':>7} {'temp j/r/i':>16} {'jax/inp':>8} {'values':>6}  targets")


def case_line(row, targets: list[dict]) -> str:
  v = row["variants"]
  t = lambda k: human_time(v.get(k, {}).get("median_s"), "-")
  marks = "; ".join(fmt_target(x, _short(x)) for x in targets)
  return (f"{row['case'][:27]:<27} {t(JAX):>8} {t(REGION_JIT):>8} {t(INPLACE):>8} "
          f"{t(FLOOR):>8} {_copies(row):>7} {_temps(row):>16} "
          f"{fmt_ratio(row['ratios']['jax/inplace']):>8} {_values(row):>6}  {marks}")


def _short(t: dict) -> str:
  name = t["name"]
  for long, short in (("no-copy slowdown inplace/jax", "inp/jax"),
                      ("inplace/floor at 1e8", "inp/floor"),
                      ("jax.jit/inplace at 1e8", "jax/inp")):
    if name == long:
      return short
  return name


def print_case_table(title: str, rows: list[dict], targets_of) -> None:
  print(f"\n== {title}")
  print(CASE_HEADER)
  for row in rows:
    print(case_line(row, targets_of(row)))


def print_dispatch(rows: list[dict], targets_of) -> None:
  print("\n== dispatch: warm call of a tiny donated function, median us per call")
  for row in rows:
    v = row["variants"]
    for m in ("pipelined", "blocking"):
      cells = "  ".join(f"{k} {v[k][m]['median_us']:.2f}" for k in v)
      print(f"{m:<10} {cells}  inplace/jax {row[f'ratio_{m}']:.3f} "
            f"(paired rounds {row[f'paired_ratio_{m}']:.3f})")
    print("targets: " + "; ".join(fmt_target(t) for t in targets_of(row))
          + f"; values {_values(row)}")


def print_compile(rows: list[dict], targets_of) -> None:
  print("\n== compile: cold trace+transform+lower+compile, median over repeats")
  print(f"{'function':<27} {'jax.jit':>8} {'inplace':>8} {'ratio':>6}   "
        f"{'1st call jax':>12} {'inplace':>8} {'ratio':>6} {'values':>6}  target")
  for row in rows:
    v = row["variants"]
    t = targets_of(row)[0]
    print(f"{row['case'][:27]:<27} {human_time(v[JAX]['lower_compile_s']):>8} "
          f"{human_time(v[INPLACE]['lower_compile_s']):>8} "
          f"{row['ratio_lower_compile']:>5.2f}x   "
          f"{human_time(v[JAX]['first_call_s']):>12} "
          f"{human_time(v[INPLACE]['first_call_s']):>8} {row['ratio_first_call']:>5.2f}x "
          f"{_values(row):>6}  <= {t['bound']:g} {mark(t)}")


def print_realworld(rows: list[dict], targets_of) -> None:
  print("\n== realworld: Flax, Optax, Equinox, Diffrax, Flashbax and Gymnax programs")
  print(f"{'program':<32} {'1st call jax':>12} {'inplace':>8} {'ratio':>6}  "
        f"{'warm jax':>9} {'inplace':>8} {'jax/inp':>7}  {'buffer copies j/i':>17} "
        f"{'bytes j/i':>13}  {'runs':<9} values")
  for row in rows:
    v = row["variants"]
    j, i = v[JAX], v[INPLACE]
    print(f"{row['case'][:32]:<32} {human_time(j['first_call_s']):>12} "
          f"{human_time(i['first_call_s']):>8} {row['ratio_first_call']:>5.2f}x  "
          f"{human_time(j['median_s']):>9} {human_time(i['median_s']):>8} "
          f"{j['median_s'] / i['median_s']:>6.2f}x  "
          f"{j['buffer_copies']:>8}/{i['buffer_copies']:<8} "
          f"{fmt_bytes(j['buffer_bytes']):>6}/{fmt_bytes(i['buffer_bytes']):<6}  "
          f"{i['program'] or '-':<9} {_values(row)}")
  if rows:
    print(f"first call inplace/jax, geometric mean: {rows[0]['geomean_first_call']:.3f} "
          f"(target <= 1.3)")


def print_transform(rows: list[dict], targets_of) -> None:
  print("\n== transform: sequence_jaxpr alone on generated programs (3 donated buffers)")
  print(f"{'eqns (top/all)':<16} {'median':>8} {'us/eqn':>7} {'vs first':>8} "
        f"{'barriers':>8} {'moved':>5} {'splits':>6} {'values':>6}  target")
  for row in rows:
    p, plan = row["params"], row["plan"]
    marks = "; ".join(f"<= {t['bound']:g}s {mark(t)}" for t in targets_of(row))
    vals = _values(row) if "values_ok" in row else "-"
    print(f"{p['top_eqns']:>6}/{p['eqns_with_subjaxprs']:<9} "
          f"{human_time(row['median_s']):>8} {row['us_per_eqn']:>7.1f} "
          f"{row['scaling']:>7.2f}x {plan.get('barriers', 0):>8} "
          f"{plan.get('moved', 0):>5} {plan.get('splits', 0):>6} {vals:>6}  {marks}")


def print_summary(results: dict) -> None:
  targets = results["targets"]
  passed = sum(t["pass"] is True for t in targets)
  failed = [t for t in targets if t["pass"] is False]
  bad_values = results["failed_values"]
  values = "all exact" if not bad_values else "FAILED " + ", ".join(bad_values)
  fails = "; FAIL: " + "; ".join(fmt_target(t) for t in failed) if failed else ""
  print(f"\nsummary: {passed}/{len(targets)} targets met{fails}; values: {values}")


def write_json(results: dict, out_dir: Path) -> Path:
  out_dir.mkdir(parents=True, exist_ok=True)
  path = out_dir / "results.json"
  with open(path, "w") as f:
    json.dump(results, f, indent=1, default=_json_default)
  return path


def _json_default(x: Any):
  if hasattr(x, "item"):
    return x.item()
  return str(x)


def plot_sweep(rows: list[dict], out_dir: Path) -> str:
  """Time per call vs buffer size, log-log, one line per variant."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return "plot skipped: matplotlib is not installed (pip install '.[plot]')"
  if not rows:
    return "plot skipped: the sweep group did not run"
  out_dir.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  xs = [r["params"]["elements"] for r in rows]
  for v, style in zip(VARIANTS, ("o-", "s-", "^-", "x--"), strict=True):
    ys = [r["variants"].get(v, {}).get("median_s") for r in rows]
    pts = [(x, y * 1e6) for x, y in zip(xs, ys, strict=True) if y]
    if pts:
      ax.plot(*zip(*pts), style, label=v)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("buffer size (f32 elements)")
  ax.set_ylabel("time per call (us, median)")
  ax.set_title("openxla/xla#20440: y = x[0,0]; x = x.at[0,0].add(1), x donated")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = out_dir / "sweep_20440.png"
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return f"plot: {path}"
