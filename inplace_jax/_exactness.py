"""Where a tie can go without changing a value: what inplace_jax assumes about XLA's
fusion and arithmetic.

An `optimization_barrier` materialises what it ties and ends the fusions around it.
That changes no value after pure data movement or after a value XLA materialises
anyway; it can change the last bit elsewhere (docs/xla_notes.md):

* between a multiply and the add it feeds: XLA:CPU contracts the pair into one FMA
  when both sit in one fusion (`A - outer(a, b)` tied differed by 1e-6);
* after a dot: XLA folds a following transpose (vmap's) into the dot and runs it in
  the other operand order (an `eqx.nn.Linear` under vmap differed by 1.5e-8);
* around a float reduction or a transcendental: their accumulation order and vector
  code follow the fusion (a gathered sum differed in the fuzzer).

The traits these rules read are in `_traits.py`. The analysis asks three questions:
`cut_safe` (may a barrier follow this result?), `feeds_sensitive` (does this value
reach a fusion-sensitive op through ops XLA would fuse with it?) and
`additive_source_safe` (may this addend be added in a fusion of its own?).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from . import _compat as C
from . import _traits
from ._graph import FOLLOW, FOUND, STOP, search_uses
from ._rules import _registry as R
from ._traits import Trait

# Beyond this many steps a question is answered with the conservative "no".
MAX_DEPTH = 12


def is_inexact(v) -> bool:
  try:
    return bool(jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact))
  except (AttributeError, TypeError):
    return False


def cut_safe(eqn, out_index: int) -> bool:
  """Whether a barrier right after output `out_index` of `eqn` changes no value."""
  v = eqn.outvars[out_index]
  try:
    if not jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact):
      return True   # integers and booleans do not round
  except (AttributeError, TypeError):
    return False
  if _traits.has(eqn.primitive, Trait.CUT_SAFE):
    return True
  inner = R.call_body(eqn)
  if inner is None:
    inner = _loop_body(eqn)
  if inner is None:
    return False
  w = inner.outvars[out_index]
  if C.is_literal(w) or w in inner.invars or w in inner.constvars:
    return True
  last = _last_op(inner, out_index)
  return last is not None and cut_safe(*last)


def _last_op(inner, out_index: int) -> tuple[Any, int] | None:
  """The equation of body `inner` that computes its output `out_index`, with the
  position of that output among the equation's (None: not computed there)."""
  if out_index >= len(inner.outvars):
    return None
  w = inner.outvars[out_index]
  for e in reversed(inner.eqns):
    if any(o is w for o in e.outvars):
      return e, _out_index(e, w)
  return None


def _out_index(eqn, var) -> int:
  return [o is var for o in eqn.outvars].index(True)


def _loop_body(eqn) -> Any | None:
  """The body of a loop, read like a call's for `cut_safe`: a loop's result is its
  body's last value, and XLA inlines a loop of one trip, so a barrier after the
  loop is one after the body's operation (after a loop XLA keeps, the result is
  in memory either way)."""
  if eqn.primitive is C.while_p:
    return R.as_jaxpr(eqn.params["body_jaxpr"])
  if eqn.primitive is C.scan_p:
    return R.as_jaxpr(eqn.params["jaxpr"])
  return None


def cut_safe_var(eqn, var) -> bool:
  return cut_safe(eqn, _out_index(eqn, var))


def _ends_in_additive_scatter(eqn, out_index: int) -> bool:
  """Whether output `out_index` of `eqn` is a scatter-add's (or -sub's) result,
  directly or as a call's or one-trip loop's last operation."""
  if eqn.primitive in (C.scatter_add_p, C.scatter_sub_p):
    return True
  inner = R.call_body(eqn)
  if inner is None and eqn.primitive is C.scan_p and eqn.params["length"] == 1:
    inner = _loop_body(eqn)       # unrolled by XLA; a loop it keeps is a boundary
  last = None if inner is None else _last_op(inner, out_index)
  return last is not None and _ends_in_additive_scatter(*last)


