"""The fuzzer's oracle: a program under `jax.jit` and under `inplace_jax.jit`, through
the one comparison harness (`inplace_jax._harness.compare`), every argument donated,
on equal fresh inputs.

`Outcome.status`, first that applies:

* "invalid": jax.jit itself rejects the program (a generator bug);
* "crash": inplace_jax.jit raises where jax.jit does not;
* "value": outputs differ (structure, dtype, an integer, or a float beyond
  `np.allclose(rtol=1e-5, atol=1e-6)` and a few ulps), on the program's inputs
  or, where inplace_jax runs a sequenced program, on `OTHER_DATA`;
* "inexact": outputs differ only by float rounding (within that tolerance, or the
  sign of zeros): not bit-equal, so still a failure, reported apart from "value";
* "unverified": an HLO report could not be verified;
* "copies": inplace_jax's program copies more bytes (copies of >= 1 KiB) than
  jax.jit's;
* "residual": the program is orderable by construction, jax.jit's program copies a
  buffer (a buffer copy of >= 1 KiB) and inplace_jax's still does: a copy remains
  where an in-place order exists. Each residual program is also tried with its
  reads tied by hand (`certify`): `Outcome.certified` is True where that program is
  copy-free and bit-equal to jax.jit's on the program's inputs, on normal ones and
  on tiny ones (an exact in-place program exhibited), False where it copies or
  differs;
* "unexplained": inplace_jax's program keeps a buffer copy of >= 1 KiB whose
  `CopyInfo.cause` is None, or says something about it that the report itself
  shows false (`_harness.untrue_statements`);
* "ok".

"died"/"timeout" come from the worker pool (`pool.py`): the process checking the
program aborted or hung. Every outcome also records whether the program is
orderable, its constructs, the buffer-copy bytes of both programs and which
program inplace_jax.jit chose to run.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from inplace_jax import _compat
from inplace_jax._check import check_compiled
from inplace_jax._equal import tree_difference
from inplace_jax._harness import compare, untrue_statements
from inplace_jax._jit import _bytes, compiler_options
from inplace_jax._rewrite import barrier_in_small_loop

from .program import Buf, Program, build

ORACLE_MIN_BYTES = 1024
STATUSES = ("ok", "value", "inexact", "copies", "residual", "unexplained",
            "jax_jit_wrong", "unverified", "crash", "died", "timeout", "invalid")
# Statuses that fail a run (CI, regressions); "residual" and "unexplained" are
# reported while the core brings them to zero; "jax_jit_wrong" (inplace_jax's
# values differ from jax.jit's beyond rounding and are the eager ones, bit for
# bit, where jax.jit's are not: XLA miscompiled jax.jit's program) is reported,
# not ours. A difference by rounding is "inexact" whatever the eager values are.
HARD_FAILURES = frozenset(
    {"value", "inexact", "copies", "unverified", "crash", "died", "timeout", "invalid"})
REPORTED = frozenset({"residual", "unexplained", "jax_jit_wrong"})
INEXACT_RTOL, INEXACT_ATOL, INEXACT_ULPS = 1e-5, 1e-6, 4


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
  if mode == "tiny":
    # Near the bottom of float32's normal range: products with the generator's
    # constants (0.125, 0.1, ...) fall below it, where XLA:CPU flushes results to
    # zero. A multiply-add and its unfused multiply and add, or a power-of-two
    # scale moved into a constant, round alike on normal data but not here.
    x = (x * np.float32(2.0 ** -122)).astype(np.float32)
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


# --------------------------------------------------------------------------- outcomes


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What the oracle found for one program (see the module docstring)."""
  status: str
  detail: str = ""
  jax_bytes: int | None = None          # copies of >= 1 KiB, all categories
  inplace_bytes: int | None = None
  error: str | None = None              # exception type ("crash"/"invalid"), or a
  #                                       sub-kind ("copies": "buffer"/"smaller")
  orderable: bool | None = None         # None: not a generated program
  constructs: tuple[str, ...] = ()
  jax_buffer_bytes: int | None = None   # buffer copies of >= 1 KiB
  inplace_buffer_bytes: int | None = None
  program: str | None = None            # what inplace_jax.jit ran: jax.jit/sequenced
  residual: bool = False                # the "residual" condition holds
  unexplained: int = 0                  # buffer copies (>= 1 KiB) without a true cause
  certified: bool | None = None         # residual only: `certify`'s verdict
  certificate: str = ""                 # what `certify` found
  # Every program inplace_jax.jit compiled to decide, in order (jax.jit's first):
  # [clone level, buffer copy bytes (>= 1 KiB), operations computed differently,
  # whether it runs, whether the materialising round compiled it]. How many
  # compiles each program costs, and what each round won.
  rounds: tuple = ()

  @property
  def ok(self) -> bool:
    return self.status == "ok"

  @property
  def failed(self) -> bool:
    """Whether CI fails on it (residual and unexplained are only reported)."""
    return self.status in HARD_FAILURES

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "Outcome":
    kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
    kw["constructs"] = tuple(kw.get("constructs") or ())
    return cls(**kw)


