"""The per-primitive rule registry, and the default rules.

A primitive's `PrimitiveRule` says what the analysis needs to know about one of its
equations and how the rewrite emits it:

* `analyze(eqn, is_version, ctx) -> EqnInfo`: which operands it updates in place,
  the plans of its sub-jaxprs, what the rewrite should do (pure).
* `rewrite(eqn, info, invars, rewriter) -> [eqns]`: the equations to emit in its
  place; the default copies the equation with its sub-jaxprs rewritten.
* `bindings(eqn, pos) -> [(jaxpr, invar index)]`: which invars of which sub-jaxprs
  operand `pos` binds (calls, loops, branches).
* `carries(eqn) -> [(operand, output)]`: operand/output pairs that are one buffer
  (an update's operand 0, a loop carry).
* `call_param`: for call-like primitives (nested jit, remat, custom_jvp/vjp calls),
  the params key of the body, whose inputs map one to one to the operands.

Rules are registered by each primitive family (`updates.py`, `calls.py`, `loops.py`,
`conditionals.py`) in one block at the end of its module, keyed by primitive objects
from `_compat`. A primitive with no rule gets the default: elementwise ops (a trait in
`_traits.py`) may update an operand in place weakly; a primitive that carries jaxprs
is opaque (a read of every buffer it is given, with a finding, never skipped
silently); anything else is a plain read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _compat as C
from .. import _traits
from .._plan import Conflict, EqnInfo, FindingKind, InplaceUse, Plan


@dataclasses.dataclass(frozen=True)
class Context:
  """What a rule may know besides the equation."""
  in_loop: bool
  # constant(var): the value is known at compile time (computed from literals).
  constant: Callable[[Any], bool]
  # producer(var): the equation of this jaxpr that computes var, or None.
  producer: Callable[[Any], Any]
  # Inside a `shard_map` body: types carry manual axes that helper equations traced
  # on their own would lack.
  manual: bool
  # analyze(jaxpr, buffers, in_loop, manual, targets=()) -> Plan, for sub-jaxprs
  # (`_analysis.Analyzer.__call__`).
  analyze: Callable[..., Plan]
  # inner_sensitive(jaxpr, index) -> bool, memoised per analysis.
  inner_sensitive: Callable[[Any, int], bool]
  # A refinement round: copies remained after a compile (`_plan.Hints`).
  refining: bool = False
  # Lower every conditional that can be lowered (`_plan.Hints.lower`).
  lower: bool = False
  # left(var): a version of a donated buffer left exactly as it is (one jax.jit
  # already updates in place: `_analysis.Analyzer.__call__`'s `left`).
  left: Callable[[Any], bool] = lambda v: False


# is_version: a level per operand (0: not a buffer; see `_analysis.BUFFER`).
AnalysisRule = Callable[[C.JaxprEqn, Sequence[int], Context], EqnInfo]
RewriteRule = Callable[..., list]
Bindings = Callable[[C.JaxprEqn, int], list]
Carries = Callable[[C.JaxprEqn], list]


@dataclasses.dataclass(frozen=True)
class PrimitiveRule:
  analyze: AnalysisRule | None = None
  rewrite: RewriteRule | None = None
  bindings: Bindings | None = None
  carries: Carries | None = None
  call_param: str | None = None


RULES: dict[C.Primitive, PrimitiveRule] = {}


def register(primitive, **fields) -> None:
  """Registers (or extends) the rule of `primitive`; a None primitive (one this JAX
  version lacks) is skipped."""
  if primitive is None:
    return
  RULES[primitive] = dataclasses.replace(RULES.get(primitive, PrimitiveRule()), **fields)


def rule_for(primitive) -> PrimitiveRule:
  return RULES.get(primitive, _DEFAULT)


# --------------------------------------------------------------------------- sizes

# Arrays smaller than this are not worth sequencing unless the user donated them:
# copying them costs less than the fusion a barrier prevents (a barrier in a hot loop
# body measured 20x slower, docs/xla_notes.md), and XLA:CPU compiles loops that touch
# less than this with an emitter that has no optimization barrier.
MIN_BUFFER_BYTES = 1024


def nbytes(aval) -> int | None:
  try:
    return int(aval.size) * aval.dtype.itemsize
  except (AttributeError, TypeError):
    return None


def type_str(aval) -> str | None:
  """`aval`'s type as a report writes a copy's (`CopyInfo.type_str`):
  `float32[64,512]`."""
  try:
    dtype = getattr(aval.dtype, "name", str(aval.dtype))
    return f"{dtype}[{','.join(str(int(d)) for d in aval.shape)}]"
  except (AttributeError, TypeError):
    return None


def is_big(aval) -> bool:
  n = nbytes(aval)
  return n is not None and n >= MIN_BUFFER_BYTES


def normalised_float(aval) -> bool:
  """16-bit floats, which XLA:CPU computes in f32 between converts."""
  return getattr(aval, "dtype", None) in (jax.numpy.bfloat16, jax.numpy.float16)


def same_type(a, b) -> bool:
  return (getattr(a, "shape", None) == getattr(b, "shape", None)
          and getattr(a, "dtype", None) == getattr(b, "dtype", None))


def as_jaxpr(j) -> Any:
  return j.jaxpr if isinstance(j, C.ClosedJaxpr) else j


def can_root(eqn) -> bool:
  """Whether an array `eqn` creates can be a buffer worth sequencing."""
  return not _traits.has(eqn.primitive, _traits.Trait.GENERATED)


# --------------------------------------------------------------------------- queries


# What most equations are to the analysis (nothing): one frozen instance, not one
# per equation.
_NOTHING = EqnInfo()


def eqn_info(eqn: C.JaxprEqn, is_version: Sequence[int], ctx: Context) -> EqnInfo:
  """The analysis of one equation; `is_version[i]` says invar i is a buffer version."""
  if not any(is_version) and not C.jaxprs_in_params(eqn.params):
    return _NOTHING
  analyze = rule_for(eqn.primitive).analyze
  if analyze is not None:
    return analyze(eqn, is_version, ctx)
  if _traits.has(eqn.primitive, _traits.Trait.ELEMENTWISE):
    return _elementwise_rule(eqn, is_version)
  if C.jaxprs_in_params(eqn.params):
    return opaque_info(eqn, is_version)
  return _NOTHING


def bindings(eqn, pos: int) -> list[tuple[Any, int]] | None:
  """(sub-jaxpr, invar index) pairs that operand `pos` of `eqn` binds; None for a
  primitive whose jaxprs no rule knows."""
  fn = rule_for(eqn.primitive).bindings
  return None if fn is None else fn(eqn, pos)


def carries(eqn) -> list[tuple[int, int]]:
  """(operand, output) pairs of `eqn` that continue one buffer."""
  fn = rule_for(eqn.primitive).carries
  return [] if fn is None else fn(eqn)


def call_param(eqn) -> str | None:
  """The params key holding a call-like equation's body (inputs mapped one to one)."""
  return rule_for(eqn.primitive).call_param