def reassociated(eqn, var, eqns, consumers, outvars=(), inlined: bool = False,
                 parameters: frozenset = frozenset()) -> bool:
  """Whether XLA may move an add across a barrier after `var`: its simplifier
  rewrites `scatter_add(a, i, u) + b` into `scatter_add(a + b, i, u)`, which
  rounds differently (measured: 35 of 384 elements); a barrier after the scatter
  keeps the written order, so it is not placed where an add consumes the result.

  Only where the add is the scatter's one user: a result that is also read, reduced,
  added twice or returned (`outvars`) is scattered first under jax.jit too
  (measured, docs/xla_notes.md), and a barrier after it changes no arithmetic.
  Returned from a body XLA may inline (`inlined`: a call's, a one-trip loop's), it
  may meet an add outside as its one user: assumed so (fuzz seed 3400 #6898: a
  one-trip loop's scatter-add, then `+ -0.03` after the loop, split).
  """
  if not _ends_in_additive_scatter(eqn, _out_index(eqn, var)) and not _moved_into_scatter(
      eqn, var, eqns, consumers, outvars, parameters, 0):
    return False
  returned = var in outvars
  if returned and inlined:
    return True
  users = {_computation(eqns[k], eqns) for k, _ in consumers.get(var, ())}
  if len(users) > 1 or (users and returned):
    return False
  uses = consumers.get(var, ())
  if len(uses) == 1 and uses[0][1] == 0 and \
      eqns[uses[0][0]].primitive in (C.scatter_add_p, C.scatter_sub_p):
    # Scattered into by another scatter-add: XLA moves an add after the chain in
    # front of all of it, `scatter_add(scatter_add(a, i, u), j, w) + b` computed
    # as `scatter_add(scatter_add(a + b, i, u), j, w)` (fuzz seed 7500 #1930: 1
    # ulp in the element the first one adds to, a barrier after it).
    e = eqns[uses[0][0]]
    return reassociated(e, e.outvars[0], eqns, consumers, outvars, inlined, parameters)
  return _added(var, eqns, consumers, 0, direct=True, inputs_plain=not inlined,
                reassociating=True, parameters=parameters)


def _moved_into_scatter(eqn, var, eqns, consumers, outvars, parameters: frozenset,
                        depth: int, producer: dict | None = None) -> bool:
  """Whether `var` is an add that XLA's simplifier moves in front of a scatter-add,
  making `var` that scatter's result: `scatter_add(a, i, u) + b` becomes
  `scatter_add(a + b, i, u)`, again for the next add of the chain. A barrier after
  `scatter_add(a, i, u) + b` with another `+ c` after it stops the second move:
  `((a + b) + u) + c` where jax.jit computes `((a + b) + c) + u` (fuzz seed 6300
  #8705: 2 of 576 elements off). Only an add the simplifier moves (`_added`'s
  `reassociating` rule) of a scatter's result that the add alone uses."""
  if depth > MAX_DEPTH or eqn.primitive.name not in ("add", "sub"):
    return False
  if producer is None:
    producer = {o: j for j, q in enumerate(eqns) for o in q.outvars}
  for pos, x in enumerate(eqn.invars):
    if C.is_literal(x) or x not in producer:
      continue
    if eqn.primitive.name == "sub" and not (
        pos == 0 and _constant(eqn.invars[1], eqns, producer, parameters)):
      continue
    if x in outvars or len({_computation(eqns[k], eqns)
                            for k, _ in consumers.get(x, ())}) != 1:
      continue
    p = eqns[producer[x]]
    if _ends_in_additive_scatter(p, _out_index(p, x)) or _moved_into_scatter(
        p, x, eqns, consumers, outvars, parameters, depth + 1, producer):
      return True
  return False


def _computation(eqn, eqns) -> int:
  """What `eqn` computes, equal for equations XLA's CSE merges into one: the same
  primitive and parameters on operands that are the same or themselves merged.
  The clone round (`_passes.clone_shared`) writes such copies, one per reader, and
  so do users. A scatter's result added to a row in three cloned adds has one user
  to XLA (fuzz seed 4300 #3442: counted as three, the scatter-add was split, and
  the add XLA moves in front of it under jax.jit ran after it, 1 ulp off); so do
  two adds of it whose other operands are clones of one product (seed 4400
  #2309: `b + v * -0.01` cloned with its product, a barrier after the scatter)."""
  return _numbering(eqns)[1][id(eqn)]