# --------------------------------------------------------------------------- values


def _ulps(x: np.ndarray, y: np.ndarray, dtype) -> np.ndarray:
  """Distance of x and y in units of the last place of `dtype` at max(|x|, |y|)."""
  info = jnp.finfo(dtype)
  mag = np.maximum(np.abs(x), np.abs(y))
  tiny = float(info.smallest_normal)
  exp = np.floor(np.log2(np.maximum(mag, tiny)))
  ulp = np.exp2(exp) * float(info.eps)
  return np.abs(x - y) / ulp


def classify_difference(ref, got) -> tuple[str, str] | None:
  """None when `ref` and `got` are equal bit for bit (`tree_difference`, the
  harness's equality); else ("value" or "inexact", where and by how much)."""
  if (diff := tree_difference(ref, got)) is None:
    return None
  la, lb = jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)
  if len(la) != len(lb):
    return "value", diff
  status, parts = "inexact", []
  for k, (x, y) in enumerate(zip(la, lb)):
    if (leaf_diff := tree_difference(x, y)) is None:
      continue
    x, y = np.asarray(x), np.asarray(y)
    if (x.dtype != y.dtype or x.shape != y.shape
        or (x.dtype.kind not in "fc" and x.dtype != jnp.bfloat16)):
      return "value", (f"output {k}: {leaf_diff}:\n  jax.jit:     {x!r}\n"
                       f"  inplace_jax: {y!r}")
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    xf, yf = x.astype(wide), y.astype(wide)
    same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
    bad = np.argwhere(np.atleast_1d(~same))
    with np.errstate(invalid="ignore", over="ignore"):
      close = np.isclose(xf, yf, rtol=INEXACT_RTOL, atol=INEXACT_ATOL, equal_nan=True)
      if x.dtype.kind != "c":
        finite = np.isfinite(xf) & np.isfinite(yf)
        ulps = np.where(finite, _ulps(xf, yf, x.dtype), np.inf)
        close |= ulps <= INEXACT_ULPS
      diff_abs = np.abs(xf - yf)
    close |= same
    if not np.all(close):
      status = "value"
    sign_only = " (the sign of zeros only)" if len(bad) == 0 else ""
    maxd = np.nanmax(np.where(same, 0, diff_abs)) if len(bad) else 0
    parts.append(f"output {k} ({x.dtype}{list(x.shape)}) differs{sign_only} at "
                 f"{len(bad)} of {x.size} positions, first {bad[:3].tolist()}; max abs "
                 f"diff {maxd}; {'within' if np.all(close) else 'BEYOND'} rtol "
                 f"{INEXACT_RTOL}, atol {INEXACT_ATOL} / {INEXACT_ULPS} ulps:\n"
                 f"  jax.jit:     {x!r}\n  inplace_jax: {y!r}")
  return status, "\n".join(parts) or diff


# --------------------------------------------------------------------------- pairing


def pairs_buffers(returns: Sequence[str], bufs: Sequence[Buf], outputs) -> bool:
  """Whether jax's donation aliasing pairs each donated buffer with the output that
  returns it: each output, in order, takes the first unused donated argument of its
  shape and dtype; every buffer must be returned exactly once."""
  leaves = jax.tree_util.tree_leaves(outputs)
  if len(leaves) != len(returns):
    return False
  names = [b.name for b in bufs]
  if sorted(r for r in returns if r in names) != sorted(names):
    return False
  free = [(tuple(b.shape), np.dtype(b.dtype)) for b in bufs]
  used = [False] * len(bufs)
  for name, leaf in zip(returns, leaves):
    key = (tuple(np.shape(leaf)), np.dtype(leaf.dtype))
    k = next((k for k, f in enumerate(free) if not used[k] and f == key), None)
    if k is not None:
      used[k] = True
    if name in names and k != names.index(name):
      return False
  return True


