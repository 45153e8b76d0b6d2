"""Random read/update programs over donated buffers, for differential testing.

A program is a small tree of ops (`Stmt` lines and control-flow `Block`s) over one to
three donated buffers. It renders to plain Python source (`source`), which is also
what runs: the source is compiled and executed to get the function, so the text in a
failure report is exactly the program that failed.

Two generators share one implementation (`_Gen`), driven by a chooser:

* `generate(seed, index)`: deterministic, seeded by `random.Random(f"{seed}:{index}")`;
  CI and the long run use it, so a failure is reproduced from two integers.
* `programs()`: a hypothesis strategy (choices come from `draw`, so hypothesis shrinks
  failing programs itself; choices are ordered simplest first).

The oracle, `check_program` / `check_function`, runs the function under
`jax.jit(donate_argnums=all)` and `inplace_jax.jit(donate_argnums=all,
on_copy="ignore")` on identical, separately created inputs, and checks

1. values: every output leaf has the same shape and dtype and is bit-for-bit equal
   (`np.array_equal(..., equal_nan=True)` plus the sign of zeros). No tolerance: a
   barrier that cuts through arithmetic can change the last bit (FINDINGS.md), and
   that is reported as a failure of the transform, not absorbed;
2. copies: both compiled programs are verified by the HLO inspector and
   inplace_jax's total copy bytes are at most jax.jit's.

`shrink` minimises a failing program by deleting ops, emptying bodies, turning
branches into identities and dropping outputs while the same failure remains.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import pickle
import queue
import random
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import inplace_jax
from inplace_jax._equal import tree_difference

DTYPES = ("float32", "int32", "bfloat16")
_JNP = {"float32": "jnp.float32", "int32": "jnp.int32", "bfloat16": "jnp.bfloat16"}
# inplace_jax leaves buffers under 1 KiB alone (XLA:CPU emits small loops without
# barrier support), so most buffers are at least that large; tiny ones test that.
_TINY_DIMS = (8, 9, 12)
_SMALL_DIMS = (16, 24, 32)
_LARGE_DIMS = (33, 48, 64)
DATA_MODES = ("normal", "integer", "special")
METHODS = ("set", "add", "mul", "min", "max")

HEADER = ("import jax\n"
          "import jax.numpy as jnp\n"
          "from jax import lax\n")


# --------------------------------------------------------------------------- the AST


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
  bufs: tuple[Buf, ...]
  body: list
  returns: list[str]
  data_seed: int
  data: str
  label: str = ""

  @property
  def specs(self) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(b.shape, b.dtype) for b in self.bufs]

  def count_ops(self) -> int:
    return _count(self.body)


def _count(body) -> int:
  n = 0
  for node in body:
    n += 1
    if isinstance(node, Block):
      n += sum(_count(b) for b in node.bodies if b is not None)
  return n


# --------------------------------------------------------------------------- source


def source(p: Program) -> str:
  """The program as Python source defining `f`."""
  lines = [f"def f({', '.join(b.name for b in p.bufs)}):"]
  _render(p.body, lines, "  ")
  lines.append(f"  return ({', '.join(p.returns)},)")
  return "\n".join(lines) + "\n"


def _tup(names: Sequence[str]) -> str:
  return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _render(body, lines: list[str], ind: str) -> None:
  for node in body:
    if isinstance(node, Stmt):
      lines.append(ind + node.code)
    else:
      _render_block(node, lines, ind)


def _render_fn(name, args, prelude, body, ret, lines, ind):
  lines.append(f"{ind}def {name}({', '.join(args)}):")
  inner = ind + "  "
  for p in prelude:
    lines.append(inner + p)
  _render(body or [], lines, inner)
  lines.append(f"{inner}return {ret}")


def _render_block(b: Block, lines: list[str], ind: str) -> None:
  u, C, k = b.uid, list(b.carried), b.kind
  acc, c, i = f"a{u}", f"c{u}", f"i{u}"
  zero = "jnp.float32(0)"
  if k in ("fori", "fori_dyn"):
    _render_fn(f"body{u}", [i, c], [f"{_tup(C + [acc])} = {c}"], b.bodies[0],
               _tup(C + [acc]), lines, ind)
    lines.append(f"{ind}{_tup(C + [b.out])} = lax.fori_loop(0, {b.params['trips']}, "
                 f"body{u}, {_tup(C + [zero])})")
  elif k == "while":
    bound = str(b.params["trips"])
    if b.params.get("cond_read"):
      bound += f" + {b.params['cond_read'].format(c=c)}"
    _render_fn(f"cond{u}", [c], [], [], f"{c}[0] < {bound}", lines, ind)
    _render_fn(f"body{u}", [c], [f"{_tup([i] + C + [acc])} = {c}"], b.bodies[0],
               _tup([f"{i} + 1"] + C + [acc]), lines, ind)
    lines.append(f"{ind}{_tup(['_'] + C + [b.out])} = lax.while_loop(cond{u}, body{u}, "
                 f"{_tup(['jnp.int32(0)'] + C + [zero])})")
  elif k == "scan":
    _render_fn(f"body{u}", [c, i], [f"{_tup(C)} = {c}", f"{acc} = {zero}"],
               b.bodies[0], f"{_tup(C)}, {acc}", lines, ind)
    rev = ", reverse=True" if b.params.get("reverse") else ""
    lines.append(f"{ind}{_tup(C)}, {b.out} = lax.scan(body{u}, {_tup(C)}, "
                 f"jnp.arange({b.params['length']}, dtype=jnp.int32){rev})")
  elif k in ("cond", "switch"):
    names = []
    for j, body in enumerate(b.bodies):
      name = f"br{u}_{j}"
      names.append(name)
      if body is None:
        _render_fn(name, C, [], [], _tup(C + [zero]), lines, ind)
      else:
        _render_fn(name, C, [f"{acc} = {zero}"], body, _tup(C + [acc]), lines, ind)
    if k == "cond":
      lines.append(f"{ind}{_tup(C + [b.out])} = lax.cond({b.params['pred']}, "
                   f"{', '.join(names)}, {', '.join(C)})")
    else:
      lines.append(f"{ind}{_tup(C + [b.out])} = lax.switch({b.params['index']}, "
                   f"[{', '.join(names)}], {', '.join(C)})")
  else:
    fn = f"fn{u}"
    _render_fn(fn, C, [f"{acc} = {zero}"], b.bodies[0], _tup(C + [acc]), lines, ind)
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


def build(p: Program) -> Callable:
  """The JAX function the program's source defines."""
  return function_from_source(source(p), name=p.label or "fuzz")


