"""Worker processes for the oracle.

With barriers kept, XLA can abort the whole process while compiling (a CHECK
failure in the CPU IR emitter), so checks run in worker processes that are
restarted when they die; the program in flight is reported as "died" (or "timeout"
when it hangs).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from .generate import Config, generate
from .oracle import Outcome, _tb, check_function, check_program
from .program import Buf, Program, function_from_source

_CLEAR_EVERY = 200     # programs between jax.clear_caches() in a worker


def worker_main() -> None:
  """A worker: reads one JSON request per line, writes one JSON result per line.

  Requests: {"op": "run", "seed": S, "index": I, "config": C} (C optional, a
  `Config.to_dict()`); {"op": "check", "program": P} (P a base64 pickle);
  {"op": "source", "source": SRC, "name": F, "bufs": [[name, shape, dtype], ...],
  "data": D, "data_seed": N} (function F defined by SRC). Results (an
  `Outcome.to_dict()` plus index, ops and seconds) go to the original stdout;
  anything else printed goes to stderr."""
  import jax
  out = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)
  seen = 0
  for line in sys.stdin:
    req = json.loads(line)
    t = time.time()
    if req["op"] == "source":
      bufs = [Buf(n, tuple(sh), d) for n, sh, d in req["bufs"]]
      try:
        fn = function_from_source(req["source"], name=req["name"], entry=req["name"])
        o = check_function(fn, bufs, req.get("data_seed", 0), req.get("data", "normal"))
      except Exception as e:  # noqa: BLE001
        o = Outcome("invalid", _tb(e), error=type(e).__name__)
      ops = None
    else:
      if req["op"] == "run":
        p = generate(req["seed"], req["index"], Config.from_dict(req.get("config")))
      else:
        p = pickle.loads(base64.b64decode(req["program"]))
      o, ops = check_program(p), p.count_ops()
    r = dict(o.to_dict(), index=req.get("index"), ops=ops, seconds=time.time() - t)
    out.write(json.dumps(r) + "\n")
    out.flush()
    seen += 1
    if seen % _CLEAR_EVERY == 0:
      jax.clear_caches()


class Worker:
  """A persistent worker process; restarted after it dies or hangs."""

  def __init__(self, timeout: float = 600):
    self.timeout = timeout
    self.proc: subprocess.Popen | None = None
    self.err: IO[str] | None = None

  def _start(self) -> tuple[subprocess.Popen, IO[str]]:
    self.err = tempfile.TemporaryFile(mode="w+")
    self.proc = subprocess.Popen(
        [sys.executable, "-c",
         "from inplace_jax.testing.fuzz.pool import worker_main; worker_main()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
        bufsize=1)
    return self.proc, self.err

  def request(self, req: dict) -> dict:
    if self.proc is None or self.err is None or self.proc.poll() is not None:
      proc, err = self._start()
    else:
      proc, err = self.proc, self.err
    assert proc.stdin is not None and proc.stdout is not None
    err.seek(0)
    err.truncate()
    proc.stdin.write(json.dumps(req) + "\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
    line = proc.stdout.readline() if ready else ""
    if line:
      return json.loads(line)
    status = "died" if ready else "timeout"
    proc.kill()
    proc.wait()
    err.seek(0)
    tail = "".join(err.read().splitlines(keepends=True)[-40:])
    rc = proc.returncode
    self.proc = None
    first = next((ln for ln in tail.splitlines() if ln.startswith(("F", "E"))
                  and "]" in ln), "")
    o = Outcome(status, f"worker {status} (exit code {rc}); its stderr:\n{tail}",
                error=first.split("] ", 1)[-1][:100] or status,
                **_program_facts(req))
    return dict(o.to_dict(), index=req.get("index"), ops=None, seconds=None)

  def check(self, p: Program) -> Outcome:
    r = self.request({"op": "check",
                      "program": base64.b64encode(pickle.dumps(p)).decode()})
    if r["status"] in ("died", "timeout"):
      r.update(orderable=p.orderable, constructs=sorted(p.constructs))
    return Outcome.from_dict(r)

  def check_source(self, src: str, name: str, bufs: Sequence[Buf], data_seed: int = 0,
                   data: str = "normal") -> Outcome:
    """`check_function` on function `name` defined by `src` (in the worker)."""
    r = self.request({"op": "source", "source": src, "name": name, "data": data,
                      "data_seed": data_seed,
                      "bufs": [[b.name, list(b.shape), b.dtype] for b in bufs]})
    return Outcome.from_dict(r)

  def close(self) -> None:
    if self.proc is not None:
      if self.proc.stdin is not None:
        self.proc.stdin.close()
      self.proc.wait()
      self.proc = None


def _program_facts(req: dict) -> dict[str, Any]:
  """orderable and constructs of a "run" request's program (regenerated here)."""
  if req.get("op") != "run":
    return {}
  p = generate(req["seed"], req["index"], Config.from_dict(req.get("config")))
  return dict(orderable=p.orderable, constructs=tuple(sorted(p.constructs)))


def run_isolated(requests: Sequence[dict], workers: int = 2, timeout: float = 600):
  """Yields the result of each request (in completion order), `workers` at a time."""
  todo: queue.Queue = queue.Queue()
  for r in requests:
    todo.put(r)
  done: queue.Queue = queue.Queue()

  def slot():
    w = Worker(timeout)
    try:
      while True:
        try:
          req = todo.get_nowait()
        except queue.Empty:
          return
        try:
          done.put(w.request(req))
        except Exception as e:  # noqa: BLE001 - never leave the consumer waiting
          o = Outcome("died", _tb(e), error=type(e).__name__)
          done.put(dict(o.to_dict(), index=req.get("index"), ops=None, seconds=None))
    finally:
      w.close()

  threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, workers))]
  for t in threads:
    t.start()
  for _ in requests:
    yield done.get()
  for t in threads:
    t.join()