# (eqns, (value number per var, computation per equation id)), for the last lists
# numbered: one analysis asks about one jaxpr many times.
_NUMBERINGS: list = []


def merge_key(eqn, number: Callable[[Any], Any]) -> tuple:
  """What XLA's CSE compares of `eqn`: its primitive, its operands (a literal by
  its value and type, a variable as `number` names it) and its parameters (an
  unhashable one by identity)."""
  def operand(v):
    return ("literal", repr(v.val), str(v.aval)) if C.is_literal(v) else number(v)

  def param(v):
    try:
      hash(v)
      return v
    except TypeError:
      return ("object", id(v))

  return (eqn.primitive, tuple(operand(x) for x in eqn.invars),
          tuple(sorted((k, param(v)) for k, v in eqn.params.items())))


def _numbering(eqns) -> tuple[dict, dict]:
  for held, out in _NUMBERINGS:
    if held is eqns:
      return out
  table: dict = {}
  vn: dict = {}
  of_eqn: dict = {}
  for e in eqns:
    key = merge_key(e, lambda v: vn.get(v, ("input", id(v))))
    try:
      n = table.setdefault(key, len(table))
    except TypeError:          # a parameter whose hash raised late: never merged
      n = table.setdefault(("eqn", id(e)), len(table))
    of_eqn[id(e)] = n
    for i, o in enumerate(e.outvars):
      vn[o] = ("value", n, i)
  out = (vn, of_eqn)
  _NUMBERINGS.insert(0, (eqns, out))
  del _NUMBERINGS[4:]
  return out


# Chains XLA's simplifier folds constants along: `(A + C1) + C2` becomes
# `A + (C1 + C2)`, and likewise for products, which rounds otherwise.
_CONSTANT_CHAINS = ({"add", "sub"}, {"mul"})


def constants_folded(eqn, var, consumers) -> bool:
  """Whether `var` is a float `A + C1` (or `A * C1`, C1 a literal) that an add (a
  product) with another literal reads: XLA folds the two constants into one
  (measured: `(b * 0.5 + 1.0) + 0.5` compiled to `b * 0.5 + 1.5`, 1 ulp from the
  unfolded sum, fuzz seed 3900 #4652), which a barrier after `var` prevents.
  `consumers`: the equations using it (any iterable, read once)."""
  def chain(e):
    name = e.primitive.name
    kind = next((k for k, c in enumerate(_CONSTANT_CHAINS) if name in c), None)
    return kind if kind is not None and any(C.is_literal(v) for v in e.invars) else None

  kind = chain(eqn)
  if kind is None:
    return False
  aval = getattr(var, "aval", None)
  if aval is None or not jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact):
    return False
  return any(chain(c) == kind for c in consumers)


def excess_precision(eqn, var, eqns, consumers) -> bool:
  """Whether `var` is a 16-bit float that XLA computes in float32 and rounds, where
  a convert back to a wider float reads it: XLA:CPU removes that round trip
  (`xla_allow_excess_precision`, on by default), so jax.jit's program reads the
  unrounded value, and a barrier after `var` keeps the rounding (fuzz seed 6400
  #1065: a bfloat16 einsum's result tied, then `.astype(float32)` added into a
  float32 buffer; 252 of 256 elements off, up to 0.03). Measured 2026-12-05: `(x *
  1.1).astype(f32)` for bfloat16 `x` differs in 4,053 of 4,096 elements with a
  barrier before the convert, and a bfloat16 dot's result widened in all; in none
  where a slice of `x` is widened, `x * 1.1` is read by another bfloat16 multiply,
  or a sub-slice, a reshape or a transpose of the product sits before the convert
  (the round trip is no longer adjacent). So only through data movement that keeps
  the shape (a whole slice, which XLA removes); a call or a loop is assumed to
  convert."""
  if not R.normalised_float(getattr(var, "aval", None)):
    return False
  producer = {o: j for j, q in enumerate(eqns) for o in q.outvars}
  e, seen = eqn, 0
  while _identity_move(e):
    src = next((x for x in e.invars if not C.is_literal(x)), None)
    if src is None or src not in producer or seen > MAX_DEPTH:
      return False                      # read from memory: already rounded
    e, seen = eqns[producer[src]], seen + 1
  if _traits.has(e.primitive, Trait.DATA_MOVEMENT):
    return False                        # a part of it moved: no round trip left
  def step(w, k, c) -> str:
    if c.primitive is C.convert_element_type_p:
      new = c.params["new_dtype"]
      return FOUND if (jax.numpy.issubdtype(new, jax.numpy.floating)
                       and jax.numpy.dtype(new).itemsize > 2) else STOP
    if R.call_body(c) is not None or _holds_body(c):
      return FOUND
    return FOLLOW if _identity_move(c) else STOP

  return search_uses(eqns, consumers, var, step)


