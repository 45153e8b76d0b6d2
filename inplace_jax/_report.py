"""What the copy inspector found: plain, frozen, JSON-ready result types.

A `CopyReport` is what `check`, `check_compiled` and `assert_no_copies` return. It lists
every `copy` (and `copy-start`/`copy-done` pair) left in the compiled HLO, where each one
comes from in the user's source, what happened to every donated argument, and whether the
inspector could read the text at all. A report with `verified=False` says nothing about
copies: it never stands for "no copies".

This module imports nothing from JAX, so the text parser (`_hlo.py`) can build these too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# Roles a computation can play in an HLO module, from who calls it.
ROLES = ("entry", "while_body", "while_condition", "branch", "fusion", "other")
# What a copy copies (see `_buffers.py`): a version of a donated argument, an
# argument that was not donated, a layout change, or a temporary.
CATEGORIES = ("buffer", "argument", "layout", "temporary", "unclassified")


@dataclass(frozen=True)
class SourceLocation:
  """A user source position, as recorded in the HLO metadata."""
  file: str
  line: int
  function: str | None = None

  def __str__(self) -> str:
    where = f"{self.file}:{self.line}"
    return f"{where} ({self.function})" if self.function else where


@dataclass(frozen=True)
class Access:
  """A JAX operation in the compiled program, by name and the user's source line."""
  op: str | None
  location: SourceLocation | None

  def __str__(self) -> str:
    where = f" at {self.location}" if self.location is not None else ""
    return f"{self.op or 'an operation'}{where}"


@dataclass(frozen=True)
class CopyInfo:
  """One copy in the compiled program.

  Attributes:
    name: HLO instruction name, e.g. `"copy.1"` (the `copy-start` for an async pair).
    kind: `"copy"` or `"copy-start"` (a `copy-start`/`copy-done` pair is one entry).
    done_name: the matching `copy-done`, for kind `"copy-start"`.
    shape: dimensions of the copied array.
    dtype: numpy dtype name, e.g. `"float32"`, `"bfloat16"`, `"bool"`.
    nbytes: bytes moved by one execution of the copy.
    module: name of the HLO module.
    computation: name of the HLO computation holding the copy.
    role: what that computation is: `"entry"`, `"while_body"`, `"while_condition"`,
      `"branch"`, `"fusion"` or `"other"`.
    trip_count: iterations of the innermost enclosing while loop, when XLA knows it
      (`known_trip_count`); a copy there runs that many times per call.
    source: `"parameter"` when the copied value is an entry parameter (seen through
      get-tuple-element, bitcast, copy and branch/fusion boundaries), else
      `"instruction"`.
    parameter: that parameter's argument name as JAX wrote it (`"x"`,
      `"state['cache']"`), when `source == "parameter"`.
    operand: the copied operand's instruction name.
    location: user source of the instruction consuming the copy, else of the operand.
    op_name: JAX's `op_name` metadata of that instruction, e.g. `"jit(f)/scatter-add"`.
    hlo: the instruction's line of HLO text.
    category: `"buffer"` (a version of a donated argument: the argument, an update
      of it, a loop or branch carry of it), `"argument"` (an argument that was not
      donated), `"layout"` (a layout change, or a copy inside a fusion), or
      `"temporary"`; `"unclassified"` where the donations were not known.
    buffer: for a buffer copy, the donated argument it is a version of.
    buffer_parameter: that argument's HLO entry parameter number.
    cause: for a buffer copy, why it is there: the reads that need the old value
      and the in-place update that would overwrite it, from the HLO, and what
      inplace_jax's analysis knows about them.
    readers: for a buffer copy, the operations that read the old value.
    writer: for a buffer copy, the in-place update.
  """
  name: str
  kind: str
  done_name: str | None
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  module: str
  computation: str
  role: str
  trip_count: int | None
  source: str
  parameter: str | None
  operand: str
  location: SourceLocation | None
  op_name: str | None
  hlo: str
  category: str = "unclassified"
  buffer: str | None = None
  buffer_parameter: int | None = None
  cause: str | None = None
  readers: tuple[Access, ...] = ()
  writer: Access | None = None

  @property
  def type_str(self) -> str:
    """`float32[10000,10000]`."""
    return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

  @property
  def role_str(self) -> str:
    """The role, with the loop trip count when known: `while_body x5`."""
    return self.role if self.trip_count is None else f"{self.role} x{self.trip_count}"

  @property
  def what_str(self) -> str:
    """What is copied: the parameter's name or the operand instruction."""
    if self.source == "parameter" and self.parameter is not None:
      return f"parameter {self.parameter}"
    if self.source == "parameter":
      return f"parameter ({self.operand})"
    return f"result of {self.operand}"


