"""The generator of random read/update programs over donated buffers.

Two generators share one implementation (`_Gen`), driven by a chooser:

* `generate(seed, index)`: deterministic, seeded by `random.Random(f"{seed}:{index}")`;
  CI and the long run use it, so a failure is reproduced from two integers.
* `programs()`: a hypothesis strategy (choices come from `draw`, so hypothesis shrinks
  failing programs itself; choices are ordered simplest first).

`Config.legacy()` generates exactly the stream of the generator before the matmul
and SGD ops and the orderable mode were added (`tests/fuzzgen.py` up to 1cfc314), so
old failure reports (`seed 7 #3003`) still reproduce; the default `Config()` draws
differently for the same seed and index.

Orderable mode (`Config.orderable`, the fraction of programs generated in it): the
program is built so that an order of its ops exists in which every update of a
donated buffer happens in place. The rules, enforced while generating:

* a statement that reads an old version of a buffer (an alias taken before an
  update, read after it) is a pure read (it updates nothing) and everything it uses
  (values, other versions) was made before the earliest update that replaced a
  version it reads, so it can move before that update;
* an update always updates the current version (never an alias): no version is
  updated twice; block parameters (loop bounds, predicates, switch indices) read no
  old version;
* old versions never cross into a block body: a body sees only aliases whose
  version is current when the block starts, and a loop body none of its carried
  buffers (a loop's second trip would read a replaced version); in a branch or a call
  an alias of a carried buffer is the carried value;
* loop carries come back in their own position (by rendering);
* every donated buffer is returned exactly once, no alias is returned, no value is
  returned twice, none that is a buffer version unchanged (a full slice) or a
  constant (each needs a copy of its own), and outputs are ordered so that jax's
  donation aliasing (each output takes the first unused donated argument of its
  shape and dtype) pairs each buffer with its own argument.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from .program import DTYPES, JNP, LOOP_KINDS, Block, Buf, Program, Stmt

Int = int   # `_Gen.int` (a choice) shadows the builtin in the class's annotations

# inplace_jax leaves buffers under 1 KiB alone (XLA:CPU emits small loops without
# barrier support), so most buffers are at least that large; tiny ones test that.
_TINY_DIMS = (8, 9, 12)
_SMALL_DIMS = (16, 24, 32)
_LARGE_DIMS = (33, 48, 64)


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


# --------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes of generated programs (small: compile time dominates a check), the weights
  of the newer ops and the fraction of orderable programs."""
  max_bufs: int = 3
  min_ops: int = 2
  max_ops: int = 7
  max_body_ops: int = 4
  max_depth: int = 2
  tiny: float = 0.2              # probability of a buffer with _TINY_DIMS only
  large_dims: float = 0.15       # probability of a dimension from _LARGE_DIMS
  dtype_weights: tuple[int, int, int] = (6, 2, 2)   # float32, int32, bfloat16
  orderable: float = 0.8         # fraction of programs generated in orderable mode
  matmul_weight: int = 2         # a matrix-product read (vmap / einsum / @), used
  sgd_weight: int = 2            # an SGD step: buf = buf - lr * g, g from a read
  retries: int = 3               # orderable mode: tries for an op before skipping it
  same_type: float = 0.2         # probability that a buffer takes the shape and
  #                                dtype of an earlier one (momentum buffers, pairing)

  @classmethod
  def legacy(cls) -> "Config":
    """The generator as it was before the matmul and SGD ops and orderable mode:
    the same (seed, index) gives the same program."""
    return cls(orderable=0.0, matmul_weight=0, sgd_weight=0, same_type=0.0)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict | None) -> "Config":
    if not d:
      return cls()
    d = dict(d)
    if "dtype_weights" in d:
      d["dtype_weights"] = tuple(d["dtype_weights"])
    return cls(**d)


# --------------------------------------------------------------------------- scopes


@dataclasses.dataclass(frozen=True)
class _Val:
  name: str
  shape: tuple[int, ...]
  dtype: str


