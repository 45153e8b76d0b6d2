"""The plan: what the analysis decided and the rewrite carries out.

The analysis (`_analysis.py`) reads a jaxpr and returns a `Plan`; the rewrite
(`_rewrite.py`) consumes it. A plan refers to the equations of `Plan.jaxpr` (the
normalised jaxpr it was computed on) by index and to its variables by identity.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal

class FindingKind(enum.StrEnum):
  """Why a copy remains, or what inplace_jax noticed (`Conflict.kind`, `Finding.kind`)."""
  # No ordering can remove these copies.
  READ_DEPENDS_ON_UPDATE = "read_depends_on_update"
  TWO_LIVE_UPDATES = "two_live_updates"
  OLD_VERSION_ESCAPES = "old_version_escapes"
  UPDATE_READS_OLD = "update_reads_old"
  # The construct keeps a copy.
  NOT_IN_PLACE_CARRY = "carry_not_in_place"
  OPAQUE_PRIMITIVE = "opaque_primitive"
  UNSEQUENCED = "unsequenced"
  # A read left untied: a barrier there could change XLA's arithmetic.
  WOULD_CHANGE_ARITHMETIC = "tie_would_change_arithmetic"
  # Donation.
  NOT_DONATED = "not_donated"
  NOT_UPDATED = "donated_not_updated"
  NOT_ALIASED = "donated_not_aliased"


# The kinds that always cost a copy, whatever XLA does afterwards.
DEFINITE = frozenset({
    FindingKind.READ_DEPENDS_ON_UPDATE, FindingKind.TWO_LIVE_UPDATES,
    FindingKind.OLD_VERSION_ESCAPES, FindingKind.UPDATE_READS_OLD})


SourceKey = tuple[str, int, str]   # (file, line, primitive name)


@dataclasses.dataclass(frozen=True)
class Hints:
  """What the compiled program taught the analysis (`inplace_jax.jit`'s refinement
  rounds): reads, by source key, that XLA did not order before their update by
  itself, so they are tied even where data alone would order them; and whether a
  read that is pure data movement may be tied where its values only reach a
  fusion-sensitive op through a later update (the update's result then gets a
  barrier too, so that the op reads memory, as it does under jax.jit); and which
  operations' arithmetic a barrier changed, so that no barrier goes near them."""
  tie: frozenset[SourceKey] = frozenset()
  through_updates: bool = False
  # Operations whose arithmetic a barrier changed in an earlier compile (by source
  # key): no read is tied where it reaches them, and no barrier goes before or
  # after them as updates.
  avoid: frozenset[SourceKey] = frozenset()
  # The donated buffers jax.jit's program does not copy are left exactly as they
  # are, their versions too (an earlier compile copied one that jax.jit does not).
  leave: bool = False
  # Cheap results read by several equations computed once per reader, as XLA
  # computes them in each reader's fusion (`_passes.clone_shared`): 0 none, 1
  # elementwise ones, 2 data movement too. A clone round's hint (`inplace_jax.jit`).
  clone: int = 0
  # Updates, by (file, line), behind a buffer copy whose reads the compiled
  # program does not name (the new value computed in another buffer and copied
  # in, or the old value kept for "a later use"): the reads that only feed such
  # an update, which data alone would order, are tied before it too.
  tie_into: frozenset[tuple[str, int]] = frozenset()
  # Each update of a sequenced buffer materialised (a barrier after it): an
  # earlier compile computed a buffer's new value in another buffer and copied it
  # in, which a fusion of several updates that cannot run in place causes.
  materialise: bool = False
  # Every conditional whose branch updates a buffer lowered to zero-or-one-trip
  # loops (`_rules.conditionals`), even where XLA is predicted to keep it in place
  # as it is: an earlier compile still copied a buffer around a conditional.
  lower: bool = False
  # The analysis's predictions of XLA's fusions set aside: reads are tied even
  # where a barrier is predicted to change arithmetic (a value that feeds a
  # reduction or a transcendental, a product an add may contract), and the
  # compiled program's fingerprint and kernels decide (`inplace_jax.jit`'s last
  # round, only where copies remain).
  bold: bool = False
  # Updates, by source key, left without the barrier after them that keeps a
  # read of their result from being computed again from the old buffer: an earlier
  # compile showed that barrier changing their arithmetic (under jax.jit, XLA
  # computes such a read again, which LLVM can contract otherwise than the update's
  # own kernel). The read is still tied before the next update.
  unposted: frozenset[SourceKey] = frozenset()


@dataclasses.dataclass(frozen=True)
class Conflict:
  """A copy the transform could not remove, with the source lines that force it."""
  kind: FindingKind
  message: str
  read: str | None = None      # `file:line (function)` of the read, where one is involved
  update: str | None = None    # `file:line (function)` of the update
  nbytes: int | None = None    # size of the buffer that is copied, where known
  argument: str | None = None  # the donated argument it is about, by name
  # The type of the buffer it is about, as a report writes a copy's
  # (`CopyInfo.type_str`, "float32[64,512]"), where known: it explains only copies
  # of a buffer of that type.
  buffer_type: str | None = None

  def locations(self) -> tuple[str, ...]:
    out = []
    if self.read:
      out.append(f"read at {self.read}")
    if self.update:
      out.append(f"update at {self.update}")
    return tuple(out)

  def __str__(self) -> str:
    locs = "; ".join(self.locations())
    return f"{self.message}" + (f" [{locs}]" if locs else "")


@dataclasses.dataclass(frozen=True)
class InplaceUse:
  """Operand `operand` of an equation becomes its output `output`, in place.

  `strong` uses must happen in place for the program to be copy-free (an update
  primitive, a loop carry); weak ones may (an elementwise op whose result has the
  operand's type, which XLA can write over the operand when nothing reads it later).
  """
  operand: int
  output: int
  strong: bool = True


