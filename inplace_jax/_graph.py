"""A jaxpr's equations as a graph: producers, consumers, scheduling edges.

The analysis (`_analysis.py`) reads and extends it: edges are data dependencies and
the order of effectful equations, plus the read-before-update edges the analysis adds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _compat as C

# What a `Graph.search_uses` step answers for an equation it reaches.
FOUND, FOLLOW, STOP = "found", "follow", "stop"


class Graph:
  """Producers, consumers and the scheduling edges of one jaxpr's equations."""

  def __init__(self, jaxpr):
    self.jaxpr = jaxpr
    self.eqns = jaxpr.eqns
    self.n = len(self.eqns)
    self.producer: dict[Any, int] = {}
    self.consumers: dict[Any, list[tuple[int, int]]] = {}
    self.edges: list[set[int]] = [set() for _ in range(self.n)]
    prev_effect = None
    producer, consumers, edges = self.producer, self.consumers, self.edges
    for k, eqn in enumerate(self.eqns):
      for pos, v in enumerate(eqn.invars):
        if C.is_literal(v):
          continue
        uses = consumers.get(v)
        if uses is None:
          consumers[v] = [(k, pos)]
        else:
          uses.append((k, pos))
        p = producer.get(v)
        if p is not None:
          edges[p].add(k)
      for v in eqn.outvars:
        if not C.is_drop_var(v):
          producer[v] = k
      if eqn.effects:
        if prev_effect is not None:
          edges[prev_effect].add(k)
        prev_effect = k
    self.outvars = {v for v in jaxpr.outvars if not C.is_literal(v)}

  def producer_eqn(self, v) -> Any:
    k = self.producer.get(v)
    return None if k is None else self.eqns[k]

  def uses(self, v) -> list[tuple[int, int]]:
    return self.consumers.get(v, [])

  def search_uses(self, var, step: Callable[[Any, int, Any], str]) -> bool:
    """`search_uses` over this graph's equations."""
    return search_uses(self.eqns, self.consumers, var, step)

  def is_live(self, v) -> bool:
    """Whether `v` is used by an equation or returned."""
    return v in self.consumers or v in self.outvars

  def reaches(self, src: int, dst: int) -> bool:
    """Whether `dst` depends on `src` (searching equations up to `dst` only: should a
    path leave that window, the scheduler's cycle check still keeps the program
    unchanged rather than wrong)."""
    if src == dst:
      return True
    seen = {src}
    stack = [src]
    while stack:
      x = stack.pop()
      for y in self.edges[x]:
        if y == dst:
          return True
        if y not in seen and y < dst:
          seen.add(y)
          stack.append(y)
    return False

  def predecessors(self) -> list[list[int]]:
    preds: list[list[int]] = [[] for _ in range(self.n)]
    for a, bs in enumerate(self.edges):
      for b in bs:
        preds[b].append(a)
    return preds

  def ancestors_within(self, var, within: set[int]) -> set[int]:
    """The equations of `within` that `var` is computed from."""
    out: set[int] = set()
    stack = [var]
    while stack:
      v = stack.pop()
      if C.is_literal(v):
        continue
      k = self.producer.get(v)
      if k is None or k not in within or k in out:
        continue
      out.add(k)
      stack.extend(self.eqns[k].invars)
    return out


def search_uses(eqns, consumers: dict[Any, list[tuple[int, int]]], var,
                step: Callable[[Any, int, Any], str]) -> bool:
  """Whether `step(w, k, eqns[k])`, asked of each equation `k` that uses a value
  `w` reached from `var` (`consumers`: value -> (equation, operand) pairs), answers
  FOUND for one: the outputs of those it answers FOLLOW are reached too (dropped
  ones aside), those it answers STOP end there."""
  stack, seen = [var], set()
  while stack:
    w = stack.pop()
    if w in seen:
      continue
    seen.add(w)
    for k, _ in consumers.get(w, ()):
      e = eqns[k]
      what = step(w, k, e)
      if what == FOUND:
        return True
      if what == FOLLOW:
        stack.extend(o for o in e.outvars if not C.is_drop_var(o))
  return False