def _identity_move(eqn) -> bool:
  """Data movement whose results have its first operand's type, in the same order
  (a whole slice, a reshape to its own shape; not a transpose)."""
  if not _traits.has(eqn.primitive, Trait.DATA_MOVEMENT) or not eqn.invars or \
      eqn.primitive.name in ("transpose", "rev"):
    return False
  a = getattr(eqn.invars[0], "aval", None)
  return all(getattr(o, "aval", None) == a for o in eqn.outvars if not C.is_drop_var(o))


def folded_into_dot(eqn, var, consumers) -> bool:
  """Whether `var` is a transpose that a dot reads, or a dot's result that is
  transposed: XLA folds the transpose into the dot's operand or result layout,
  and a barrier between them makes the dot run in another operand order (an
  Equinox MLP step's gradient under vmap). `consumers`: the primitives using it
  (any iterable, read once)."""
  folded = _FOLDED_INTO_DOT.get(eqn.primitive)
  return folded is not None and any(e is folded for e in consumers)


# A transpose read by a dot, a dot's result transposed (`folded_into_dot`).
_FOLDED_INTO_DOT = {C.transpose_p: C.dot_general_p, C.dot_general_p: C.transpose_p}


def cut_safe_here(eqn, var, eqns, consumers, inputs_plain: bool = False) -> bool:
  """`cut_safe_var`, or, in a refinement round (whose compiled program the
  fingerprint checks): `var` is an elementwise product (or a transcendental, whose
  code ends in one) that no add or subtract consumes, even through data movement or
  inside the calls it is passed to, so there is no multiply-add for a barrier to
  split; or the result of a dot. `inputs_plain`: this jaxpr's inputs are not
  products XLA could see (a whole program, a loop body XLA keeps; not a body it
  may inline into its caller)."""
  if cut_safe_var(eqn, var):
    return True
  if R.normalised_float(getattr(var, "aval", None)):
    # XLA:CPU computes a 16-bit result in f32 and drops the rounding where it is
    # converted back; a tie keeps it, and the fingerprint lists no converts
    # (fuzz seed 2033 #849: a bfloat16 einsum set into a float32 buffer).
    return False
  if _traits.has(eqn.primitive, Trait.CONTRACTION):
    # A dot's result: tied only on trial; if XLA then computes the dot otherwise
    # (its operand order, a transpose folded in), the fingerprint rejects it.
    return True
  if _traits.has(eqn.primitive, Trait.LANE_WISE):
    # Its code is a call (or XLA's expansion) whose result an add takes as it is,
    # stored or recomputed; the kernels' IR check confirms it.
    return True
  if not _traits.has(eqn.primitive, Trait.ELEMENTWISE):
    return False
  return not _added(var, eqns, consumers, 0, inputs_plain=inputs_plain)


def _consumers_of(jaxpr) -> dict:
  out: dict = {}
  for j, q in enumerate(jaxpr.eqns):
    for i, x in enumerate(q.invars):
      if not C.is_literal(x):
        out.setdefault(x, []).append((j, i))
  return out


