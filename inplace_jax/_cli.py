"""`python -m inplace_jax check`: audit a function's copies from the command line.

The command compiles and runs one function of a user's file under `jax.jit` and
under `inplace_jax.jit`, with the same donated and static arguments, and prints side
by side how many buffers each copies, how many bytes, the median time of a warm
call, the ratio, whether the outputs are equal bit for bit, and then
inplace_jax's report of the copies that remain and why::

  python -m inplace_jax check examples/xla_20440.py:step --arg 'f32[4000,4000]' --donate 0

Arguments come from `--arg` specs (one per positional argument, in order) and/or
from `--args-factory FILE.py:FN`, a function of no arguments returning a tuple of
positional arguments (its arguments come first). An `--arg` is one of:

* an array: `DTYPE[d0,d1,...]`, `[]` for a scalar, with an optional `=FILL`:
  `f32[1000,1000]`, `bf16[8,128]=zeros`, `i32[]=5`. DTYPE is an XLA/JAX short
  name (`f16 bf16 f32 f64 i8 i16 i32 i64 u8 u16 u32 u64 bool c64 c128`, XLA's
  `s32`/`pred` too) or a NumPy name (`float32`). FILL is `randn` (the default for
  floating and complex types), `rand`, `zeros` (the default otherwise), `ones`,
  `arange` or a number. 64-bit types turn on `jax_enable_x64`.
* a pytree of arrays, as JSON or a Python literal whose string leaves are array
  specs: `'{"k": "f32[64,8]", "v": "f32[64,8]", "pos": "i32[]"}'`, `'["f32[4]", 2]'`.
* a Python literal, for static arguments: `3`, `"relu"`, `(2, 2)`, `None`.

Arrays are made by a jitted function, never by `jax.device_put` of NumPy memory:
on CPU a donated buffer that aliases host memory is copied by the runtime, silently
and outside the HLO (see docs/xla_notes.md), which would make the timings lie.

Timing: a donated buffer is consumed by the call that receives it, so each timed
call needs a fresh valid input. By default each call is given the outputs of the
previous call that reuse a donated input's buffer (found by buffer address after
an untimed warm call), as a training or decoding loop does; donated inputs that no
output reuses are re-created by a jitted copy, outside the timed region.
`--fresh-inputs` re-creates every donated input from a kept original before each
call instead (every call then sees the same values, but on CPU a call on a freshly
written large buffer measured ~10x slower than the steady state: 80 us against
8.5 us for the #20440 step at 4000x4000). The time is of the call alone, until its
outputs are ready; the median over `--repeat` calls is reported. `--repeat 0`
compiles and inspects only: nothing is allocated or run.

Exit status: 0 when the check ran (and, with `--strict`, passed); 1 with
`--strict` when a copy of at least `--min-bytes` remains under `inplace_jax.jit`,
the report could not be verified, or the outputs differ from `jax.jit`'s, and
always when `inplace_jax.jit` fails on a function `jax.jit` runs; 2 when the check
could not run (bad arguments, a file that does not import, a function that fails
under `jax.jit`), with a one-line message on stderr (`--traceback` shows more).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import json
import math
import os
import re
import statistics
import sys
import threading
import time
import traceback
import warnings

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._equal import trees_equal
from ._harness import run_variant

PROG = "python -m inplace_jax"

# XLA / JAX short dtype names. NumPy names (`float32`) are accepted as well.
DTYPE_CODES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "bool": "bool", "pred": "bool", "c64": "complex64", "c128": "complex128",
}
FILLS = ("randn", "rand", "zeros", "ones", "arange")

# DTYPE[dims] with an optional =FILL.
_ARRAY_RE = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[([^\]]*)\]\s*(?:=\s*(.*?))?\s*$")
_HEARTBEAT_S = 15.0


class UsageError(Exception):
  """The check cannot run: the message is printed as one line, exit status 2."""


class InplaceFailure(Exception):
  """`inplace_jax.jit` failed where `jax.jit` ran: exit status 1."""


# --------------------------------------------------------------------------- arg specs


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  """An array to make: dtype, shape, and how to fill it."""
  dtype: Any
  shape: tuple[int, ...]
  fill: str | float | int
  text: str

  def __str__(self) -> str:
    return self.text


def _dtype(name: str, text: str):
  import jax.numpy as jnp
  import numpy as np
  canon = DTYPE_CODES.get(name.lower(), name)
  try:
    dtype = jnp.dtype(canon)
  except TypeError:
    dtype = None
  # jnp.issubdtype knows bfloat16 and the float8 types, which NumPy does not.
  if dtype is None or not (jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_):
    raise UsageError(f"--arg {text!r}: unknown dtype {name!r} (use one of "
                     f"{', '.join(DTYPE_CODES)} or a NumPy name such as float32)")
  return dtype


def parse_array_spec(text: str) -> ArraySpec:
  """`"f32[1000,1000]"` -> an `ArraySpec`; raises `UsageError` if malformed."""
  import jax.numpy as jnp
  m = _ARRAY_RE.match(text)
  if m is None:
    raise UsageError(f"--arg {text!r}: expected DTYPE[d0,d1,...] such as "
                     "f32[1000,1000] (or [] for a scalar)")
  name, dims, fill = m.group(1), m.group(2).strip(), m.group(3)
  dtype = _dtype(name, text)
  shape: list[int] = []
  if dims:
    for d in dims.split(","):
      d = d.strip()
      if not d.isdigit():
        raise UsageError(f"--arg {text!r}: malformed shape [{dims}]: dimensions must "
                         "be non-negative integers separated by commas")
      shape.append(int(d))
  inexact = jnp.issubdtype(dtype, jnp.inexact)
  if fill is None or fill == "":
    fill_value: str | float | int = "randn" if inexact else "zeros"
  elif fill in FILLS:
    if fill in ("randn", "rand") and not inexact:
      raise UsageError(f"--arg {text!r}: fill {fill!r} needs a floating or complex "
                       "dtype; use zeros, ones, arange or a number")
    fill_value = fill
  else:
    try:
      fill_value = int(fill)
    except ValueError:
      try:
        fill_value = float(fill)
      except ValueError:
        raise UsageError(f"--arg {text!r}: unknown fill {fill!r} (use "
                         f"{', '.join(FILLS)} or a number)") from None
  return ArraySpec(dtype=dtype, shape=tuple(shape), fill=fill_value, text=text.strip())


def _looks_like_array(text: str) -> bool:
  return re.match(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*\[", text) is not None


def _spec_tree(obj: Any, text: str) -> Any:
  """Strings in a parsed pytree spec become `ArraySpec`s; lists stay lists."""
  if isinstance(obj, str):
    return parse_array_spec(obj)
  if isinstance(obj, dict):
    return {k: _spec_tree(v, text) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return type(obj)(_spec_tree(v, text) for v in obj)
  if obj is None or isinstance(obj, (bool, int, float, complex)):
    return obj
  raise UsageError(f"--arg {text!r}: unsupported value {obj!r} in a pytree spec")


def parse_arg(text: str) -> Any:
  """One `--arg`: an `ArraySpec`, a pytree with `ArraySpec` leaves, or a Python value."""
  stripped = text.strip()
  if not stripped:
    raise UsageError("--arg '': empty argument spec")
  if _looks_like_array(stripped):
    return parse_array_spec(stripped)
  if stripped[0] in "{[(":
    try:
      obj = json.loads(stripped)
    except ValueError:
      try:
        obj = ast.literal_eval(stripped)
      except (ValueError, SyntaxError):
        raise UsageError(f"--arg {text!r}: malformed pytree spec (expected JSON or a "
                         "Python literal whose strings are array specs, e.g. "
                         "'{\"k\": \"f32[8,4]\", \"pos\": \"i32[]\"}')") from None
    return _spec_tree(obj, text)
  try:
    return ast.literal_eval(stripped)
  except (ValueError, SyntaxError):
    raise UsageError(f"--arg {text!r}: expected DTYPE[d0,d1,...] such as f32[1000,1000], "
                     "a JSON pytree of such specs, or a Python literal") from None


def _spec_leaves(tree: Any) -> list[ArraySpec]:
  out: list[ArraySpec] = []

  def walk(t):
    if isinstance(t, ArraySpec):
      out.append(t)
    elif isinstance(t, dict):
      for v in t.values():
        walk(v)
    elif isinstance(t, (list, tuple)):
      for v in t:
        walk(v)

  walk(tree)
  return out


def _needs_x64(specs: Sequence[Any]) -> bool:
  return any(s.dtype.itemsize == 8 and s.dtype.kind in "fiu" or s.dtype.itemsize == 16
             for tree in specs for s in _spec_leaves(tree))


def _map_specs(tree: Any, fn: Callable[[ArraySpec], Any]) -> Any:
  if isinstance(tree, ArraySpec):
    return fn(tree)
  if isinstance(tree, dict):
    return {k: _map_specs(v, fn) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return type(tree)(_map_specs(v, fn) for v in tree)
  return tree


@functools.lru_cache(maxsize=None)
def _maker(shape: tuple[int, ...], dtype: Any, fill: Any) -> Callable:
  import jax
  import jax.numpy as jnp

  # Made by XLA, so the buffer belongs to the runtime and donation can reuse it.
  @jax.jit
  def make(key):
    if fill == "randn":
      return jax.random.normal(key, shape, dtype)
    if fill == "rand":
      return jax.random.uniform(key, shape, dtype)
    if fill == "zeros":
      return jnp.zeros(shape, dtype)
    if fill == "ones":
      return jnp.ones(shape, dtype)
    if fill == "arange":
      return jnp.arange(math.prod(shape)).reshape(shape).astype(dtype)
    return jnp.full(shape, fill, dtype)

  return make


def build_args(specs: Sequence[Any], seed: int) -> list[Any]:
  """Arrays for the specs, each from its own key, made by jitted functions."""
  import jax
  counter = iter(range(1 << 30))

  def make(s: ArraySpec):
    key = jax.random.fold_in(jax.random.key(seed), next(counter))
    return _maker(s.shape, s.dtype, s.fill)(key)

  return [_map_specs(tree, make) for tree in specs]


def abstract_args(specs: Sequence[Any]) -> list[Any]:
  import jax
  return [_map_specs(tree, lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype))
          for tree in specs]


def _is_array(x: Any) -> bool:
  import jax
  import numpy as np
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


@functools.lru_cache(maxsize=None)
def _copier() -> Callable:
  import jax
  import jax.numpy as jnp
  # An explicit copy: `jax.jit(lambda x: x)` forwards its input and would hand the
  # same buffer back, which the next donating call would then consume.
  return jax.jit(lambda t: jax.tree.map(lambda a: jnp.array(a, copy=True), t))


def runtime_owned(tree: Any) -> Any:
  """A copy of the array leaves of `tree` in buffers XLA made (safe to donate)."""
  import jax
  leaves, treedef = jax.tree.flatten(tree)
  arrays = [i for i, leaf in enumerate(leaves) if _is_array(leaf)]
  copied = _copier()([leaves[i] for i in arrays])
  for i, c in zip(arrays, copied, strict=True):
    leaves[i] = c
  return jax.tree.unflatten(treedef, leaves)


def _fresh(args: Sequence[Any], donate: Sequence[int]) -> list[Any]:
  """The arguments with every donated one re-created (the others are not consumed)."""
  import jax
  out = list(args)
  if donate:
    copies = runtime_owned([args[i] for i in donate])
    for i, c in zip(donate, copies, strict=True):
      out[i] = c
  jax.block_until_ready(out)
  return out


# --------------------------------------------------------------------------- loading


_modules: dict[str, Any] = {}


def _split_target(target: str, flag: str) -> tuple[str, str]:
  path, sep, name = target.rpartition(":")
  if not sep or not path or not name:
    raise UsageError(f"{flag} {target!r}: expected FILE.py:FUNCTION")
  return path, name


def load_module(path: str) -> Any:
  """Imports the file at `path` (its directory first on `sys.path`)."""
  real = os.path.realpath(path)
  if real in _modules:
    return _modules[real]
  if not os.path.isfile(real):
    raise UsageError(f"no such file: {path}")
  directory = os.path.dirname(real)
  if directory not in sys.path:
    sys.path.insert(0, directory)
  stem = os.path.splitext(os.path.basename(real))[0]
  safe = re.sub(r"\W", "_", stem)
  name = stem if stem.isidentifier() and stem not in sys.modules else (
      f"_inplace_jax_cli_{len(_modules)}_{safe}")
  spec = importlib.util.spec_from_file_location(name, real)
  if spec is None or spec.loader is None:
    raise UsageError(f"cannot import {path}: not a Python file")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # the user's code: one line, --traceback for the rest
    del sys.modules[name]
    raise UsageError(f"importing {path} failed: {_one_line(e)}") from e
  _modules[real] = module
  return module


def load_function(target: str, flag: str = "check") -> tuple[Callable, str]:
  """`"file.py:fn"` (or `"file.py:Class.method"`) -> (the callable, its label)."""
  path, name = _split_target(target, flag)
  module = load_module(path)
  obj: Any = module
  for part in name.split("."):
    if not hasattr(obj, part):
      defined = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
      hint = f" (it defines: {', '.join(defined)})" if defined else ""
      raise UsageError(f"{path} has no function {name!r}{hint}")
    obj = getattr(obj, part)
  if not callable(obj):
    raise UsageError(f"{path}:{name} is a {type(obj).__name__}, not a function")
  return _unjit(obj), f"{path}:{name}"


def _unjit(fn: Callable) -> Callable:
  """The plain function under a `jax.jit` or `inplace_jax.jit` wrapper: both variants
  are compiled here, with the donation given on the command line."""
  while hasattr(fn, "lower") and hasattr(fn, "__wrapped__"):
    fn = fn.__wrapped__
  return fn


def _one_line(e: BaseException) -> str:
  msg = str(e).strip().splitlines()
  return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


# --------------------------------------------------------------------------- running


@contextlib.contextmanager
def progress(label: str, enabled: bool) -> Iterator[None]:
  """`label ...` on stderr, a heartbeat while it runs, and the elapsed time."""
  if not enabled:
    yield
    return
  err = sys.stderr
  start = time.perf_counter()
  print(f"[inplace_jax] {label} ...", file=err, flush=True)
  done = threading.Event()

  def beat():
    while not done.wait(_HEARTBEAT_S):
      print(f"[inplace_jax]   ... still {label} ({time.perf_counter() - start:.0f} s)",
            file=err, flush=True)

  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  outcome = "failed after"
  try:
    yield
    outcome = "done in"
  finally:
    done.set()
    thread.join()
    print(f"[inplace_jax] {label}: {outcome} {time.perf_counter() - start:.2f} s",
          file=err, flush=True)


@dataclasses.dataclass
class Variant:
  """What one compilation (jax.jit or inplace_jax.jit) gave."""
  name: str
  report: Any = None
  first_call_s: float | None = None
  times_s: list[float] = dataclasses.field(default_factory=list)
  output: Any = None
  timing: str | None = None

  @property
  def median_s(self) -> float | None:
    return statistics.median(self.times_s) if self.times_s else None

  def summary(self, min_bytes: int) -> dict[str, Any]:
    r = self.report
    return {
        "copies": len(r.copies),
        "copy_bytes": r.total_copy_bytes,
        "copies_over_min_bytes": len(r.copies_over(min_bytes)),
        "copy_bytes_over_min_bytes": sum(c.nbytes for c in r.copies_over(min_bytes)),
        "verified": r.verified,
        "median_time_s": self.median_s,
        "times_s": list(self.times_s),
        "first_call_s": self.first_call_s,
        "timing": self.timing,
    }


def _pointer(leaf: Any) -> int | None:
  try:
    return int(leaf.unsafe_buffer_pointer())
  except Exception:  # noqa: BLE001 - not a single-device array: no feed-back
    return None


class _Inputs:
  """Valid arguments for each call of a function whose donated arguments it consumes.

  Feed-back mode (the default) gives each call the outputs of the previous call that
  reuse a donated input's buffer (found by buffer address after a warm call), as a
  training or decoding loop does; donated leaves no output reuses are re-created.
  Fresh mode re-creates every donated argument from the kept original before each
  call. Either way the re-creation happens outside the timed region.
  """

  def __init__(self, args: Sequence[Any], donate: Sequence[int], feed_back: bool):
    import jax
    self.args, self.donate = list(args), list(donate)
    self.feed_back = feed_back and bool(donate)
    self.plan: dict[tuple[int, int], int] = {}   # (arg, leaf) -> output leaf
    self.treedefs = {i: jax.tree.structure(self.args[i]) for i in self.donate}

  def fresh(self) -> list[Any]:
    return _fresh(self.args, self.donate)

  def learn(self, call_args: Sequence[Any], pointers: dict, out: Any) -> None:
    """Which output leaf reuses each donated leaf's buffer, from one call."""
    import jax
    if not self.feed_back:
      return
    by_pointer: dict[int, int] = {}
    for k, leaf in enumerate(jax.tree.leaves(out)):
      p = _pointer(leaf)
      if p is not None:
        by_pointer.setdefault(p, k)
    self.plan = {key: by_pointer[p] for key, p in pointers.items()
                 if p is not None and p in by_pointer}

  def pointers(self, call_args: Sequence[Any]) -> dict:
    import jax
    return {(i, j): _pointer(leaf) for i in self.donate
            for j, leaf in enumerate(jax.tree.leaves(call_args[i]))}

  def next(self, previous_out: Any) -> list[Any]:
    import jax
    if not self.plan:
      return self.fresh()
    out_leaves = jax.tree.leaves(previous_out)
    call_args = list(self.args)
    for i in self.donate:
      master = jax.tree.leaves(self.args[i])
      missing = [j for j in range(len(master)) if (i, j) not in self.plan]
      copies = dict(zip(missing, runtime_owned([master[j] for j in missing]),
                        strict=True))
      leaves = [out_leaves[self.plan[(i, j)]] if (i, j) in self.plan else copies[j]
                for j in range(len(master))]
      call_args[i] = jax.tree.unflatten(self.treedefs[i], leaves)
    jax.block_until_ready(call_args)
    return call_args

  @property
  def mode(self) -> str:
    if not self.donate:
      return "no donated arguments"
    if not self.plan:
      return "donated inputs re-created before each call"
    return "aliased outputs fed back as the next call's donated inputs"