def function_from_source(src: str, name: str = "fuzz", entry: str = "f") -> Callable:
  namespace: dict[str, Any] = {"jax": jax, "jnp": jnp, "lax": lax}
  exec(compile(src, f"<{name}>", "exec"), namespace)  # noqa: S102 - our own generated code
  return namespace[entry]


# --------------------------------------------------------------------------- choosers


class RandomChooser:
  """Choices from `random.Random`: the seed-driven generator."""

  def __init__(self, rng: random.Random):
    self.rng = rng

  def int(self, lo: int, hi: int) -> int:
    return self.rng.randint(lo, hi)

  def p(self, prob: float) -> bool:
    return self.rng.random() < prob


class DrawChooser:
  """Choices from a hypothesis `draw`; every choice shrinks towards its first option."""

  def __init__(self, draw):
    from hypothesis import strategies as st
    self.draw, self.st = draw, st

  def int(self, lo: int, hi: int) -> int:
    return self.draw(self.st.integers(lo, hi))

  def p(self, prob: float) -> bool:
    return self.draw(self.st.integers(0, 999)) >= round(1000 * (1 - prob))


def _choice(ch, seq):
  return seq[ch.int(0, len(seq) - 1)]


def _weighted(ch, options: Sequence[tuple[Any, int]]):
  total = sum(w for _, w in options)
  r = ch.int(0, total - 1)
  for opt, w in options:
    if r < w:
      return opt
    r -= w
  raise AssertionError("unreachable")


