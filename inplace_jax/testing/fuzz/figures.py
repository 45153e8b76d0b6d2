"""Figures over a run's outcomes: status counts, and the copy-free rate of orderable
programs under inplace_jax.jit, overall and per construct.

The rate's population: orderable programs (an in-place order exists by
construction) whose jax.jit program has a buffer copy of >= 1 KiB; copy-free: no
buffer copy of >= 1 KiB under inplace_jax.jit.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from .oracle import STATUSES, Outcome
from .program import CONSTRUCTS


def _rate(k: int, n: int) -> float | None:
  return round(k / n, 4) if n else None


def figures(outcomes: Iterable[Outcome | dict]) -> dict:
  """The figures of a list of outcomes (`Outcome`s or their dicts), JSON-ready."""
  os_ = [o if isinstance(o, Outcome) else Outcome.from_dict(o) for o in outcomes]
  counts = collections.Counter(o.status for o in os_)
  status = {s: counts[s] for s in STATUSES if counts[s]}
  status.update({s: n for s, n in counts.items() if s not in status})
  orderable = [o for o in os_ if o.orderable]
  population = [o for o in orderable
                if o.jax_buffer_bytes and o.inplace_buffer_bytes is not None]
  free = [o for o in population if o.inplace_buffer_bytes == 0]
  per = {}
  for c in CONSTRUCTS:
    pop = [o for o in population if c in o.constructs]
    k = sum(1 for o in pop if o.inplace_buffer_bytes == 0)
    per[c] = dict(programs=len(pop), copy_free=k, rate=_rate(k, len(pop)))
  return dict(
      programs=len(os_),
      status=status,
      orderable=len(orderable),
      orderable_with_jax_jit_copy=len(population),
      copy_free=len(free),
      copy_free_rate=_rate(len(free), len(population)),
      per_construct=per,
      value=counts["value"],
      inexact=counts["inexact"],
      copies_more=counts["copies"],
      residual=sum(1 for o in os_ if o.residual),
      unexplained=sum(1 for o in os_ if o.unexplained),
      programs_run={p: n for p, n in sorted(collections.Counter(
          o.program for o in os_ if o.program).items())},
  )


def _pct(rate: float | None) -> str:
  return "n/a" if rate is None else f"{100 * rate:.1f}%"


def format_figures(f: dict) -> str:
  """The figures as a few lines of text."""
  lines = [
      f"programs: {f['programs']}  status: "
      + ", ".join(f"{s} {n}" for s, n in f["status"].items()),
      f"orderable: {f['orderable']}; of them with a jax.jit buffer copy: "
      f"{f['orderable_with_jax_jit_copy']}; copy-free under inplace_jax: "
      f"{f['copy_free']} ({_pct(f['copy_free_rate'])})",
      "copy-free rate per construct: " + ", ".join(
          f"{c} {v['copy_free']}/{v['programs']} ({_pct(v['rate'])})"
          for c, v in f["per_construct"].items()),
      f"mismatches (value): {f['value']}  inexact: {f['inexact']}  copies more: "
      f"{f['copies_more']}  residual: {f['residual']}  unexplained: "
      f"{f['unexplained']}",
      "inplace_jax ran: " + (", ".join(f"{p} {n}" for p, n in f["programs_run"].items())
                             or "n/a"),
  ]
  return "\n".join(lines)