def _run(variant: Variant, jitted: Callable, args: Sequence[Any], donate: Sequence[int],
         repeat: int, verbose: bool, report_fn: Callable[[], Any],
         feed_back: bool = True) -> Variant:
  import jax
  if repeat == 0:
    with progress(f"compiling under {variant.name}", verbose):
      variant.report = report_fn()
    return variant
  inputs = _Inputs(args, donate, feed_back)
  with progress(f"compiling and running under {variant.name}", verbose):
    # The first call, through the comparison harness every tool shares; the output
    # is kept (on the host) for the comparison and never fed back.
    run = run_variant(jitted, lambda: tuple(inputs.fresh()), report=report_fn)
    variant.output, variant.first_call_s, variant.report = (
        run.output, run.first_call_s, run.report)
    for w in run.warnings:    # for the notes `_check` collects
      warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
  with progress(f"timing {repeat} warm calls under {variant.name}", verbose):
    call_args = inputs.fresh()
    pointers = inputs.pointers(call_args)
    out = jax.block_until_ready(jitted(*call_args))
    inputs.learn(call_args, pointers, out)
    del call_args
    for _ in range(repeat):
      call_args = inputs.next(out)
      del out
      start = time.perf_counter()
      out = jitted(*call_args)
      jax.block_until_ready(out)
      variant.times_s.append(time.perf_counter() - start)
      del call_args
  variant.timing = inputs.mode
  return variant