def call_body(eqn) -> Any | None:
  """The open body of a call-like equation, else None."""
  key = rule_for(eqn.primitive).call_param
  return None if key is None else as_jaxpr(eqn.params[key])


# --------------------------------------------------------------------------- defaults


def _elementwise_rule(eqn, is_version) -> EqnInfo:
  """The result may be written over one operand of its type: a version of a buffer
  the caller gave before an array made inside (`is_version` holds levels; `select_n`
  lists its cases in reverse, so the first operand is not always the buffer)."""
  out = eqn.outvars[0].aval
  best, level = None, 0
  for i, (v, ver) in enumerate(zip(eqn.invars, is_version, strict=True)):
    if ver and int(ver) > level and same_type(v.aval, out):
      best, level = i, int(ver)
  return _NOTHING if best is None else EqnInfo(uses=(InplaceUse(best, 0, strong=False),))


def opaque_info(eqn, is_version) -> EqnInfo:
  """A primitive carrying jaxprs that no rule knows: a read of every buffer."""
  if not any(is_version):
    return _NOTHING
  return EqnInfo(conflicts=(Conflict(
      FindingKind.OPAQUE_PRIMITIVE,
      f"primitive '{eqn.primitive}' carries jaxprs inplace_jax does not know how to "
      "sequence; it is treated as reading every buffer it is given, and updates "
      "inside it are left as they are",
      update=C.source_summary(eqn)),))


