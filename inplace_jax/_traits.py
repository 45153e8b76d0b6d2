"""What inplace_jax knows about each JAX primitive's arithmetic and data movement.

One table, keyed by primitive objects. Every per-primitive fact the analysis, the
rewrite and the exactness checks use is a `Trait` of the primitive here, so that a
question such as "may a barrier follow this op without changing a value?" has one
answer in one place. The names in `_TABLE` are resolved to primitive objects through
`_compat.primitive_by_name` once, at import; `tests/test_traits.py` checks that every
name is a primitive of the installed JAX (a renamed primitive would otherwise drop out
of a set silently, the failure kfac-jax met when `pjit` became `jit`).

Structural knowledge (which operand an update writes, how a loop binds its body's
inputs, how a conditional is lowered) lives with each primitive family's rules in
`_rules/`; this table only holds the facts about values.

The facts, and the measurements behind them, are in docs/xla_notes.md.
"""

from __future__ import annotations

import enum

from . import _compat as C


class Trait(enum.Flag):
  """Properties of a primitive's result that matter to in-place sequencing."""
  NONE = 0
  # The result is computed elementwise from operands of its shape, so XLA may write
  # it over an operand's buffer (`A - outer(l, u)` is an in-place update).
  ELEMENTWISE = enum.auto()
  # Moves or selects values without arithmetic: a value read through it rounds as
  # its source did.
  DATA_MOVEMENT = enum.auto()
  # Reads a window of its operand; XLA's simplifier may forward such a read of an
  # update's result to the update's operand.
  SLICING = enum.auto()
  # Writes into its operand 0: the result is that buffer's next version.
  UPDATE = enum.auto()
  # IEEE-exact elementwise arithmetic: the result does not depend on the vector
  # width or on what it is fused with.
  EXACT = enum.auto()
  # The result can change with its fusion: float accumulations (their order follows
  # the vectorisation) and transcendentals (XLA:CPU's scalar and vector code differ
  # in the last bit).
  SENSITIVE = enum.auto()
  # Ends a fusion: the result is materialised.
  REDUCTION = enum.auto()
  # Comparisons and logic, fused with the values they read.
  PREDICATE = enum.auto()
  # A barrier right after the result changes no value: the last floating-point step
  # is not a multiply (XLA:CPU contracts a multiply feeding an add into one FMA when
  # both sit in one fusion, and a barrier between them moves the last bit), and the
  # result's layout is not folded into the op (a dot's is: XLA folds a following
  # transpose into the dot and runs it in another operand order).
  CUT_SAFE = enum.auto()
  # XLA generates the array inside the fusion that consumes it (a broadcast of
  # zeros): never a buffer of its own.
  GENERATED = enum.auto()
  # Loops and conditionals: XLA cannot move them into their users as it can a
  # slice, and it simplifies their results when it learns a trip count or an index.
  CONTROL_FLOW = enum.auto()
  # Dots and convolutions: their operand layouts and order decide the summation.
  CONTRACTION = enum.auto()
  # Adds or subtracts: XLA:CPU may contract a product it consumes into one FMA.
  ADDITIVE = enum.auto()
  # A transcendental whose XLA:CPU vector and scalar code give the same bits
  # (measured on 2^24 inputs each, docs/xla_notes.md), and whose result an add or a
  # multiply-add consumes as it is, fused or materialised (2^22 inputs each; not
  # erf: `y - 0.25 * erf(x)` tied differed in 2,301): a tie after it, or before it,
  # moves no bit; the kernels' IR check confirms it (`_llvm.same_semantics`).
  LANE_WISE = enum.auto()


T = Trait
_MOVE = T.DATA_MOVEMENT | T.CUT_SAFE
_EXACT_ARITH = T.EXACT | T.ELEMENTWISE | T.CUT_SAFE   # add, sub, max, ...
_EXACT_MUL = T.EXACT | T.ELEMENTWISE                   # mul, div, sqrt: FMA-able
_TRANSCENDENTAL = T.SENSITIVE | T.ELEMENTWISE
_LANE_TRANSCENDENTAL = _TRANSCENDENTAL | T.LANE_WISE
_COMPARE = T.PREDICATE | T.ELEMENTWISE | T.CUT_SAFE
_UPDATE = T.UPDATE | T.CUT_SAFE
_ROUNDING_REDUCTION = T.REDUCTION | T.SENSITIVE