# --------------------------------------------------------------------------- output


def _fmt_ratio(r: float | None) -> str:
  if r is None:
    return "n/a"
  return f"{r:,.0f}x" if r >= 100 else f"{r:.2f}x"


def _arg_labels(fn: Callable, n: int) -> list[str]:
  try:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  return [params[i].name if i < len(params) else f"args[{i}]" for i in range(n)]


def _describe(arg: Any) -> str:
  import jax
  leaves = jax.tree.leaves(arg)
  if len(leaves) == 1 and leaves[0] is arg and hasattr(arg, "shape"):
    return _type_str(arg)
  if leaves and all(hasattr(v, "shape") for v in leaves):
    shown = ", ".join(_type_str(v) for v in leaves[:4])
    more = ", ..." if len(leaves) > 4 else ""
    return f"pytree of {len(leaves)} arrays ({shown}{more})"
  return repr(arg)


def _type_str(a: Any) -> str:
  import numpy as np
  return f"{np.dtype(a.dtype).name}[{','.join(str(d) for d in a.shape)}]"


def format_text(result: dict[str, Any], jj: Variant, ij: Variant, arg_lines: list[str]
                ) -> str:
  from ._report import format_copy, human_bytes, human_time
  lines = [f"inplace_jax check: {result['function']} "
           f"(backend {result['backend']}, jax {result['jax_version']})"]
  lines += [f"  {a}" for a in arg_lines]
  rows = [["", "jax.jit", "inplace_jax.jit"]]
  for label, key in (("copies", "copies"),
                     (f"copies >= {result['min_bytes']} B", "copies_over_min_bytes")):
    rows.append([label, *(str(result[v][key]) for v in ("jax_jit", "inplace_jax_jit"))])
  copied = (v.report.total_copy_bytes for v in (jj, ij))
  rows.append(["copied bytes per call", *(f"{n:,} ({human_bytes(n)})" for n in copied)])
  rows.append([f"median time per call ({result['repeat']} warm calls)",
               human_time(jj.median_s), human_time(ij.median_s)])
  rows.append(["compile + first call",
               human_time(jj.first_call_s), human_time(ij.first_call_s)])
  widths = [max(len(r[i]) for r in rows) for i in range(3)]
  lines.append("")
  lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]
  lines.append("")
  ratio = _fmt_ratio(result["time_ratio"])
  lines.append(f"  time ratio jax.jit / inplace_jax.jit: {ratio}")
  if ij.timing:
    lines.append(f"  timing: {ij.timing}")
  eq = result["outputs_equal"]
  lines.append("  outputs equal bit for bit: " + ("n/a (not run)" if eq is None
                                                  else "yes" if eq else "NO"))
  if jj.report.copies:
    lines.append("")
    lines.append("Copies under jax.jit:")
    lines += [f"  - {format_copy(c)}" for c in jj.report.copies]
  lines.append("")
  lines.append("inplace_jax.jit report (what remains and why):")
  lines.append(str(ij.report))
  remaining = ij.report.copies_over(result["min_bytes"])
  if remaining and not ij.report.findings:
    lines.append("No transform finding explains the copies above; the HLO lines are:")
    lines += [f"  {c.hlo}" for c in remaining]
  return "\n".join(lines)


