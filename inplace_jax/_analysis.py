"""The analysis: which reads must happen before which update (pure: jaxpr in, plan out).

Vocabulary. A *buffer* is an array XLA should update in place: a donated input, a
loop carry, or an array created inside the function that an update consumes. Each
update produces a new *version* of its buffer. A *read* of a version is any other
equation that consumes it. XLA copies a buffer whenever it cannot prove that every
read of a version runs before the update that overwrites it (docs/xla_notes.md).

The analysis is a sequence of named passes over one `Graph` (`_graph.py`), each
adding to a `_State`:

1. `find_versions`: each equation's rule (`_rules/`) says which operands it updates
   in place; versions are followed forward from the buffers.
2. `pick_successors`: for each version, the update that continues the buffer in
   place (one strong update, such as a scatter or a loop carry; failing that, one
   elementwise op whose result has the buffer's type and leads to an output: the
   buffer's own, the one JAX aliases it to or the same carry, where known).
3. `order_reads`: every read of a version goes before its successor, moving reads
   the user wrote after the update, unless the read depends on the update's result
   (a conflict: it needs the old and the new value at once).
4. `tie_reads`: where data does not already order a read before the update, the
   read's result and the version pass through one `optimization_barrier` just
   before the update, tied where XLA would end the read's fusion anyway
   (`_exactness.py`: never where a value could change; in a refinement round, a
   read that is itself arithmetic a barrier may not follow, `0.01 * x` feeding an
   add, is tied where the expression it feeds ends). At the top level,
   unique-index read-modify-write scatters are split into read, barrier, write.
5. `post_update_barriers`: results of updates that XLA's simplifier could see
   through (dynamic-update-slice, scatter, inlined calls) get a barrier after them
   when something slices them.
6. `tie_derived_reads`: what consumes a tied read runs after the barrier, from its
   output.
7. `schedule`: a topological order close to the original, barriers placed.

Sub-jaxprs (calls, loop bodies, branches) are analysed recursively, memoised per
jaxpr, and their in-place flows become the equation's in-place uses.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import _compat as C
from . import _exactness as X
from . import _rules
from ._graph import FOLLOW, FOUND, STOP, Graph
from ._plan import (
    BarrierSpec, Conflict, EqnInfo, FindingKind, Hints, InplaceUse, Plan, Step)
from . import _traits
from ._rules import updates as _updates
from ._passes import fused_into_readers
from ._rewrite import loop_fused_reach


class Analyzer:
  """Analyses jaxprs, memoising per (jaxpr, buffers, loop context).

  Every cache lives on the analyzer, so it is freed with it (one per transform).
  """

  def __init__(self, hints: Hints = Hints()):
    self._cache: dict[tuple, tuple[Any, Plan]] = {}
    self._live: dict[int, tuple[Any, Any]] = {}
    self.inner_sensitive = X.inner_sensitivity({}, hints.through_updates)
    self.hints = hints

  def __call__(self, jaxpr, buffers: Sequence[bool], in_loop: bool,
               manual: bool = False, left: Sequence[bool] = (),
               targets: Sequence[int | None] = (),
               names: Sequence[str | None] = (), top: bool = False) -> Plan:
    """`left` marks inputs (donated buffers jax.jit already updates in place) whose
    versions are left exactly as they are: no chain of updates starts from them.
    `targets` gives, per input, the output whose buffer it is (the output JAX
    aliases a donated argument to, the same carry of a loop body); None or absent:
    not known. `names`, per input, the argument's name as JAX writes it (a whole
    program's): a conflict about one argument's buffer names it
    (`Conflict.argument`). `top`: the jaxpr is a whole program, not a body that
    XLA may inline into its caller (a call, a one-trip loop, a nested jit)."""
    levels = tuple(_level(b) for b in buffers)
    left = tuple(bool(x) for x in left)
    targets = tuple(None if t is None else int(t) for t in targets)
    names = tuple(names)
    key = (id(jaxpr), levels, bool(in_loop), bool(manual), left, targets, names, top)
    hit = self._cache.get(key)
    if hit is not None and hit[0] is jaxpr:
      return hit[1]
    plan = analyze_one(jaxpr, levels, bool(in_loop), bool(manual), self, left, targets,
                       names, top)
    self._cache[key] = (jaxpr, plan)  # keeps `jaxpr` alive, so its id stays unique
    return plan

  def live(self, jaxpr):
    """`dce(jaxpr)`, found once per jaxpr (the transform and each analysis of the
    same jaxpr ask)."""
    hit = self._live.get(id(jaxpr))
    if hit is None or hit[0] is not jaxpr:
      hit = self._live[id(jaxpr)] = (jaxpr, dce(jaxpr))
    return hit[1]


# How much an operand is a buffer: a version of one the caller gave (a donated
# argument, a carry), or an array made inside that an update could continue.
BUFFER, STARTED = 2, 1


def _level(b) -> int:
  """A buffer mask entry as a level: `True` is a buffer; rules pass levels on."""
  if isinstance(b, (bool, np.bool_)):
    return BUFFER if b else 0
  return int(b)


def analyze(jaxpr, buffers: Sequence[bool], in_loop: bool = False,
            manual: bool = False, targets: Sequence[int | None] = ()) -> Plan:
  """The sequencing plan for an open `core.Jaxpr` whose invars `buffers` are donated
  (`targets`: see `Analyzer.__call__`)."""
  return Analyzer()(jaxpr, buffers, in_loop, manual, targets=targets, top=True)


@dataclasses.dataclass
class _State:
  """What the passes learn about one jaxpr, pass by pass."""
  g: Graph
  buffers: tuple[int, ...]     # levels: BUFFER, STARTED or 0
  in_loop: bool
  manual: bool
  # Per invar: the output whose buffer it is, where known (`Analyzer.__call__`).
  targets: tuple[int | None, ...] = ()
  # Per invar: the argument's name, where known (`Analyzer.__call__`).
  names: tuple[str | None, ...] = ()
  infos: list[EqnInfo] = dataclasses.field(default_factory=list)
  versions: set[Any] = dataclasses.field(default_factory=set)
  # Per version: the invars (by position) whose buffer it may continue.
  roots: dict[Any, frozenset[int]] = dataclasses.field(default_factory=dict)
  updaters: dict[Any, list[tuple[int, InplaceUse]]] = dataclasses.field(
      default_factory=dict)
  successor: dict[Any, tuple[int, InplaceUse]] = dataclasses.field(default_factory=dict)
  conflicts: list[Conflict] = dataclasses.field(default_factory=list)
  read_sets: dict[Any, list[int]] = dataclasses.field(default_factory=dict)
  conflicting: set[tuple[int, Any]] = dataclasses.field(default_factory=set)
  moved: set[int] = dataclasses.field(default_factory=set)
  splits: set[int] = dataclasses.field(default_factory=set)
  # Per update (equation index): the pre barrier's versions, read results to tie,
  # read equations that must run before it, their sources; reads placed after it.
  pre_versions: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
  pre_reads: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
  pre_read_eqns: dict[int, set[int]] = dataclasses.field(default_factory=dict)
  pre_sources: dict[int, list[str]] = dataclasses.field(default_factory=dict)
  after_pre: dict[int, set[int]] = dataclasses.field(default_factory=dict)
  post_versions: dict[int, list[Any]] = dataclasses.field(default_factory=dict)
  sensitive_memo: dict[Any, bool] = dataclasses.field(default_factory=dict)
  # `_no_fold_across` per (value, its equation's id; the equation lives in `g`).
  no_fold_memo: dict[tuple[Any, int], bool] = dataclasses.field(default_factory=dict)
  parameters: frozenset | None = None     # `_parameters`, once found
  inner_sensitive: Any = None
  hints: Hints = Hints()
  # A whole program (`Analyzer.__call__`): its outputs are not read by anything
  # XLA could fuse with this jaxpr's operations.
  top: bool = False
  # Updates whose result gets a barrier because a read was tied through them.
  forced_post: set[int] = dataclasses.field(default_factory=set)
  # Read results a barrier may not follow (a product an add takes into an FMA):
  # their reads are tied further on, past the arithmetic they feed (`_tie_frontier`).
  uncut: set[Any] = dataclasses.field(default_factory=set)
  # Slices of a buffer that only its elementwise update reads: tied where they
  # are read (`_reads_to_tie`).
  slice_reads: set[int] = dataclasses.field(default_factory=set)
  # Per update: results computed with the version it updates by a loop or call
  # XLA inlines, tied before it (`_co_outputs`), read through the barrier.
  co_reads: dict[int, set[Any]] = dataclasses.field(default_factory=dict)
  # Whether read-modify-write updates may be split (`_split_here`).
  splits_allowed: bool = True

  def sensitive(self, var) -> bool:
    """A barrier materialises the value it ties. Where that value feeds a float
    reduction or a transcendental, XLA would otherwise fuse it into that op, whose
    last bit can change with the fusion; such values are not tied. Nor values that
    reach an operation a barrier changed in an earlier compile (`Hints.avoid`)."""
    if self.hints.bold:
      return self.reaches_avoided(var)
    return (X.feeds_sensitive(var, self.g.eqns, self.g.consumers, self.sensitive_memo,
                              self.inner_sensitive,
                              lane_wise=self.hints.through_updates)
            or self.reaches_avoided(var))

  def reaches_avoided(self, var) -> bool:
    if not self.hints.avoid:
      return False
    memo = self.__dict__.setdefault("_avoid_memo", {})
    if var not in memo:
      avoid = self.hints.avoid
      memo[var] = self.g.search_uses(
          var, lambda w, k, e: FOUND if source_key(e) in avoid else FOLLOW)
    return memo[var]


def analyze_one(jaxpr, buffers: tuple[int, ...], in_loop: bool, manual: bool,
                analyzer: Analyzer, left: tuple[bool, ...] = (),
                targets: tuple[int | None, ...] = (),
                names: tuple[str | None, ...] = (), top: bool = False) -> Plan:
  """The passes, in order, over one jaxpr (sub-jaxprs through `analyzer`).

  Where read-modify-write splits leave barriers that cannot all be honoured (a
  split's gather needs another buffer's tied reads first, whose barrier needs this
  buffer's tied reads first: fuzz seed 5300 #9670), the passes run again without
  splits, and that plan is kept if it leaves fewer updates to XLA."""
  def passes(splits: bool):
    st = _State(Graph(analyzer.live(jaxpr)), buffers, in_loop, manual, targets=targets,
                names=names, inner_sensitive=analyzer.inner_sensitive,
                hints=analyzer.hints, top=top, splits_allowed=splits)
    find_versions(st, analyzer, left)
    pick_successors(st)
    order_reads(st)
    tie_reads(st)
    post_update_barriers(st)
    after_tie = tie_derived_reads(st)
    return st, make_plan(st, after_tie)

  def unsequenced(st: _State) -> int:
    return sum(c.kind is FindingKind.UNSEQUENCED for c in st.conflicts)

  st, plan = passes(True)
  if st.splits and unsequenced(st):
    st2, plan2 = passes(False)
    if unsequenced(st2) < unsequenced(st):
      return plan2
  return plan


# --------------------------------------------------------------------------- helpers


def dce(jaxpr):
  """Drops equations whose results are unused and that have no effects.

  A dead equation that reads a buffer would otherwise count as a read and, through
  a barrier, be kept alive.
  """
  live = {v for v in jaxpr.outvars if not C.is_literal(v)}
  keep = []
  for eqn in reversed(jaxpr.eqns):
    if eqn.effects or any(v in live for v in eqn.outvars if not C.is_drop_var(v)):
      keep.append(eqn)
      for v in eqn.invars:
        if not C.is_literal(v):
          live.add(v)
  if len(keep) == len(jaxpr.eqns):
    return jaxpr
  keep.reverse()
  return C.Jaxpr(jaxpr.constvars, jaxpr.invars, jaxpr.outvars, keep, jaxpr.effects,
                 jaxpr.debug_info)


def _src(eqn) -> str:
  return C.source_summary(eqn)


def source_key(eqn):
  """(file, line, primitive name) of the user frame that created `eqn`, or None."""
  frame = C.user_frame(eqn)
  if frame is None:
    return None
  return (frame.file_name, frame.start_line, eqn.primitive.name)


def _out(st: _State, k: int, use: InplaceUse):
  return st.g.eqns[k].outvars[use.output]


# --------------------------------------------------------------------------- 1. versions


def find_versions(st: _State, analyzer: Analyzer, left: Sequence[bool] = ()) -> None:
  """Runs each equation's rule; follows buffer versions forward through its uses.

  Small buffers are left alone, donated or not: their copies cost next to nothing,
  and XLA:CPU emits while loops that touch under 1 KiB as one kernel with its
  legacy emitter, which has no optimization barrier (it fails to compile, or aborts
  the process; xla/service/cpu/small_while_loop_hoisting_pass.cc).
  """
  g = st.g
  constant: set[Any] = set()
  ctx = _rules.Context(
      in_loop=st.in_loop, manual=st.manual, analyze=analyzer,
      constant=lambda v: C.is_literal(v) or v in constant,
      producer=g.producer_eqn, inner_sensitive=analyzer.inner_sensitive,
      refining=st.hints.through_updates, lower=st.hints.lower,
      left=lambda v: v in alone)
  levels: dict[Any, int] = {v: b for v, b in zip(g.jaxpr.invars, st.buffers, strict=True)
            if b and _rules.is_big(v.aval)}
  st.versions = set(levels)
  st.roots = {v: frozenset({i}) for i, v in enumerate(g.jaxpr.invars) if v in levels}
  # Versions of the buffers left alone: an update of one continues it, and no
  # chain of ours may start there (the operand's type, out of any equation).
  alone = {v for v, x in zip(g.jaxpr.invars, left) if x}
  # Versions an elementwise op made (a weak update): `_made_strongly_first`.
  weakly: set[Any] = set()
  startable: dict[Any, bool] = {}     # `_can_start`, asked once per value

  def can_start(v) -> bool:
    hit = startable.get(v)
    if hit is None:
      hit = startable[v] = _can_start(g, v)
    return hit

  for k, eqn in enumerate(g.eqns):
    if alone:
      types = [v.aval for v in eqn.invars if not C.is_literal(v) and v in alone]
      alone.update(o for o in eqn.outvars if not C.is_drop_var(o)
                   and any(_rules.same_type(o.aval, a) for a in types))
    cand = [0 if C.is_literal(v) or v in alone else
            levels.get(v) or (STARTED if can_start(v) else 0)
            for v in eqn.invars]
    if _traits.has(eqn.primitive, _traits.Trait.ELEMENTWISE):
      cand = _made_strongly_first(eqn, _unreturned_first(g, eqn, cand), weakly)
    info = _rules.eqn_info(eqn, cand, ctx)
    kept = []
    for use in info.uses:
      v, out = eqn.invars[use.operand], eqn.outvars[use.output]
      if C.is_drop_var(out):
        continue
      if v in st.versions or (use.strong and v in g.producer):
        st.versions.update((v, out))
        levels[out] = levels.setdefault(v, STARTED)
        st.roots[out] = st.roots.get(out, frozenset()) | st.roots.get(v, frozenset())
        st.updaters.setdefault(v, []).append((k, use))
        kept.append(use)
        if not use.strong:
          weakly.add(out)
    if len(kept) != len(info.uses):
      info = dataclasses.replace(info, uses=tuple(kept))
    st.infos.append(info)
    if not eqn.effects and all(C.is_literal(v) or v in constant for v in eqn.invars) \
        and not C.jaxprs_in_params(eqn.params):
      constant.update(v for v in eqn.outvars if not C.is_drop_var(v))


def _unreturned_first(g: Graph, eqn, cand: list[int]) -> list[int]:
  """The version levels an elementwise op may continue: where one operand is a
  version that is also returned and another, of the result's type, is one that is
  not, only the latter. Written over, the returned one would be a second value
  to keep (`where(x > 0, x, sin(x))` returning `sin(x)` too: `x` is the version
  the select continues, `sin(x)` a read of it)."""
  out = eqn.outvars[0].aval
  fits = [i for i, (v, c) in enumerate(zip(eqn.invars, cand)) if c
          and _rules.same_type(v.aval, out)]
  kept = [i for i in fits if eqn.invars[i] not in g.outvars]
  if not kept or len(kept) == len(fits):
    return cand
  return [0 if i in fits and i not in kept else c for i, c in enumerate(cand)]


def _made_strongly_first(eqn, cand: list[int], weakly: set) -> list[int]:
  """The version levels an elementwise op may continue: where operands of the
  result's type at the highest level include both a version an elementwise op
  made (`weakly`) and one an update or the caller made, only the latter. The op
  is then the next step of the buffer's chain of updates, and the other operand a
  value computed from an older version (`jnp.where(b > 0, b, -v)` after
  `v = b * b; b = b.at[i].set(...)`: the select continues the updated `b`, and
  `-v`, made from `b` before its update, is a read of it; fuzz seed 7600 #8263)."""
  out = eqn.outvars[0].aval
  fits = [i for i, (v, c) in enumerate(zip(eqn.invars, cand)) if c
          and _rules.same_type(v.aval, out)]
  if len(fits) < 2:
    return cand
  top = max(cand[i] for i in fits)
  fits = [i for i in fits if cand[i] == top]
  strong = [i for i in fits if eqn.invars[i] not in weakly]
  if not strong or len(strong) == len(fits):
    return cand
  return [0 if i in fits and i not in strong else c for i, c in enumerate(cand)]


def _can_start(g: Graph, v) -> bool:
  """Whether `v`, made inside this jaxpr, can become a buffer an update continues."""
  p = g.producer.get(v)
  return p is not None and _rules.is_big(v.aval) and _rules.can_root(g.eqns[p])


# --------------------------------------------------------------------------- 2. successors


def pick_successors(st: _State) -> None:
  """The update that continues each version in place: the one that leads to the
  output whose buffer it is (`_State.targets`) where that is known, else the one
  that leads to the first output it reaches."""
  g = st.g
  reaches_out = _reaching_outputs(st)

  def rank(v, u) -> int:
    reached = reaches_out.get(_out(st, *u), ())
    return 2 if not reached else 0 if _targets(st, v) & set(reached) else 1

  for v, ups in st.updaters.items():
    strong = [u for u in ups if u[1].strong]
    weak = [u for u in ups if not u[1].strong]
    # stable: strong[0] on a tie
    best = min(strong, key=lambda u: rank(v, u)) if strong else None
    if best is not None and rank(v, best) == 2:
      # No strong update leads to an output: a loop that carries the buffer
      # unchanged, whose result JAX forwards to the version before it. Chosen,
      # it would end the chain at a version nothing returns, and the whole chain
      # would be dropped. Instead the version is returned itself (the chain ends
      # there: fuzz seed 7900 #1253, a row set, then such a loop), or an
      # elementwise op continues it (`b * 2 + 7` after the loop, returned: fuzz
      # seed 7800 #580); the loop is one more read of it.
      best = None
    if best is not None:
      st.successor[v] = best
      if len(strong) > 1:
        other = next(u for u in strong if u is not best)
        st.conflicts.append(Conflict(
            FindingKind.TWO_LIVE_UPDATES,
            f"{len(strong)} updates of the same {v.aval.str_short()} version are "
            "live at once; each one but the first needs its own copy",
            read=_src(g.eqns[other[0]]), update=_src(g.eqns[best[0]]),
            nbytes=_rules.nbytes(v.aval),
            buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))
    elif v not in g.outvars:
      # A version that is returned ends its buffer's chain: an elementwise op that
      # reads it makes a new value, not the buffer's next version.
      # Of the elementwise ops that read it (`x + u` and `p - 0.1 * x` both have
      # x's type), the one that leads to x's own output: the one JAX aliases x to
      # (with two donated buffers of one type, x's is not the first of its type),
      # or the same carry of a loop body. Failing that (a call's body), the one
      # that leads to the first output.
      leading = sorted((u for u in weak if reaches_out.get(_out(st, *u))),
                       key=lambda u: (rank(v, u), reaches_out[_out(st, *u)][0]))
      if leading:
        st.successor[v] = leading[0]
  _drop_unreturned_chains(st)


def _targets(st: _State, v) -> set[int]:
  """The outputs whose buffers version `v` may continue (`_State.targets`)."""
  return {t for i in st.roots.get(v, ()) if i < len(st.targets)
          for t in (st.targets[i],) if t is not None}


def _argument(st: _State, v) -> str | None:
  """The argument whose buffer version `v` continues, by name, where it is one
  named argument's (`_State.names`)."""
  roots = st.roots.get(v, frozenset())
  if len(roots) != 1:
    return None
  (i,) = roots
  return st.names[i] if i < len(st.names) else None


def _reaching_outputs(st: _State) -> dict[Any, tuple[int, ...]]:
  """Versions that lead to an output through in-place uses (backward), each with
  the outputs it leads to, in order."""
  g = st.g
  reaches: dict[Any, set[int]] = {}
  for i, v in enumerate(g.jaxpr.outvars):   # in order: `g.outvars` is a set
    if not C.is_literal(v) and v in st.versions:
      reaches.setdefault(v, set()).add(i)
  for k in range(g.n - 1, -1, -1):
    for use in st.infos[k].uses:
      out = _out(st, k, use)
      if out in reaches:
        reaches.setdefault(g.eqns[k].invars[use.operand], set()).update(reaches[out])
  return {v: tuple(sorted(outs)) for v, outs in reaches.items()}


def _drop_unreturned_chains(st: _State) -> None:
  """A chain of updates whose last version is not returned is left alone: nothing
  needs that buffer afterwards, and XLA often removes such updates altogether (a
  read of the final version is rewritten to read what was written); barriers would
  keep them alive, and a read-only argument would then be copied."""
  chained = {_out(st, k, use) for k, use in st.successor.values()}
  for root in [v for v in st.successor if v not in chained]:
    chain, v = [], root
    on_chain: set = set()      # membership in one step, not a scan of the chain
    while v in st.successor and v not in on_chain:
      chain.append(v)
      on_chain.add(v)
      v = _out(st, *st.successor[v])
    if v not in st.g.outvars:
      for w in chain:
        del st.successor[w]


# --------------------------------------------------------------------------- 3. order


def order_reads(st: _State) -> None:
  """Orders every read of a version before the version's successor.

  Forward edges first: they follow the original order, so they can never close a
  cycle; backward ones (a read written after its update) are checked one by one.
  """
  g = st.g
  pending: list[tuple[int, int, Any]] = []   # (read eqn, update eqn, version)
  for v, (u, use) in st.successor.items():
    reads = sorted({k for k, pos in g.uses(v) if not (k == u and pos == use.operand)})
    if u in reads:
      reads.remove(u)
      st.conflicts.append(Conflict(
          FindingKind.UPDATE_READS_OLD,
          f"{g.eqns[u].primitive} both updates a {v.aval.str_short()} in place and "
          "reads its old value through another operand; XLA copies it",
          update=_src(g.eqns[u]), nbytes=_rules.nbytes(v.aval),
          buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))
    if v in g.outvars:
      st.conflicts.append(Conflict(
          FindingKind.OLD_VERSION_ESCAPES,
          f"the {v.aval.str_short()} value before an update is also returned; "
          "returning the old and the new value needs a copy",
          update=_src(g.eqns[u]), nbytes=_rules.nbytes(v.aval),
          buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))
    st.read_sets[v] = reads
    for r in reads:
      if r < u:
        g.edges[r].add(u)
      else:
        pending.append((r, u, v))
  for r, u, v in pending:
    if g.reaches(u, r):
      st.conflicting.add((r, v))
      st.conflicts.append(Conflict(
          FindingKind.READ_DEPENDS_ON_UPDATE,
          f"a read of the old {v.aval.str_short()} value depends on the updated "
          "value, so it cannot run before the update; XLA keeps a copy of the old "
          "value", read=_src(g.eqns[r]), update=_src(g.eqns[u]),
          nbytes=_rules.nbytes(v.aval),
          buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))
    else:
      g.edges[r].add(u)
      st.moved.add(r)


# --------------------------------------------------------------------------- 4. ties


def tie_reads(st: _State) -> None:
  """Decides, per version, which reads go through a barrier before its update."""
  g = st.g
  for v, (u, use) in st.successor.items():
    reads = [r for r in st.read_sets[v] if (r, v) not in st.conflicting]
    ueqn = g.eqns[u]
    if ueqn.primitive is C.optimization_barrier_p:
      # The user's own barrier is the ordering; reads it ties need nothing more.
      reads = [r for r in reads
               if not any(w in ueqn.invars for w in g.eqns[r].outvars)]
    p = g.producer.get(v)
    if not reads and not _split_here(st, v, u, use) and not _co_outputs(st, v, p):
      continue    # no barrier to place: nothing is read, split or computed with it
    if p is not None and not _cut_safe_at(st, g.eqns[p], v):
      # A barrier right after arithmetic could change rounding: this version's
      # reads stay as they were (values exact, XLA may copy).
      continue
    if _avoided(st, ueqn) or (p is not None and _avoided(st, g.eqns[p])):
      continue    # a barrier here changed the arithmetic in an earlier compile
    split = _split_here(st, v, u, use)
    tied = _reads_to_tie(st, reads, u, use, v, split)
    frontier_vars, region, tied = _frontiers(st, tied, u, v)
    # Every read left untied runs after the barrier and reads its output. Read
    # from the version before the barrier, it would be a second value of one
    # buffer, and XLA:CPU has fused such a read into the in-place update itself and
    # returned wrong values (a row swap in bfloat16, in the fuzzer).
    left = set(reads) - set(tied) - region
    if left:
      left -= _feeding_ties(g, left, frontier_vars, u)
    st.after_pre.setdefault(u, set()).update(left)
    if split:
      st.splits.add(u)
    # A read's results are tied even when they are buffers themselves (the result
    # of a second update of this version): the copy that update needs must be
    # taken before this version is overwritten.
    co = _co_outputs(st, v, p)
    read_vars = [w for w in frontier_vars if w is not v] + co
    if read_vars or split:
      _add_pre_barrier(st, u, v, read_vars, tied, region, split)
    if co and p is not None and st.infos[p].forwards_reads:
      # Results of a loop or call XLA inlines are used through the barrier
      # (`_rewrite._kept_control`): their users run after it (`tie_derived_reads`).
      st.co_reads.setdefault(u, set()).update(co)


def _feeding_ties(g: Graph, reads: set[int], frontier_vars: list[Any], u: int
                  ) -> set[int]:
  """The reads that tied values are computed from, and that XLA cannot fuse into
  update `u` (no result of theirs is among what `u`'s operands are computed from
  by operations XLA fuses into a loop, `_rewrite.loop_fused_reach`): they run
  before the barrier by data, so an untied one is left where it is rather than
  after the barrier, where it would close a cycle with the tied value it feeds
  (a ring buffer's `softmax(h @ buf.T) @ buf`, the second product tied, the
  transpose before the first not; a layer's forward product, untied, that its
  backward product, tied, is computed from). Fused into the update, such a read
  would read the buffer the update writes (`_rewrite.reads_across_barrier`)."""
  if not reads or not frontier_vars:
    return set()
  # Producers precede their users: a path back from a tied value to a read only
  # passes equations after that read.
  window = set(range(min(reads), u))
  fed: set[int] = set()
  for w in frontier_vars:
    fed |= g.ancestors_within(w, window)
  if not fed.intersection(reads):
    return set()
  fused: set[Any] = set()
  for w in g.eqns[u].invars:
    if not C.is_literal(w):
      fused |= loop_fused_reach(w, g.jaxpr, g.producer)
  return {r for r in reads if r in fed and fused.isdisjoint(g.eqns[r].outvars)}


def _unrolled_loop(st: _State, u: int) -> bool:
  """Whether update `u` is a loop a refinement round takes XLA to unroll into
  straight-line code (one trip: `EqnInfo.forwards_reads`). A value computed from
  the buffer before the loop and passed in, `b * 0.5 + 1` read by the body after
  it updates `b`, is then fused into the body's readers after the update: XLA
  copies the buffer (fuzz seed 7400 #1199)."""
  e = st.g.eqns[u]
  return st.hints.through_updates and st.infos[u].forwards_reads and \
      e.primitive in (C.scan_p, C.while_p)


def _tied_into(st: _State, u: int) -> bool:
  """Whether an earlier compile copied a buffer for update `u` without naming a
  read (`Hints.tie_into`): its reads are all tied before it, and it is not split
  (a split scatter becomes a select of the update and the old buffer, which XLA
  computes in another buffer and copies in; fuzz seed 4100 #5073)."""
  if not st.hints.tie_into:
    return False
  # A loop whose body holds the update: its operands' reads too (a one-trip loop
  # XLA inlines reads them where the body's update writes; fuzz seed 5100 #298).
  # Not a call's or a conditional's: tying every operand read of a nested jit
  # changed the arithmetic of fuzz seed 4400 #1087.
  eqn = st.g.eqns[u]
  nested = _nested_eqns(eqn) if eqn.primitive in (C.while_p, C.scan_p) else (eqn,)
  return any((source_key(e) or ())[:2] in st.hints.tie_into for e in nested)


def _nested_eqns(eqn):
  """`eqn` and every equation of the jaxprs in its parameters, recursively."""
  yield eqn
  for sub in C.sub_jaxprs(eqn.params):
    for e in sub.eqns:
      yield from _nested_eqns(e)


def _split_here(st: _State, v, u: int, use: InplaceUse) -> bool:
  """Whether update `u` of `v` is split into read, barrier, write.

  Splits trace helper equations whose types carry no manual-axis information, so
  they are left out inside `shard_map` bodies. A version that is a fresh
  elementwise result is not split either: XLA computes it and the update in one
  fusion, and the split would force it into a buffer of its own. Nor for 16-bit
  floats: XLA:CPU computes them through f32 converts, where its simplifier treats
  `x + 0` differently once split (the sign of -0.0 changed). Nor an additive
  scatter whose result an add consumes: XLA moves that add in front of the
  scatter under jax.jit (`_exactness.reassociated`), which the split's
  read-add-write no longer allows (fuzz seed 2044 #1262).
  """
  g = st.g
  ueqn = g.eqns[u]
  p = g.producer.get(v)
  made_weakly = p is not None and _made_by(st, p, v, strong=False)
  return (st.splits_allowed and st.infos[u].splittable and not st.in_loop
          and not st.manual
          and not _tied_into(st, u)
          and use.operand == 0 and not _rules.normalised_float(v.aval)
          and not made_weakly
          and (ueqn.primitive not in _updates.ADDITIVE or (X.additive_source_safe(
              ueqn.invars[2], g.eqns, g.producer) and not X.reassociated(
                  ueqn, ueqn.outvars[0], g.eqns, g.consumers, g.outvars,
                  _inlined(st), _parameters(st)))))


def _reads_to_tie(st: _State, reads: list[int], u: int, use: InplaceUse, v,
                  split: bool) -> list[int]:
  """The reads of `v` to order through the barrier (before the frontier search).

  A read that only feeds its own update is ordered by data. A barrier there would
  change the update's fusion: inside loops that costs speed (20x measured), and
  anywhere it can change how XLA vectorises or contracts the arithmetic between the
  read and the write, and so the last bit. (Not for 16-bit floats: XLA:CPU computes
  them through f32 converts, and a read fused into a converting update is not done
  in place.)
  """
  if not reads:
    return []     # nothing to tie: the walks below would only find what is private
  g = st.g
  tied = reads
  chain_only: set[int] | None = None
  if not use.strong:
    # An elementwise update runs as one loop over the buffer, writing each element
    # where it reads it: a slice of the buffer that only that loop reads (a row
    # broadcast, `x * 0.99 - 0.25 * x[13]`) would be read after elements of it are
    # written. Such a read is tied where it is read (data movement: no value
    # changes) and loaded from memory, as XLA loads it from its copy under jax.jit.
    sliced = [r for r in reads if _traits.has(g.eqns[r].primitive, _traits.Trait.SLICING)]
    if sliced:
      chain_only = _private_ancestors(g, u, _weak_chain(st, u, use))
      st.slice_reads.update(r for r in sliced if r in chain_only)
  if (use.strong or st.hints.clone) and not _rules.normalised_float(v.aval):
    if st.hints.clone and chain_only is not None:
      private = set(chain_only)      # the same walk, done above
    else:
      private = _private_ancestors(g, u, _weak_chain(st, u, use) if st.hints.clone
                                   else frozenset((u,)))
    if split:
      # The split reads the old values before the barrier, at the update's
      # indices: reads those indices are computed from must come first.
      private -= g.ancestors_within(g.eqns[u].invars[1], private)
    private -= st.slice_reads
    if st.hints.tie:
      # Reads XLA did not order by itself in an earlier compile are tied anyway,
      # and so are the reads they are computed from (a gather's index from an
      # argmax over a row): run after the barrier, those would close a cycle
      # (fuzz seed 5100 #298).
      named = {k for k in private if source_key(g.eqns[k]) in st.hints.tie}
      for k in list(named):
        for w in g.eqns[k].invars:
          named |= g.ancestors_within(w, private)
      private -= named
    if _tied_into(st, u) or _unrolled_loop(st, u):
      # An earlier compile copied for this update without naming a read: its
      # own reads are tied too. So are those of a loop XLA unrolls: its body's
      # operations, the update among them, take the read's place, and a read
      # fused into one of them after the update reads the overwritten buffer.
      private = set()
    tied = [r for r in reads if r not in private]
    st.after_pre.setdefault(u, set()).update(r for r in reads if r in private)
  safe = []
  for r in tied:
    outs = [w for w in g.eqns[r].outvars if not C.is_drop_var(w)]
    uncut = [w for w in outs if not _cut_safe(st, g.eqns[r], w)]
    if uncut and not (st.hints.through_updates and _traits.has(
        g.eqns[r].primitive, _traits.Trait.ELEMENTWISE)):
      _untied(st, r, u, v, _UNCUT.format(g.eqns[r].primitive))
      continue
    # In a refinement round (copies remained), an elementwise result a barrier may
    # not follow is tied where the arithmetic it feeds ends instead
    # (`_tie_frontier`): `b1 - 0.01 * b0`, whole, before b0's update, its
    # multiply-add in one fusion as under jax.jit. Not in the first round: there
    # the larger fusions it moves changed more programs' arithmetic than it freed
    # (fuzz seed 2062: 5 lost, 4 won).
    st.uncut.update(uncut)
    safe.append(r)
  return safe


_UNCUT = ("its result comes from {}, and a barrier right after it could change "
          "how XLA computes it")


def _frontiers(st: _State, tied: list[int], u: int, v):
  """Each tied read's frontier (`_tie_frontier`); reads that cannot be tied without
  changing a value are dropped (left as they are)."""
  frontier_vars: list[Any] = []
  region: set[int] = set()
  kept = []
  for r in tied:
    if r in st.slice_reads:
      f: tuple[list[Any], set[int]] | None = (
          [w for w in st.g.eqns[r].outvars if not C.is_drop_var(w)], set())
    else:
      f = None
      if st.hints.clone and not st.hints.bold:
        f = _tie_frontier(st, r, u, v, past_contractions=True)
      if f is None:
        f = _tie_frontier(st, r, u, v)
      if f is None and st.hints.bold:
        f = _moved_read(st, r)
    if f is None:
      eqn = st.g.eqns[r]
      if any(w in st.uncut for w in eqn.outvars):
        _untied(st, r, u, v, _UNCUT.format(eqn.primitive))
      else:
        _untied(st, r, u, v, "it feeds a reduction, a transcendental, a dot or a "
                "loop whose result could change if a barrier moved its fusion")
      continue
    kept.append(r)
    frontier_vars.extend(f[0])
    region |= f[1]
  return frontier_vars, region, kept


def _moved_read(st: _State, r: int) -> tuple[list[Any], set[int]] | None:
  """In the bold round, a read that moves data and no more (a row's slice) whose
  frontier does not exist (its values reach a reduction after the update) is
  tied where it is read: the barrier passes the same values on, and the kernels'
  IR check refuses the candidate should a reader's fusion compute otherwise
  (fuzz seed 7200 #620: row 5 of b1, read before the row is set and subtracted
  from the whole updated buffer before its sum). Not in the clone rounds: there
  it changed candidates that earlier ran (seed 7200 #2302, #8870 copied more)."""
  eqn = st.g.eqns[r]
  outs = [w for w in eqn.outvars if not C.is_drop_var(w)]
  if not outs or not _traits.has(eqn.primitive, _traits.Trait.DATA_MOVEMENT) or \
      eqn.effects or any(w in st.uncut for w in outs):
    return None
  return outs, set()


def _cut_safe(st: _State, eqn, var) -> bool:
  """Whether a barrier may follow `var`; in a refinement round, also after a product
  nothing adds (`_exactness.cut_safe_here`), which the fingerprint then checks."""
  if st.hints.bold:
    return _no_fold_across(st, eqn, var)
  if st.hints.through_updates:
    return X.cut_safe_here(eqn, var, st.g.eqns, st.g.consumers,
                           inputs_plain=not _inlined(st)) and \
        _no_fold_across(st, eqn, var)
  return _cut_safe_at(st, eqn, var)


def _cut_safe_at(st: _State, eqn, var) -> bool:
  """`_exactness.cut_safe_var`, no add XLA would move across the barrier, and no
  transpose XLA would fold into a dot."""
  return X.cut_safe_var(eqn, var) and _no_fold_across(st, eqn, var)


def _no_fold_across(st: _State, eqn, var) -> bool:
  """No rewrite XLA would make across a barrier after `var` (`_exactness`); asked
  about one value up to a few times per pass, answered once."""
  key = (var, id(eqn))
  hit = st.no_fold_memo.get(key)
  if hit is None:
    g = st.g
    hit = st.no_fold_memo[key] = not X.reassociated(
        eqn, var, g.eqns, g.consumers, g.outvars, _inlined(st), _parameters(st)) and \
        not X.folded_into_dot(eqn, var, (g.eqns[c].primitive for c, _ in g.uses(var))) \
        and not X.constants_folded(eqn, var, (g.eqns[c] for c, _ in g.uses(var))) and \
        not X.excess_precision(eqn, var, g.eqns, g.consumers)
  return hit


def _parameters(st: _State) -> frozenset:
  """The inputs of a whole program (its arguments: no value XLA knows when it
  compiles); none inside a loop, a conditional or a call, whose inputs may be
  constants of the caller."""
  if st.parameters is None:
    st.parameters = (frozenset(st.g.jaxpr.invars) if st.top and not st.in_loop
                     else frozenset())
  return st.parameters


def _inlined(st: _State) -> bool:
  """Whether XLA may inline this jaxpr into its caller, where an add could consume
  what it returns: a call's or a one-trip loop's body, or a program called inside
  another's jit; not a whole program, not a loop body XLA keeps."""
  return not st.top and not st.in_loop


def _untied(st: _State, r: int, u: int, v, why: str) -> None:
  g = st.g
  st.conflicts.append(Conflict(
      FindingKind.WOULD_CHANGE_ARITHMETIC,
      f"the read of the {v.aval.str_short()} buffer is not ordered before its "
      f"update by a barrier: {why}",
      read=_src(g.eqns[r]), update=_src(g.eqns[u]), nbytes=_rules.nbytes(v.aval),
      buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))


def _co_outputs(st: _State, v, p: int | None) -> list[Any]:
  """Results computed together with version `v` (a loop's other outputs, a call's),
  which may be reads of it that XLA inlines (a loop of one trip): tied too.

  Results computed without this buffer read nothing of it, inlined or not: they are
  left free (tied, a constant one would be hidden from XLA's simplifier, which
  folds `-0.0 + 0.0` under jax.jit).
  """
  g = st.g
  if p is None or len(g.eqns[p].outvars) <= 1:
    return []
  co = [w for w in g.eqns[p].outvars
        if w is not v and not C.is_drop_var(w) and w not in st.versions
        and g.is_live(w)]
  if not co:
    return []
  src = [use.operand for use in st.infos[p].uses if g.eqns[p].outvars[use.output] is v]
  free = _rules.outputs_free_of(g.eqns[p], src)
  co = [w for k, w in enumerate(g.eqns[p].outvars) if k not in free and w in co]
  return [w for w in co if _cut_safe_at(st, g.eqns[p], w) and not st.sensitive(w)]


def _add_pre_barrier(st: _State, u: int, v, read_vars, tied, region, split) -> None:
  g = st.g
  st.pre_versions.setdefault(u, []).append(v)
  lst = st.pre_reads.setdefault(u, [])
  for w in read_vars:
    if w not in lst:
      lst.append(w)
  st.pre_read_eqns.setdefault(u, set()).update(tied)
  st.pre_read_eqns[u].update(region)
  st.pre_sources.setdefault(u, []).extend(_src(g.eqns[r]) for r in tied)
  idx_p = g.producer.get(g.eqns[u].invars[1]) if split else None
  if idx_p is not None:
    # The split's gather, at the barrier, needs the indices computed.
    st.pre_read_eqns[u].add(idx_p)


_REGION_LIMIT = 64


def _tie_frontier(st: _State, r: int, u: int, v=None, past_contractions: bool = False
                  ) -> tuple[list[Any], set[int]] | None:
  """Where to tie read `r` of version `v` before update `u`.

  Returns (variables to tie, equations to run before the barrier besides `r`), or
  None when that is impossible without changing a value. A float value that feeds
  a reduction or a transcendental is not tied itself, since XLA would fuse it into
  that op and the op's result can change with its fusion; instead the fusible
  equations between the read and those ops (the read's fusion region) run before
  the barrier, and the values leaving the region are tied: reduction results,
  operands of ops XLA never fuses into (dots, loops), outputs of the function.

  `past_contractions` (clone rounds): a value that is itself a multiply-add
  (`_multiply_added`) is not tied either, but followed into its readers' fusions.
  Whether LLVM contracts the product depends on the fusion that computes it: in
  a reader's fusion over one column (an argmin of `b[:, k]` after `b = b - c *
  b[:, j:j+1]`) the row's product has one use and is contracted, as under
  jax.jit; tied whole, the product is computed once per row for every column,
  not contracted, and the reader loads other values (fuzz seed 7200 #3724).
  """
  g = st.g
  ties: list[Any] = []
  region: set[int] = set()
  stack = _read_outputs(g.eqns[r], v)
  seen = set()
  while stack:
    w = stack.pop()
    if w in seen or not g.is_live(w):
      continue
    seen.add(w)
    p = g.producer.get(w)
    uncut = w in st.uncut
    if not uncut and not st.sensitive(w) and not _after_avoided(st, w) and (
        p is None or _no_fold_across(st, g.eqns[p], w)) and not (
            st.hints.clone and _fused_onward(st, w)) and not (
                past_contractions and w not in g.outvars and _multiply_added(st, w)):
      ties.append(w)        # everything downstream rounds the same fused or not
      continue
    if w in g.outvars:
      if uncut:
        return None
      ties.append(w)
    for c, _ in g.uses(w):
      if c in region:
        continue
      step = _frontier_step(st, c, u, w, region)
      if step is None:
        return None
      if step == "tie":
        if uncut or (p is not None and not _no_fold_across(st, g.eqns[p], w)):
          return None     # a transpose a dot folds in, or an add XLA moves
        if w not in ties:
          ties.append(w)
      else:
        ties.extend(step[0])
        stack.extend(step[1])
  return ties, region


def _multiply_added(st: _State, w, depth: int = 0) -> bool:
  """Whether float `w` is an add or subtract with a product among its operands,
  or data movement of one: code LLVM may contract into an FMA, in the fusion of
  whatever reads `w`."""
  g = st.g
  p = g.producer.get(w)
  if p is None or depth > 4 or not X.is_inexact(w):
    return False
  e = g.eqns[p]
  if e.primitive.name in ("add", "sub"):
    return any(_product(st, x, depth + 1) for x in e.invars if not C.is_literal(x))
  # Data movement counts where the moved value goes on to reductions only (a
  # column's argmin): XLA fuses the whole chain, multiply-add included, into the
  # reduction's fusion.
  if _traits.has(e.primitive, _traits.Trait.DATA_MOVEMENT) and (
      depth > 0 or _reduced_onward(st, w, 0)):
    return any(_multiply_added(st, x, depth + 1) for x in e.invars if not C.is_literal(x))
  return False


def _reduced_onward(st: _State, w, depth: int) -> bool:
  """Whether every use of `w` is a reduction, through data movement."""
  g = st.g
  uses = g.uses(w)
  if not uses or w in g.outvars or depth > 4:
    return False
  for c, _ in uses:
    e = g.eqns[c]
    if _traits.has(e.primitive, _traits.Trait.REDUCTION):
      continue
    if not _traits.has(e.primitive, _traits.Trait.DATA_MOVEMENT) or not all(
        _reduced_onward(st, o, depth + 1) for o in e.outvars if not C.is_drop_var(o)):
      return False
  return True


def _product(st: _State, w, depth: int) -> bool:
  """Whether `w` is a product, through data movement and negation."""
  p = st.g.producer.get(w)
  if p is None or depth > 8:
    return False
  e = st.g.eqns[p]
  if e.primitive.name == "mul":
    return True
  if e.primitive.name == "neg" or _traits.has(e.primitive, _traits.Trait.DATA_MOVEMENT):
    return any(_product(st, x, depth + 1) for x in e.invars if not C.is_literal(x))
  return False


def _read_outputs(eqn, v) -> list[Any]:
  """The outputs of read `eqn` computed from version `v` (all of them where none
  is, or `v` is not given): a loop that reads `v` and carries another buffer
  (fuzz seed 6800 #8088: a scan over b1 that sums an element of b0) is ordered
  before `v`'s update by its results from `v`; tying its other buffer too would
  keep that buffer's old value alive across the later updates of it that the
  barrier waits for, and XLA would copy it."""
  outs = [w for w in eqn.outvars if not C.is_drop_var(w)]
  if v is None or len(outs) < 2:
    return outs
  pos = [i for i, x in enumerate(eqn.invars) if x is v]
  if not pos:
    return outs
  free = _rules.outputs_free_of(eqn, pos)
  kept = [w for k, w in enumerate(eqn.outvars) if not C.is_drop_var(w) and k not in free]
  return kept or outs


def _fused_onward(st: _State, w) -> bool:
  """Whether XLA computes `w` inside the fusions of the equations that read it (each
  a cheap one, `_passes.clone_shared` having given each its own copy): tied, it
  would be stored and read from memory instead."""
  g = st.g
  if w in g.outvars or not g.uses(w):
    return False
  p = g.producer.get(w)
  if p is not None and _traits.has(g.eqns[p].primitive, _traits.Trait.REDUCTION) \
      and _feeds_update(st, w):
    # XLA fuses a reduction into the cheap operations that read its result (a
    # mean's division), but not into an update's fusion: there jax.jit stores
    # the result, and so does a tie here. Tied further on, the reduction was
    # fused into the tied value's fusion, for the few elements it reads (fuzz
    # seed 8800 #672: the mean of a column set, negated and added into a row).
    return False
  return all(fused_into_readers(g.eqns[c], st.hints.clone)
             for c, _ in g.uses(w))


def _feeds_update(st: _State, w) -> bool:
  """Whether `w` reaches an update through operations XLA computes again in each
  reader (`fused_into_readers` at the round's clone level)."""
  def step(x, k, e) -> str:
    if _traits.has(e.primitive, _traits.Trait.UPDATE):
      return FOUND
    return FOLLOW if fused_into_readers(e, st.hints.clone) else STOP

  return st.g.search_uses(w, step)


def _frontier_step(st: _State, c: int, u: int, w, region: set[int]):
  """What to do with consumer `c` of the sensitive value `w`: "tie" `w` itself,
  None (impossible), or (values to tie, values to follow) after adding `c` to the
  region."""
  g = st.g
  e = g.eqns[c]
  if _avoided(st, e) and (not _traits.any_of(e.primitive, _traits.FUSIBLE)
                         or c == u or g.reaches(c, u)):
    return None         # its arithmetic changed when a read was tied before it
  if c == u or (g.reaches(c, u) and not (
      _unrolled_loop(st, u) and _traits.any_of(e.primitive, _traits.FUSIBLE)
      and not _traits.has(e.primitive, _traits.Trait.UPDATE))):
    # Toward the update, the tied value is used (after the barrier): computed from
    # the buffer before it, it would be fused into the update, which then reads the
    # buffer it writes and cannot be done in place. A loop XLA unrolls is no
    # fusion: what its operand is computed by runs before the barrier, and the
    # operand is tied (`b * 0.5 + 1` whole, its multiply-add in one fusion as
    # under jax.jit: fuzz seed 7400 #1199).
    return "tie"
  if _traits.any_of(e.primitive, _traits.FUSIBLE):
    if (st.hints.through_updates and _traits.has(e.primitive, _traits.Trait.UPDATE)
        and g.eqns[c].invars[0] is not w and _moved_only(st, w, region)):
      # The values are written into a buffer by a later update and only read from
      # memory afterwards: tied, they are the same memory; the update's result gets
      # a barrier so that no read of it is forwarded to them.
      st.forced_post.add(c)
      return "tie"
    if e.effects or g.reaches(u, c) or len(region) >= _REGION_LIMIT:
      return None
    region.add(c)
    outs = [o for o in e.outvars if not C.is_drop_var(o)]
    if _traits.has(e.primitive, _traits.Trait.REDUCTION):
      live = [o for o in outs if g.is_live(o)]
      if st.hints.clone and all(_fused_onward(st, o) for o in live):
        # Its result read by cheap operations only, which XLA fuses into the
        # reduction's fusion (a mean's division): tied where that fusion ends.
        return [], live
      return live, []
    return [], outs
  if C.jaxprs_in_params(e.params):
    if (st.hints.through_updates and e.primitive is C.scan_p
        and int(e.params.get("unroll", 1)) < e.params["length"]
        and _moved_only(st, w, region)):
      # A scan XLA keeps takes its operands materialised: data movement of the
      # buffer tied before it is the value the loop reads either way (and a
      # reduction XLA hoists out of the body is compared by the fingerprint).
      return "tie"
    return None         # used sensitively inside a loop, branch or call
  dot = _dot_step(st, c, u, region)
  if dot is not None:
    return dot
  return "tie"          # an op XLA does not fuse its operand into


def _dot_step(st: _State, c: int, u: int, region: set[int]):
  """A dot reading the tied value, taken into the region where that changes no
  value: a dot without contracting dimensions, which XLA rewrites into a multiply
  and fuses (its operand, tied, would be read from memory instead of recomputed in
  that fusion), and a dot whose results only leave the jaxpr (materialised as they
  are, nothing after them to fold a transpose into; they are tied). A backward
  scan's step reads the cotangent row this way before zeroing it. None: tie the
  dot's operand, as for any op XLA does not fuse into."""
  g = st.g
  e = g.eqns[c]
  if (e.primitive is not C.dot_general_p or e.effects or g.reaches(u, c)
      or len(region) >= _REGION_LIMIT):
    return None
  outs = [o for o in e.outvars if not C.is_drop_var(o) and g.is_live(o)]
  (contracting, _), _ = e.params["dimension_numbers"]
  if not contracting:
    region.add(c)
    return [], outs
  if outs and all(o in g.outvars and not g.uses(o) for o in outs):
    region.add(c)
    return outs, []
  return None


def _avoided(st: _State, eqn) -> bool:
  return bool(st.hints.avoid) and source_key(eqn) in st.hints.avoid


def _after_avoided(st: _State, w) -> bool:
  """Whether `w` is the result of an operation whose arithmetic changed when a read
  was tied before it in an earlier compile: that operation joins the read's region
  (it runs before the barrier, fused as under jax.jit) and the tie moves past it."""
  p = st.g.producer.get(w)
  return p is not None and _avoided(st, st.g.eqns[p])


def _moved_only(st: _State, w, region: set[int]) -> bool:
  """Whether `w` is computed from memory by data movement alone (its producer and
  everything in the read's region so far move data without arithmetic)."""
  g = st.g
  p = g.producer.get(w)
  if p is None or not _traits.has(g.eqns[p].primitive, _traits.Trait.DATA_MOVEMENT):
    return False
  return all(_traits.has(g.eqns[k].primitive, _traits.Trait.DATA_MOVEMENT)
             for k in region)


def _sliced_in_call(eqn, pos: int, tie) -> bool:
  """Whether call `eqn` (a nested jit, say) slices its operand `pos` in its body,
  where an earlier compile showed that slice reading the old buffer (`tie`, in a
  refinement round; None: any slice), and otherwise only updates it in place: XLA
  inlines the call and forwards the slice to the buffer before the update, or
  recomputes an elementwise update's result in the slice's fusion. (A barrier in
  front of a call that computes with the whole operand would move that
  arithmetic's fusion.)"""
  body = _rules.call_body(eqn)
  if (tie is not None and not tie) or body is None or pos >= len(body.invars):
    return False
  v = body.invars[pos]
  users = [(e, [i for i, w in enumerate(e.invars) if w is v]) for e in body.eqns]
  users = [(e, ps) for e, ps in users if ps]
  in_place = (C.dynamic_update_slice_p, *C.SCATTER_PRIMITIVES)
  return any(X.is_slicing(e) and (tie is None or source_key(e) in tie)
             for e, _ in users) and all(
      X.is_slicing(e) or (e.primitive in in_place and ps == [0]) for e, ps in users)


def _recomputed(st: _State, use: InplaceUse, c: int) -> bool:
  """In a refinement round: whether XLA may recompute an elementwise update's result
  inside reader `c`'s fusion (it duplicates cheap elementwise producers into their
  consumers), reading the buffer after the update overwrote it."""
  return st.hints.through_updates and not use.strong and \
      _traits.has(st.g.eqns[c].primitive, _traits.Trait.ELEMENTWISE)


def _fused_reader(st: _State, out, c: int) -> bool:
  """In a refinement round: whether XLA may fuse an update into reader `c` (a
  reduction over the whole new version, say), reading the old buffer there, and a
  barrier between them changes no value: the values are integers, the reader is
  a reduction whose combiner does not round (max, min, argmax, and, or), or it is
  elementwise (each of its elements reads one element, moved or not; a
  transcendental over a fused dynamic-update-slice and over the materialised one
  gave the same bits, docs/xla_notes.md; the fingerprint checks the rest)."""
  if not st.hints.through_updates:
    return False
  e = st.g.eqns[c]
  if _traits.has(e.primitive, _traits.Trait.ELEMENTWISE):
    return True
  exact_reduction = (_traits.has(e.primitive, _traits.Trait.REDUCTION)
                     and not _traits.eqn_has(e, _traits.Trait.SENSITIVE))
  return exact_reduction or not X.is_inexact(out)


def _moved_to_sensitive(st: _State, var) -> bool:
  """Whether every fusion-sensitive op `var` reaches reads it through data movement
  alone (a sum of a row of it, say): behind a barrier such an op reads memory, as
  under jax.jit, where XLA forwards the read to the buffer before the update."""
  def step(w, k, e) -> str:
    if _traits.eqn_has(e, _traits.Trait.SENSITIVE):
      return STOP
    if _traits.eqn_has(e, _traits.Trait.DATA_MOVEMENT):
      return FOLLOW
    outs = [o for o in e.outvars if not C.is_drop_var(o)]
    if any(st.sensitive(o) for o in outs) or (
        C.jaxprs_in_params(e.params) and st.sensitive(w)):
      return FOUND       # a sensitive op reads more than moved data
    return STOP

  return not st.g.search_uses(var, step)


def _weak_chain(st: _State, u: int, use: InplaceUse) -> frozenset[int]:
  """Update `u` and the elementwise updates that continue its version, up to the
  first update that must be in place (`InplaceUse.strong`): XLA computes such a
  chain in one fusion, reading what the chain reads."""
  chain = {u}
  v = _out(st, u, use)
  while v in st.successor:
    k, nxt = st.successor[v]
    if nxt.strong or k in chain:
      break
    chain.add(k)
    v = _out(st, k, nxt)
  return frozenset(chain)


def _private_ancestors(g: Graph, u: int, chain: frozenset[int] = frozenset()) -> set[int]:
  """Equations whose results flow only into update `u` (directly or through others),
  or into the elementwise updates `chain` that continue its version (a clone round,
  `_weak_chain`).

  Inside a loop such a read is ordered before the update by data alone, and XLA then
  fuses it with the update in place; a barrier there only costs speed. Visited from
  `u` backwards in decreasing position, so every user of an equation is decided
  before the equation is, and the walk stops at the first shared value.
  """
  private: set[int] = set()
  heap: list[int] = []
  seen: set[int] = set()

  def push_producers(k):
    for v in g.eqns[k].invars:
      if C.is_literal(v):
        continue
      p = g.producer.get(v)
      if p is not None and p not in seen and p not in chain:
        seen.add(p)
        heapq.heappush(heap, -p)

  for k in sorted(chain | {u}):
    push_producers(k)
  while heap:
    k = -heapq.heappop(heap)
    shared = any(w in g.outvars or any(c != u and c not in chain and c not in private
                                       for c, _ in g.uses(w))
                 for w in g.eqns[k].outvars if not C.is_drop_var(w))
    if not shared:
      private.add(k)
      push_producers(k)
  return private


# --------------------------------------------------------------------------- 5. post


def post_update_barriers(st: _State) -> None:
  """Barriers after updates whose results are sliced: XLA's simplifier would
  otherwise rewrite a read of the new version into a read of the old buffer."""
  g = st.g
  for k, info in enumerate(st.infos):
    for use in info.uses:
      out = _out(st, k, use)
      v = g.eqns[k].invars[use.operand]
      if C.is_drop_var(out) or v not in st.successor or st.successor[v][0] != k:
        continue
      # In a refinement round (`Hints.materialise`): every update of the buffer.
      into = st.hints.materialise or _tied_into(st, k)
      if not (info.forwards_reads or not use.strong or into):
        continue
      if not _cut_safe_at(st, g.eqns[k], out) or _avoided(st, g.eqns[k]) or \
          source_key(g.eqns[k]) in st.hints.unposted:
        continue
      nxt = st.successor.get(out)
      # The use of `out` by the update that continues it, if any.
      cont = (nxt[0], nxt[1].operand) if nxt is not None else None
      # Only slicing reads can be forwarded to the old buffer; a barrier in front
      # of arithmetic would change what XLA fuses, and so last-bit rounding.
      has_reads = any(((c, pos) != cont
                       and (X.is_slicing(g.eqns[c]) or _recomputed(st, use, c)
                            or _fused_reader(st, out, c)))
                      # A call that slices it (then updates it, maybe): inlined, a
                      # slice XLA forwards to the old buffer as outside.
                      or _sliced_in_call(g.eqns[c], pos, st.hints.tie)
                      # An elementwise result XLA would recompute there.
                      or (not use.strong and _sliced_in_call(g.eqns[c], pos, None))
                      for c, pos in g.uses(out))
      # A split successor reads `out` with a gather, a slicing read too.
      has_reads = has_reads or (nxt is not None and nxt[0] in st.splits)
      # In a refinement round: an update an earlier compile showed recomputed
      # inside a reader's fusion (the reader's copy names the update itself as a
      # read of the old value): its result, materialised, is what readers read.
      dup = (st.hints.through_updates and use.strong
             and source_key(g.eqns[k]) in st.hints.tie
             and any((c, pos) != cont for c, pos in g.uses(out)))
      has_reads = has_reads or dup
      # In a refinement round: the new value was computed in another buffer and
      # copied in. Each update materialised, XLA writes each in place (fuzz seed
      # 4100 #5073: a fusion of a row add, a whole-buffer op and a row set does
      # not run in place; with a barrier after the row add, it does).
      has_reads = has_reads or into
      # In a refinement round: an update followed by an elementwise one. Fused
      # together, XLA writes the result to a new buffer (the elementwise op reads
      # elements the update moved) and copies it into the donated one; with the
      # update's result materialised, the elementwise op runs in place.
      has_reads = has_reads or (st.hints.through_updates and use.strong
                                and nxt is not None and not nxt[1].strong)
      # A barrier there would also move the fusion boundary of the reductions and
      # transcendentals those reads feed (a sum of a slice of the new version
      # changed in the fuzzer): values first, XLA may copy instead. Unless a read
      # was tied through this update (see `_frontier_step`).
      if has_reads and (k in st.forced_post or dup or into or not st.sensitive(out)
                        or (st.hints.through_updates and _moved_to_sensitive(st, out))):
        st.post_versions.setdefault(k, []).append(out)


# --------------------------------------------------------------------------- 6. derived


def tie_derived_reads(st: _State) -> dict[int, set[int]]:
  """Equations to emit after each pre barrier; extends `pre_reads`.

  Whatever consumes a tied read's result (a squeeze of a slice, say) runs after the
  barrier and reads the barrier's output; run before it, it would be a second,
  unordered read of the buffer ("a barrier over a slice that was already reshaped
  before the barrier orders nothing"). A value computed before the barrier from a
  read and used after it is tied too: left untied, XLA may recompute its cheap read
  of the buffer in the later fusion, after the update. Not another buffer's
  version that an in-place update (a scatter of a value read here) made: it is
  memory, not recomputed, and tied, every later use of that buffer would wait for
  this barrier (a swap between two buffers whose indices read both then had no
  order at all).
  """
  g = st.g
  if not st.pre_read_eqns and not st.co_reads:
    return {}
  preds = g.predecessors()
  # Each equation's place in an order every edge follows, read-before-update edges
  # included (found when first needed): the search for a tied read's ancestors
  # among some equations stops below the earliest of them (10,000 equations took
  # 1.15 s, mostly these searches over the whole program).
  found: list = []

  def order() -> list[int] | None:
    if not found:
      found.append(_edge_order(g))
    return found[0]

  out: dict[int, set[int]] = {}
  for u, co in st.co_reads.items():
    # The users of an inlined loop's other results, tied with the buffer before
    # this update: run before the barrier, they read the result untied, and XLA
    # fuses the loop body's last reads of the buffer into them, after the update
    # (a one-trip scan's sum of `b[0, 0]` feeding a row set; fuzz seed 5300
    # #1732). Not those the barrier's own inputs need.
    inputs = st.pre_read_eqns.get(u, set()) | {
        k for w in (*st.pre_versions.get(u, ()), *st.pre_reads.get(u, ()))
        if (k := g.producer.get(w)) is not None}
    later = {c for w in co for c, _ in g.uses(w) if c != u} - inputs
    if later:
      later -= _ancestors(preds, inputs, order(), later)
    if later:
      out.setdefault(u, set()).update(later)
  for u, tied in st.pre_read_eqns.items():
    if not tied:
      continue
    anc = _between_tied(g, preds, tied)
    ties = st.pre_reads.setdefault(u, [])
    for k in sorted(anc - set(tied)):
      for w in g.eqns[k].outvars:
        if C.is_drop_var(w) or w in ties:
          continue
        if any(c not in anc for c, _ in g.uses(w)) and not _made_by(st, k, w, strong=True) \
            and _cut_safe_at(st, g.eqns[k], w) and not st.sensitive(w):
          ties.append(w)
    # A use that a tied read needs runs before the barrier, whatever it reads (a
    # loop's other result that picks a branch reading this buffer).
    later = {c for w in ties for c, _ in g.uses(w) if c not in anc and c != u}
    if any(c < max(tied) for c in later):     # equations are in program order
      later -= _ancestors(preds, tied, order(), later)
    if later:
      out.setdefault(u, set()).update(later)
  return out


def _ancestors(preds, eqns, order: list[int] | None = None,
               among: set[int] | None = None) -> set[int]:
  """The equations `eqns` depend on (`preds`: each equation's predecessors); given
  `order` (`_edge_order`) and `among`, only those placed no earlier than the
  earliest of `among`, which holds every one of `among` they depend on: along a
  path of predecessors the places only fall."""
  place = order if order is not None and among else [0] * len(preds)
  floor = min(place[k] for k in among) if order is not None and among else 0
  out: set[int] = set()
  stack = list(eqns)
  while stack:
    for y in preds[stack.pop()]:
      if y not in out and place[y] >= floor:
        out.add(y)
        stack.append(y)
  return out


def _edge_order(g: Graph) -> list[int] | None:
  """Each equation's place in an order that every edge follows, program order where
  no edge goes against it; None where the edges close a cycle."""
  found = _heap_order(range(g.n), g.edges.__getitem__)
  if found is None:
    return None
  order = [0] * g.n
  for place, k in enumerate(found):
    order[k] = place
  return order


def _made_by(st: _State, k: int, w, strong: bool) -> bool:
  """Whether `w` is a buffer version that equation `k` makes in place (`strong`)
  or elementwise (its kept uses make only versions)."""
  return any(use.strong == strong and st.g.eqns[k].outvars[use.output] is w
             for use in st.infos[k].uses)


def _between_tied(g: Graph, preds, tied: set[int]) -> set[int]:
  """The equations that depend on a tied read and that a tied read depends on.

  They lie between the tied reads, so only that window is searched and the analysis
  stays linear in the program (a wider path only loses a tie, never a value).
  """
  lo, hi = min(tied), max(tied)
  fwd = set(tied)
  stack = list(tied)
  while stack:
    x = stack.pop()
    for y in g.edges[x]:
      if lo <= y <= hi and y not in fwd:
        fwd.add(y)
        stack.append(y)
  anc = set(tied)
  stack = list(tied)
  while stack:
    x = stack.pop()
    for y in preds[x]:
      if y in fwd and y not in anc:
        anc.add(y)
        stack.append(y)
  return anc


# --------------------------------------------------------------------------- 7. plan


def make_plan(st: _State, after_tie: dict[int, set[int]]) -> Plan:
  """Schedules the equations and barriers and records the plan.

  Both kinds of edges are needed for a barrier to be sound. Where the barriers
  cannot all be honoured together (one buffer's reads feed another's tied read,
  and the other way round: a swap between two buffers whose indices read both),
  the barriers are kept in program order as long as they can be, and the updates
  whose barrier would close a cycle are left to XLA (`_schedulable`).
  """
  g = st.g
  after = {k: set(v) for k, v in st.after_pre.items()}
  for k, v in after_tie.items():
    after.setdefault(k, set()).update(v)
  pre, order = _schedulable(st, after)
  barriers = [BarrierSpec("pre", u, tuple(vs), tuple(st.pre_reads.get(u, ())),
                          tuple(st.pre_sources.get(u, ())))
              for u, vs in pre.items()]
  barriers += [BarrierSpec("post", u, tuple(vs)) for u, vs in st.post_versions.items()]
  splits, moved = frozenset(u for u in st.splits if u in pre), st.moved
  if order is None:
    st.conflicts.append(Conflict(
        FindingKind.UNSEQUENCED, "inplace_jax could not order the reads of this "
        "jaxpr soundly; it is left unchanged"))
    order = tuple(Step("eqn", k) for k in range(g.n))
    barriers, splits, moved = [], frozenset(), set()
  flows, strong_flows = _flows(st)
  return Plan(jaxpr=g.jaxpr, buffers=st.buffers, in_loop=st.in_loop, order=order,
              barriers=tuple(barriers), infos=tuple(st.infos),
              splits=splits, flows=flows, strong_flows=strong_flows,
              moved=tuple(sorted(moved)), conflicts=tuple(st.conflicts))


def _schedulable(st: _State, after: dict[int, set[int]]):
  """The pre barriers that can be honoured together, with their schedule (None:
  none at all): all of them, or else, in program order, each that keeps the
  schedule acyclic (the others are recorded as conflicts; their buffers are left
  to XLA)."""
  g = st.g

  def order_with(pre):
    return schedule(g, pre, st.pre_read_eqns, after, st.post_versions)

  order = order_with(st.pre_versions)
  if order is not None:
    return st.pre_versions, order
  kept: dict[int, list[Any]] = {}
  order = order_with(kept)
  for u in sorted(st.pre_versions):
    trial = {**kept, u: st.pre_versions[u]}
    found = order_with(trial)
    if found is not None:
      kept, order = trial, found
      continue
    v = st.pre_versions[u][0]
    # Said only as far as it was found: with the barriers kept so far, or alone.
    why = (" together with the reads ordered before {} other update{} (each "
           "needs the other's first)".format(len(kept), "" if len(kept) == 1 else "s")
           if kept and order_with({u: st.pre_versions[u]}) is not None
           else ": the order they need closes a cycle")
    st.conflicts.append(Conflict(
        FindingKind.UNSEQUENCED,
        f"the reads of this {v.aval.str_short()} value cannot be ordered before its "
        f"update{why}; this update is left to XLA", update=_src(g.eqns[u]),
        nbytes=_rules.nbytes(v.aval),
        buffer_type=_rules.type_str(v.aval), argument=_argument(st, v)))
  return {u: vs for u, vs in st.pre_versions.items() if u in kept}, order


def schedule(g: Graph, pre_versions, pre_read_eqns, after_pre, post_versions
             ) -> tuple[Step, ...] | None:
  """A topological order close to the original, with barrier steps placed.

  Node ids: eqn k -> 3k+1, its pre barrier -> 3k, its post barrier -> 3k+2. The id
  doubles as priority: the original position, barriers hugging their update.
  """
  nodes = set(3 * k + 1 for k in range(g.n))
  # The equations' own edges, built in one pass (the most of them by far).
  out: dict[int, set[int]] = {3 * k + 1: {3 * j + 1 for j in js}
                              for k, js in enumerate(g.edges) if js}

  def edge(a, b):
    out.setdefault(a, set()).add(b)

  for u, vs in pre_versions.items():
    b = 3 * u
    nodes.add(b)
    edge(b, 3 * u + 1)
    for p in (g.producer.get(v) for v in vs):
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
      for c, _ in g.uses(v):
        edge(b, 3 * c + 1)
  return _topological(nodes, out)


def _topological(nodes: set[int], out: dict[int, set[int]]) -> tuple[Step, ...] | None:
  found = _heap_order(nodes, lambda x: out.get(x, ()))
  if found is None:
    return None
  return tuple(Step(("pre", "eqn", "post")[r], k) for k, r in (divmod(x, 3) for x in found))


def _heap_order(nodes: Iterable[int], successors: Callable[[int], Iterable[int]]
                ) -> list[int] | None:
  """`nodes` in an order every edge (`successors`) follows, the smallest ready node
  first; None where the edges close a cycle."""
  succ = {x: successors(x) for x in nodes}
  indeg = dict.fromkeys(succ, 0)
  for bs in succ.values():
    for b in bs:
      indeg[b] += 1
  heap = [x for x, d in indeg.items() if d == 0]
  heapq.heapify(heap)
  order = []
  pop, push = heapq.heappop, heapq.heappush
  while heap:
    x = pop(heap)
    order.append(x)
    for y in succ[x]:
      indeg[y] -= 1
      if indeg[y] == 0:
        push(heap, y)
  return order if len(order) == len(succ) else None


def _flows(st: _State) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
  """For each buffer invar, the output its last version is (None: not in place),
  and whether a strong update is on the way."""
  g = st.g
  out_index: dict[Any, int] = {}
  for i, v in enumerate(g.jaxpr.outvars):
    if not C.is_literal(v) and v not in out_index:
      out_index[v] = i
  flows: list[int | None] = []
  strong: list[bool] = []
  for v, b in zip(g.jaxpr.invars, st.buffers, strict=True):
    if not b:
      flows.append(None)
      strong.append(False)
      continue
    seen = set()
    is_strong = False
    while v in st.successor and v not in seen:
      seen.add(v)
      k, use = st.successor[v]
      is_strong = is_strong or use.strong
      v = _out(st, k, use)
    o = out_index.get(v)
    flows.append(o)
    strong.append(is_strong and o is not None)
  return tuple(flows), tuple(strong)