_TABLE: dict[str, Trait] = {
    # data movement
    "slice": _MOVE | T.SLICING,
    "dynamic_slice": _MOVE | T.SLICING,
    "gather": _MOVE | T.SLICING,
    "squeeze": _MOVE,
    "reshape": _MOVE,
    "broadcast_in_dim": _MOVE | T.GENERATED,
    "transpose": _MOVE,
    "rev": _MOVE,
    "concatenate": _MOVE,
    "pad": _MOVE,
    "copy": _MOVE,
    "tile": T.DATA_MOVEMENT,
    "select_n": _MOVE | T.ELEMENTWISE,
    "bitcast_convert_type": T.CUT_SAFE,
    "iota": T.CUT_SAFE | T.GENERATED,
    # exact elementwise arithmetic
    "convert_element_type": T.EXACT | T.ELEMENTWISE | T.CUT_SAFE,
    "add": _EXACT_ARITH | T.ADDITIVE,
    "sub": _EXACT_ARITH | T.ADDITIVE,
    "neg": _EXACT_ARITH,
    "abs": _EXACT_ARITH,
    "max": _EXACT_ARITH,
    "min": _EXACT_ARITH,
    "clamp": _EXACT_ARITH,
    "sign": _EXACT_ARITH,
    "floor": _EXACT_ARITH,
    "ceil": _EXACT_ARITH,
    "round": _EXACT_ARITH,
    "real": _EXACT_ARITH,
    "imag": _EXACT_ARITH,
    "conj": _EXACT_ARITH,
    "add_any": T.EXACT | T.CUT_SAFE | T.ADDITIVE,
    "mul": _EXACT_MUL,
    "div": _EXACT_MUL,
    "rem": _EXACT_MUL,
    "sqrt": _EXACT_MUL,
    "rsqrt": _EXACT_MUL,
    "square": _EXACT_MUL,
    "integer_pow": _EXACT_MUL,
    "stop_gradient": T.CUT_SAFE,
    # comparisons and logic
    "eq": _COMPARE, "ne": _COMPARE, "lt": _COMPARE, "le": _COMPARE, "gt": _COMPARE,
    "ge": _COMPARE, "and": _COMPARE, "or": _COMPARE, "not": _COMPARE,
    "is_finite": _COMPARE,
    "xor": T.ELEMENTWISE | T.CUT_SAFE,
    "shift_left": T.ELEMENTWISE, "shift_right_logical": T.ELEMENTWISE,
    "shift_right_arithmetic": T.ELEMENTWISE, "population_count": T.ELEMENTWISE,
    "clz": T.ELEMENTWISE, "nextafter": T.ELEMENTWISE,
    "reduce_precision": T.ELEMENTWISE,
    # transcendentals
    "exp": _LANE_TRANSCENDENTAL, "exp2": _TRANSCENDENTAL,
    "expm1": _LANE_TRANSCENDENTAL, "log": _LANE_TRANSCENDENTAL,
    "log1p": _LANE_TRANSCENDENTAL, "sin": _LANE_TRANSCENDENTAL,
    "cos": _LANE_TRANSCENDENTAL, "tan": _TRANSCENDENTAL,
    "tanh": _LANE_TRANSCENDENTAL, "logistic": _LANE_TRANSCENDENTAL,
    "pow": _TRANSCENDENTAL, "erf": _TRANSCENDENTAL,
    "erfc": _TRANSCENDENTAL, "erf_inv": _TRANSCENDENTAL, "lgamma": _TRANSCENDENTAL,
    "digamma": _TRANSCENDENTAL, "atan2": _TRANSCENDENTAL, "asin": _TRANSCENDENTAL,
    "acos": _TRANSCENDENTAL, "atan": _TRANSCENDENTAL, "sinh": _TRANSCENDENTAL,
    "cosh": _TRANSCENDENTAL, "asinh": _TRANSCENDENTAL, "acosh": _TRANSCENDENTAL,
    "atanh": _TRANSCENDENTAL, "cbrt": _TRANSCENDENTAL,
    "igamma": T.SENSITIVE, "igammac": T.SENSITIVE, "bessel_i0e": T.SENSITIVE,
    "bessel_i1e": T.SENSITIVE, "polygamma": T.SENSITIVE, "zeta": T.SENSITIVE,
    "regularized_incomplete_beta": T.SENSITIVE,
    # reductions and scans
    "reduce_sum": T.REDUCTION | T.SENSITIVE | T.CUT_SAFE,
    "reduce_prod": T.REDUCTION | T.SENSITIVE,
    "reduce_max": T.REDUCTION | T.CUT_SAFE,
    "reduce_min": T.REDUCTION | T.CUT_SAFE,
    "reduce_and": T.REDUCTION | T.CUT_SAFE,
    "reduce_or": T.REDUCTION | T.CUT_SAFE,
    "reduce_xor": T.REDUCTION | T.CUT_SAFE,
    "argmax": T.REDUCTION | T.CUT_SAFE,
    "argmin": T.REDUCTION | T.CUT_SAFE,
    "cumsum": T.REDUCTION | T.SENSITIVE | T.CUT_SAFE,
    "cumprod": T.REDUCTION | T.SENSITIVE,
    "cumlogsumexp": T.REDUCTION | T.SENSITIVE,
    "cummax": T.REDUCTION | T.CUT_SAFE,
    "cummin": T.REDUCTION | T.CUT_SAFE,
    "sort": T.CUT_SAFE,
    "dot_general": T.CONTRACTION,
    "conv_general_dilated": T.CONTRACTION,
    # updates
    "dynamic_update_slice": _UPDATE | T.EXACT,
    "scatter": _UPDATE | T.EXACT,
    "scatter-add": _UPDATE, "scatter-sub": _UPDATE, "scatter-mul": _UPDATE,
    "scatter-min": _UPDATE, "scatter-max": _UPDATE,
    # results that are materialised buffers anyway
    "while": T.CUT_SAFE | T.CONTROL_FLOW, "scan": T.CUT_SAFE | T.CONTROL_FLOW,
    "cond": T.CUT_SAFE | T.CONTROL_FLOW,
    "optimization_barrier": T.CUT_SAFE,
}