# --------------------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
  """argparse that reports a usage error as one line, without the usage text."""

  def error(self, message: str):  # type: ignore[override]
    raise UsageError(message)


def _indices(values: Sequence[str] | None, flag: str) -> list[int]:
  out: list[int] = []
  for v in values or ():
    for part in v.split(","):
      part = part.strip()
      if not part:
        continue
      try:
        out.append(int(part))
      except ValueError:
        raise UsageError(f"{flag} {v!r}: expected argument indices such as 0 or 0,2") \
            from None
  return out


def make_parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=PROG, description="Audit copies of donated buffers.")
  sub = parser.add_subparsers(dest="command", parser_class=_Parser)
  p = sub.add_parser(
      "check", help="compare a function under jax.jit and inplace_jax.jit",
      description="Compile and run FILE.py:FUNCTION under jax.jit and inplace_jax.jit "
      "and compare copies, time and outputs.")
  p.add_argument("target", metavar="FILE.py:FUNCTION")
  p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                 help="a positional argument: DTYPE[d0,d1,...][=FILL], a JSON pytree "
                 "of such specs, or a Python literal (for static arguments)")
  p.add_argument("--args-factory", metavar="FILE.py:FN",
                 help="a function of no arguments returning a tuple of positional "
                 "arguments (they come before any --arg)")
  p.add_argument("--donate", action="append", metavar="I",
                 help="donate positional argument I (repeat, or 0,1)")
  p.add_argument("--static", action="append", metavar="I",
                 help="positional argument I is static (repeat, or 0,1)")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object to stdout and nothing else")
  p.add_argument("--strict", action="store_true",
                 help="exit 1 if a copy of at least --min-bytes remains under "
                 "inplace_jax.jit (or the outputs differ)")
  p.add_argument("--min-bytes", type=int, default=1024, metavar="N",
                 help="copies smaller than N bytes do not count (default 1024)")
  p.add_argument("--repeat", type=int, default=20, metavar="N",
                 help="timed warm calls per variant (default 20; 0: compile and "
                 "inspect only, run nothing)")
  p.add_argument("--fresh-inputs", action="store_true",
                 help="re-create the donated inputs before each timed call instead "
                 "of feeding the aliased outputs back")
  p.add_argument("--seed", type=int, default=0, help="seed for random fills")
  p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
  p.add_argument("--traceback", action="store_true",
                 help="on failure, print the full traceback")
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command line; returns the exit status (0, 1 or 2)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  show_tb = "--traceback" in argv
  try:
    try:
      opts = make_parser().parse_args(argv)
    except SystemExit as e:  # --help
      return int(e.code or 0)
    if opts.command != "check":
      raise UsageError("expected a command: check (see python -m inplace_jax check -h)")
    return _check(opts)
  except UsageError as e:
    if show_tb and e.__cause__ is not None:
      traceback.print_exception(e.__cause__, file=sys.stderr)
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  except InplaceFailure as e:
    if show_tb and e.__cause__ is not None:
      traceback.print_exception(e.__cause__, file=sys.stderr)
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 1


