"""The long differential fuzz run: inplace_jax.jit against jax.jit on random programs.

    python -m inplace_jax.testing.fuzz --count 10000 --seed 7 --workers 2

Program `i` of seed `S` is `generate(S, i)`, so any program is reproduced from the
two numbers (`--legacy`: the generator's stream before the matmul and SGD ops and
orderable mode). Each is checked by `check_program` (oracle.py). Progress goes to
stdout; at the end: the count, the seed, every failure, residual and unexplained
copy (the first few of each kind shrunk to a minimal program, all with their
source), copy-byte statistics and the figures (status counts, copy-free rate of
orderable programs overall and per construct). `--json PATH` also writes every
result, the shrunk programs and the figures. The exit status is 1 when a program
failed ("value", "inexact", "copies", "unverified", "crash", "died", "timeout",
"invalid"); residual and unexplained copies are reported only.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time

from .figures import figures, format_figures
from .generate import Config, generate
from .oracle import HARD_FAILURES, Outcome, failure_kind, kind_of
from .pool import Worker, run_isolated
from .program import describe
from .shrink import shrink


def kind(r: dict) -> str:
  return failure_kind(r["status"], r["error"], r["detail"], r.get("certified"))


def _shrink_all(seed: int, config: Config, failures: list[dict], workers: int,
                timeout: float, max_checks: int) -> dict[int, dict]:
  """Shrinks each failure in worker processes (a check may abort its process)."""
  out: dict[int, dict] = {}
  todo = list(failures)
  lock = threading.Lock()

  def slot():
    w = Worker(timeout)
    try:
      while True:
        with lock:
          if not todo:
            return
          r = todo.pop(0)
        p = generate(seed, r["index"], config)
        t = time.time()
        first = w.check(p)
        if kind_of(first) != kind(r):    # flaky, or the library changed meanwhile
          with lock:
            out[r["index"]] = dict(status=first.status, kind=kind_of(first),
                                   source=describe(p), detail=first.detail,
                                   ops=p.count_ops(), reproduced=False)
            print(f"  {seed}:{r['index']} did not reproduce ({kind(r)} in the run, "
                  f"{kind_of(first)} now): not shrunk", flush=True)
          continue
        q, o = shrink(p, first, check=w.check, max_checks=max_checks)
        with lock:
          out[r["index"]] = dict(status=o.status, kind=kind_of(o), source=describe(q),
                                 detail=o.detail, ops=q.count_ops(), reproduced=True)
          print(f"  shrunk {seed}:{r['index']} ({kind_of(o)}) to {q.count_ops()} ops "
                f"in {time.time() - t:.0f}s", flush=True)
    finally:
      w.close()

  threads = [threading.Thread(target=slot) for _ in range(max(1, workers))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m inplace_jax.testing.fuzz",
                               description=__doc__.split("\n\n")[0])
  ap.add_argument("--count", type=int, default=10000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--start", type=int, default=0, help="first program index")
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--shrink", type=int, default=2,
                  help="failures (and residual/unexplained copies) of each kind to "
                  "shrink to a minimal program")
  ap.add_argument("--shrink-checks", type=int, default=200,
                  help="most checks one shrink may run")
  ap.add_argument("--show", type=int, default=30,
                  help="failures whose full source is printed")
  ap.add_argument("--timeout", type=float, default=600,
                  help="seconds one program may take")
  ap.add_argument("--orderable", type=float, default=None,
                  help="fraction of programs generated orderable (default: "
                  f"{Config().orderable})")
  ap.add_argument("--legacy", action="store_true",
                  help="the generator's stream before the matmul/SGD ops and orderable "
                  "mode")
  ap.add_argument("--json", default=None, help="write every result here")
  ap.add_argument("--every", type=int, default=100, help="progress interval")
  args = ap.parse_args(argv)

  config = Config.legacy() if args.legacy else Config()
  if args.orderable is not None:
    config = Config.from_dict(dict(config.to_dict(), orderable=args.orderable))
  cfg = None if config == Config() else config.to_dict()
  reqs = [dict(op="run", seed=args.seed, index=i, config=cfg)
          for i in range(args.start, args.start + args.count)]
  results: list[dict] = []
  counts: collections.Counter = collections.Counter()
  t0 = time.time()
  print(f"fuzz: {args.count} programs, seed {args.seed}, indices "
        f"{args.start}..{args.start + args.count - 1}, {args.workers} worker(s), "
        f"inplace_jax {_version()}" + (f", config {cfg}" if cfg else ""), flush=True)
  for r in run_isolated(reqs, args.workers, args.timeout):
    results.append(r)
    counts[r["status"]] += 1
    if r["status"] in HARD_FAILURES:
      print(f"  FAIL {args.seed}:{r['index']} {kind(r)}", flush=True)
    if len(results) % args.every == 0 or len(results) == len(reqs):
      el = time.time() - t0
      print(f"[{len(results)}/{len(reqs)}] {el:.0f}s ({len(results) / el:.2f}/s) "
            f"{dict(counts)}", flush=True)
  results.sort(key=lambda r: r["index"])
  failures = [r for r in results if r["status"] != "ok"]
  kinds: dict[str, list[dict]] = collections.defaultdict(list)
  for r in failures:
    kinds[kind(r)].append(r)
  pick = [r for rs in kinds.values() for r in rs[:args.shrink]
          if r["status"] != "timeout"]
  if pick:
    print(f"shrinking {len(pick)} program(s) ...", flush=True)
  shrunk = _shrink_all(args.seed, config, pick, args.workers, args.timeout,
                       args.shrink_checks)
  fig = figures(Outcome.from_dict(r) for r in results)
  _report(args, config, results, failures, kinds, shrunk, fig, time.time() - t0)
  if args.json:
    with open(args.json, "w") as fh:
      json.dump(dict(seed=args.seed, start=args.start, count=args.count, config=cfg,
                     inplace_jax=_version(),
                     results=results, shrunk=shrunk, figures=fig), fh)
  return 1 if any(r["status"] in HARD_FAILURES for r in results) else 0


def _report(args, config, results, failures, kinds, shrunk, fig, seconds) -> None:
  hard = [r for r in failures if r["status"] in HARD_FAILURES]
  print("\n" + "=" * 78)
  print(f"programs: {len(results)}  seed: {args.seed}  indices {args.start}.."
        f"{args.start + args.count - 1}  time: {seconds:.0f}s")
  print(f"failures: {len(hard)}; residual or unexplained copies: "
        f"{len(failures) - len(hard)}; {len(kinds)} kind(s)")
  for sig, rs in kinds.items():
    print(f"\n--- {sig}: {len(rs)} program(s): "
          f"{', '.join(str(r['index']) for r in rs[:40])}{' ...' if len(rs) > 40 else ''}")
    for r in rs:
      if r["index"] in shrunk:
        s = shrunk[r["index"]]
        if not s["reproduced"]:
          print(f"\n  {args.seed}:{r['index']} did not reproduce when rechecked "
                f"(now {s['kind']}): not shrunk")
          continue
        print(f"\n  minimal form of {args.seed}:{r['index']} ({s['kind']}, "
              f"{s['ops']} ops):")
        print(_indent(s["source"]))
        print(_indent(_excerpt(s["status"], s["detail"])))
  if hard:
    print("\n--- failing programs' source:")
    for r in hard[:args.show]:
      print(_indent(describe(generate(args.seed, r["index"], config))))
    if len(hard) > args.show:
      print(f"  ({len(hard) - args.show} more: regenerate with generate(seed, index))")
  _copy_stats(results)
  print("\nfigures:")
  print(_indent(format_figures(fig), "  "))


def _copy_stats(results) -> None:
  rs = [r for r in results if r["jax_bytes"] is not None and r["inplace_bytes"] is not None]
  removed = [r for r in rs if r["inplace_bytes"] < r["jax_bytes"]]
  all_removed = [r for r in removed if r["inplace_bytes"] == 0]
  same = [r for r in rs if r["inplace_bytes"] == r["jax_bytes"] > 0]
  none = [r for r in rs if r["inplace_bytes"] == r["jax_bytes"] == 0]
  worse = [r for r in rs if r["inplace_bytes"] > r["jax_bytes"]]
  jb = sum(r["jax_bytes"] for r in rs)
  ib = sum(r["inplace_bytes"] for r in rs)
  print(f"\ncopy bytes (static, per call, copies of >= 1 KiB; {len(rs)} programs with "
        "both reports):")
  print(f"  inplace_jax removed copies: {len(removed)} ({len(all_removed)} to zero)")
  print(f"  copies remain, same bytes:  {len(same)}")
  print(f"  no copies either way:       {len(none)}")
  print(f"  inplace_jax worse:          {len(worse)}"
        + (f" (indices {', '.join(str(r['index']) for r in worse[:20])})" if worse else ""))
  print(f"  total bytes: jax.jit {jb:,}, inplace_jax {ib:,}")


def _indent(text: str, pad: str = "    ") -> str:
  return "\n".join(pad + ln for ln in text.rstrip().splitlines())


def _excerpt(status: str, detail: str) -> str:
  """A failure's detail, short: where values differ (the first lines), or the tail
  (copies, tracebacks)."""
  lines = detail.rstrip().splitlines()
  if status in ("value", "inexact"):
    keep = [ln for ln in lines if not ln.startswith(" ")]
    return "\n".join(keep[:6])
  return "\n".join(lines[-14:])


def _version() -> str:
  """The library's git commit (and whether its files have local changes), if known."""
  import os
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--",
                            "inplace_jax"], capture_output=True, text=True,
                           timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return (head + (" with local changes" if dirty else "")) if head else "unknown"


if __name__ == "__main__":
  sys.exit(main())