@dataclasses.dataclass(eq=False)
class _Version:
  """One version of a buffer (orderable mode): made at time `t`, replaced (by an
  update or a block carrying it) at time `consumed`."""
  buf: str
  t: int
  consumed: int | None = None


@dataclasses.dataclass
class _Order:
  """What orderable mode tracks in one scope."""
  ver: dict[str, _Version]            # current version of each visible buffer
  alias: dict[str, _Version]          # the version each alias holds
  times: dict[str, int]               # when each visible value was made
  noreturn: set[str]                  # values never returned: a buffer version
  #                                     unchanged (a full slice), or a constant


@dataclasses.dataclass
class _Scope:
  bufs: dict[str, Buf]                 # visible buffers, by variable name
  writable: tuple[str, ...]            # the ones this body may update
  aliases: list[tuple[str, Buf]]       # names holding an old version of a buffer
  values: list[_Val]
  counters: list[str]                  # int32 scalars: loop counters
  depth: int
  acc: str | None = None               # this body's float32 accumulator
  ord: _Order | None = None            # orderable mode's bookkeeping


def _names(node) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# --------------------------------------------------------------------------- generator


class _Gen:

  def __init__(self, ch, cfg: Config):
    self.ch, self.cfg = ch, cfg
    self.n = 0
    self.clock = 0

  def fresh(self, prefix: str) -> str:
    self.n += 1
    return f"{prefix}{self.n}"

  def int(self, lo, hi):
    return self.ch.int(lo, hi)

  def p(self, prob):
    return self.ch.p(prob)

  def choice(self, seq):
    return _choice(self.ch, seq)

  def tick(self) -> Int:
    self.clock += 1
    return self.clock

  # ------------------------------------------------------------------ program

  def program(self, label: str) -> Program:
    cfg = self.cfg
    nbufs = self.int(1, cfg.max_bufs)
    bufs: list[Buf] = []
    for k in range(nbufs):
      dtype = _weighted(self.ch, list(zip(DTYPES, cfg.dtype_weights, strict=True)))
      shape: tuple[Int, ...]
      if self.p(cfg.tiny):
        shape = (self.choice(_TINY_DIMS), self.choice(_TINY_DIMS))
      else:
        shape = tuple(self.choice(_LARGE_DIMS) if self.p(cfg.large_dims)
                      else self.choice(_SMALL_DIMS) for _ in range(2))
      if k and cfg.same_type > 0 and self.p(cfg.same_type):
        other = self.choice(bufs)
        shape, dtype = other.shape, other.dtype
      bufs.append(Buf(f"b{k}", (shape[0], shape[1]), dtype))
    data = _weighted(self.ch, [("normal", 5), ("integer", 4), ("special", 1)])
    data_seed = self.int(0, 2**31 - 1)
    orderable = cfg.orderable > 0 and self.p(cfg.orderable)
    scope = _Scope(bufs={b.name: b for b in bufs}, writable=tuple(b.name for b in bufs),
                   aliases=[], values=[], counters=[], depth=0)
    if orderable:
      scope.ord = _Order(ver={b.name: _Version(b.name, 0) for b in bufs}, alias={},
                         times={}, noreturn=set())
    body = self.body(scope, self.int(cfg.min_ops, cfg.max_ops))
    if orderable:
      returns = self.orderable_returns(scope, bufs)
    else:
      returns = self.returns(scope, bufs)
    return Program(tuple(bufs), body, returns, data_seed, data, label, orderable)

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
    self.shuffle(outs)
    return outs

  def shuffle(self, outs: list) -> None:
    """Buffers and values in random output positions."""
    for j in range(len(outs) - 1, 0, -1):
      k = self.int(0, j)
      outs[j], outs[k] = outs[k], outs[j]

  def orderable_returns(self, sc: _Scope, bufs) -> list[str]:
    """Every buffer once, some values once each (never an alias, a buffer version
    unchanged or a constant), in positions where jax's donation aliasing pairs
    each buffer with its own argument."""
    assert sc.ord is not None
    outs = [b.name for b in bufs]
    values = [v for v in sc.values if v.name not in sc.ord.noreturn]
    for _ in range(self.int(0, 3)):
      if values and self.p(0.7):
        outs.append(values.pop(self.int(0, len(values) - 1)).name)
    self.shuffle(outs)
    return pair_outputs(outs, bufs, {v.name: (v.shape, v.dtype) for v in sc.values})

  # ------------------------------------------------------------------ bodies

  def body(self, sc: _Scope, n: Int) -> list:
    out: list = []
    for _ in range(n):
      kinds = [("read", 7), ("update", 7), ("alias", 1), ("combine", 1),
               ("swap", 1)]
      if sc.depth < self.cfg.max_depth:
        kinds.append(("block", 3))
      kinds += [("matmul", self.cfg.matmul_weight), ("sgd", self.cfg.sgd_weight)]
      out.extend(self.op(sc, _weighted(self.ch, kinds)))
    if sc.acc is not None and self.p(0.8):
      out.extend(self.op(sc, "accumulate"))
    return out

  def op(self, sc: _Scope, kind: str) -> list:
    """The nodes of one op; in orderable mode, retried until it keeps an in-place
    order (`accept`), else left out."""
    if sc.ord is None or kind == "block":
      return self.make(sc, kind)
    for _ in range(self.cfg.retries):
      marks = len(sc.values), len(sc.aliases)
      nodes = self.make(sc, kind)
      if self.accept(sc, nodes):
        return nodes
      del sc.values[marks[0]:]
      del sc.aliases[marks[1]:]
    return []

  def make(self, sc: _Scope, kind: str) -> list:
    if kind == "read":
      return [self.read(sc)]
    if kind == "update":
      return [self.update(sc)]
    if kind == "alias":
      return [self.alias(sc)]
    if kind == "combine":
      return [self.combine(sc)] if sc.values else []
    if kind == "swap":
      return self.swap(sc)
    if kind == "block":
      b = self.block(sc)
      return [b] if b is not None else []
    if kind == "matmul":
      return self.matmul(sc)
    if kind == "sgd":
      return self.sgd(sc)
    if kind == "accumulate":
      return [self.accumulate(sc)]
    raise ValueError(kind)

  def accumulate(self, sc: _Scope) -> Stmt:
    if sc.values and self.p(0.9):
      v = self.choice(sc.values[-4:]).name
    else:
      src, _ = self.source(sc)
      v = f"{src}[0, 0]"
    red = "jnp.max" if self.p(0.6) else "jnp.sum"
    return Stmt(f"{sc.acc} = {sc.acc} + {red}({v}).astype(jnp.float32)")

  # ------------------------------------------------------------------ orderable mode

  def accept(self, sc: _Scope, nodes: list) -> bool:
    """Whether the statements keep an in-place order (see the module docstring);
    if so their effects are recorded, else nothing is."""
    assert sc.ord is not None
    undo: list = []
    for node in nodes:
      if not self._accept_stmt(sc.ord, node.code, undo):
        for fn in reversed(undo):
          fn()
        return False
    return True

  def _accept_stmt(self, o: _Order, code: str, undo: list) -> bool:
    tree = ast.parse(code).body[0]
    assert isinstance(tree, ast.Assign), code
    targets = [n for t in tree.targets for n in sorted(_names(t))]
    made, replaced = [], []
    for name in _names(tree.value):
      v = o.ver.get(name) or o.alias.get(name)
      if v is not None:
        made.append(v.t)
        if v.consumed is not None:
          replaced.append(v.consumed)
      elif name in o.times:
        made.append(o.times[name])
    if replaced:
      if any(t in o.ver for t in targets):
        return False                   # an update that reads an old version
      first = min(replaced)
      if any(t >= first for t in made):
        return False                   # cannot move before that update
    t = self.tick()
    for name in targets:
      if name in o.ver:                # an update: the current version is replaced
        old = o.ver[name]
        old.consumed = t
        o.ver[name] = _Version(name, t)
        undo.append(lambda o=o, name=name, old=old: _restore(o, name, old))
      elif isinstance(tree.value, ast.Name) and tree.value.id in o.ver:
        o.alias[name] = o.ver[tree.value.id]
        undo.append(lambda o=o, name=name: o.alias.pop(name, None))
      else:
        prev = o.times.get(name)
        o.times[name] = t
        undo.append(lambda o=o, name=name, prev=prev: (
            o.times.pop(name, None) if prev is None else o.times.__setitem__(name, prev)))
    return True

  def _reads_old(self, sc: _Scope, text) -> bool:
    if sc.ord is None or text is None:
      return False
    for name in _names(ast.parse(str(text), mode="eval")):
      v = sc.ord.ver.get(name) or sc.ord.alias.get(name)
      if v is not None and v.consumed is not None:
        return True
    return False

  def param(self, sc: _Scope, make):
    """A block parameter (bound, predicate, index); in orderable mode one that reads
    no old version, or None after `retries` tries."""
    for _ in range(self.cfg.retries if sc.ord is not None else 1):
      text = make()
      if not self._reads_old(sc, text):
        return text
    return None

  # ------------------------------------------------------------------ reads

  def source(self, sc: _Scope) -> tuple[str, Buf]:
    """A readable version: a current buffer or an old version (alias)."""
    srcs = [(n, b) for n, b in sc.bufs.items()]
    if sc.aliases and self.p(0.3):
      return self.choice(sc.aliases)
    return self.choice(srcs)

  def float_source(self, sc: _Scope, ok=lambda b: True) -> tuple[str, Buf] | None:
    """A readable float version (of a buffer for which `ok(buf)`), or None."""
    srcs = [(n, b) for n, b in sc.bufs.items() if b.dtype != "int32" and ok(b)]
    als = [(n, b) for n, b in sc.aliases if b.dtype != "int32" and ok(b)]
    if als and (not srcs or self.p(0.3)):
      return self.choice(als)
    return self.choice(srcs) if srcs else None

  def read(self, sc: _Scope) -> Stmt:
    src, buf = self.source(sc)
    expr, shape, dtype = self.read_expr(sc, src, buf)
    name = self.fresh("v")
    sc.values.append(_Val(name, shape, dtype))
    if sc.ord is not None and shape == buf.shape and _is_view(expr, src):
      sc.ord.noreturn.add(name)
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

  def idx(self, sc: _Scope, n: Int, oob: float = 0.1) -> str:
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

  def idxarr(self, sc: _Scope, n: Int, k: Int) -> tuple[str, bool, bool]:
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

  def fit(self, sc: _Scope, shape: tuple[Int, ...], dtype: str,
          scalar_ok: bool) -> str:
    """A value of `shape` and `dtype` (or a scalar, where `scalar_ok`)."""
    if not sc.values or self.p(0.2):
      lit = self.literal(dtype)
      if shape == () or scalar_ok:
        return lit
      return f"jnp.full({shape}, {lit}, {JNP[dtype]})"
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
      e = f"{e}.astype({JNP[dtype]})"
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
    if sc.ord is not None and a.name in sc.ord.noreturn:
      sc.ord.noreturn.add(name)
    return Stmt(f"{name} = {a.name} {op} {other}")

  def alias(self, sc: _Scope) -> Stmt:
    name = self.fresh("o")
    b = self.choice(list(sc.bufs))
    sc.aliases.append((name, sc.bufs[b]))
    return Stmt(f"{name} = {b}")

  # ------------------------------------------------------------------ matmul and SGD

  def weight(self, n: Int, k: Int, dtype: str) -> str:
    """A small constant float matrix [n, k] of multiples of 1/8."""
    m = self.choice((3, 5, 7))
    e = (f"(jnp.arange({n * k}, dtype=jnp.float32).reshape({n}, {k}) % {m} - "
         f"{m // 2}) * 0.125")
    return e if dtype == "float32" else f"({e}).astype({JNP[dtype]})"

  def matmul(self, sc: _Scope) -> list[Stmt]:
    """A matrix product reads a buffer (`jax.vmap(lambda r: r @ w)`, `jnp.einsum`,
    `@`, a row times `w`); the result is written into a buffer or accumulated."""
    picked = self.float_source(sc)
    if picked is None:
      return [self.read(sc)]
    src, buf = picked
    H, W = buf.shape
    K = self.choice((4, 8))
    shape: tuple[Int, ...]
    w = self.weight(W, K, buf.dtype)
    form = _weighted(self.ch, [("vmap", 3), ("einsum", 1), ("matmul", 1), ("row", 1)])
    if form == "vmap":
      expr, shape = f"jax.vmap(lambda r: r @ {w})({src})", (H, K)
    elif form == "einsum":
      expr, shape = f"jnp.einsum('ij,jk->ik', {src}, {w})", (H, K)
    elif form == "matmul":
      expr, shape = f"{src} @ {w}", (H, K)
    else:
      row = self.idx(sc, H) if self.p(0.4) else str(self.int(0, H - 1))
      expr, shape = f"{src}[{row}] @ {w}", (K,)
    name = self.fresh("v")
    sc.values.append(_Val(name, shape, buf.dtype))
    out = [Stmt(f"{name} = {expr}")]
    use = _weighted(self.ch, [("write", 3), ("accumulate", 2 if sc.acc else 0),
                              ("later", 1)])
    if use == "write":
      out.append(self.write_into(sc, name, shape, buf.dtype, avoid=buf.name))
    elif use == "accumulate":
      out.append(Stmt(f"{sc.acc} = {sc.acc} + jnp.sum({name}).astype(jnp.float32)"))
    return out

  def write_into(self, sc: _Scope, val: str, shape, dtype: str, avoid: str) -> Stmt:
    """`val` (1-D or 2-D) written into a block of a writable buffer, preferably
    another one than `avoid`."""
    t = self.choice([n for n in sc.writable if n != avoid] or list(sc.writable))
    TH, TW = sc.bufs[t].shape
    if len(shape) == 1:
      k = min(shape[0], TW)
      r, c0 = self.int(0, TH - 1), self.int(0, TW - k)
      ix, v = f"{r}, {c0}:{c0 + k}", f"{val}[0:{k}]"
    else:
      h, k = min(shape[0], TH), min(shape[1], TW)
      r0, c0 = self.int(0, TH - h), self.int(0, TW - k)
      ix, v = f"{r0}:{r0 + h}, {c0}:{c0 + k}", f"{val}[0:{h}, 0:{k}]"
    tdtype = sc.bufs[t].dtype
    if tdtype != dtype:
      v = f"{v}.astype({JNP[tdtype]})"
    return Stmt(f"{t} = {t}.at[{ix}].{self.choice(['add', 'set'])}({v})")

  def sgd(self, sc: _Scope) -> list[Stmt]:
    """An SGD step on a whole float buffer: `b = b - lr * g`, `g` read first (a
    vmapped matmul, a row or column broadcast, an elementwise function, a value);
    sometimes through a momentum buffer of the same type. A multiply feeds a
    subtract or an add: what XLA:CPU may contract into an FMA."""
    targets = [n for n in sc.writable if sc.bufs[n].dtype != "int32"]
    if not targets:
      return [self.update(sc)]
    b = self.choice(targets)
    buf = sc.bufs[b]
    H, W = buf.shape
    d = buf.dtype
    form = _weighted(self.ch, [("matmul", 3), ("row", 2), ("column", 1),
                               ("elementwise", 2), ("value", 1)])
    picked = None
    gshape: tuple[Int, ...] = (H, W)
    if form == "matmul":
      picked = self.float_source(sc, lambda s: s.shape[0] == H)
      if picked is not None:
        src, s = picked
        expr = f"jax.vmap(lambda r: r @ {self.weight(s.shape[1], W, s.dtype)})({src})"
        gshape = (H, W)
    elif form == "row":
      picked = self.float_source(sc, lambda s: s.shape[1] == W)
      if picked is not None:
        src, s = picked
        row = self.idx(sc, s.shape[0]) if self.p(0.3) else str(self.int(0, s.shape[0] - 1))
        expr, gshape = f"{src}[{row}]", (W,)
    elif form == "column":
      picked = self.float_source(sc, lambda s: s.shape[0] == H)
      if picked is not None:
        src, s = picked
        c = self.int(0, s.shape[1] - 1)
        expr, gshape = f"{src}[:, {c}:{c + 1}]", (H, 1)
    elif form == "elementwise":
      picked = self.float_source(sc, lambda s: s.shape == (H, W))
      if picked is not None:
        src, s = picked
        expr = self.choice([f"jnp.sin({src})", f"{src} * {src}", f"jnp.tanh({src})"])
        gshape = (H, W)
    if picked is None:
      expr, gshape, gdtype = self.fit(sc, (H, W), d, scalar_ok=False), (H, W), d
    else:
      gdtype = picked[1].dtype
    g = self.fresh("v")
    sc.values.append(_Val(g, gshape, gdtype))
    if sc.ord is not None and (picked is None or expr in sc.ord.noreturn):
      sc.ord.noreturn.add(g)         # a constant, or a value it may be
    out = [Stmt(f"{g} = {expr}")]
    gx = g if gdtype == d else f"{g}.astype({JNP[d]})"
    lr = self.choice(["0.1", "0.01", "0.5", "0.25"])
    moms = [n for n in sc.writable if n != b and sc.bufs[n].shape == buf.shape
            and sc.bufs[n].dtype == d]
    if moms and self.p(0.4):
      m = self.choice(moms)
      out.append(Stmt(f"{m} = {m} * {self.choice(['0.9', '0.5'])} + {gx}"))
      out.append(Stmt(f"{b} = {b} - {lr} * {m}"))
    else:
      out.append(Stmt(self.choice([f"{b} = {b} - {lr} * {gx}",
                                   f"{b} = {b} * 0.99 - {lr} * {gx}",
                                   f"{b} = {b} + {gx} * -{lr}"])))
    return out

  # ------------------------------------------------------------------ updates

  def update(self, sc: _Scope) -> Stmt:
    b = self.choice(sc.writable)
    buf = sc.bufs[b]
    base = b
    olds = [a for a, ab in sc.aliases if ab.name == buf.name]
    if sc.ord is None and olds and self.p(0.1):
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
    shape: tuple[Int, ...]
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
              Stmt(f"{b.name} = {b.name}.at[{rb}, 0:{w}].set({s}.astype({JNP[b.dtype]}))"),
              Stmt(f"{c.name} = {c.name}.at[{rc}, 0:{w}].set({t}.astype({JNP[c.dtype]}))")]
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

  def block(self, sc: _Scope) -> Block | None:
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
      params["trips"] = self.param(
          sc, lambda: f"{self.idx(sc, 3, 0.0)} + {self.int(0, 1)}")
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
      params["pred"] = self.param(sc, lambda: self.pred(sc))
    elif kind == "switch":
      params["index"] = None   # set below, once the branch count is known
    closure = kind not in ("custom_vjp", "custom_jvp")
    nb = 2 if kind == "cond" else (self.int(2, 4) if kind == "switch" else 1)
    if kind == "switch":
      params["index"] = self.param(sc, lambda: self.idx(sc, nb, 0.15))
    if any(params.get(k, 0) is None for k in ("trips", "pred", "index")):
      return None                      # orderable mode: every try read an old version
    start = self.tick()
    bodies: list[list | None] = []
    for j in range(nb):
      if nb > 1 and self.p(0.3):
        bodies.append(None)
        continue
      child = self.child(sc, carried, closure, counter, f"a{uid}", kind, start)
      bodies.append(self.body(child, self.int(1, self.cfg.max_body_ops)))
    if kind == "scan":
      sc.values.append(_Val(out, (params["length"],), "float32"))
    else:
      sc.values.append(_Val(out, (), "float32"))
    if sc.ord is not None:             # the block replaces its carried versions
      for name in carried:
        sc.ord.ver[name].consumed = start
        sc.ord.ver[name] = _Version(name, start)
      sc.ord.times[out] = start
    return Block(kind, uid, carried, bodies, out, params)

  def child(self, sc: _Scope, carried, closure: bool, counter, acc, kind: str,
            start: Int) -> _Scope:
    if closure:
      bufs = dict(sc.bufs)
      child = _Scope(bufs=bufs, writable=tuple(carried), aliases=list(sc.aliases),
                     values=list(sc.values),
                     counters=sc.counters + ([counter] if counter else []),
                     depth=sc.depth + 1, acc=acc)
    else:
      child = _Scope(bufs={n: sc.bufs[n] for n in carried}, writable=tuple(carried),
                     aliases=[], values=[], counters=[counter] if counter else [],
                     depth=sc.depth + 1, acc=acc)
    if sc.ord is not None:
      child.ord = self.child_order(sc.ord, carried, closure, kind, start)
      child.ord.times.update({n: start for n in (counter, acc) if n})
      child.aliases = [(a, b) for a, b in child.aliases if a in child.ord.alias]
    return child

  @staticmethod
  def child_order(o: _Order, carried, closure: bool, kind: str, start: Int) -> _Order:
    """A body's view: carried buffers start a version of their own; only aliases of
    versions current at the block are visible (in a loop, none of a carried buffer;
    elsewhere an alias of a carried buffer is the carried value)."""
    ver = {n: (_Version(n, start) if n in carried else v) for n, v in o.ver.items()
           if n in carried or closure}
    alias = {}
    if closure:
      for a, v in o.alias.items():
        if v.consumed is not None:
          continue
        if v.buf in carried:
          if kind in LOOP_KINDS:
            continue
          alias[a] = ver[v.buf]
        else:
          alias[a] = v
    return _Order(ver=ver, alias=alias, times=dict(o.times) if closure else {},
                  noreturn=set(o.noreturn) if closure else set())