_DEFAULT = PrimitiveRule()


def outputs_free_of(eqn, operands: Sequence[int]) -> set[int]:
  """Positions of `eqn`'s outputs computed without any of its `operands` (positions
  in `eqn.invars`), by JAX's own dead-code rules (loops to their fixpoint; an
  equation with effects needs every operand)."""
  inner = call_body(eqn)
  if inner is not None and not eqn.effects and len(inner.invars) == len(eqn.invars):
    # Calls: their bodies (custom_jvp/vjp calls have no dead-code rule of their own).
    free = set()
    for o in range(len(eqn.outvars)):
      _, used = C.dce_jaxpr(inner, [k == o for k in range(len(eqn.outvars))])
      if not any(used[i] for i in operands):
        free.add(o)
    return free
  if eqn.primitive is C.while_p and not eqn.effects:
    return _while_outputs_free_of(eqn, operands)
  targets = {id(eqn.invars[i]) for i in operands if not C.is_literal(eqn.invars[i])}
  ins: list[Any] = []
  for v in eqn.invars:
    if not C.is_literal(v) and all(v is not w for w in ins):
      ins.append(v)
  free = set()
  for o, out in enumerate(eqn.outvars):
    if C.is_drop_var(out):
      continue
    one = C.scratch_jaxpr(ins, [out], [eqn], eqn.effects)
    _, used = C.dce_jaxpr(one, [True])
    if not any(u and id(v) in targets for v, u in zip(ins, used, strict=True)):
      free.add(o)
  return free


def _zero_trips(eqn, read, trips: set[int]) -> bool:
  """Whether while loop `eqn` makes no trip: every input its condition reads
  (`trips`, positions in `eqn.invars`) is a literal, and the condition cut to
  those inputs (`read`, its jaxpr after dead-code elimination) is false on them."""
  if not all(C.is_literal(eqn.invars[i]) for i in trips):
    return False
  args = [eqn.invars[i].val for i in sorted(trips)]
  return not bool(C.eval_jaxpr(read, eqn.params["cond_jaxpr"].consts, *args)[0])


def _while_outputs_free_of(eqn, operands: Sequence[int]) -> set[int]:
  """`outputs_free_of` for a while loop, carry by carry: JAX's dead-code rule keeps
  every input of a loop any of whose outputs is used. A carry's final value is
  computed from what its body reads, to the fixpoint, and from whatever decides the
  number of trips (the condition's reads, to the fixpoint)."""
  cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
  nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
  n = len(eqn.outvars)
  # Each body output's direct inputs, as positions in `eqn.invars`.
  def body_reads(j: int) -> set[int]:
    _, used = C.dce_jaxpr(body, [k == j for k in range(n)])
    return {nc + i for i, u in enumerate(used) if u}
  direct = [body_reads(j) for j in range(n)]
  read, used = C.dce_jaxpr(cond, [True])
  trips = {i if i < nc else nc + nb + (i - nc) for i, u in enumerate(used) if u}

  def closure(start: set[int]) -> set[int]:
    out, stack = set(), list(start)
    while stack:
      i = stack.pop()
      if i in out:
        continue
      out.add(i)
      j = i - nc - nb
      if j >= 0:                       # a carry: what its body output reads
        stack.extend(direct[j])
    return out

  trip_inputs = closure(trips)
  zero = _zero_trips(eqn, read, trips)
  free = set()
  for j, out in enumerate(eqn.outvars):
    if C.is_drop_var(out):
      continue
    # A loop of no trips returns its initial carries.
    deps = {nc + nb + j} if zero else closure(direct[j] | {nc + nb + j}) | trip_inputs
    if not any(i in deps for i in operands):
      free.add(j)
  return free