def _resolve(table: dict[str, Trait]) -> tuple[dict[C.Primitive, Trait], tuple[str, ...]]:
  traits: dict[C.Primitive, Trait] = {}
  missing = []
  for name, t in table.items():
    p = C.primitive_by_name(name)
    if p is None:
      missing.append(name)
    else:
      traits[p] = t
  return traits, tuple(missing)


TRAITS, UNRESOLVED = _resolve(_TABLE)


def traits(primitive) -> Trait:
  """The traits of `primitive` (`Trait.NONE` for one the table does not list)."""
  return TRAITS.get(primitive, Trait.NONE)


def has(primitive, trait: Trait) -> bool:
  """Whether `primitive` has every flag of `trait`."""
  w = trait._value_
  return _VALUES.get(primitive, 0) & w == w


def any_of(primitive, trait: Trait) -> bool:
  """Whether `primitive` has at least one flag of `trait`."""
  return bool(_VALUES.get(primitive, 0) & trait._value_)


# The flags as integers: `Flag` arithmetic and hashing run Python code per
# operation, and the analysis asks these questions tens of thousands of times per
# program.
_VALUES: dict[C.Primitive, int] = {p: t._value_ for p, t in TRAITS.items()}


def _all_flags(t: Trait, trait: Trait) -> bool:
  w = trait._value_
  return t._value_ & w == w


def of_eqn(eqn) -> Trait:
  """The traits of one equation: its primitive's, except that a rounding reduction
  over `axes` (a sum, a product) that reduces nothing (no axis, or axes of size 1
  only) moves data (`_MOVE`): XLA's simplifier makes it a bitcast of its operand
  (`jnp.sum(x[0, 0])`; measured on XLA:CPU, docs/xla_notes.md), no arithmetic,
  whatever it is fused with."""
  t = traits(eqn.primitive)
  if _all_flags(t, _ROUNDING_REDUCTION) and eqn.invars:
    shape = getattr(eqn.invars[0].aval, "shape", None)
    axes = eqn.params.get("axes")      # the cumulative ones take `axis`: left alone
    if shape is not None and axes is not None and all(shape[a] == 1 for a in axes):
      return _MOVE
  return t


def eqn_has(eqn, trait: Trait) -> bool:
  """`has` for one equation (`of_eqn`)."""
  return _all_flags(of_eqn(eqn), trait)


def eqn_any_of(eqn, trait: Trait) -> bool:
  """`any_of` for one equation (`of_eqn`)."""
  return bool(of_eqn(eqn)._value_ & trait._value_)


# A value passes through these unchanged in rounding (for "does this value reach a
# fusion-sensitive op?").
TRANSPARENT = T.DATA_MOVEMENT | T.EXACT
# What XLA fuses with a value it reads: data movement, elementwise arithmetic
# (transcendentals included), predicates and the reductions that end such a fusion.
FUSIBLE = T.SENSITIVE | TRANSPARENT | T.REDUCTION | T.PREDICATE

UPDATE_PRIMITIVES = frozenset(p for p, t in TRAITS.items() if t & T.UPDATE)