def _restore(o: _Order, name: str, old: _Version) -> None:
  o.ver[name] = old
  old.consumed = None


def _is_view(expr: str, src: str) -> bool:
  """Whether `expr`, of the shape of the buffer `src`, is `src` unchanged (a full
  static or dynamic slice)."""
  return expr.startswith(f"{src}[") or expr.startswith(f"lax.dynamic_slice({src},")


def pair_outputs(outs: list[str], bufs: Sequence[Buf],
                 avals: dict[str, tuple]) -> list[str]:
  """`outs` reordered, within each group of outputs of one shape and dtype, so that
  the buffers of that type come first, in argument order: jax's donation aliasing
  gives each output the first unused donated argument of its type."""
  def aval(name):
    b = next((b for b in bufs if b.name == name), None)
    return (tuple(b.shape), b.dtype) if b is not None else tuple(avals[name])

  outs = list(outs)
  names = {b.name for b in bufs}
  for key in dict.fromkeys(aval(b.name) for b in bufs):
    pos = [j for j, o in enumerate(outs) if aval(o) == key]
    group = ([b.name for b in bufs if aval(b.name) == key and b.name in outs]
             + [outs[j] for j in pos if outs[j] not in names])
    for j, o in zip(pos, group, strict=True):
      outs[j] = o
  return outs


def generate(seed: int, index: int = 0, config: Config | None = None) -> Program:
  """The `index`-th program of the deterministic stream `seed`."""
  rng = random.Random(f"{seed}:{index}")
  return _Gen(RandomChooser(rng), config or Config()).program(f"fuzz_{seed}_{index}")


def programs(config: Config | None = None):
  """A hypothesis strategy of `Program`s."""
  from hypothesis import strategies as st

  @st.composite
  def strategy(draw):
    return _Gen(DrawChooser(draw), config or Config()).program("hyp")

  return strategy()
