"""The long differential fuzz run: inplace_jax.jit against jax.jit on random programs.

    python scripts/fuzz_long.py --count 10000 --seed 7 --workers 2

Program `i` of seed `S` is `fuzzgen.generate(S, i)` (tests/fuzzgen.py), so any program
is reproduced from the two numbers. Each is checked by `fuzzgen.check_program`
(values bit-for-bit equal, both HLO reports verified, inplace_jax's copy bytes at most
jax.jit's). Progress goes to stdout; at the end: the count, the seed, every failure
(the first few of each kind shrunk to a minimal program, all with their source) and
copy-byte statistics. `--json PATH` also writes every result.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                os.pardir, "tests")))
import fuzzgen  # noqa: E402


def kind(r: dict) -> str:
  return fuzzgen.failure_kind(r["status"], r["error"], r["detail"])


def _shrink_all(seed: int, failures: list[dict], workers: int, timeout: float,
                ) -> dict[int, dict]:
  """Shrinks each failure in worker processes (a check may abort its process)."""
  out: dict[int, dict] = {}
  todo = list(failures)
  lock = threading.Lock()

  def slot():
    w = fuzzgen.Worker(timeout)
    try:
      while True:
        with lock:
          if not todo:
            return
          r = todo.pop(0)
        p = fuzzgen.generate(seed, r["index"])
        t = time.time()
        q, o = fuzzgen.shrink(p, w.check(p), check=w.check, max_checks=300)
        with lock:
          out[r["index"]] = dict(status=o.status, kind=fuzzgen._kind(o),
                                 source=fuzzgen.describe(q), detail=o.detail,
                                 ops=q.count_ops())
          print(f"  shrunk {seed}:{r['index']} to {q.count_ops()} ops in "
                f"{time.time() - t:.0f}s", flush=True)
    finally:
      w.close()

  threads = [threading.Thread(target=slot) for _ in range(max(1, workers))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--count", type=int, default=10000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--start", type=int, default=0, help="first program index")
  ap.add_argument("--workers", type=int, default=2)
  ap.add_argument("--shrink", type=int, default=2,
                  help="failures of each kind to shrink to a minimal program")
  ap.add_argument("--show", type=int, default=30,
                  help="failures whose full source is printed")
  ap.add_argument("--timeout", type=float, default=600,
                  help="seconds one program may take")
  ap.add_argument("--json", default=None, help="write every result here")
  ap.add_argument("--every", type=int, default=100, help="progress interval")
  args = ap.parse_args(argv)

  reqs = [dict(op="run", seed=args.seed, index=i)
          for i in range(args.start, args.start + args.count)]
  results: list[dict] = []
  counts: collections.Counter = collections.Counter()
  t0 = time.time()
  print(f"fuzz_long: {args.count} programs, seed {args.seed}, indices "
        f"{args.start}..{args.start + args.count - 1}, {args.workers} worker(s)",
        flush=True)
  for r in fuzzgen.run_isolated(reqs, args.workers, args.timeout):
    results.append(r)
    counts[r["status"]] += 1
    if r["status"] != "ok":
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
    print(f"shrinking {len(pick)} failure(s) ...", flush=True)
  shrunk = _shrink_all(args.seed, pick, args.workers, args.timeout)
  _report(args, results, failures, kinds, shrunk, time.time() - t0)
  if args.json:
    with open(args.json, "w") as fh:
      json.dump(dict(seed=args.seed, start=args.start, count=args.count,
                     results=results, shrunk=shrunk), fh)
  return 1 if failures else 0


def _report(args, results, failures, kinds, shrunk, seconds) -> None:
  print("\n" + "=" * 78)
  print(f"programs: {len(results)}  seed: {args.seed}  indices {args.start}.."
        f"{args.start + args.count - 1}  time: {seconds:.0f}s")
  print(f"status: {dict(collections.Counter(r['status'] for r in results))}")
  print(f"failures: {len(failures)} in {len(kinds)} kind(s)")
  for sig, rs in kinds.items():
    print(f"\n--- {sig}: {len(rs)} program(s): "
          f"{', '.join(str(r['index']) for r in rs[:40])}{' ...' if len(rs) > 40 else ''}")
    for r in rs:
      if r["index"] in shrunk:
        s = shrunk[r["index"]]
        print(f"\n  minimal form of {args.seed}:{r['index']} ({s['status']}, "
              f"{s['ops']} ops):")
        print(_indent(s["source"]))
        print(_indent(_tail(s["detail"], 8)))
  print("\n--- failing programs' source:")
  for r in failures[:args.show]:
    print(_indent(fuzzgen.describe(fuzzgen.generate(args.seed, r["index"]))))
  if len(failures) > args.show:
    print(f"  ({len(failures) - args.show} more: regenerate with "
          "fuzzgen.generate(seed, index))")
  _copy_stats(results)


def _copy_stats(results) -> None:
  rs = [r for r in results if r["jax_bytes"] is not None and r["inplace_bytes"] is not None]
  removed = [r for r in rs if r["inplace_bytes"] < r["jax_bytes"]]
  all_removed = [r for r in removed if r["inplace_bytes"] == 0]
  same = [r for r in rs if r["inplace_bytes"] == r["jax_bytes"] > 0]
  none = [r for r in rs if r["inplace_bytes"] == r["jax_bytes"] == 0]
  worse = [r for r in rs if r["inplace_bytes"] > r["jax_bytes"]]
  jb = sum(r["jax_bytes"] for r in rs)
  ib = sum(r["inplace_bytes"] for r in rs)
  print(f"\ncopy bytes (static, per call; {len(rs)} programs with both reports):")
  print(f"  inplace_jax removed copies: {len(removed)} ({len(all_removed)} to zero)")
  print(f"  copies remain, same bytes:  {len(same)}")
  print(f"  no copies either way:       {len(none)}")
  print(f"  inplace_jax worse:          {len(worse)}"
        + (f" (indices {', '.join(str(r['index']) for r in worse[:20])})" if worse else ""))
  print(f"  total bytes: jax.jit {jb:,}, inplace_jax {ib:,}")


def _indent(text: str, pad: str = "    ") -> str:
  return "\n".join(pad + ln for ln in text.rstrip().splitlines())


def _tail(text: str, n: int) -> str:
  return "\n".join(text.rstrip().splitlines()[-n:])


if __name__ == "__main__":
  sys.exit(main())