# --------------------------------------------------------------------------- the check


def _rounds(cmp) -> tuple:
  """`Outcome.rounds` of the signature `cmp`'s inplace_jax.jit function ran."""
  sigs = getattr(cmp.fn, "signatures", ())
  if not sigs:
    return ()
  sig = sigs[-1]
  return tuple([c.clone, _bytes(c, ORACLE_MIN_BYTES)[0], len(c.changed), c is sig.chosen,
                c.materialised] for c in sig.candidates)


def _no_in_place_updates(bufs: Sequence[Buf]) -> bool:
  """Whether a buffer of these types cannot be updated in place on this backend
  whatever the order: XLA:CPU computes a bfloat16 update through float32 converts
  into a new buffer and copies it into the donated one, even `b.at[0, 5].set(1.5)`
  with no read at all (docs/xla_notes.md). Such a program has no in-place order."""
  return jax.default_backend() == "cpu" and any(b.dtype == "bfloat16" for b in bufs)


def check_function(fn: Callable, bufs: Sequence[Buf], data_seed: int = 0,
                   data: str = "normal", *, orderable: bool | None = None,
                   constructs: Iterable[str] = (),
                   returns: Sequence[str] | None = None) -> Outcome:
  """The oracle on `fn(*buffers)`, every argument donated. `orderable` (with the
  program's `returns`, to check that donation aliasing pairs the buffers with their
  outputs) decides whether a remaining buffer copy is "residual"."""
  donate = tuple(range(len(bufs)))
  facts = Outcome("ok", orderable=orderable, constructs=tuple(sorted(constructs)))
  try:
    cmp = compare(fn, lambda: tuple(make_inputs(bufs, data_seed, data)),
                  donate_argnums=donate, on_copy="ignore", min_bytes=ORACLE_MIN_BYTES)
  except Exception as e:  # noqa: BLE001 - whose error it is decides the status
    if (ref_error := _jax_jit_error(fn, bufs, donate, data_seed, data)) is not None:
      return dataclasses.replace(facts, status="invalid", detail=ref_error[1],
                                 error=ref_error[0])
    return dataclasses.replace(facts, status="crash", detail=_tb(e),
                               error=type(e).__name__)
  ref_report, report = cmp.reference.report, cmp.candidate.report
  if report is None or ref_report is None:
    return dataclasses.replace(facts, status="unverified", detail="no report")
  if orderable and returns is not None and not pairs_buffers(returns, bufs,
                                                             cmp.reference.output):
    facts = dataclasses.replace(facts, orderable=False)   # outputs do not pair as built
  if orderable and _no_in_place_updates(bufs):
    facts = dataclasses.replace(facts, orderable=False)
  jb, ib = cmp.copy_bytes(ORACLE_MIN_BYTES)
  jbuf, ibuf = cmp.buffer_bytes(ORACLE_MIN_BYTES)
  # A cause that the report itself shows false explains nothing.
  untrue = untrue_statements(report)
  unexplained = [c for c in report.buffer_copies(ORACLE_MIN_BYTES) if c.cause is None
                 or any(u.startswith(f"{c.name}: ") for u in untrue)]
  residual = bool(facts.orderable) and jbuf > 0 and ibuf > 0
  facts = dataclasses.replace(
      facts, jax_bytes=jb, inplace_bytes=ib, jax_buffer_bytes=jbuf,
      inplace_buffer_bytes=ibuf, program=report.program, residual=residual,
      unexplained=len(unexplained), rounds=_rounds(cmp))
  if cmp.difference is not None:
    status, detail = classify_difference(cmp.reference.output, cmp.candidate.output) \
        or ("value", cmp.difference)
    # Only a difference beyond rounding can be XLA's fault: where they differ by
    # rounding, jax.jit computed another form (a chain of constants folded into
    # one, fuzz seed 8800 #2206), and inplace_jax's promise is jax.jit's bits.
    if status == "value" and _eager_agrees_with_candidate(fn, bufs, data_seed, data, cmp):
      status, detail = "jax_jit_wrong", (
          "inplace_jax's outputs are the eager ones (jax.disable_jit) bit for bit and "
          f"jax.jit's are not: XLA miscompiled jax.jit's program. {detail}")
    return dataclasses.replace(facts, status=status, detail=detail)
  if report.program == "sequenced":
    found = _difference_on_other_data(cmp, bufs, data_seed)
    if found is not None:
      return dataclasses.replace(facts, status=found[0], detail=found[1])
  if not report.verified or not ref_report.verified:
    problems = ("jax.jit: " + "; ".join(ref_report.problems) + " | inplace_jax: "
                + "; ".join(report.problems))
    return dataclasses.replace(facts, status="unverified", detail=problems)
  copies = f"jax.jit:\n{_copies(ref_report)}\ninplace_jax:\n{_copies(report)}"
  if ib > jb:
    # Grouped by whether the extra bytes include copies as large as a buffer, or
    # are only smaller copies (of slices, transposes, scalars).
    least = min(int(np.prod(b.shape)) * np.dtype(b.dtype).itemsize for b in bufs)
    big = [sum(c.nbytes for c in r.copies if c.nbytes >= least)
           for r in (ref_report, report)]
    return dataclasses.replace(
        facts, status="copies", detail=f"inplace_jax copies {ib} bytes, jax.jit {jb}:"
        f"\n{copies}", error="buffer" if big[1] > big[0] else "smaller")
  if residual:
    return dataclasses.replace(
        facts, status="residual", detail=f"orderable, yet inplace_jax "
        f"({report.program}) copies {ibuf} buffer bytes where jax.jit copies {jbuf}:"
        f"\n{copies}")
  if unexplained:
    return dataclasses.replace(
        facts, status="unexplained", detail=f"{len(unexplained)} buffer cop"
        f"{'y' if len(unexplained) == 1 else 'ies'} without a true cause in "
        f"inplace_jax's program ({report.program}):\n" + "".join(
            f"{u}\n" for u in untrue) + copies)
  return facts