def _check(opts: argparse.Namespace) -> int:
  if opts.min_bytes < 0:
    raise UsageError(f"--min-bytes {opts.min_bytes}: must be >= 0")
  if opts.repeat < 0:
    raise UsageError(f"--repeat {opts.repeat}: must be >= 0")
  donate = sorted(set(_indices(opts.donate, "--donate")))
  static = sorted(set(_indices(opts.static, "--static")))
  specs = [parse_arg(a) for a in opts.arg]

  # In --json mode stdout carries the JSON object only; the user's prints go to stderr.
  quiet_stdout = contextlib.redirect_stdout(sys.stderr) if opts.json \
      else contextlib.nullcontext()
  with quiet_stdout, warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result, jj, ij, arg_lines = _audit(opts, specs, donate, static)
  notes = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
                  for w in caught})
  for note in notes:
    if not opts.quiet:
      print(f"[inplace_jax] note: {note}", file=sys.stderr)
  result["warnings"] = notes

  failed = []
  remaining = ij.report.copies_over(opts.min_bytes)
  if remaining:
    failed.append(f"{len(remaining)} copy(ies) of at least {opts.min_bytes} bytes "
                  "remain under inplace_jax.jit")
  if not ij.report.verified:
    failed.append("the inplace_jax.jit program could not be verified")
  if result["outputs_equal"] is False:
    failed.append("inplace_jax.jit's outputs differ from jax.jit's")
  result["strict_failures"] = failed
  if opts.json:
    print(json.dumps(result, indent=2))
  else:
    print(format_text(result, jj, ij, arg_lines))
  if opts.strict and failed:
    print(f"{PROG}: --strict: " + "; ".join(failed), file=sys.stderr)
    return 1
  return 0