@dataclasses.dataclass(frozen=True)
class EqnInfo:
  """The analysis of one equation, produced by its primitive's rule (`_rules/`)."""
  uses: tuple[InplaceUse, ...] = ()
  # Plans for the jaxprs in the equation's params, keyed by (param name, position);
  # position is None for a single jaxpr, an index for a sequence of them (branches).
  subplans: tuple[tuple[tuple[str, int | None], "Plan"], ...] = ()
  # Read-modify-write update that is exact to split into read, barrier, write.
  splittable: bool = False
  # XLA's simplifier may rewrite reads of this equation's result into reads of its
  # operand (slice of a dynamic-update-slice, through inlined calls).
  forwards_reads: bool = False
  # What the primitive's rewrite rule is to do besides rewriting sub-jaxprs (a
  # rule-specific frozen value, e.g. `conditionals.LowerCond`); None: nothing.
  action: Any = None
  conflicts: tuple[Conflict, ...] = ()

  @property
  def changed(self) -> bool:
    if self.action is not None:
      return True
    for _, p in self.subplans:      # asked of every equation: no generator
      if p.changed:
        return True
    return False


@dataclasses.dataclass(frozen=True)
class BarrierSpec:
  """One `optimization_barrier` to insert.

  A "pre" barrier ties `versions` and the results of their pending reads (`reads`,
  variables of `Plan.jaxpr`) before the update `update` consumes the versions. A
  "post" barrier follows the update so that later reads see an opaque value.
  """
  kind: Literal["pre", "post"]
  update: int                   # equation index of the update
  versions: tuple[Any, ...]     # the jaxpr Vars of buffers that flow through it
  reads: tuple[Any, ...] = ()   # Vars of read results tied with it (pre only)
  read_sources: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
  """One element of the emission order: an equation or a barrier."""
  kind: Literal["eqn", "pre", "post"]
  index: int   # equation index (for barriers: the update's index)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sequencing plan for one jaxpr (and, recursively, its sub-jaxprs)."""
  jaxpr: Any                          # normalised core.Jaxpr the plan refers to
  buffers: tuple[int, ...]            # which invars are treated as buffers (levels)
  in_loop: bool                       # the jaxpr is (inside) a loop body
  order: tuple[Step, ...]
  barriers: tuple[BarrierSpec, ...]
  infos: tuple[EqnInfo, ...]          # per equation of `jaxpr`
  splits: frozenset[int]              # equations split into read, barrier, write
  flows: tuple[int | None, ...]       # per invar: outvar its last version reaches
  strong_flows: tuple[bool, ...]      # per invar: that chain has a strong update
  moved: tuple[int, ...]              # reads emitted earlier than in the original order
  conflicts: tuple[Conflict, ...]
  # Normalisation passes that restructured the jaxpr for in-place updates (as
  # opposed to cleaning it up), e.g. "predicate_batched_loops".
  restructured: tuple[str, ...] = ()
  # Why the rewritten jaxpr was withheld and the input returned unchanged
  # (`sequence_jaxpr`); empty when it was returned.
  refused: str = ""

  @property
  def changed(self) -> bool:
    """Whether the rewrite would produce anything but the normalised jaxpr, or the
    normalisation restructured it."""
    if self.refused:
      return False
    return bool(self.barriers or self.splits or self.moved or self.restructured or
                any(i.changed for i in self.infos))

  def all_conflicts(self) -> tuple[Conflict, ...]:
    out = list(self.conflicts)
    for info in self.infos:
      out.extend(info.conflicts)
      for _, sub in info.subplans:
        out.extend(sub.all_conflicts())
    # The same sub-jaxpr can be analysed once and used in several places.
    seen, uniq = set(), []
    for c in out:
      if c not in seen:
        seen.add(c)
        uniq.append(c)
    return tuple(uniq)

  def plans(self) -> list[Plan]:
    """This plan and its sub-plans at every depth, each distinct one once."""
    out: list[Plan] = []
    seen: set[int] = set()

    def visit(p: Plan) -> None:
      if id(p) in seen:
        return
      seen.add(id(p))
      out.append(p)
      for info in p.infos:
        for _, sub in info.subplans:
          visit(sub)

    visit(self)
    return out

  def stats(self) -> dict[str, int]:
    """Counts over this plan and its sub-plans (each distinct sub-plan once)."""
    counts = {"barriers": 0, "splits": 0, "moved": 0, "lowered_conds": 0,
              "predicated_loops": 0}
    for p in self.plans():
      counts["barriers"] += len(p.barriers)
      counts["splits"] += len(p.splits)
      counts["moved"] += len(p.moved)
      counts["predicated_loops"] += p.restructured.count("predicate_batched_loops")
      for info in p.infos:
        stat = getattr(info.action, "stat", None)
        if stat is not None:
          counts[stat] += 1
    return counts

  def __str__(self) -> str:
    if self.refused:
      lines = [f"Plan: not applied ({self.refused}); the input is returned unchanged"]
    else:
      s = self.stats()
      lines = [f"Plan: {s['barriers']} barrier(s), {s['splits']} read-modify-write "
               f"split(s), {s['moved']} read(s) moved, {s['lowered_conds']} "
               f"conditional(s) lowered to loops"
               + (f", {s['predicated_loops']} batched loop(s) predicated"
                  if s["predicated_loops"] else "")]
    for c in self.all_conflicts():
      lines.append(f"  conflict ({c.kind}): {c}")
    return "\n".join(lines)
