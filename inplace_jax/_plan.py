"""The plan: what the analysis decided and the rewrite carries out.

The analysis (`_analysis.py`) reads a jaxpr and returns a `Plan`; the rewrite
(`_rewrite.py`) consumes it. A plan refers to the equations of `Plan.jaxpr` (the
normalised jaxpr it was computed on) by index and to its variables by identity.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Kinds of conflict: situations no ordering can make copy-free.
READ_DEPENDS_ON_UPDATE = "read_depends_on_update"
TWO_LIVE_UPDATES = "two_live_updates"
OLD_VERSION_ESCAPES = "old_version_escapes"
UPDATE_READS_OLD = "update_reads_old"
NOT_IN_PLACE_CARRY = "carry_not_in_place"
OPAQUE_PRIMITIVE = "opaque_primitive"
NOT_DONATED = "not_donated"
NOT_UPDATED = "donated_not_updated"
NOT_ALIASED = "donated_not_aliased"


@dataclasses.dataclass(frozen=True)
class Conflict:
  """A copy the transform could not remove, with the source lines that force it."""
  kind: str
  message: str
  read: str | None = None      # `file:line (function)` of the read, where one is involved
  update: str | None = None    # `file:line (function)` of the update
  nbytes: int | None = None    # size of the buffer that is copied, where known

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
  """The analysis of one equation, produced by its rule in `_rules.py`."""
  uses: tuple[InplaceUse, ...] = ()
  # Plans for the jaxprs in the equation's params, keyed by (param name, position);
  # position is None for a single jaxpr, an index for a sequence of them (branches).
  subplans: tuple[tuple[tuple[str, int | None], "Plan"], ...] = ()
  # Read-modify-write update that is exact to split into read, barrier, write.
  splittable: bool = False
  # XLA's simplifier may rewrite reads of this equation's result into reads of its
  # operand (slice of a dynamic-update-slice, through inlined calls).
  forwards_reads: bool = False
  # `cond`/`switch` to lower to 0-or-1-trip while loops (see `_rules.lower_cond`),
  # carrying these (operand, output) pairs.
  lower_cond: bool = False
  cond_carries: tuple[tuple[int, int], ...] = ()
  # Invars of an unrolled `scan` body to pass through one `optimization_barrier` at
  # the start of the body (see `_rules._unrolled_entry_barrier`).
  entry_barrier: tuple[int, ...] = ()
  conflicts: tuple[Conflict, ...] = ()

  @property
  def changed(self) -> bool:
    return (self.lower_cond or bool(self.entry_barrier)
            or any(p.changed for _, p in self.subplans))


@dataclasses.dataclass(frozen=True)
class BarrierSpec:
  """One `optimization_barrier` to insert.

  A "pre" barrier ties `versions` and the results of their pending reads (`reads`,
  variables of `Plan.jaxpr`) before the update `update` consumes the versions. A
  "post" barrier follows the update so that later reads see an opaque value.
  """
  kind: str                     # "pre" | "post"
  update: int                   # equation index of the update
  versions: tuple[Any, ...]     # the jaxpr Vars of buffers that flow through it
  reads: tuple[Any, ...] = ()   # Vars of read results tied with it (pre only)
  read_sources: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
  """One element of the emission order: an equation or a barrier."""
  kind: str    # "eqn" | "pre" | "post"
  index: int   # equation index (for barriers: the update's index)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sequencing plan for one jaxpr (and, recursively, its sub-jaxprs)."""
  jaxpr: Any                          # normalised core.Jaxpr the plan refers to
  buffers: tuple[bool, ...]           # which invars are treated as buffers
  in_loop: bool                       # the jaxpr is (inside) a loop body
  order: tuple[Step, ...]
  barriers: tuple[BarrierSpec, ...]
  infos: tuple[EqnInfo, ...]          # per equation of `jaxpr`
  splits: frozenset[int]              # equations split into read, barrier, write
  flows: tuple[int | None, ...]       # per invar: outvar its last version reaches
  strong_flows: tuple[bool, ...]      # per invar: that chain has a strong update
  moved: tuple[int, ...]              # reads emitted earlier than in the original order
  conflicts: tuple[Conflict, ...]

  @property
  def changed(self) -> bool:
    """Whether the rewrite would produce anything but the normalised jaxpr."""
    return bool(self.barriers or self.splits or self.moved or
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

  def stats(self) -> dict[str, int]:
    """Counts over this plan and its sub-plans (each distinct sub-plan once)."""
    counts = {"barriers": 0, "splits": 0, "moved": 0, "lowered_conds": 0}
    seen: set[int] = set()

    def visit(p: Plan) -> None:
      if id(p) in seen:
        return
      seen.add(id(p))
      counts["barriers"] += len(p.barriers)
      counts["splits"] += len(p.splits)
      counts["moved"] += len(p.moved)
      for info in p.infos:
        counts["lowered_conds"] += int(info.lower_cond)
        counts["barriers"] += int(bool(info.entry_barrier))
        for _, sub in info.subplans:
          visit(sub)

    visit(self)
    return counts

  def __str__(self) -> str:
    s = self.stats()
    lines = [f"Plan: {s['barriers']} barrier(s), {s['splits']} read-modify-write "
             f"split(s), {s['moved']} read(s) moved, {s['lowered_conds']} "
             f"conditional(s) lowered to loops"]
    for c in self.all_conflicts():
      lines.append(f"  conflict ({c.kind}): {c}")
    return "\n".join(lines)