@dataclass(frozen=True)
class DonationInfo:
  """What happened to one argument leaf.

  Attributes:
    argument: the leaf's name as JAX writes it in the HLO (`"x"`, `"state['cache']"`,
      `"args[0]"` for arguments without a usable signature).
    parameter: HLO entry parameter number; None when JAX pruned the unused argument.
    shape: the leaf's shape.
    dtype: numpy dtype name.
    nbytes: the leaf's size in bytes.
    donated: whether the caller donated it.
    aliased_output: index of the output leaf that reuses the donated buffer, as an
      XLA shape index into the flat outputs (`(0,)` for the first, or only, output);
      None when not donated or when the donation was not used (wasted).
  """
  argument: str
  parameter: int | None
  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  donated: bool
  aliased_output: tuple[int, ...] | None

  @property
  def wasted(self) -> bool:
    return self.donated and self.aliased_output is None

  @property
  def status_str(self) -> str:
    if not self.donated:
      return "not donated"
    if self.aliased_output is None:
      pruned = " (argument unused, pruned)" if self.parameter is None else ""
      return f"donated, NOT aliased: donation wasted{pruned}"
    out = ",".join(str(i) for i in self.aliased_output)
    return f"donated, aliased to output {out}"


@dataclass(frozen=True)
class Finding:
  """A note from inplace_jax's transform (filled by `inplace_jax.jit`)."""
  kind: str
  message: str
  locations: tuple[str, ...] = ()


@dataclass(frozen=True)
class CopyReport:
  """Copies and donations of one compiled program.

  Attributes:
    copies: every copy found, in the order of the HLO text.
    donations: one entry per argument leaf.
    temp_size_in_bytes: from `compiled.memory_analysis()`, None if unavailable.
    alias_size_in_bytes: from `compiled.memory_analysis()`, None if unavailable.
    backend: platform of the compiled program (`"cpu"`, `"gpu"`, ...).
    jax_version: `jax.__version__` when the report was made.
    jaxlib_version: `jaxlib.__version__`.
    verified: True only when all of the HLO text was read and understood. When
      False, `copies` may be incomplete and must not be read as "no copies".
    problems: why the report is not verified, and anything odd met on the way.
    findings: notes from inplace_jax's transform.
    modules: names of the HLO modules read.
    partitions: devices the program is partitioned over (`num_partitions` in the
      module header). Above 1, the HLO is the per-device program: each copy's
      shape and bytes are per device, and every device runs it.
    program: under `inplace_jax.jit`, which program runs: `"jax.jit"` (plain
      jax.jit's, unchanged) or `"sequenced"`; None for a report of `check`.
    decision: under `inplace_jax.jit`, why that program runs.
  """
  copies: tuple[CopyInfo, ...]
  donations: tuple[DonationInfo, ...]
  temp_size_in_bytes: int | None
  alias_size_in_bytes: int | None
  backend: str
  jax_version: str
  jaxlib_version: str
  verified: bool
  problems: tuple[str, ...] = ()
  findings: tuple[Finding, ...] = ()
  modules: tuple[str, ...] = ()
  partitions: int = 1
  program: str | None = None
  decision: str | None = None

  def with_findings(self, findings: tuple[Finding, ...]) -> "CopyReport":
    """This report with `findings` added."""
    return dataclasses.replace(self, findings=self.findings + tuple(findings))

  def copies_over(self, min_bytes: int) -> tuple[CopyInfo, ...]:
    """Copies of at least `min_bytes` bytes."""
    return tuple(c for c in self.copies if c.nbytes >= min_bytes)

  def buffer_copies(self, min_bytes: int = 0) -> tuple[CopyInfo, ...]:
    """Copies of a buffer the user asked to update in place (a donated argument,
    an update or a loop or branch carry of one), of at least `min_bytes` bytes: what
    `inplace_jax.jit` warns about."""
    return tuple(c for c in self.copies
                 if c.category == "buffer" and c.nbytes >= min_bytes)

  def loop_temporaries(self, min_bytes: int = 0) -> tuple[CopyInfo, ...]:
    """Copies of temporaries in a loop body (a carry that no donated buffer flows
    into, such as a backward scan's cotangent buffer), of at least `min_bytes`
    bytes: each runs every iteration. Not warned about; `inplace_jax.jit`
    sequences the loop where they are big."""
    return tuple(c for c in self.copies
                 if c.category == "temporary" and c.role == "while_body"
                 and c.nbytes >= min_bytes)

  @property
  def buffer_copy_bytes(self) -> int:
    """Bytes of the buffer copies, each counted once (not per loop iteration)."""
    return sum(c.nbytes for c in self.buffer_copies())

  @property
  def total_copy_bytes(self) -> int:
    """Bytes copied by one execution, counting each copy once (not per iteration)."""
    return sum(c.nbytes for c in self.copies)

  def wasted_donations(self) -> tuple[DonationInfo, ...]:
    """Donated arguments whose buffer no output reuses."""
    return tuple(d for d in self.donations if d.wasted)

  def to_dict(self) -> dict[str, Any]:
    """A JSON-serialisable dict (`json.dumps(report.to_dict())` works)."""
    d = dataclasses.asdict(self)
    d["total_copy_bytes"] = self.total_copy_bytes
    d["buffer_copy_bytes"] = self.buffer_copy_bytes
    return _jsonable(d)

  def __str__(self) -> str:
    return format_report(self)


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  return x