# Where inplace_jax runs a sequenced program, it is also compared on these inputs:
# integer data hides most changes of rounding, and one draw can miss a change in
# a few elements; tiny data finds arithmetic that differs only where results are
# flushed to zero.
OTHER_DATA = (("normal", 1), ("normal", 2), ("special", 3), ("tiny", 4))


def _difference_on_other_data(cmp, bufs: Sequence[Buf],
                              data_seed: int) -> tuple[str, str] | None:
  """("value" or "inexact", what differs) where the two compiled programs differ
  on `OTHER_DATA`, else None."""
  for mode, k in OTHER_DATA:
    seed = data_seed + 7919 * k
    want = cmp.reference_fn(*make_inputs(bufs, seed, mode))
    got = cmp.fn(*make_inputs(bufs, seed, mode))
    found = classify_difference(jax.device_get(want), jax.device_get(got))
    if found is not None:
      return found[0], f"on {mode} data (seed {seed}): {found[1]}"
  return None


def _eager_agrees_with_candidate(fn, bufs, data_seed, data, cmp) -> bool:
  """Whether `fn` run op by op (`jax.disable_jit`) gives inplace_jax's outputs bit
  for bit and not jax.jit's (fuzz seed 5300 #3749: a loop whose body passes the
  buffer through a nested jit; jax.jit's program is wrong in 11 of 576 elements).
  Asked only of differences beyond rounding: eager code can round as the
  sequenced program does where jax.jit folded a chain of constants (fuzz seed 8800
  #2206, 1 ulp in 162 of 576 elements), which is no miscompile."""
  try:
    with jax.disable_jit():
      eager = jax.device_get(fn(*make_inputs(bufs, data_seed, data)))
  except Exception:  # noqa: BLE001 - no eager reference, no claim
    return False
  return (tree_difference(eager, cmp.candidate.output) is None
          and tree_difference(eager, cmp.reference.output) is not None)


def _jax_jit_error(fn, bufs, donate, data_seed, data) -> tuple[str, str] | None:
  """(type, traceback) of the error jax.jit alone raises on the program, or None."""
  try:
    jax.block_until_ready(jax.jit(fn, donate_argnums=donate)(
        *make_inputs(bufs, data_seed, data)))
  except Exception as e:  # noqa: BLE001
    return type(e).__name__, _tb(e)
  return None


