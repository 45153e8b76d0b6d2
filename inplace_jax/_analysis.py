"""The analysis: which reads must happen before which update (pure: jaxpr in, plan out).

Vocabulary. A *buffer* is an array XLA should update in place: a donated input, a
loop carry, or an array created inside the function that an update consumes. Each
update produces a new *version* of its buffer. A *read* of a version is any other
equation that consumes it. XLA copies a buffer whenever it cannot prove that every
read of a version runs before the update that overwrites it (FINDINGS.md), so for
each version this module

1. picks its *successor*: the update that continues the buffer in place (one strong
   update, such as a scatter or a loop carry; failing that, one elementwise op whose
   result has the buffer's type and leads to an output);
2. orders every read of the version before the successor, moving reads that the user
   wrote after the update, unless the read depends on the update's result (a
   conflict: it needs the old and the new value at once);
3. decides where a barrier is needed: a read that only feeds the update itself is
   already ordered by data (a barrier there would change the update's fusion, its
   speed and possibly its rounding); anything else goes through one
   `optimization_barrier` with the version, just before the update.
   Results of updates that XLA's simplifier could see through (dynamic-update-slice,
   scatter, inlined calls) get a barrier after them when something reads them.
4. at the top level (outside loops), splits unique-index read-modify-write scatters
   into read, barrier, write: fused, they rewrite the whole buffer on CPU.

Sub-jaxprs (calls, loop bodies, branches) are analysed recursively, memoised per
jaxpr, and their in-place flows become the equation's in-place uses.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from typing import Any

from . import _compat as C
from . import _rules
from ._plan import (
    BarrierSpec, Conflict, EqnInfo, InplaceUse, OLD_VERSION_ESCAPES, Plan,
    READ_DEPENDS_ON_UPDATE, Step, TWO_LIVE_UPDATES, UPDATE_READS_OLD)


class Analyzer:
  """Analyses jaxprs, memoising per (jaxpr, buffers, loop context)."""

  def __init__(self):
    self._cache: dict[tuple, tuple[Any, Plan]] = {}

  def __call__(self, jaxpr, buffers: Sequence[bool], in_loop: bool,
               manual: bool = False) -> Plan:
    key = (id(jaxpr), tuple(bool(b) for b in buffers), bool(in_loop), bool(manual))
    hit = self._cache.get(key)
    if hit is not None and hit[0] is jaxpr:
      return hit[1]
    plan = _analyze(jaxpr, tuple(bool(b) for b in buffers), bool(in_loop),
                    bool(manual), self)
    self._cache[key] = (jaxpr, plan)  # keeps `jaxpr` alive, so its id stays unique
    return plan


def analyze(jaxpr, buffers: Sequence[bool], in_loop: bool = False,
            manual: bool = False) -> Plan:
  """The sequencing plan for an open `core.Jaxpr` whose invars `buffers` are donated."""
  return Analyzer()(jaxpr, buffers, in_loop, manual)


# --------------------------------------------------------------------------- helpers


def _dce(jaxpr):
  """Drops equations whose results are unused and that have no effects.

  A dead equation that reads a buffer would otherwise count as a read and, through
  a barrier, be kept alive.
  """
  live = {v for v in jaxpr.outvars if not C.is_literal(v)}
  keep = []
  for eqn in reversed(jaxpr.eqns):
    if eqn.effects or any(not C.is_drop_var(v) and v in live for v in eqn.outvars):
      keep.append(eqn)
      live.update(v for v in eqn.invars if not C.is_literal(v))
  if len(keep) == len(jaxpr.eqns):
    return jaxpr
  keep.reverse()
  return C.Jaxpr(jaxpr.constvars, jaxpr.invars, jaxpr.outvars, keep, jaxpr.effects,
                 jaxpr.debug_info)


def _src(eqn) -> str:
  return C.source_summary(eqn)


def _nbytes(v) -> int | None:
  try:
    return int(v.aval.size) * v.aval.dtype.itemsize
  except (AttributeError, TypeError):
    return None


# --------------------------------------------------------------------------- analysis


def _analyze(jaxpr, buffers: tuple[bool, ...], in_loop: bool, manual: bool,
             analyzer: Analyzer) -> Plan:
  jaxpr = _dce(jaxpr)
  eqns = jaxpr.eqns
  n = len(eqns)
  constant: set[Any] = set()
  ctx = _rules.Context(
      in_loop=in_loop, manual=manual, analyze=analyzer,
      constant=lambda v: C.is_literal(v) or v in constant,
      producer=lambda v: eqns[producer[v]] if v in producer else None)

  producer: dict[Any, int] = {}          # var -> index of the equation defining it
  consumers: dict[Any, list[tuple[int, int]]] = {}   # var -> [(eqn, operand)]
  # Small buffers are left alone, donated or not: their copies cost next to nothing,
  # and XLA:CPU emits while loops that touch under 1 KiB as one kernel with its
  # legacy emitter, which has no optimization barrier (it fails to compile, or
  # aborts the process; xla/service/cpu/small_while_loop_hoisting_pass.cc).
  versions: set[Any] = {v for v, b in zip(jaxpr.invars, buffers, strict=True)
                        if b and _rules.is_big(v.aval)}
  updaters: dict[Any, list[tuple[int, InplaceUse]]] = {}
  infos: list[EqnInfo] = []
  conflicts: list[Conflict] = []

  # 1. Versions, forward.
  for k, eqn in enumerate(eqns):
    cand = []
    for pos, v in enumerate(eqn.invars):
      if C.is_literal(v):
        cand.append(False)
        continue
      consumers.setdefault(v, []).append((k, pos))
      cand.append(v in versions or (v in producer and _rules.is_big(v.aval)
                                    and _rules.can_root(eqns[producer[v]])))
    info = _rules.eqn_info(eqn, cand, ctx)
    kept = []
    for use in info.uses:
      v = eqn.invars[use.operand]
      out = eqn.outvars[use.output]
      if C.is_drop_var(out):
        continue
      if v in versions or (use.strong and v in producer):
        versions.add(v)
        versions.add(out)
        updaters.setdefault(v, []).append((k, use))
        kept.append(use)
    if len(kept) != len(info.uses):
      info = dataclasses.replace(info, uses=tuple(kept))
    infos.append(info)
    for v in eqn.outvars:
      if not C.is_drop_var(v):
        producer[v] = k
    if not eqn.effects and not C.jaxprs_in_params(eqn.params) and all(
        C.is_literal(v) or v in constant for v in eqn.invars):
      constant.update(v for v in eqn.outvars if not C.is_drop_var(v))

  outvar_set = {v for v in jaxpr.outvars if not C.is_literal(v)}

  # Which versions lead to an output through in-place uses (backward).
  reaches_out: set[Any] = set(v for v in outvar_set if v in versions)
  for k in range(n - 1, -1, -1):
    eqn = eqns[k]
    for use in infos[k].uses:
      if eqn.outvars[use.output] in reaches_out:
        reaches_out.add(eqn.invars[use.operand])

  # 2. Successors.
  successor: dict[Any, tuple[int, InplaceUse]] = {}
  for v, ups in updaters.items():
    strong = [u for u in ups if u[1].strong]
    weak = [u for u in ups if not u[1].strong]
    if strong:
      best = next((u for u in strong
                   if eqns[u[0]].outvars[u[1].output] in reaches_out), strong[0])
      successor[v] = best
      if len(strong) > 1:
        others = [u for u in strong if u is not best]
        conflicts.append(Conflict(
            TWO_LIVE_UPDATES,
            f"{len(strong)} updates of the same {v.aval.str_short()} version are "
            "live at once; each one but the first needs its own copy",
            read=_src(eqns[others[0][0]]), update=_src(eqns[best[0]]),
            nbytes=_nbytes(v)))
    else:
      leading = [u for u in weak if eqns[u[0]].outvars[u[1].output] in reaches_out]
      if leading:
        successor[v] = leading[0]

  # A chain of updates whose last version is not returned is left alone: nothing
  # needs that buffer afterwards, and XLA often removes such updates altogether
  # (a read of the final version is rewritten to read what was written); barriers
  # would keep them alive, and a read-only argument would then be copied.
  chained = {eqns[k].outvars[use.output] for k, use in successor.values()}
  for root in [v for v in successor if v not in chained]:
    chain, v = [], root
    while v in successor and v not in chain:
      chain.append(v)
      k, use = successor[v]
      v = eqns[k].outvars[use.output]
    if v not in outvar_set:
      for w in chain:
        del successor[w]

  # Edges of the scheduling graph, as successor lists over equation indices.
  succ_edges: list[set[int]] = [set() for _ in range(n)]
  for v, cons in consumers.items():
    p = producer.get(v)
    if p is not None:
      for k, _ in cons:
        succ_edges[p].add(k)
  prev_effect = None
  for k, eqn in enumerate(eqns):
    if eqn.effects:
      if prev_effect is not None:
        succ_edges[prev_effect].add(k)
      prev_effect = k

  def reaches(src: int, dst: int) -> bool:
    """Whether `dst` depends on `src` in the current graph (searching equations up
    to `dst` only: should a path leave that window, the scheduler's cycle check
    still keeps the program unchanged rather than wrong)."""
    if src == dst:
      return True
    seen = {src}
    stack = [src]
    while stack:
      x = stack.pop()
      for y in succ_edges[x]:
        if y == dst:
          return True
        if y not in seen and y < dst:
          seen.add(y)
          stack.append(y)
    return False

  # A barrier materialises the value it ties. Where that value feeds a float
  # reduction or a transcendental, XLA would otherwise fuse it into that op, and
  # the op's accumulation order or vector code, and so its last bit, can change
  # with the fusion (a gathered sum differed in the fuzzer). Such values are not
  # tied: values stay exact, and XLA may copy.
  sensitive_memo: dict[Any, bool] = {}

  def sensitive(var) -> bool:
    return _rules.feeds_sensitive(var, eqns, consumers, sensitive_memo)

  # 3. Reads of each version, ordered before its successor.
  pre_reads: dict[int, list[Any]] = {}      # update -> read result vars to tie
  pre_read_eqns: dict[int, set[int]] = {}   # update -> read equations feeding them
  pre_sources: dict[int, list[str]] = {}
  pre_versions: dict[int, list[Any]] = {}
  after_pre: dict[int, set[int]] = {}       # update -> reads placed after the barrier
  post_versions: dict[int, list[Any]] = {}
  moved: set[int] = set()
  splits: set[int] = set()

  # Forward edges first: they follow the original order, so they can never close a
  # cycle; backward ones (a read written after its update) are checked one by one.
  pending: list[tuple[int, int, Any]] = []   # (read eqn, update eqn, version)
  read_sets: dict[Any, list[int]] = {}
  for v, (u, use) in successor.items():
    reads = sorted({k for k, pos in consumers.get(v, ())
                    if not (k == u and pos == use.operand)})
    if u in reads:
      reads.remove(u)
      conflicts.append(Conflict(
          UPDATE_READS_OLD,
          f"{eqns[u].primitive} both updates a {v.aval.str_short()} in place and "
          "reads its old value through another operand; XLA copies it",
          update=_src(eqns[u]), nbytes=_nbytes(v)))
    if v in outvar_set:
      conflicts.append(Conflict(
          OLD_VERSION_ESCAPES,
          f"the {v.aval.str_short()} value before an update is also returned; "
          "returning the old and the new value needs a copy",
          update=_src(eqns[u]), nbytes=_nbytes(v)))
    read_sets[v] = reads
    for r in reads:
      if r < u:
        succ_edges[r].add(u)
      else:
        pending.append((r, u, v))
  conflicting: set[tuple[int, Any]] = set()
  for r, u, v in pending:
    if reaches(u, r):
      conflicting.add((r, v))
      conflicts.append(Conflict(
          READ_DEPENDS_ON_UPDATE,
          f"a read of the old {v.aval.str_short()} value depends on the updated "
          "value, so it cannot run before the update; XLA keeps a copy of the old "
          "value", read=_src(eqns[r]), update=_src(eqns[u]), nbytes=_nbytes(v)))
    else:
      succ_edges[r].add(u)
      moved.add(r)

  for v, (u, use) in successor.items():
    info_u = infos[u]
    ueqn = eqns[u]
    reads = [r for r in read_sets[v] if (r, v) not in conflicting]
    # Results computed together with this version (a loop's other outputs, a
    # call's) may be reads of it that XLA inlines (a loop of one trip); tie them too.
    p = producer.get(v)
    co_out = []
    if p is not None and len(eqns[p].outvars) > 1:
      co_out = [w for w in eqns[p].outvars
                if w is not v and not C.is_drop_var(w) and w not in versions
                and (w in consumers or w in outvar_set)]
      if co_out:
        # Results computed without this buffer read nothing of it, inlined or
        # not: leave them free (tied, a constant one would be hidden from XLA's
        # simplifier, which folds `-0.0 + 0.0` under jax.jit).
        src = [use.operand for use in infos[p].uses
               if eqns[p].outvars[use.output] is v]
        free = _rules.outputs_free_of(eqns[p], src)
        co_out = [w for k, w in enumerate(eqns[p].outvars)
                  if k not in free and w in co_out]
    if ueqn.primitive is C.optimization_barrier_p:
      # The user's own barrier is the ordering; reads it ties need nothing more.
      reads = [r for r in reads
               if not any(w in ueqn.invars for w in eqns[r].outvars)]
    if p is not None and not _cut_safe_var(eqns[p], v):
      # A barrier right after arithmetic could change rounding: this version's
      # reads stay as they were (values exact, XLA may copy).
      continue
    # Splits trace helper equations whose types carry no manual-axis information,
    # so they are left out inside `shard_map` bodies. A version that is a fresh
    # elementwise result is not split either: XLA computes it and the update in one
    # fusion, and the split would force it into a buffer of its own.
    # Nor for 16-bit floats: XLA:CPU computes them through f32 converts, where its
    # simplifier treats `x + 0` differently once split (the sign of -0.0 changed).
    split = (info_u.splittable and not in_loop and not manual and use.operand == 0
             and not _rules.normalised_float(v.aval)
             and not (p is not None and _made_by_weak_use(infos[p], eqns[p], v))
             and (ueqn.primitive not in _ADDITIVE or _rules.additive_source_safe(
                 ueqn.invars[2], eqns, producer)))
    if use.strong and not _rules.normalised_float(v.aval):
      # A read that only feeds its own update is ordered by data. A barrier there
      # would change the update's fusion: inside loops that costs speed (20x in
      # FINDINGS.md), and anywhere it can change how XLA vectorises or contracts
      # the arithmetic between the read and the write, and so the last bit.
      # (Not for 16-bit floats: XLA:CPU computes them through f32 converts, and a
      # read fused into a converting update is not done in place.)
      private = _private_ancestors(eqns, u, consumers, producer, outvar_set)
      if split:
        # The split reads the old values before the barrier, at the update's
        # indices: reads those indices are computed from must come first.
        private -= _ancestors_within(eqns, ueqn.invars[1], producer, private)
      tied = [r for r in reads if r not in private]
      after_pre.setdefault(u, set()).update(r for r in reads if r in private)
    else:
      tied = reads
    tied = [r for r in tied
            if all(_cut_safe_var(eqns[r], w) for w in eqns[r].outvars
                   if not C.is_drop_var(w))]
    # Each tied read is tied where XLA would end its fusion anyway: past the
    # reductions and transcendentals it feeds (see `_tie_frontier`).
    frontier_vars: list[Any] = []
    region: set[int] = set()
    kept_tied = []
    for r in tied:
      f = _tie_frontier(eqns, r, u, v, consumers, outvar_set, sensitive,
                        lambda c: reaches(u, c), lambda c: reaches(c, u))
      if f is None:
        continue    # cannot be tied without changing a value: left as it is
      kept_tied.append(r)
      frontier_vars.extend(f[0])
      region |= f[1]
    tied = kept_tied
    # Every read left untied runs after the barrier and reads its output. Read
    # from the version before the barrier, it would be a second value of one
    # buffer, and XLA:CPU has fused such a read into the in-place update itself and
    # returned wrong values (a row swap in bfloat16, in the fuzzer).
    after_pre.setdefault(u, set()).update(set(reads) - set(tied) - region)
    co_out = [w for w in co_out if _cut_safe_var(eqns[p], w) and not sensitive(w)]
    if split:
      splits.add(u)
    # A read's results are tied even when they are buffers themselves (the result
    # of a second update of this version): the copy that update needs must be
    # taken before this version is overwritten.
    read_vars = [w for w in frontier_vars if w is not v]
    read_vars += co_out
    if read_vars or split:
      pre_versions.setdefault(u, []).append(v)
      lst = pre_reads.setdefault(u, [])
      for w in read_vars:
        if w not in lst:
          lst.append(w)
      pre_read_eqns.setdefault(u, set()).update(tied)
      pre_read_eqns[u].update(region)
      pre_sources.setdefault(u, []).extend(_src(eqns[r]) for r in tied)
      idx_p = producer.get(ueqn.invars[1]) if split else None
      if idx_p is not None:
        # The split's gather, at the barrier, needs the indices computed.
        pre_read_eqns[u].add(idx_p)

  # Barriers after updates whose results are read.
  for k, info in enumerate(infos):
    for use in info.uses:
      out = eqns[k].outvars[use.output]
      if C.is_drop_var(out) or eqns[k].invars[use.operand] not in successor or \
          successor[eqns[k].invars[use.operand]][0] != k:
        continue
      if not (info.forwards_reads or not use.strong):
        continue
      if not _cut_safe_var(eqns[k], out):
        continue
      nxt = successor.get(out)
      # Only slicing reads can be forwarded to the old buffer; a barrier in front
      # of arithmetic would change what XLA fuses, and so last-bit rounding.
      has_reads = any(not (nxt is not None and c == nxt[0]
                           and pos == nxt[1].operand)
                      and _rules.is_slicing(eqns[c])
                      for c, pos in consumers.get(out, ()))
      # A split successor reads `out` with a gather, a slicing read too.
      has_reads = has_reads or (nxt is not None and nxt[0] in splits)
      # A barrier there would also move the fusion boundary of the reductions and
      # transcendentals those reads feed (a sum of a slice of the new version
      # changed in the fuzzer): values first, XLA may copy instead.
      if has_reads and not sensitive(out):
        post_versions.setdefault(k, []).append(out)

  # Whatever consumes a tied read's result (a squeeze of a slice, say) runs after
  # the barrier and reads the barrier's output; run before it, it would be a second,
  # unordered read of the buffer (FINDINGS.md: "a barrier over a slice that was
  # already reshaped before the barrier orders nothing").
  after_tie = _consumers_after_barrier(eqns, succ_edges, pre_read_eqns, pre_reads,
                                       consumers, sensitive)

  barriers = []
  for u, vs in pre_versions.items():
    barriers.append(BarrierSpec("pre", u, tuple(vs), tuple(pre_reads.get(u, ())),
                                tuple(pre_sources.get(u, ()))))
  for u, vs in post_versions.items():
    barriers.append(BarrierSpec("post", u, tuple(vs)))
  # Both kinds of edges are needed for the barriers to be sound, so where they
  # cannot all be honoured (an untied read that a tied one needs first, say), the
  # jaxpr is left as it is.
  order = _schedule(n, succ_edges, pre_versions, pre_read_eqns,
                    _union(after_pre, after_tie), post_versions, producer,
                    consumers)
  if order is None:
    conflicts.append(Conflict("unsequenced", "inplace_jax could not order the reads "
                              "of this jaxpr soundly; it is left unchanged"))
    order = tuple(Step("eqn", k) for k in range(n))
    barriers, splits, moved = [], set(), set()

  flows, strong_flows = _flows(jaxpr, buffers, successor, eqns)
  return Plan(jaxpr=jaxpr, buffers=buffers, in_loop=in_loop, order=order,
              barriers=tuple(barriers), infos=tuple(infos),
              splits=frozenset(splits), flows=flows, strong_flows=strong_flows,
              moved=tuple(sorted(moved)),
              conflicts=tuple(conflicts))


_REGION_LIMIT = 64
_ADDITIVE = (C.scatter_add_p, C.scatter_sub_p)


def _tie_frontier(eqns, r, u, v, consumers, outvar_set, sensitive, after_update,
                  feeds_update) -> tuple[list[Any], set[int]] | None:
  """Where to tie read `r` of version `v` before update `u`.

  Returns (variables to tie, equations to run before the barrier besides `r`), or
  None when that is impossible without changing a value. A float value that feeds
  a reduction or a transcendental is not tied itself, since XLA would fuse it into
  that op and the op's result can change with its fusion; instead the fusible
  equations between the read and those ops (the read's fusion region) run before
  the barrier, and the values leaving the region are tied: reduction results,
  operands of ops XLA never fuses into (dots, loops), outputs of the function.
  """
  ties: list[Any] = []
  region: set[int] = set()
  stack = [w for w in eqns[r].outvars if not C.is_drop_var(w)]
  seen = set()
  while stack:
    w = stack.pop()
    if w in seen:
      continue
    seen.add(w)
    if not (w in consumers or w in outvar_set):
      continue
    if not sensitive(w):
      ties.append(w)        # everything downstream rounds the same fused or not
      continue
    if w in outvar_set:
      ties.append(w)
    for c, _ in consumers.get(w, ()):
      e = eqns[c]
      if c in region:
        continue
      name = e.primitive.name
      if c == u or feeds_update(c):
        # Toward the update, the tied value is used (after the barrier): computed
        # from the buffer before it, it would be fused into the update, which then
        # reads the buffer it writes and cannot be done in place.
        if w not in ties:
          ties.append(w)
      elif name in _rules.REGION_NAMES:
        if e.effects or after_update(c) or len(region) >= _REGION_LIMIT:
          return None
        region.add(c)
        if name in _rules.REDUCTION_NAMES:
          ties.extend(o for o in e.outvars if not C.is_drop_var(o)
                      and (o in consumers or o in outvar_set))
        else:
          stack.extend(o for o in e.outvars if not C.is_drop_var(o))
      elif C.jaxprs_in_params(e.params):
        return None         # used sensitively inside a loop, branch or call
      else:
        if w not in ties:
          ties.append(w)    # an op XLA does not fuse its operand into
  return ties, region


def _made_by_weak_use(info, eqn, var) -> bool:
  return any(not u.strong and eqn.outvars[u.output] is var for u in info.uses)


def _ancestors_within(eqns, var, producer, within: set[int]) -> set[int]:
  """The equations of `within` that `var` is computed from."""
  out: set[int] = set()
  stack = [var]
  while stack:
    v = stack.pop()
    if C.is_literal(v):
      continue
    k = producer.get(v)
    if k is None or k not in within or k in out:
      continue
    out.add(k)
    stack.extend(eqns[k].invars)
  return out


def _cut_safe_var(eqn, var) -> bool:
  return _rules.cut_safe(eqn, [o is var for o in eqn.outvars].index(True))


def _union(a: dict[int, set[int]], b: dict[int, set[int]]) -> dict[int, set[int]]:
  out = {k: set(v) for k, v in a.items()}
  for k, v in b.items():
    out.setdefault(k, set()).update(v)
  return out


def _consumers_after_barrier(eqns, succ_edges, pre_read_eqns, pre_reads, consumers,
                             sensitive) -> dict[int, set[int]]:
  """Equations to emit after each pre barrier; extends `pre_reads` in place.

  The equations that must run before update `u`'s barrier are its tied reads and
  their ancestors. A value computed there from a read and used after the barrier is
  tied too: left untied, XLA may recompute its cheap read of the buffer in the
  later fusion, after the update.
  """
  if not pre_read_eqns:
    return {}
  preds: list[list[int]] = [[] for _ in eqns]
  for a, bs in enumerate(succ_edges):
    for b in bs:
      preds[b].append(a)
  out: dict[int, set[int]] = {}
  for u, tied in pre_read_eqns.items():
    if not tied:
      continue
    # The equations that must stay before the barrier and depend on a tied read
    # lie between the tied reads: search only that window, so the analysis stays
    # linear in the program (a wider path only loses a tie, never a value).
    lo, hi = min(tied), max(tied)
    fwd = set(tied)
    stack = list(tied)
    while stack:
      x = stack.pop()
      for y in succ_edges[x]:
        if lo <= y <= hi and y not in fwd:
          fwd.add(y)
          stack.append(y)
    anc = set(tied)     # in `fwd` and an ancestor of a tied read
    stack = list(tied)
    while stack:
      x = stack.pop()
      for y in preds[x]:
        if y in fwd and y not in anc:
          anc.add(y)
          stack.append(y)
    derived = anc
    ties = pre_reads.setdefault(u, [])
    for k in sorted(derived - set(tied)):
      for w in eqns[k].outvars:
        if C.is_drop_var(w) or w in ties:
          continue
        if any(c not in anc for c, _ in consumers.get(w, ())) and \
            _cut_safe_var(eqns[k], w) and not sensitive(w):
          ties.append(w)
    later = set()
    for w in ties:
      for c, _ in consumers.get(w, ()):
        if c not in anc and c != u:
          later.add(c)
    if later:
      out[u] = later
  return out


def _private_ancestors(eqns, u, consumers, producer, outvar_set) -> set[int]:
  """Equations whose results flow only into update `u` (directly or through others).

  Inside a loop such a read is ordered before the update by data alone, and XLA then
  fuses it with the update in place; a barrier there only costs speed (FINDINGS.md).
  Visited from `u` backwards in decreasing position, so every user of an equation
  is decided before the equation is, and the walk stops at the first shared value.
  """
  private: set[int] = set()
  heap: list[int] = []
  seen: set[int] = set()

  def push_producers(k):
    for v in eqns[k].invars:
      if C.is_literal(v):
        continue
      p = producer.get(v)
      if p is not None and p not in seen:
        seen.add(p)
        heapq.heappush(heap, -p)

  push_producers(u)
  while heap:
    k = -heapq.heappop(heap)
    ok = True
    for w in eqns[k].outvars:
      if C.is_drop_var(w):
        continue
      if w in outvar_set or any(c != u and c not in private
                                for c, _ in consumers.get(w, ())):
        ok = False
        break
    if ok:
      private.add(k)
      push_producers(k)
  return private


def _schedule(n, succ_edges, pre_versions, pre_read_eqns, after_pre,
              post_versions, producer, consumers) -> tuple[Step, ...] | None:
  """A topological order close to the original, with barrier steps placed."""
  # Node ids: eqn k -> 3k+1, its pre barrier -> 3k, its post barrier -> 3k+2.
  # The id doubles as priority: the original position, barriers hugging their update.
  nodes = set(3 * k + 1 for k in range(n))
  out: dict[int, set[int]] = {}
  def edge(a, b):
    out.setdefault(a, set()).add(b)
  for k in range(n):
    for j in succ_edges[k]:
      edge(3 * k + 1, 3 * j + 1)
  for u, vs in pre_versions.items():
    b = 3 * u
    nodes.add(b)
    edge(b, 3 * u + 1)
    for v in vs:
      p = producer.get(v)
      if p is not None:
        edge(3 * p + 1, b)
    for r in pre_read_eqns.get(u, ()):
      edge(3 * r + 1, b)
    for r in after_pre.get(u, ()):
      edge(b, 3 * r + 1)
  for u, vs in post_versions.items():
    b = 3 * u + 2
    nodes.add(b)
    edge(3 * u + 1, b)
    for v in vs:
      for c, _ in consumers.get(v, ()):
        edge(b, 3 * c + 1)
  indeg = dict.fromkeys(nodes, 0)
  for a, bs in out.items():
    for b in bs:
      indeg[b] += 1
  heap = [x for x in nodes if indeg[x] == 0]
  heapq.heapify(heap)
  order = []
  while heap:
    x = heapq.heappop(heap)
    k, r = divmod(x, 3)
    order.append(Step(("pre", "eqn", "post")[r], k))
    for y in out.get(x, ()):
      indeg[y] -= 1
      if indeg[y] == 0:
        heapq.heappush(heap, y)
  if len(order) != len(nodes):
    return None
  return tuple(order)


def _flows(jaxpr, buffers, successor, eqns
           ) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
  """For each buffer invar, the output its last version is (None: not in place),
  and whether a strong update is on the way."""
  out_index: dict[Any, int] = {}
  for i, v in enumerate(jaxpr.outvars):
    if not C.is_literal(v) and v not in out_index:
      out_index[v] = i
  flows, strong = [], []
  for v, b in zip(jaxpr.invars, buffers, strict=True):
    if not b:
      flows.append(None)
      strong.append(False)
      continue
    seen = set()
    is_strong = False
    while v in successor and v not in seen:
      seen.add(v)
      k, use = successor[v]
      is_strong = is_strong or use.strong
      v = eqns[k].outvars[use.output]
    o = out_index.get(v)
    flows.append(o)
    strong.append(is_strong and o is not None)
  return tuple(flows), tuple(strong)