def _added(var, eqns, consumers, depth: int, direct: bool = False,
           inputs_plain: bool = False, reassociating: bool = False,
           parameters: frozenset = frozenset()) -> bool:
  """Whether an add consumes `var`, through call bodies and, unless `direct`,
  data movement (and assumed inside loops and conditionals; `direct`: those are
  boundaries XLA keeps, and only an add of `var` itself counts).

  With `reassociating` (`reassociated`: the adds XLA's simplifier moves in front
  of a scatter-add), a `sub` counts only where it subtracts a constant from `var`
  (XLA writes `x - 3` as `x + -3`): `scatter_add(...) - y` for any other `y`, and
  `y - scatter_add(...)`, are left in their order (measured 2026-12-05 on the
  optimised HLO of a row, window and dynamic-row `.at[].add`, followed by `- c`,
  `- 0.5 * c`, `- b[3] * 0.5`: the subtract reads the scatter's result; `+ c`,
  `+ c * -0.5`, `+ 3` and `- 3` are moved in front of it). `parameters`: the
  program's arguments, which XLA cannot know (`_constant`)."""
  if depth > MAX_DEPTH:
    return True
  # A value scaled by a literal (`w * c`, then data movement) is added, for this
  # question, only where the add's other operand is scaled by the same literal:
  # `w * c + v * c` is `(w + v) * c` to XLA's simplifier, an add of `w` (fuzz seed
  # 3900 #2539: a scatter-add's result scaled, then added). In `b - (w * c)` the
  # multiply-add XLA may contract is `w * c`'s, whose operand `w` is the same
  # rounded value whether computed there or read from memory.
  scale: dict = {var: None}
  producer: dict | None = None
  stack, seen = [var], set()
  while stack:
    w = stack.pop()
    if w in seen:
      continue
    seen.add(w)
    for k, pos in consumers.get(w, ()):
      e = eqns[k]
      if _traits.has(e.primitive, Trait.ADDITIVE):
        if producer is None:
          producer = {o: j for j, q in enumerate(eqns) for o in q.outvars}
        if reassociating and e.primitive.name == "sub" and not (
            pos == 0 and _constant(e.invars[1], eqns, producer, parameters)):
          continue
        if scale[w] is None:
          return True
        if any(_scaled_by(x, scale[w], eqns, producer, inputs_plain, 0, parameters)
               for i, x in enumerate(e.invars) if i != pos):
          return True
        continue
      c = _literal_factor(e)
      if c is not None:
        for o in e.outvars:
          if not C.is_drop_var(o):
            scale[o] = c
            stack.append(o)
        continue
      inner = R.call_body(e)
      if inner is not None:
        if pos < len(inner.invars) and _added(inner.invars[pos], inner.eqns,
                                              _consumers_of(inner), depth + 1, direct,
                                              reassociating=reassociating):
          return True
      elif direct:
        continue
      elif _holds_body(e):
        return True
      elif _traits.has(e.primitive, Trait.DATA_MOVEMENT):
        for o in e.outvars:
          if not C.is_drop_var(o):
            scale[o] = scale[w]
            stack.append(o)
  return False


def _constant(x, eqns, producer: dict, parameters: frozenset = frozenset()) -> bool:
  """Whether `x` may be a value XLA's simplifier knows: a literal, or computed
  from such values only (a broadcast of one, an iota), at any depth, as XLA folds
  constants through any chain (a value reshaped and tiled by `jnp.resize` after a
  product of an argument is no constant: fuzz seed 5600 #3645). A program's
  argument (`parameters`) is not. Where that cannot be told (a body's input, a
  closed-over constant), it may: the answer errs towards "reassociated", which
  only keeps a tie away."""
  known: dict = {}
  stack = [x]
  while stack:
    y = stack[-1]
    if C.is_literal(y) or y in known:
      stack.pop()
      continue
    k = producer.get(y)
    if y in parameters or k is None:
      known[y] = y not in parameters
      stack.pop()
      continue
    e = eqns[k]
    if C.jaxprs_in_params(e.params):
      known[y] = False
      stack.pop()
      continue
    todo = [z for z in e.invars if not C.is_literal(z) and z not in known]
    if todo:
      stack.extend(todo)
      continue
    known[y] = all(C.is_literal(z) or known[z] for z in e.invars)
    stack.pop()
  return C.is_literal(x) or known[x]