def _copies(report) -> str:
  return "\n".join(f"  {c.nbytes} B {c.type_str} {c.category}"
                   f"{' of ' + c.buffer if c.buffer else ''} in {c.role} ({c.op_name}) "
                   f"at {c.location}" + (f": {c.cause}" if c.cause else "")
                   for c in report.copies) or "  (none)"


def _tb(e: BaseException) -> str:
  return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6))


def certify(p: Program) -> tuple[bool, str]:
  """Whether an exact in-place program of `p` is exhibited: its reads tied by hand
  (`program.reference_source`, without and with a tie after each update), compiled
  with barriers kept (with and without small-loop hoisting), copies no buffer (>= 1 KiB) and gives jax.jit's outputs bit
  for bit on the program's inputs, on normal ones where those are not normal
  data (integer data hides a changed rounding), and on tiny ones (`_host_data`:
  a multiply-add left unfused rounds alike elsewhere). (True/False, what was
  found.)

  A certificate from values, not from the kernels: it says such a program exists
  on these inputs; False says only that this one placement of ties copies or
  changes a value, not that no exact in-place order exists."""
  donate = tuple(range(len(p.bufs)))
  plain = build(p)
  modes = [p.data] + (["normal"] if p.data != "normal" else []) + ["tiny"]
  want = [jax.jit(plain, donate_argnums=donate)(*make_inputs(p.bufs, p.data_seed, m))
          for m in modes]
  ours = tuple(compiler_options().items())
  found = []
  tries = [(after, options) for after in (False, True)
           for options in dict.fromkeys((ours, _compat.small_loops_hoisted(ours, ())))]
  for after, options in tries:
    ref = build(p, reference=True, after_updates=after)
    if options != ours and barrier_in_small_loop(jax.make_jaxpr(ref)(*p.specs).jaxpr):
      continue      # XLA:CPU may abort hoisting such a loop (`barrier_in_small_loop`)
    compiled = jax.jit(ref, donate_argnums=donate).lower(*p.specs).compile(
        compiler_options=dict(options))
    nbytes = sum(c.nbytes for c in check_compiled(compiled).buffer_copies(ORACLE_MIN_BYTES))
    if nbytes:
      found.append(f"copies {nbytes} buffer bytes")
      continue
    bad = [m for m, w in zip(modes, want)
           if tree_difference(w, compiled(*make_inputs(p.bufs, p.data_seed, m)))
           is not None]
    if not bad:
      return True, "the program with its reads tied by hand is copy-free and exact"
    found.append(f"differs from jax.jit on {'/'.join(bad)} data")
  return False, "the program with its reads tied by hand " + "; ".join(found)


def check_program(p: Program, certify_residual: bool = True) -> Outcome:
  """The oracle on a generated program; a residual one is also certified
  (`certify`) unless `certify_residual` is False."""
  try:
    fn = build(p)
  except Exception as e:  # noqa: BLE001
    return Outcome("invalid", _tb(e), error=type(e).__name__, orderable=p.orderable,
                   constructs=tuple(sorted(p.constructs)))
  out = check_function(fn, p.bufs, p.data_seed, p.data, orderable=p.orderable,
                       constructs=p.constructs, returns=p.returns)
  if out.status == "residual" and certify_residual:
    try:
      ok, why = certify(p)
    except Exception as e:  # noqa: BLE001 - a reference XLA rejects certifies nothing
      ok, why = False, f"the hand-tied reference failed: {type(e).__name__}: {e}"[:300]
    out = dataclasses.replace(out, certified=ok, certificate=why)
  return out


def failure_kind(status: str, error: str | None, detail: str,
                 certified: bool | None = None) -> str:
  """A failure's kind, to group failures and to keep shrinking on the same one:
  the status, for crashes the exception's message with numbers and ids removed,
  and for a residual copy whether an exact in-place program was exhibited
  (`certify`)."""
  if status == "residual" and certified:
    return "residual (certified)"
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
  if status in ("value", "inexact") and "(the sign of zeros only)" in detail:
    return f"{status} (the sign of zeros only)"
  return status


def kind_of(o: Outcome) -> str:
  return failure_kind(o.status, o.error, o.detail, o.certified)
