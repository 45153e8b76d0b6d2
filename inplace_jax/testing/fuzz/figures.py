"""Figures over a run's outcomes: status counts, and the copy-free rate of orderable
programs under inplace_jax.jit, overall and per construct.

The rate's population: orderable programs (an in-place order exists by
construction) whose jax.jit program has a buffer copy of >= 1 KiB; copy-free: no
buffer copy of >= 1 KiB under inplace_jax.jit.

The certified rate (`certified_copy_free_rate`) narrows the population to the
programs where an exact in-place program is exhibited: copy-free under inplace_jax
(its outputs checked bit-equal), or residual with a hand-tied reference that is
copy-free and bit-equal (`oracle.certify`). It tells residual copies that are
misses of inplace_jax's from those no exhibited program avoids exactly; it is
not the acceptance figure, which counts every orderable program.
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
  certified = [o for o in population if o.inplace_buffer_bytes == 0 or o.certified]
  per = {}
  for c in CONSTRUCTS:
    pop = [o for o in population if c in o.constructs]
    k = sum(1 for o in pop if o.inplace_buffer_bytes == 0)
    cert = sum(1 for o in certified if c in o.constructs)
    per[c] = dict(programs=len(pop), copy_free=k, rate=_rate(k, len(pop)),
                  certified=cert, certified_rate=_rate(k, cert))
  return dict(
      programs=len(os_),
      status=status,
      orderable=len(orderable),
      orderable_with_jax_jit_copy=len(population),
      copy_free=len(free),
      copy_free_rate=_rate(len(free), len(population)),
      certified=len(certified),
      certified_copy_free_rate=_rate(len(free), len(certified)),
      residual_certified=sum(1 for o in os_ if o.residual and o.certified),
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
      f"certified (an exact in-place program exhibited): {f['certified']}; "
      f"copy-free among them: {f['copy_free']} ({_pct(f['certified_copy_free_rate'])}); "
      f"residual yet certified: {f['residual_certified']}",
      "certified rate per construct: " + ", ".join(
          f"{c} {v['copy_free']}/{v['certified']} ({_pct(v['certified_rate'])})"
          for c, v in f["per_construct"].items()),
      f"mismatches (value): {f['value']}  inexact: {f['inexact']}  copies more: "
      f"{f['copies_more']}  residual: {f['residual']}  unexplained: "
      f"{f['unexplained']}",
      "inplace_jax ran: " + (", ".join(f"{p} {n}" for p, n in f["programs_run"].items())
                             or "n/a"),
  ]
  return "\n".join(lines)