def _holds_body(eqn) -> bool:
  """Whether `eqn` holds a jaxpr whose code XLA may inline around its operands
  and result. A multiplying, min or max scatter's combiner (`update_jaxpr`: the
  `mul` of a scatter-multiply) is not such a body: XLA applies it inside the
  scatter, whose result is no product its simplifier sees, and it adds nothing to
  its updates. An additive scatter's still counts (its add takes the updates,
  where XLA can contract a product into it), and so does a scatter that applies a
  user's function (`.at[].apply`)."""
  if eqn.primitive in _COMBINING_SCATTERS or (
      eqn.primitive is C.scatter_p and not applies_function(eqn)):
    return False
  return bool(C.jaxprs_in_params(eqn.params))


_COMBINING_SCATTERS = (C.scatter_mul_p, C.scatter_min_p, C.scatter_max_p)
# What passes a value on to `feeds_sensitive`'s next step (data movement, exact
# arithmetic, the scatter family).
_PASSED_ON = _traits.TRANSPARENT | Trait.UPDATE


def _literal_factor(eqn) -> float | None:
  """The literal a `mul` multiplies by (None: not a product with a literal)."""
  if eqn.primitive.name != "mul":
    return None
  lits = [v for v in eqn.invars if C.is_literal(v)]
  if len(lits) != 1:
    return None
  try:
    return float(lits[0].val)
  except (TypeError, ValueError):
    return None


def _scaled_by(x, c: float, eqns, producer, inputs_plain: bool, depth: int,
               parameters: frozenset = frozenset()) -> bool:
  """Whether `x` is a product with the literal `c` (through data movement), or may
  be: anything not known otherwise counts (an input, unless `inputs_plain`; a
  call's result; too deep; a product with a factor that may be a constant XLA
  knows, `_constant`). A product of values XLA cannot know (`a * a` of an
  argument `a`, in `parameters`) shares no factor `c` with `w * c`, so the
  simplifier does not factor `w * c + a * a` (fuzz seed 6800 #6073: a scatter-add's
  result scaled by 0.9, then added to the square of an argument)."""
  if C.is_literal(x):
    return False
  if depth > MAX_DEPTH:
    return True
  k = producer.get(x)
  if k is None:
    return not inputs_plain   # an input: a product only where XLA may inline
  e = eqns[k]
  f = _literal_factor(e)
  if f is not None:
    return f == c or (f != f and c != c)
  if e.primitive.name == "mul":
    # A product with a computed factor: only one that may be a constant.
    return any(_constant(y, eqns, producer, parameters) for y in e.invars)
  if _holds_body(e):
    return True             # a call's result
  if _traits.has(e.primitive, Trait.DATA_MOVEMENT):
    return any(_scaled_by(y, c, eqns, producer, inputs_plain, depth + 1, parameters)
               for y in e.invars)
  return False


def applies_function(eqn) -> bool:
  """A `scatter` that applies a function to the old values (`.at[].apply`)."""
  return (eqn.primitive is C.scatter_p and eqn.params.get("update_jaxpr") is not None
          and bool(eqn.params["update_jaxpr"].eqns))


def feeds_sensitive(var, eqns, consumers, memo: dict, inner_sensitive,
                    depth: float = 0, lane_wise: bool = False) -> bool:
  """Whether float `var` reaches a fusion-sensitive op through ops XLA would fuse
  with it, here or inside the sub-jaxprs it is passed to (XLA inlines calls and
  hoists loop-invariant and branch code out of loops and conditionals).

  `inner_sensitive(jaxpr, index)` answers the same question for invar `index` of a
  sub-jaxpr (memoised by the caller). With `lane_wise` (a refinement round, whose
  candidate the kernels' IR check compares), a `Trait.LANE_WISE` transcendental is
  followed like data movement rather than counted as sensitive.
  """
  if not is_inexact(var):
    return False
  hit = memo.get(var)
  if hit is not None:
    return hit
  if depth > MAX_DEPTH:
    return True     # too deep to tell: assume the worst
  memo[var] = False   # cycles cannot happen in a jaxpr; this only stops repeats
  out = False
  for k, pos in consumers.get(var, ()):
    e = eqns[k]
    if lane_wise and _traits.has(e.primitive, Trait.LANE_WISE):
      out = any(feeds_sensitive(w, eqns, consumers, memo, inner_sensitive, depth + 1,
                                lane_wise) for w in e.outvars if not C.is_drop_var(w))
    elif _traits.eqn_has(e, Trait.SENSITIVE) or applies_function(e):
      out = True
    elif _traits.eqn_any_of(e, _PASSED_ON):
      # The scatter family carries its combiner as a jaxpr of one exact operation
      # (or none): data movement for this purpose, not a sub-computation. Data
      # movement counts a quarter step: `jnp.resize` spliced into its caller
      # (reshape, tile, slice, reshape) is as deep as one operation (fuzz seed
      # 5600 #752: counted whole, a row read tied before a whole-buffer step
      # looked too deep to tell, and was left untied).
      step = 0.25 if _traits.has(e.primitive, Trait.DATA_MOVEMENT) else 1
      out = any(feeds_sensitive(w, eqns, consumers, memo, inner_sensitive, depth + step,
                                lane_wise) for w in e.outvars if not C.is_drop_var(w))
    elif C.jaxprs_in_params(e.params):
      pairs = R.bindings(e, pos)
      out = pairs is None or any(inner_sensitive(j, i) for j, i in pairs)
    if out:
      break
  memo[var] = out
  return out