# --------------------------------------------------------------------------- formatting


def human_bytes(n: int | None) -> str:
  """`400000000` -> `"381.5 MiB"`."""
  if n is None:
    return "n/a"
  size = float(n)
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(size) < 1024 or unit == "TiB":
      return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
    size /= 1024
  raise AssertionError("unreachable")


def human_time(s: float | None, missing: str = "n/a") -> str:
  """`0.00748` -> `"7.48 ms"`; three significant digits, `missing` for None or NaN."""
  if s is None or s != s:
    return missing
  for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
    if abs(s) >= scale or unit == "us":
      return f"{s / scale:.3g} {unit}"
  raise AssertionError("unreachable")


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return [
      (indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
      for r in rows
  ]


def format_copy(c: CopyInfo) -> str:
  """One line naming a copy: size, type, role, what it copies and where."""
  where = str(c.location) if c.location is not None else "unknown source"
  op = f" [{c.op_name}]" if c.op_name else ""
  return (f"{c.name}: {c.nbytes:,} bytes ({human_bytes(c.nbytes)}) {c.type_str}, "
          f"in {c.module}/{c.computation} ({c.role_str}), copies {c.what_str}, "
          f"at {where}{op}")


def _copy_rows(copies) -> list[str]:
  rows = [["name", "bytes", "type", "role", "copy of", "source", "why"]]
  for c in copies:
    rows.append([
        c.name, human_bytes(c.nbytes), c.type_str, c.role_str,
        c.buffer or c.what_str,
        str(c.location) if c.location is not None else "?", c.cause or c.op_name or ""
    ])
  return _table(rows)


def _copy_lines(r: CopyReport) -> list[str]:
  """The copies that matter first (buffers, then undonated arguments, as a table);
  every other copy folded into one line."""
  lines: list[str] = []
  if not r.copies:
    lines.append("No copies." if r.verified
                 else "No copies found in the part that was read (NOT a guarantee).")
    return lines
  classified = any(c.category != "unclassified" for c in r.copies)
  main = ([c for c in r.copies if c.category in ("buffer", "argument")] if classified
          else list(r.copies))
  rest = [c for c in r.copies if c not in main]
  if main:
    total = sum(c.nbytes for c in main)
    what = "buffer" if classified else ""
    lines.append(f"{len(main)} {what + ' ' if what else ''}cop"
                 f"{'y' if len(main) == 1 else 'ies'}, {total:,} bytes "
                 f"({human_bytes(total)}) per call, loops not multiplied:")
    lines += _copy_rows(main)
  elif r.verified:
    lines.append("No copies of buffers.")
  if rest:
    kinds: dict[str, int] = {}
    for c in rest:
      kinds[c.category] = kinds.get(c.category, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    lines.append(f"Not buffer copies: {len(rest)} ({parts}), "
                 f"{human_bytes(sum(c.nbytes for c in rest))} in all; see "
                 "report.copies.")
  return lines


def format_report(r: CopyReport) -> str:
  """The report as a table a person can act on."""
  state = "verified" if r.verified else "UNVERIFIED"
  mods = f", modules: {', '.join(r.modules)}" if r.modules else ""
  lines = [f"CopyReport ({state}): backend {r.backend}, jax {r.jax_version}, "
           f"jaxlib {r.jaxlib_version}{mods}"]
  if r.program is not None:
    lines.append(f"Program: {r.program} ({r.decision})")
  if not r.verified:
    lines.append("UNVERIFIED: the compiled HLO could not be fully read, so the copies "
                 "below may be incomplete. Problems:")
    lines += [f"  - {p}" for p in r.problems] or ["  - (none recorded)"]
  if r.partitions > 1:
    lines.append(f"Partitioned over {r.partitions} devices: shapes and bytes below "
                 "are per device.")
  lines += _copy_lines(r)
  if r.donations:
    lines.append("Donations:")
    rows = [["argument", "type", "bytes", "status"]]
    for d in r.donations:
      t = f"{d.dtype}[{','.join(str(s) for s in d.shape)}]"
      rows.append([d.argument, t, human_bytes(d.nbytes), d.status_str])
    lines += _table(rows)
  lines.append(f"Memory: temp {human_bytes(r.temp_size_in_bytes)}, "
               f"aliased {human_bytes(r.alias_size_in_bytes)}")
  if r.findings:
    lines.append("Findings:")
    for f in r.findings:
      at = f" ({'; '.join(f.locations)})" if f.locations else ""
      lines.append(f"  - {f.kind}: {f.message}{at}")
  if r.verified and r.problems:
    lines.append("Notes:")
    lines += [f"  - {p}" for p in r.problems]
  return "\n".join(lines)
