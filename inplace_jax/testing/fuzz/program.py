"""The program tree of the differential fuzzer, its rendering to Python source, and
the function that source defines.

A program is a small tree of ops (`Stmt` lines and control-flow `Block`s) over one to
three donated buffers. It renders to plain Python source (`source`), which is also
what runs: the source is compiled and executed to get the function (`build`), so the
text in a failure report is exactly the program that failed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

DTYPES = ("float32", "int32", "bfloat16")
JNP = {"float32": "jnp.float32", "int32": "jnp.int32", "bfloat16": "jnp.bfloat16"}
DATA_MODES = ("normal", "integer", "special")
METHODS = ("set", "add", "mul", "min", "max")

HEADER = ("import jax\n"
          "import jax.numpy as jnp\n"
          "from jax import lax\n")

LOOP_KINDS = ("fori", "fori_dyn", "while", "scan")
CONDITIONAL_KINDS = ("cond", "switch")
CALL_KINDS = ("jit", "checkpoint", "custom_vjp", "custom_jvp")
# What a program is made of, for the figures: "straight" (no loop and no
# conditional; calls may be there), "loop", "conditional", "several_buffers" (two or
# more donated buffers), "matmul" (a matrix product reads a buffer).
CONSTRUCTS = ("straight", "loop", "conditional", "several_buffers", "matmul")
_MATMUL = re.compile(r" @ |jnp\.einsum\(|jnp\.matmul\(")


@dataclasses.dataclass(frozen=True)
class Buf:
  """A donated buffer: argument `name`, a 2-D array."""
  name: str
  shape: tuple[int, int]
  dtype: str


@dataclasses.dataclass
class Stmt:
  """One line of straight-line code."""
  code: str


@dataclasses.dataclass
class Block:
  """Control flow or a call around sub-bodies.

  `carried` buffers go in and come back out (loop carries, branch operands, call
  arguments); the block also yields one float32 value `out` (a scalar; `[length]`
  for `scan`), the body's accumulator `a{uid}`. `bodies` has one body, or one per
  branch for `cond`/`switch`, where `None` is an identity branch. `params`:
  `trips` (a loop bound, source text), `pred`/`index` (branch selector), `length`,
  `reverse`, `cond_read` (a `while` condition that reads a carried buffer).
  """
  kind: str
  uid: int
  carried: tuple[str, ...]
  bodies: list[list | None]
  out: str
  params: dict[str, Any]


@dataclasses.dataclass
class Program:
  """A generated program.

  `orderable`: True when an in-place order exists by construction (the generator's
  orderable mode, `generate.Config.orderable`): every read of an old version of a
  buffer can move before the update that replaced it, no version is updated twice,
  no old version is returned, every donated buffer is returned once, in an output
  position that jax's donation aliasing pairs with its own argument. A copy of a
  buffer that remains under `inplace_jax.jit` is then a "residual" one. False means
  unknown (generated as before, without those rules)."""
  bufs: tuple[Buf, ...]
  body: list
  returns: list[str]
  data_seed: int
  data: str
  label: str = ""
  orderable: bool = False

  @property
  def specs(self) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(b.shape, b.dtype) for b in self.bufs]

  def count_ops(self) -> int:
    return _count(self.body)

  @property
  def constructs(self) -> frozenset[str]:
    """Which of `CONSTRUCTS` the program uses (from its tree, so a shrunk program
    has its own)."""
    kinds = {b.kind for b in blocks(self.body)}
    out = set()
    if kinds & set(LOOP_KINDS):
      out.add("loop")
    if kinds & set(CONDITIONAL_KINDS):
      out.add("conditional")
    if not out:
      out.add("straight")
    if len(self.bufs) >= 2:
      out.add("several_buffers")
    if any(_MATMUL.search(s.code) for s in statements(self.body)):
      out.add("matmul")
    return frozenset(out)


def _count(body) -> int:
  n = 0
  for node in body:
    n += 1
    if isinstance(node, Block):
      n += sum(_count(b) for b in node.bodies if b is not None)
  return n


def blocks(body):
  """Every `Block` in `body`, outer first."""
  for node in body or ():
    if isinstance(node, Block):
      yield node
      for sub in node.bodies:
        yield from blocks(sub)


def statements(body):
  """Every `Stmt` in `body`, nested ones included."""
  for node in body or ():
    if isinstance(node, Block):
      for sub in node.bodies:
        yield from statements(sub)
    else:
      yield node


# --------------------------------------------------------------------------- source


def source(p: Program) -> str:
  """The program as Python source defining `f`."""
  return _source(p, None)


def reference_source(p: Program, after_updates: bool = False) -> str:
  """The program with its reads tied by hand: before each update of a buffer (a
  statement that assigns it, or a block that carries it), the values computed from
  it since its last update (`v = b0[3]`, `v = b0 @ w`, `o = b0`) are tied with it,
  `(v, o, b0) = lax.optimization_barrier((v, o, b0))`, so that, compiled with
  barriers kept (`inplace_jax.compiler_options()`), every read of a version runs
  before its update. The fuzzer's certificate that an in-place order exists
  (`oracle.certify`); whether the ties change arithmetic the certificate checks on
  values. With `after_updates`, each updated buffer is also tied alone after its
  update (`b0 = lax.optimization_barrier(b0)`), so that no later read of it is
  forwarded to the version before."""
  return _source(p, frozenset(b.name for b in p.bufs), after_updates)


def _source(p: Program, tie: frozenset[str] | None, post: bool = False) -> str:
  lines = [f"def f({', '.join(b.name for b in p.bufs)}):"]
  _render(p.body, lines, "  ", tie, post)
  lines.append(f"  return ({', '.join(p.returns)},)")
  return "\n".join(lines) + "\n"


_ASSIGN = re.compile(r"^(\w+) = (.*)$")


def _tup(names: Sequence[str]) -> str:
  return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _render(body, lines: list[str], ind: str, tie: frozenset[str] | None = None,
            post: bool = False) -> None:
  """`body` rendered; where `tie` (the buffers in scope) is given, with the reads
  of each buffer tied with it before its next update (`reference_source`)."""
  pending: dict[str, list[str]] = {}

  def flush(updated) -> None:
    for buf in sorted(updated):
      reads = pending.pop(buf, [])
      if reads:
        names = _tup(reads + [buf])
        lines.append(f"{ind}{names} = lax.optimization_barrier({names})")

  for node in body:
    if isinstance(node, Stmt):
      m = _ASSIGN.match(node.code) if tie is not None else None
      if m is not None and tie is not None and m.group(1) in tie:
        flush({m.group(1)})
      lines.append(ind + node.code)
      if post and m is not None and tie is not None and m.group(1) in tie:
        lines.append(f"{ind}{m.group(1)} = lax.optimization_barrier({m.group(1)})")
      if m is not None and tie is not None and m.group(1) not in tie:
        for buf in tie:
          reads = pending.setdefault(buf, [])
          if re.search(rf"\b{buf}\b", m.group(2)) and m.group(1) not in reads:
            reads.append(m.group(1))
    else:
      if tie is not None:
        flush(set(node.carried) & tie)
      _render_block(node, lines, ind, tie, post)


def _render_fn(name, args, prelude, body, ret, lines, ind, tie=None, post=False,
               carried=()):
  lines.append(f"{ind}def {name}({', '.join(args)}):")
  inner = ind + "  "
  for p in prelude:
    lines.append(inner + p)
  # Inside a body only the buffers it takes are its own (as arguments, or unpacked
  # from a loop's carry): a closed-over one, if assigned there, would become a
  # local of the body.
  scope = None if tie is None else frozenset(a for a in (*args, *carried) if a in tie)
  _render(body or [], lines, inner, scope, post)
  lines.append(f"{inner}return {ret}")


def _render_block(b: Block, lines: list[str], ind: str,
                  tie: frozenset[str] | None = None, post: bool = False) -> None:
  u, C, k = b.uid, list(b.carried), b.kind
  acc, c, i = f"a{u}", f"c{u}", f"i{u}"
  zero = "jnp.float32(0)"
  if k in ("fori", "fori_dyn"):
    _render_fn(f"body{u}", [i, c], [f"{_tup(C + [acc])} = {c}"], b.bodies[0],
               _tup(C + [acc]), lines, ind, tie, post, C)
    lines.append(f"{ind}{_tup(C + [b.out])} = lax.fori_loop(0, {b.params['trips']}, "
                 f"body{u}, {_tup(C + [zero])})")
  elif k == "while":
    bound = str(b.params["trips"])
    if b.params.get("cond_read"):
      bound += f" + {b.params['cond_read'].format(c=c)}"
    _render_fn(f"cond{u}", [c], [], [], f"{c}[0] < {bound}", lines, ind, tie, post)
    _render_fn(f"body{u}", [c], [f"{_tup([i] + C + [acc])} = {c}"], b.bodies[0],
               _tup([f"{i} + 1"] + C + [acc]), lines, ind, tie, post, C)
    lines.append(f"{ind}{_tup(['_'] + C + [b.out])} = lax.while_loop(cond{u}, body{u}, "
                 f"{_tup(['jnp.int32(0)'] + C + [zero])})")
  elif k == "scan":
    _render_fn(f"body{u}", [c, i], [f"{_tup(C)} = {c}", f"{acc} = {zero}"],
               b.bodies[0], f"{_tup(C)}, {acc}", lines, ind, tie, post, C)
    rev = ", reverse=True" if b.params.get("reverse") else ""
    lines.append(f"{ind}{_tup(C)}, {b.out} = lax.scan(body{u}, {_tup(C)}, "
                 f"jnp.arange({b.params['length']}, dtype=jnp.int32){rev})")
  elif k in CONDITIONAL_KINDS:
    names = []
    for j, body in enumerate(b.bodies):
      name = f"br{u}_{j}"
      names.append(name)
      if body is None:
        _render_fn(name, C, [], [], _tup(C + [zero]), lines, ind, tie, post)
      else:
        _render_fn(name, C, [f"{acc} = {zero}"], body, _tup(C + [acc]), lines, ind, tie, post)
    if k == "cond":
      lines.append(f"{ind}{_tup(C + [b.out])} = lax.cond({b.params['pred']}, "
                   f"{', '.join(names)}, {', '.join(C)})")
    else:
      lines.append(f"{ind}{_tup(C + [b.out])} = lax.switch({b.params['index']}, "
                   f"[{', '.join(names)}], {', '.join(C)})")
  else:
    fn = f"fn{u}"
    _render_fn(fn, C, [f"{acc} = {zero}"], b.bodies[0], _tup(C + [acc]), lines, ind, tie, post)
    n = len(C)
    if k == "jit":
      call = f"jax.jit({fn})"
    elif k == "checkpoint":
      call = f"jax.checkpoint({fn})"
    elif k == "custom_vjp":
      lines.append(f"{ind}{fn}c = jax.custom_vjp({fn})")
      lines.append(f"{ind}{fn}c.defvjp(lambda *a: ({fn}(*a), None), "
                   f"lambda _, g: g[:{n}])")
      call = f"{fn}c"
    elif k == "custom_jvp":
      lines.append(f"{ind}{fn}c = jax.custom_jvp({fn})")
      lines.append(f"{ind}{fn}c.defjvp(lambda p, t: ({fn}(*p), {fn}(*t)))")
      call = f"{fn}c"
    else:
      raise ValueError(f"unknown block kind {k!r}")
    lines.append(f"{ind}{_tup(C + [b.out])} = {call}({', '.join(C)})")


def build(p: Program, reference: bool = False, after_updates: bool = False) -> Callable:
  """The JAX function the program's source defines (`reference`: the source with
  its reads tied by hand, `reference_source`)."""
  src = reference_source(p, after_updates) if reference else source(p)
  return function_from_source(src, name=(p.label or "fuzz") + ("_ref" if reference else ""))


def function_from_source(src: str, name: str = "fuzz", entry: str = "f") -> Callable:
  """Function `entry` of `src`, executed with `jax`, `jnp` and `lax` in scope."""
  namespace: dict[str, Any] = {"jax": jax, "jnp": jnp, "lax": lax}
  exec(compile(src, f"<{name}>", "exec"), namespace)  # noqa: S102 - our own generated code
  return namespace[entry]


def describe(p: Program) -> str:
  """The program as a runnable script header: its source and how to rerun it."""
  shapes = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in p.bufs)
  return (f"# {p.label}  buffers {shapes}  data={p.data} data_seed={p.data_seed}\n"
          f"# orderable={p.orderable}  constructs={','.join(sorted(p.constructs))}\n"
          + source(p))