def inner_sensitivity(cache: dict, lane_wise: bool = False):
  """`inner_sensitive(jaxpr, index)` memoised in `cache` (owned by one analysis);
  `lane_wise` as for `feeds_sensitive`."""

  def inner_sensitive(jaxpr, index: int) -> bool:
    key = (id(jaxpr), index)
    hit = cache.get(key)
    if hit is not None and hit[0] is jaxpr:
      return hit[1]
    consumers: dict = {}
    for k, e in enumerate(jaxpr.eqns):
      for pos, v in enumerate(e.invars):
        if not C.is_literal(v):
          consumers.setdefault(v, []).append((k, pos))
    out = feeds_sensitive(jaxpr.invars[index], jaxpr.eqns, consumers, {},
                          inner_sensitive, 1, lane_wise)
    cache[key] = (jaxpr, out)   # keeps `jaxpr` alive, so its id stays unique
    return out

  return inner_sensitive


def additive_source_safe(var, eqns, producer, depth: int = 0) -> bool:
  """Whether the float value `var` comes, through data movement only, from a value
  whose last step is not a multiply (nor a division XLA may turn into one, nor a
  transcendental). Adding such a value in a fusion of its own rounds as adding it
  in the producer's fusion; a multiply could instead be contracted into an FMA on
  one side and not the other (a split `.at[rows].add(mean(x))` differed by 1 ulp)."""
  if C.is_literal(var) or not is_inexact(var):
    return True
  k = producer.get(var)
  if k is None:
    return True                     # an input: materialised
  if depth > MAX_DEPTH:
    return False
  e = eqns[k]
  if _traits.has(e.primitive, Trait.DATA_MOVEMENT):
    return all(additive_source_safe(x, eqns, producer, depth + 1) for x in e.invars)
  inner = R.call_body(e)
  if inner is not None:
    idx = [o is var for o in e.outvars].index(True)
    inner_producer = {o: i for i, q in enumerate(inner.eqns) for o in q.outvars}
    return _inner_source_safe(inner.outvars[idx], inner, inner_producer, e, eqns,
                              producer, depth)
  return cut_safe(e, [o is var for o in e.outvars].index(True))


def _inner_source_safe(w, inner, inner_producer, call, eqns, producer, depth) -> bool:
  if C.is_literal(w) or not is_inexact(w):
    return True
  if w in inner.invars:
    outer = call.invars[list(inner.invars).index(w)]
    return additive_source_safe(outer, eqns, producer, depth + 1)
  k = inner_producer.get(w)
  if k is None:
    return True
  e = inner.eqns[k]
  if _traits.has(e.primitive, Trait.DATA_MOVEMENT):
    return all(_inner_source_safe(x, inner, inner_producer, call, eqns, producer,
                                  depth + 1) for x in e.invars)
  return additive_source_safe(w, inner.eqns, inner_producer, depth + 1)


def is_slicing(eqn) -> bool:
  """Whether XLA's simplifier may rewrite this read of an update's result into a read
  of the update's operand (a slice of a dynamic-update-slice outside the updated
  window; inlined calls can hold such slices)."""
  return _traits.has(eqn.primitive, Trait.SLICING) or R.call_param(eqn) is not None