def _audit(opts, specs, donate, static):
  """Loads the target, runs it under jax.jit and inplace_jax.jit, and returns the
  result dictionary, both variants and the argument lines."""
  import jax

  fn, label = load_function(opts.target)
  factory_args = _factory_args(opts)
  nargs = len(factory_args) + len(specs)
  _validate_indices(opts, specs, factory_args, donate, static)
  if _needs_x64(specs) and not jax.config.jax_enable_x64:
    jax.config.update("jax_enable_x64", True)
    if not opts.quiet:
      print("[inplace_jax] note: 64-bit dtype requested: jax_enable_x64 turned on",
            file=sys.stderr)
  args = _make_args(opts, specs, factory_args, static)
  names = _arg_labels(fn, nargs)
  arg_lines = [f"{names[i]}: {_describe(a)}"
               + (" (donated)" if i in donate else " (static)" if i in static else "")
               for i, a in enumerate(args)]
  jj, ij = _run_both(opts, fn, label, args, donate, static)
  ratio = (jj.median_s / ij.median_s if jj.median_s is not None and ij.median_s
           else None)
  result = {
      "function": label,
      "args": arg_lines,
      "donate_argnums": donate,
      "static_argnums": static,
      "min_bytes": opts.min_bytes,
      "repeat": opts.repeat,
      "backend": jax.default_backend(),
      "jax_version": jax.__version__,
      "jax_jit": jj.summary(opts.min_bytes),
      "inplace_jax_jit": ij.summary(opts.min_bytes),
      "time_ratio": ratio,
      "outputs_equal": trees_equal(jj.output, ij.output) if opts.repeat > 0 else None,
      "jax_jit_report": jj.report.to_dict(),
      "inplace_jax_report": ij.report.to_dict(),
  }
  return result, jj, ij, arg_lines