# --------------------------------------------------------------------------- generator


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of generated programs (small: compile time dominates a check)."""
  max_bufs: int = 3
  min_ops: int = 2
  max_ops: int = 7
  max_body_ops: int = 4
  max_depth: int = 2
  tiny: float = 0.2              # probability of a buffer with _TINY_DIMS only
  large_dims: float = 0.15       # probability of a dimension from _LARGE_DIMS
  dtype_weights: tuple[int, int, int] = (6, 2, 2)   # float32, int32, bfloat16


@dataclasses.dataclass(frozen=True)
class _Val:
  name: str
  shape: tuple[int, ...]
  dtype: str


@dataclasses.dataclass
class _Scope:
  bufs: dict[str, Buf]                 # visible buffers, by variable name
  writable: tuple[str, ...]            # the ones this body may update
  aliases: list[tuple[str, Buf]]       # names holding an old version of a buffer
  values: list[_Val]
  counters: list[str]                  # int32 scalars: loop counters
  depth: int
  acc: str | None = None               # this body's float32 accumulator


class _Gen:

  def __init__(self, ch, cfg: Config):
    self.ch, self.cfg = ch, cfg
    self.n = 0

  def fresh(self, prefix: str) -> str:
    self.n += 1
    return f"{prefix}{self.n}"

  def int(self, lo, hi):
    return self.ch.int(lo, hi)

  def p(self, prob):
    return self.ch.p(prob)

  def choice(self, seq):
    return _choice(self.ch, seq)

  # ------------------------------------------------------------------ program

  def program(self, label: str) -> Program:
    cfg = self.cfg
    nbufs = self.int(1, cfg.max_bufs)
    bufs = []
    for k in range(nbufs):
      dtype = _weighted(self.ch, list(zip(DTYPES, cfg.dtype_weights, strict=True)))
      if self.p(cfg.tiny):
        shape = (self.choice(_TINY_DIMS), self.choice(_TINY_DIMS))
      else:
        shape = tuple(self.choice(_LARGE_DIMS) if self.p(cfg.large_dims)
                      else self.choice(_SMALL_DIMS) for _ in range(2))
      bufs.append(Buf(f"b{k}", shape, dtype))
    data = _weighted(self.ch, [("normal", 5), ("integer", 4), ("special", 1)])
    data_seed = self.int(0, 2**31 - 1)
    scope = _Scope(bufs={b.name: b for b in bufs}, writable=tuple(b.name for b in bufs),
                   aliases=[], values=[], counters=[], depth=0)
    body = self.body(scope, self.int(cfg.min_ops, cfg.max_ops))
    returns = self.returns(scope, bufs)
    return Program(tuple(bufs), body, returns, data_seed, data, label)

  def returns(self, sc: _Scope, bufs) -> list[str]:
    outs = [b.name for b in bufs if self.p(0.85)]
    if outs and self.p(0.05):
      outs.append(self.choice(outs))                 # one buffer returned twice
    for _ in range(self.int(0, 3)):
      if sc.values and self.p(0.7):
        outs.append(self.choice(sc.values).name)
      elif sc.aliases:
        outs.append(self.choice(sc.aliases)[0])       # an old version escapes
    if not outs:
      outs.append(bufs[0].name)
    # buffers and values in random output positions
    for j in range(len(outs) - 1, 0, -1):
      k = self.int(0, j)
      outs[j], outs[k] = outs[k], outs[j]
    return outs

  # ------------------------------------------------------------------ bodies

  def body(self, sc: _Scope, n: int) -> list:
    out: list = []
    for _ in range(n):
      kinds = [("read", 7), ("update", 7), ("alias", 1), ("combine", 1),
               ("swap", 1)]
      if sc.depth < self.cfg.max_depth:
        kinds.append(("block", 3))
      kind = _weighted(self.ch, kinds)
      if kind == "read":
        out.append(self.read(sc))
      elif kind == "update":
        out.append(self.update(sc))
      elif kind == "alias":
        out.append(self.alias(sc))
      elif kind == "combine" and sc.values:
        out.append(self.combine(sc))
      elif kind == "swap":
        out.extend(self.swap(sc))
      elif kind == "block":
        out.append(self.block(sc))
    if sc.acc is not None and self.p(0.8):
      out.append(self.accumulate(sc))
    return out

  def accumulate(self, sc: _Scope) -> Stmt:
    if sc.values and self.p(0.9):
      v = self.choice(sc.values[-4:]).name
    else:
      src, _ = self.source(sc)
      v = f"{src}[0, 0]"
    red = "jnp.max" if self.p(0.6) else "jnp.sum"
    return Stmt(f"{sc.acc} = {sc.acc} + {red}({v}).astype(jnp.float32)")

  # ------------------------------------------------------------------ reads

  def source(self, sc: _Scope) -> tuple[str, Buf]:
    """A readable version: a current buffer or an old version (alias)."""
    srcs = [(n, b) for n, b in sc.bufs.items()]
    if sc.aliases and self.p(0.3):
      return self.choice(sc.aliases)
    return self.choice(srcs)

  def read(self, sc: _Scope) -> Stmt:
    src, buf = self.source(sc)
    expr, shape, dtype = self.read_expr(sc, src, buf)
    name = self.fresh("v")
    sc.values.append(_Val(name, shape, dtype))
    return Stmt(f"{name} = {expr}")

  def read_expr(self, sc: _Scope, src: str, buf: Buf):
    H, W = buf.shape
    d = buf.dtype
    kind = _weighted(self.ch, [
        ("slice", 3), ("element", 2), ("row", 2), ("dslice", 3), ("drow", 2),
        ("gather_rows", 2), ("gather_cols", 1), ("gather_pts", 1), ("reduce", 2),
        ("elementwise", 2), ("argmax", 2)])
    if kind == "slice":
      r0 = self.int(0, H - 1)
      r1 = self.int(r0 + 1, H)
      c0 = self.int(0, W - 1)
      c1 = self.int(c0 + 1, W)
      return f"{src}[{r0}:{r1}, {c0}:{c1}]", (r1 - r0, c1 - c0), d
    if kind == "element":
      return f"{src}[{self.int(-H, H - 1)}, {self.int(-W, W - 1)}]", (), d
    if kind == "row":
      if self.p(0.5):
        return f"{src}[{self.int(0, H - 1)}]", (W,), d
      return f"{src}[:, {self.int(0, W - 1)}]", (H,), d
    if kind == "dslice":
      h, w = self.int(1, H), self.int(1, W)
      i, j = self.idx(sc, H - h + 1), self.idx(sc, W - w + 1)
      return f"lax.dynamic_slice({src}, ({i}, {j}), ({h}, {w}))", (h, w), d
    if kind == "drow":
      if self.p(0.6):
        return f"{src}[{self.idx(sc, H)}]", (W,), d
      return (f"lax.dynamic_index_in_dim({src}, {self.idx(sc, W)}, 1, keepdims=False)",
              (H,), d)
    if kind == "gather_rows":
      k = self.int(1, 5)
      return f"{src}[{self.idxarr(sc, H, k)[0]}]", (k, W), d
    if kind == "gather_cols":
      k = self.int(1, 5)
      return f"{src}[:, {self.idxarr(sc, W, k)[0]}]", (H, k), d
    if kind == "gather_pts":
      k = self.int(1, 5)
      return (f"{src}[{self.idxarr(sc, H, k)[0]}, {self.idxarr(sc, W, k)[0]}]",
              (k,), d)
    if kind == "reduce":
      which = self.int(0, 3 if d != "int32" else 2)
      if which == 0:
        return f"jnp.sum({src})", (), d
      if which == 1:
        return f"jnp.max({src}, axis=0)", (W,), d
      if which == 2:
        return f"jnp.min({src}, axis=1)", (H,), d
      return f"jnp.mean({src}, axis=0)", (W,), d
    if kind == "elementwise":
      if d == "int32":
        e = self.choice([f"{src} * 3 - 1", f"jnp.abs({src})", f"{src} // 2"])
      else:
        e = self.choice([f"{src} * 0.5 + 1.0", f"jnp.sin({src})", f"jnp.abs({src})",
                         f"{src} * {src}"])
      return e, (H, W), d
    # argmax: an int32 index computed from data
    if self.p(0.5):
      return f"jnp.argmax({src}[{self.int(0, H - 1)}])", (), "int32"
    return f"jnp.argmin({src}[:, {self.int(0, W - 1)}])", (), "int32"

  def idx(self, sc: _Scope, n: int, oob: float = 0.1) -> str:
    """An int32 scalar expression, usually in [0, n), sometimes out of range."""
    ints = [v for v in sc.values if v.dtype == "int32" and v.shape == ()]
    opts = [("const", 1), ("read", 3)]
    if sc.counters:
      opts.append(("counter", 4))
    if ints:
      opts.append(("value", 3))
    kind = _weighted(self.ch, opts)
    if kind == "const":
      return f"jnp.int32({self.int(0, n - 1)})"
    if kind == "counter":
      e = f"({self.choice(sc.counters)} + {self.int(0, 3)}) % {n}"
    elif kind == "value":
      e = f"{self.choice(ints).name} % {n}"
    else:
      src, buf = self.source(sc)
      if self.p(0.5):
        e = f"jnp.argmax({src}[{self.int(0, buf.shape[0] - 1)}]) % {n}"
      else:
        e = f"jnp.argmin({src}[:, {self.int(0, buf.shape[1] - 1)}]) % {n}"
    if self.p(oob):
      e = f"{e} + {n}" if self.p(0.5) else f"{e} - {n + 1}"
    return e

  def idxarr(self, sc: _Scope, n: int, k: int) -> tuple[str, bool, bool]:
    """An int32[k] index array; returns (expr, unique and in range, sorted)."""
    if self.p(0.6):
      vals = [self.int(0, n - 1) for _ in range(k)]
      if k > 1 and self.p(0.5):                     # repeated indices
        vals[self.int(0, k - 1)] = vals[self.int(0, k - 1)]
      if self.p(0.1):
        vals[self.int(0, k - 1)] = self.int(-n, -1)
      if self.p(0.05):
        vals[self.int(0, k - 1)] = n + self.int(0, 3)
      unique = len(set(vals)) == k and all(0 <= v < n for v in vals)
      return (f"jnp.array({vals}, dtype=jnp.int32)", unique,
              vals == sorted(vals))
    step = self.int(0, 3)
    return (f"(jnp.arange({k}, dtype=jnp.int32) * {step} + {self.idx(sc, n, 0.0)}) % {n}",
            False, False)

  # ------------------------------------------------------------------ values

  def literal(self, dtype: str) -> str:
    if dtype == "int32":
      return str(self.choice([1, -2, 3, 7, 0]))
    return self.choice(["1.5", "-2.0", "0.5", "3.0", "0.0"])

  def fit(self, sc: _Scope, shape: tuple[int, ...], dtype: str,
          scalar_ok: bool) -> str:
    """A value of `shape` and `dtype` (or a scalar, where `scalar_ok`)."""
    if not sc.values or self.p(0.2):
      lit = self.literal(dtype)
      if shape == () or scalar_ok:
        return lit
      return f"jnp.full({shape}, {lit}, {_JNP[dtype]})"
    v = self.choice(sc.values)
    e = v.name
    if v.shape == shape:
      pass
    elif shape == ():
      e = f"jnp.max({e})"
    elif v.shape == () and scalar_ok:
      pass
    elif v.shape == ():
      e = f"jnp.full({shape}, {e})"
    else:
      e = f"jnp.resize({e}, {shape})"
    if v.dtype != dtype:
      e = f"{e}.astype({_JNP[dtype]})"
    if self.p(0.3):
      if dtype == "int32":
        e = self.choice([f"{e} * 2 + 1", f"-{e}", f"jnp.maximum({e}, 0)"])
      else:
        e = self.choice([f"{e} * 0.5 + 1", f"-{e}", f"jnp.maximum({e}, 0)"])
    return e

  def combine(self, sc: _Scope) -> Stmt:
    a = self.choice(sc.values)
    name = self.fresh("v")
    other = self.fit(sc, a.shape, a.dtype, scalar_ok=True)
    op = self.choice(["+", "-", "*"])
    sc.values.append(_Val(name, a.shape, a.dtype))
    return Stmt(f"{name} = {a.name} {op} {other}")

  def alias(self, sc: _Scope) -> Stmt:
    name = self.fresh("o")
    b = self.choice(list(sc.bufs))
    sc.aliases.append((name, sc.bufs[b]))
    return Stmt(f"{name} = {b}")

  # ------------------------------------------------------------------ updates

  def update(self, sc: _Scope) -> Stmt:
    b = self.choice(sc.writable)
    buf = sc.bufs[b]
    base = b
    olds = [a for a, ab in sc.aliases if ab.name == buf.name]
    if olds and self.p(0.1):
      base = self.choice(olds)                       # update an old version
    return Stmt(f"{b} = {self.update_expr(sc, base, buf)}")

  def method(self, sc, dtype, shape, unique=False, sorted_=False, mode=None) -> str:
    m = _weighted(self.ch, [("set", 4), ("add", 3), ("mul", 1), ("min", 1), ("max", 1)])
    val = self.fit(sc, shape, dtype, scalar_ok=True)
    kw = []
    if unique and self.p(0.5):
      kw.append("unique_indices=True")
    if sorted_ and self.p(0.3):
      kw.append("indices_are_sorted=True")
    if mode:
      kw.append(f"mode={mode!r}")
    return f".{m}({', '.join([val] + kw)})"

  def update_expr(self, sc: _Scope, base: str, buf: Buf) -> str:
    H, W = buf.shape
    d = buf.dtype
    kind = _weighted(self.ch, [("static", 5), ("dynamic", 3), ("scatter", 3),
                               ("dus", 3), ("elementwise", 1)])
    if kind == "static":
      form = self.int(0, 4)
      if form == 0:
        ix, shape = f"{self.int(-H, H - 1)}, {self.int(-W, W - 1)}", ()
      elif form == 1:
        ix, shape = f"{self.int(0, H - 1)}", (W,)
      elif form == 2:
        ix, shape = f":, {self.int(0, W - 1)}", (H,)
      elif form == 3:
        r0 = self.int(0, H - 1)
        r1 = self.int(r0 + 1, H)
        c0 = self.int(0, W - 1)
        c1 = self.int(c0 + 1, W)
        ix, shape = f"{r0}:{r1}, {c0}:{c1}", (r1 - r0, c1 - c0)
      else:
        r0 = self.int(0, H - 1)
        r1 = self.int(r0 + 1, H)
        ix, shape = f"{r0}:{r1}", (r1 - r0, W)
      return f"{base}.at[{ix}]{self.method(sc, d, shape)}"
    if kind == "dynamic":
      form = self.int(0, 2)
      mode = "clip" if self.p(0.1) else None
      if form == 0:
        ix, shape = self.idx(sc, H), (W,)
      elif form == 1:
        ix, shape = f"{self.idx(sc, H)}, {self.idx(sc, W)}", ()
      else:
        c0 = self.int(0, W - 1)
        c1 = self.int(c0 + 1, W)
        ix, shape = f"{self.idx(sc, H)}, {c0}:{c1}", (c1 - c0,)
      return f"{base}.at[{ix}]{self.method(sc, d, shape, mode=mode)}"
    if kind == "scatter":
      k = self.int(1, 5)
      form = self.int(0, 2)
      if form == 0:
        a, u, s = self.idxarr(sc, H, k)
        ix, shape = a, (k, W)
      elif form == 1:
        a, u, s = self.idxarr(sc, W, k)
        ix, shape = f":, {a}", (H, k)
      else:
        a, u1, s = self.idxarr(sc, H, k)
        a2, u2, _ = self.idxarr(sc, W, k)
        ix, shape, u = f"{a}, {a2}", (k,), u1 and u2
      return f"{base}.at[{ix}]{self.method(sc, d, shape, unique=u, sorted_=s)}"
    if kind == "dus":
      if self.p(0.3):
        val = self.fit(sc, (W,), d, scalar_ok=False)
        return f"lax.dynamic_update_index_in_dim({base}, {val}, {self.idx(sc, H)}, 0)"
      h, w = self.int(1, H), self.int(1, W)
      val = self.fit(sc, (h, w), d, scalar_ok=False)
      i, j = self.idx(sc, H - h + 1), self.idx(sc, W - w + 1)
      return f"lax.dynamic_update_slice({base}, {val}, ({i}, {j}))"
    val = self.fit(sc, (H, W), d, scalar_ok=True)
    if d == "int32":
      return self.choice([f"{base} * 2 + {val}", f"jnp.minimum({base}, {val})",
                          f"-{base}"])
    return self.choice([f"{base} * 0.5 + {val}", f"jnp.maximum({base}, {val})",
                        f"jnp.where({base} > 0, {base}, {val})", f"-{base}"])

  def swap(self, sc: _Scope) -> list[Stmt]:
    """Swap two rows of one buffer, or exchange rows between two buffers."""
    if len(sc.writable) >= 2 and self.p(0.5):
      b, c = [sc.bufs[n] for n in self._pick2(sc.writable)]
      w = min(b.shape[1], c.shape[1])
      rb, rc = self.int(0, b.shape[0] - 1), self.int(0, c.shape[0] - 1)
      t, s = self.fresh("v"), self.fresh("v")
      sc.values += [_Val(t, (w,), b.dtype), _Val(s, (w,), c.dtype)]
      return [Stmt(f"{t} = {b.name}[{rb}, 0:{w}]"),
              Stmt(f"{s} = {c.name}[{rc}, 0:{w}]"),
              Stmt(f"{b.name} = {b.name}.at[{rb}, 0:{w}].set({s}.astype({_JNP[b.dtype]}))"),
              Stmt(f"{c.name} = {c.name}.at[{rc}, 0:{w}].set({t}.astype({_JNP[c.dtype]}))")]
    b = sc.bufs[self.choice(sc.writable)]
    H, W = b.shape
    r1 = self.int(0, H - 1)
    r2 = self.idx(sc, H) if self.p(0.4) else str(self.int(0, H - 1))
    t = self.fresh("v")
    sc.values.append(_Val(t, (W,), b.dtype))
    return [Stmt(f"{t} = {b.name}[{r1}]"),
            Stmt(f"{b.name} = {b.name}.at[{r1}].set({b.name}[{r2}])"),
            Stmt(f"{b.name} = {b.name}.at[{r2}].set({t})")]

  def _pick2(self, names):
    names = list(names)
    a = names.pop(self.int(0, len(names) - 1))
    return a, self.choice(names)

  # ------------------------------------------------------------------ blocks

  def pred(self, sc: _Scope) -> str:
    ints = [v for v in sc.values if v.dtype == "int32" and v.shape == ()]
    opts = [("read", 4), ("sum", 1)]
    if sc.counters:
      opts.append(("counter", 3))
    if ints:
      opts.append(("int", 2))
    kind = _weighted(self.ch, opts)
    if kind == "counter":
      return f"{self.choice(sc.counters)} % 2 == {self.int(0, 1)}"
    if kind == "int":
      return f"{self.choice(ints).name} % 2 == {self.int(0, 1)}"
    src, buf = self.source(sc)
    if kind == "sum":
      return f"jnp.sum({src}[{self.int(0, buf.shape[0] - 1)}]) > 0"
    H, W = buf.shape
    return f"{src}[{self.int(0, H - 1)}, {self.int(0, W - 1)}] > 0"

  def block(self, sc: _Scope) -> Block:
    kind = _weighted(self.ch, [
        ("cond", 4), ("fori", 3), ("fori_dyn", 2), ("while", 2), ("scan", 2),
        ("switch", 2), ("jit", 2), ("checkpoint", 1), ("custom_vjp", 1),
        ("custom_jvp", 1)])
    carried = tuple(n for n in sc.writable if self.p(0.6)) or (self.choice(sc.writable),)
    u = self.fresh("")
    uid = int(u)
    out = f"v{uid}"
    params: dict[str, Any] = {}
    counter = None
    if kind == "fori":
      params["trips"] = _weighted(self.ch, [(2, 3), (1, 2), (3, 2), (0, 1)])
      counter = f"i{uid}"
    elif kind == "fori_dyn":
      params["trips"] = f"{self.idx(sc, 3, 0.0)} + {self.int(0, 1)}"
      counter = f"i{uid}"
    elif kind == "while":
      params["trips"] = self.int(0, 3)
      if self.p(0.3):
        b = sc.bufs[self.choice(carried)]
        pos = 1 + carried.index(b.name)
        params["cond_read"] = ("({c}[%d][%d, %d] > 0).astype(jnp.int32)"
                               % (pos, self.int(0, b.shape[0] - 1),
                                  self.int(0, b.shape[1] - 1)))
      counter = f"i{uid}"
    elif kind == "scan":
      params["length"] = _weighted(self.ch, [(2, 3), (1, 1), (3, 2)])
      params["reverse"] = self.p(0.3)
      counter = f"i{uid}"
    elif kind == "cond":
      params["pred"] = self.pred(sc)
    elif kind == "switch":
      params["index"] = None   # set below, once the branch count is known
    closure = kind not in ("custom_vjp", "custom_jvp")
    nb = 2 if kind == "cond" else (self.int(2, 4) if kind == "switch" else 1)
    if kind == "switch":
      params["index"] = self.idx(sc, nb, 0.15)
    bodies: list[list | None] = []
    for j in range(nb):
      if nb > 1 and self.p(0.3):
        bodies.append(None)
        continue
      child = self.child(sc, carried, closure, counter, f"a{uid}")
      bodies.append(self.body(child, self.int(1, self.cfg.max_body_ops)))
    if kind == "scan":
      sc.values.append(_Val(out, (params["length"],), "float32"))
    else:
      sc.values.append(_Val(out, (), "float32"))
    return Block(kind, uid, carried, bodies, out, params)

  def child(self, sc: _Scope, carried, closure: bool, counter, acc) -> _Scope:
    if closure:
      bufs = dict(sc.bufs)
      return _Scope(bufs=bufs, writable=tuple(carried), aliases=list(sc.aliases),
                    values=list(sc.values),
                    counters=sc.counters + ([counter] if counter else []),
                    depth=sc.depth + 1, acc=acc)
    return _Scope(bufs={n: sc.bufs[n] for n in carried}, writable=tuple(carried),
                  aliases=[], values=[], counters=[counter] if counter else [],
                  depth=sc.depth + 1, acc=acc)


def generate(seed: int, index: int = 0, config: Config = Config()) -> Program:
  """The `index`-th program of the deterministic stream `seed`."""
  rng = random.Random(f"{seed}:{index}")
  return _Gen(RandomChooser(rng), config).program(f"fuzz_{seed}_{index}")


def programs(config: Config = Config()):
  """A hypothesis strategy of `Program`s."""
  from hypothesis import strategies as st

  @st.composite
  def strategy(draw):
    return _Gen(DrawChooser(draw), config).program("hyp")

  return strategy()


# --------------------------------------------------------------------------- inputs


def _host_data(shape, dtype: str, mode: str, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if dtype == "int32":
    return rng.integers(-20, 21, shape, dtype=np.int32)
  if mode == "integer":
    x = rng.integers(-8, 9, shape).astype(np.float32)
  else:
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
  if mode == "special":
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)
    mask = rng.random(shape) < 0.05
    x = np.where(mask, specials[rng.integers(0, 5, shape)], x)
  return x


# `x * 1` keeps NaN, infinities and the sign of zero, and makes XLA allocate a fresh
# buffer: donating an array made by `jax.device_put(numpy)` can alias host memory,
# which the runtime then copies silently (FINDINGS.md).
_fresh = jax.jit(lambda x: x * 1)


def make_inputs(bufs: Sequence[Buf], data_seed: int, data: str) -> list[jax.Array]:
  """Fresh device arrays owned by XLA, the same values for the same seed."""
  return [_fresh(jnp.asarray(_host_data(b.shape, b.dtype, data, data_seed + k))
                 .astype(b.dtype))
          for k, b in enumerate(bufs)]


# --------------------------------------------------------------------------- oracle


@dataclasses.dataclass(frozen=True)
class Outcome:
  """`status`: "ok"; "value" (outputs differ); "copies" (inplace_jax copies more
  bytes); "unverified" (an HLO report could not be verified); "crash" (inplace_jax
  raised where jax.jit did not); "died"/"timeout" (the process running it aborted or
  hung, see `Worker`); "invalid" (jax.jit itself rejected the program: a generator
  bug)."""
  status: str
  detail: str = ""
  jax_bytes: int | None = None
  inplace_bytes: int | None = None
  error: str | None = None       # exception type, for status "crash"/"invalid"

  @property
  def ok(self) -> bool:
    return self.status == "ok"


def _leaves_equal(a, b) -> str | None:
  """None when equal bit for bit (`tree_difference`), else where and by how much."""
  if (diff := tree_difference(a, b)) is None:
    return None
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  if len(la) != len(lb):
    return diff
  for k, (x, y) in enumerate(zip(la, lb)):
    if (leaf_diff := tree_difference(x, y)) is None:
      continue
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype or x.shape != y.shape or x.dtype.kind not in "fc" and \
        x.dtype.name != "bfloat16":
      return f"output {k}: {leaf_diff}:\n  jax.jit:     {x!r}\n  inplace_jax: {y!r}"
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    xf, yf = x.astype(wide), y.astype(wide)
    bad = np.argwhere(np.atleast_1d(~((xf == yf) | (np.isnan(xf) & np.isnan(yf)))))
    diff = np.abs(xf - yf)
    sign_only = " (the sign of zeros only)" if len(bad) == 0 else ""
    return (f"output {k} ({x.dtype}{list(x.shape)}) differs{sign_only} at {len(bad)} "
            f"of {x.size} positions, first {bad[:3].tolist()}; max abs diff "
            f"{np.nanmax(diff) if np.any(diff > 0) else 0}:\n"
            f"  jax.jit:     {x!r}\n  inplace_jax: {y!r}")
  return diff


def check_function(fn: Callable, bufs: Sequence[Buf], data_seed: int = 0,
                   data: str = "normal") -> Outcome:
  """Runs the oracle on `fn(*buffers)`, every argument donated."""
  donate = tuple(range(len(bufs)))
  specs = [jax.ShapeDtypeStruct(b.shape, b.dtype) for b in bufs]
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    try:
      compiled = jax.jit(fn, donate_argnums=donate).lower(*specs).compile()
      ref_report = inplace_jax.check_compiled(compiled)
      ref = compiled(*make_inputs(bufs, data_seed, data))
      jax.block_until_ready(ref)
    except Exception as e:  # noqa: BLE001 - any error means the program is invalid
      return Outcome("invalid", _tb(e), error=type(e).__name__)
    try:
      g = inplace_jax.jit(fn, donate_argnums=donate, on_copy="ignore")
      got = g(*make_inputs(bufs, data_seed, data))
      jax.block_until_ready(got)
      report = g.last_report
    except Exception as e:  # noqa: BLE001 - jax.jit ran it, so this is inplace_jax's
      return Outcome("crash", _tb(e), error=type(e).__name__)
  # Copies are compared from 1 KiB up, inplace_jax.jit's default `min_bytes`: below
  # that are XLA's own loop-counter and scalar copies (4-8 bytes), which a while
  # loop of either program can add; inplace_jax only compiles plain jax.jit's
  # program to compare (and fall back) when a copy at least that large remains.
  jb = _bytes_over(ref_report)
  ib = _bytes_over(report) if report is not None else None
  diff = _leaves_equal(ref, got)
  if diff is not None:
    return Outcome("value", diff, jb, ib)
  if report is None or not report.verified or not ref_report.verified:
    problems = "jax.jit: " + "; ".join(ref_report.problems)
    if report is not None:
      problems += " | inplace_jax: " + "; ".join(report.problems)
    return Outcome("unverified", problems, jb, ib)
  if ib > jb:
    # Grouped by whether the extra bytes include copies as large as a buffer, or
    # are only smaller copies (of slices, transposes, scalars).
    least = min(int(np.prod(b.shape)) * np.dtype(b.dtype).itemsize for b in bufs)
    big = [sum(c.nbytes for c in r.copies if c.nbytes >= least)
           for r in (ref_report, report)]
    return Outcome("copies", f"inplace_jax copies {ib} bytes, jax.jit {jb}:\n"
                   f"jax.jit:\n{_copies(ref_report)}\ninplace_jax:\n{_copies(report)}",
                   jb, ib, error="buffer" if big[1] > big[0] else "smaller")
  return Outcome("ok", "", jb, ib)


ORACLE_MIN_BYTES = 1024


def _bytes_over(report) -> int:
  return sum(c.nbytes for c in report.copies_over(ORACLE_MIN_BYTES))


def _copies(report) -> str:
  return "\n".join(f"  {c.nbytes} B {c.type_str} in {c.role} ({c.op_name}) at "
                   f"{c.location}" for c in report.copies) or "  (none)"


def _tb(e: BaseException) -> str:
  return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6))


def check_program(p: Program) -> Outcome:
  try:
    fn = build(p)
  except Exception as e:  # noqa: BLE001
    return Outcome("invalid", _tb(e), error=type(e).__name__)
  return check_function(fn, p.bufs, p.data_seed, p.data)


def describe(p: Program) -> str:
  """The program as a runnable script header: its source and how to rerun it."""
  shapes = ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in p.bufs)
  return (f"# {p.label}  buffers {shapes}  data={p.data} data_seed={p.data_seed}\n"
          + source(p))


# --------------------------------------------------------------------------- shrinking


def _bodies(body, path=()):
  """Every (path, body list) in the tree; path indexes Block.bodies."""
  yield path, body
  for k, node in enumerate(body):
    if isinstance(node, Block):
      for j, sub in enumerate(node.bodies):
        if sub is not None:
          yield from _bodies(sub, path + (k, j))


def _get(body, path):
  for k in range(0, len(path), 2):
    body = body[path[k]].bodies[path[k + 1]]
  return body


def _candidates(p: Program):
  """Smaller variants of `p`, most aggressive first."""
  for path, body in list(_bodies(p.body)):
    for k in range(len(body)):
      q = copy.deepcopy(p)
      del _get(q.body, path)[k]
      yield q
  for path, body in list(_bodies(p.body)):
    for k, node in enumerate(body):
      if not isinstance(node, Block):
        continue
      for j, sub in enumerate(node.bodies):
        if sub is None:
          continue
        if len(node.bodies) > 1:
          q = copy.deepcopy(p)
          _get(q.body, path)[k].bodies[j] = None
          yield q
      if node.kind == "switch" and len(node.bodies) > 2:
        for j in range(len(node.bodies)):
          q = copy.deepcopy(p)
          del _get(q.body, path)[k].bodies[j]
          yield q
      if node.kind in ("fori", "while") and node.params.get("trips") not in (0, 1):
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["trips"] = 1
        yield q
      if node.kind == "while" and node.params.get("cond_read"):
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["cond_read"] = None
        yield q
      if node.kind == "scan" and node.params["length"] > 1:
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["length"] = 1
        yield q
      if len(node.carried) > 1:
        for c in node.carried:
          q = copy.deepcopy(p)
          _get(q.body, path)[k].carried = tuple(x for x in node.carried if x != c)
          yield q
  if len(p.returns) > 1:
    for k in range(len(p.returns)):
      q = copy.deepcopy(p)
      del q.returns[k]
      yield q
  for path, body in list(_bodies(p.body)):
    for k, node in enumerate(body):
      texts = ([("code", node.code)] if isinstance(node, Stmt) else
               [(key, v) for key, v in node.params.items() if isinstance(v, str)])
      for key, text in texts:
        for simpler in _simpler(text):
          q = copy.deepcopy(p)
          target = _get(q.body, path)[k]
          if isinstance(target, Stmt):
            target.code = simpler
          else:
            target.params[key] = simpler
          yield q


_WRAPPED_INDEX = re.compile(r"( % \d+)?( [+-] \d+)?")
_NOISE = re.compile(r"\.astype\(jnp\.\w+\)| \* 0\.5 \+ 1| \* 2 \+ 1|, unique_indices=True|"
                    r", indices_are_sorted=True|, mode='clip'")


def _close(text: str, start: int) -> int:
  """The index just past the parenthesis closing the one before `start`."""
  depth = 1
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i + 1
  return len(text)


def _simpler(text: str):
  """Variants of one line with one sub-expression simplified: computed indices
  become constants, `jnp.maximum(e, 0)` becomes `e`, casts and decorations go."""
  for m in re.finditer(r"jnp\.arg(max|min)\(|jnp\.maximum\(", text):
    end = _close(text, m.end())
    if m.group(0).startswith("jnp.arg"):
      end = _WRAPPED_INDEX.match(text, end).end()
      for rep in ("0", "jnp.int32(0)"):
        yield text[:m.start()] + rep + text[end:]
    elif text[end - 4:end] == ", 0)":
      yield text[:m.start()] + text[m.end():end - 4] + text[end:]
  for m in _NOISE.finditer(text):
    yield text[:m.start()] + text[m.end():]


def failure_kind(status: str, error: str | None, detail: str) -> str:
  """A failure's kind, to group failures and to keep shrinking on the same one:
  the status, and for crashes the exception's message with numbers and ids
  removed."""
  if status == "crash":
    lines = [ln for ln in detail.strip().splitlines() if ln and not ln.startswith(" ")]
    msg = next((ln for ln in reversed(lines) if error and f"{error}:" in ln),
               lines[-1] if lines else "")
    msg = msg.split("jax.errors.", 1)[-1]
    return "crash: " + re.sub(r"\d+", "N", msg)[:120]
  if status == "copies" and error:
    return f"copies ({error})"
  if status in ("died", "invalid"):
    return f"{status}: " + re.sub(r"\d+", "N", error or "")[:120]
  if status == "value" and "(the sign of zeros only)" in detail:
    return "value (the sign of zeros only)"
  return status


def _kind(o: Outcome) -> str:
  return failure_kind(o.status, o.error, o.detail)


def shrink(p: Program, outcome: Outcome | None = None,
           check: Callable[[Program], Outcome] = check_program,
           max_checks: int = 400, log: Callable[[str], None] | None = None
           ) -> tuple[Program, Outcome]:
  """Greedily removes parts of failing `p` while it keeps failing the same way."""
  outcome = outcome or check(p)
  if outcome.ok:
    return p, outcome
  checks = 0
  progress = True
  while progress and checks < max_checks:
    progress = False
    for q in _candidates(p):
      checks += 1
      r = check(q)
      if _kind(r) == _kind(outcome):
        p, outcome, progress = q, r, True
        if log:
          log(f"  shrunk to {p.count_ops()} ops")
        break
      if checks >= max_checks:
        break
  return p, outcome


# --------------------------------------------------------------------------- isolation
#
# With barriers kept, XLA can abort the whole process while compiling (a CHECK
# failure in the CPU IR emitter), so batches run in worker processes that are
# restarted when they die; the program in flight is reported as "died".

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_CLEAR_EVERY = 200     # programs between jax.clear_caches() in a worker


def worker_main() -> None:
  """A worker: reads one JSON request per line, writes one JSON result per line.

  Requests: {"op": "run", "seed": S, "index": I}; {"op": "check", "program": P}
  (P a base64 pickle); {"op": "source", "source": SRC, "name": F, "bufs":
  [[name, shape, dtype], ...]} (function F defined by SRC). Results go to the
  original stdout; anything else printed goes to stderr."""
  out = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)
  seen = 0
  for line in sys.stdin:
    req = json.loads(line)
    t = time.time()
    if req["op"] == "source":
      bufs = [Buf(n, tuple(sh), d) for n, sh, d in req["bufs"]]
      fn = function_from_source(req["source"], name=req["name"], entry=req["name"])
      o, ops = check_function(fn, bufs, req.get("data_seed", 0),
                              req.get("data", "normal")), None
    else:
      if req["op"] == "run":
        p = generate(req["seed"], req["index"])
      else:
        p = pickle.loads(base64.b64decode(req["program"]))
      o, ops = check_program(p), p.count_ops()
    r = dict(dataclasses.asdict(o), index=req.get("index"), ops=ops,
             seconds=time.time() - t)
    out.write(json.dumps(r) + "\n")
    out.flush()
    seen += 1
    if seen % _CLEAR_EVERY == 0:
      jax.clear_caches()


class Worker:
  """A persistent worker process; restarted after it dies or hangs."""

  def __init__(self, timeout: float = 600):
    self.timeout = timeout
    self.proc: subprocess.Popen | None = None
    self.err = None

  def _start(self) -> None:
    self.err = tempfile.TemporaryFile(mode="w+")
    self.proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {_TESTS_DIR!r}); "
         "import fuzzgen; fuzzgen.worker_main()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
        bufsize=1)

  def request(self, req: dict) -> dict:
    if self.proc is None or self.proc.poll() is not None:
      self._start()
    self.err.seek(0)
    self.err.truncate()
    self.proc.stdin.write(json.dumps(req) + "\n")
    self.proc.stdin.flush()
    ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
    line = self.proc.stdout.readline() if ready else ""
    if line:
      return json.loads(line)
    status = "died" if ready else "timeout"
    self.proc.kill()
    self.proc.wait()
    self.err.seek(0)
    tail = "".join(self.err.read().splitlines(keepends=True)[-40:])
    rc = self.proc.returncode
    self.proc = None
    first = next((ln for ln in tail.splitlines() if ln.startswith(("F", "E"))
                  and "]" in ln), "")
    return dict(status=status, error=first.split("] ", 1)[-1][:100] or status,
                detail=f"worker {status} (exit code {rc}); its stderr:\n{tail}",
                jax_bytes=None, inplace_bytes=None, index=req.get("index"),
                ops=None, seconds=None)

  def check(self, p: Program) -> Outcome:
    r = self.request({"op": "check",
                      "program": base64.b64encode(pickle.dumps(p)).decode()})
    return Outcome(**{f.name: r[f.name] for f in dataclasses.fields(Outcome)})

  def check_source(self, src: str, name: str, bufs: Sequence[Buf], data_seed: int = 0,
                   data: str = "normal") -> Outcome:
    """`check_function` on function `name` defined by `src` (in the worker)."""
    r = self.request({"op": "source", "source": src, "name": name, "data": data,
                      "data_seed": data_seed,
                      "bufs": [[b.name, list(b.shape), b.dtype] for b in bufs]})
    return Outcome(**{f.name: r[f.name] for f in dataclasses.fields(Outcome)})

  def close(self) -> None:
    if self.proc is not None:
      self.proc.stdin.close()
      self.proc.wait()
      self.proc = None


def run_isolated(requests: Sequence[dict], workers: int = 2, timeout: float = 600):
  """Yields the result of each request (in completion order), `workers` at a time."""
  todo: queue.Queue = queue.Queue()
  for r in requests:
    todo.put(r)
  done: queue.Queue = queue.Queue()

  def slot():
    w = Worker(timeout)
    try:
      while True:
        try:
          req = todo.get_nowait()
        except queue.Empty:
          return
        try:
          done.put(w.request(req))
        except Exception as e:  # noqa: BLE001 - never leave the consumer waiting
          done.put(dict(status="died", error=type(e).__name__, detail=_tb(e),
                        jax_bytes=None, inplace_bytes=None, index=req.get("index"),
                        ops=None, seconds=None))
    finally:
      w.close()

  threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, workers))]
  for t in threads:
    t.start()
  for _ in requests:
    yield done.get()
  for t in threads:
    t.join()