def _factory_args(opts) -> list[Any]:
  """The positional arguments `--args-factory` returns (none without it)."""
  if not opts.args_factory:
    return []
  make_args, _ = load_function(opts.args_factory, "--args-factory")
  try:
    made = make_args()
  except Exception as e:
    raise UsageError(f"--args-factory {opts.args_factory}: raised "
                     f"{_one_line(e)}") from e
  if not isinstance(made, (tuple, list)):
    raise UsageError(f"--args-factory {opts.args_factory}: must return a tuple of "
                     f"positional arguments, got {type(made).__name__}")
  return list(made)


def _validate_indices(opts, specs, factory_args, donate, static) -> None:
  """Usage errors for missing arguments and bad `--donate`/`--static` indices."""
  if not factory_args and not specs:
    raise UsageError("no arguments: give --arg specs (e.g. --arg 'f32[1000,1000]') "
                     "or --args-factory FILE.py:FN")
  nargs = len(factory_args) + len(specs)
  for flag, idx in (("--donate", donate), ("--static", static)):
    bad = [i for i in idx if not 0 <= i < nargs]
    if bad:
      raise UsageError(f"{flag} {bad[0]}: out of range, the function gets {nargs} "
                       f"positional argument(s) (indices 0..{nargs - 1})")
  both = sorted(set(donate) & set(static))
  if both:
    raise UsageError(f"argument {both[0]} is both --donate and --static")
  all_specs = [None] * len(factory_args) + specs
  for i in static:
    if all_specs[i] is not None and _spec_leaves(all_specs[i]):
      raise UsageError(f"--static {i}: argument {i} is an array spec "
                       f"({opts.arg[i - len(factory_args)]}); static arguments are "
                       "Python values such as 3 or \"relu\"")
  for i in donate:
    if all_specs[i] is not None and not _spec_leaves(all_specs[i]):
      raise UsageError(f"--donate {i}: argument {i} is a Python value, not an array")


def _make_args(opts, specs, factory_args, static) -> list[Any]:
  """Concrete arguments (with `--repeat`) or abstract ones (without)."""
  import jax

  if opts.repeat > 0:
    args = runtime_owned(factory_args) + build_args(specs, opts.seed)
  else:
    args = [jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)
                         if _is_array(a) else a, a) for a in factory_args]
    args += abstract_args(specs)
  for i in static:
    try:
      hash(args[i])
    except TypeError:
      raise UsageError(f"--static {i}: static arguments must be hashable, got "
                       f"{type(args[i]).__name__}") from None
  return args


def _run_both(opts, fn, label, args, donate, static) -> tuple[Variant, Variant]:
  """The target under jax.jit, then under inplace_jax.jit."""
  import jax

  import inplace_jax

  run = opts.repeat > 0
  jit_kw: dict[str, Any] = dict(donate_argnums=tuple(donate) or None,
                                static_argnums=tuple(static) or None)
  ref = jax.jit(fn, **jit_kw)
  jj = Variant("jax.jit")
  try:
    _run(jj, ref, args, donate, opts.repeat, not opts.quiet,
         lambda: inplace_jax.check(ref, *args), feed_back=not opts.fresh_inputs)
  except UsageError:
    raise
  except Exception as e:
    raise UsageError(f"{label} failed under jax.jit with these arguments: "
                     f"{_one_line(e)}") from e

  ours = inplace_jax.jit(fn, on_copy="ignore", min_bytes=opts.min_bytes, **jit_kw)
  ij = Variant("inplace_jax.jit")
  try:
    _run(ij, ours, args, donate, opts.repeat, not opts.quiet,
         (lambda: ours.last_report) if run else (lambda: inplace_jax.check(ours, *args)),
         feed_back=not opts.fresh_inputs)
  except Exception as e:
    raise InplaceFailure(f"{label} runs under jax.jit but failed under inplace_jax.jit "
                         f"(please report it as a bug): {_one_line(e)}") from e
  if ij.report is None:
    raise InplaceFailure(f"inplace_jax.jit produced no report for {label} "
                         "(please report it as a bug)")
  return jj, ij
