"""`inplace_jax.jit`: `jax.jit` whose donated buffers are updated in place, verified.

Each signature (one entry of jax.jit's cache: argument types, static values) decides
once, on its first call or `.lower()`, which program runs:

1. JAX traces the function (its own trace, cached as for `jax.jit`).
2. Plain `jax.jit`'s program is compiled and inspected. If it copies no buffer the
   user asked to update in place, it runs: exactly jax.jit's program, nothing paid.
3. Otherwise the transform sequences the jaxpr (`sequence_jaxpr`) and the sequenced
   program is compiled with the options that keep barriers alive on CPU. The program
   that copies fewer buffer bytes runs, never one that copies more bytes in all
   than jax.jit's; on a tie, jax.jit's.

The decision, its `CopyReport` and its `Plan` belong to that signature
(`InplaceJitted.signatures`). The chosen executable is handed to jax.jit's C++
dispatch, so warm calls run no Python at all: the object's `__call__` is the
dispatcher itself.

Called under another transformation (an outer `jax.jit`, `jax.grad`, `jax.vmap`, a
`lax.scan` body, `jax.checkpoint`, `shard_map`), it behaves as a nested `jax.jit`:
the sequenced program is bound as a nested jit into the outer trace. The outermost
compilation decides whether the barriers survive: inside `inplace_jax.jit`, or a
`jax.jit` given `inplace_jax.compiler_options()`, they do; elsewhere on CPU they are
erased, which changes no value, and an `InplaceNestingWarning` says so once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax

from . import _compat as C
from . import _passes
from . import _plan
from . import _fingerprint
from . import _llvm
from . import _rewrite
from ._analysis import source_key
from ._check import CopiesFoundError, check_compiled, inspect_compiled
from ._report import CopyReport, Finding
from ._transform import _sequence_jaxpr, sequence_jaxpr

OnCopy = Literal["warn", "raise", "ignore"]
ON_COPY = ("warn", "raise", "ignore")
Program = Literal["jax.jit", "sequenced"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# Set while an inplace_jax.jit traces its function at the top level: a function of
# ours called inside is then part of a program the outer one sequences as a whole.
_TRACING = threading.local()


@contextlib.contextmanager
def _outer_trace():
  depth = getattr(_TRACING, "depth", 0)
  _TRACING.depth = depth + 1
  try:
    yield
  finally:
    _TRACING.depth = depth


def _inside_ours() -> bool:
  return getattr(_TRACING, "depth", 0) > 0


from ._errors import (  # noqa: E402
    ConflictError, InplaceCopyWarning, InplaceDonationWarning, InplaceNestingWarning,
    user_stacklevel)


def compiler_options(backend: str | None = None) -> dict[str, Any]:
  """The XLA options `inplace_jax.jit` adds so that barriers reach copy insertion.

  Pass them to your own `jax.jit(..., compiler_options=...)` when you use
  `inplace_jax.sequence`, or call an `inplace_jax.jit` function, inside it.

  Examples:
    >>> import inplace_jax
    >>> inplace_jax.compiler_options("cpu")
    {'xla_disable_hlo_passes': 'cse_barrier_expander,small-while-loop-hoisting'}
  """
  return C.backend_compiler_options(backend or jax.default_backend())


def findings_from(conflicts: Sequence[_plan.Conflict]) -> tuple[Finding, ...]:
  return tuple(Finding(kind=c.kind, message=c.message, locations=c.locations())
               for c in conflicts)


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One compiled program considered for a signature.

  `changed` lists the operations whose arithmetic differs from jax.jit's program
  (`_fingerprint.py`, and `_llvm.CONTRACTIONS` where the kernels' multiply-adds
  differ); a candidate with any is never run. Where the HLO shows other forms only
  for elementwise operations, the kernels' LLVM IR decides (`settled_by_ir`).
  """
  program: Program
  jaxpr: Any
  options: tuple[tuple[str, Any], ...]
  report: CopyReport
  fingerprint: Any = dataclasses.field(default=None, repr=False, compare=False)
  changed: tuple[Any, ...] = ()
  # The elementwise operations whose HLO form differs from jax.jit's, but whose
  # kernels' LLVM IR shows the same floating-point arithmetic (`_llvm.py`).
  settled_by_ir: tuple[Any, ...] = ()
  kernels: Any = dataclasses.field(default=None, repr=False, compare=False)
  # The `jax.stages.Compiled` inspected (dumped or not); kept for the one that runs,
  # which the first call then runs without compiling it again.
  compiled: Any = dataclasses.field(default=None, repr=False, compare=False)
  # Whether XLA hoisted a small loop into one kernel (`xla_cpu_small_call`).
  small_calls: bool = False
  # The clone level of the round that compiled it (`_plan.Hints.clone`): 0 for
  # jax.jit's program and the first rounds' candidates.
  clone: int = 0
  # Whether the materialising round compiled it (`_plan.Hints.materialise`).
  materialised: bool = False
  # Whether the lowering round compiled it (`_plan.Hints.lower`).
  lowered: bool = False
  # Whether the last round compiled it, the analysis's arithmetic predictions set
  # aside (`_plan.Hints.bold`).
  bold: bool = False


@dataclasses.dataclass(frozen=True)
class Signature:
  """What one signature runs, and why.

  Attributes:
    program: `"jax.jit"` (plain jax.jit's program) or `"sequenced"`.
    report: the `CopyReport` of the program that runs.
    plan: the sequencing plan (None when jax.jit's program copied no buffer and
      nothing was analysed).
    candidates: every program compiled to decide, in order.
    chosen: the one of them that runs.
    reason: one sentence on why this program runs.
    threshold: the size from which a buffer copy is warned about
      (`significant_bytes`).
  """
  program: Program
  report: CopyReport
  plan: _plan.Plan | None
  candidates: tuple[Candidate, ...]
  reason: str
  threshold: int = 0
  chosen: Candidate | None = None


class InplaceJitted:
  """A function compiled by `inplace_jax.jit`. Call it like a `jax.jit` function."""

  __name__: str          # set from the function by functools.update_wrapper

  def __init__(self, fun: Callable, *, donate_argnums=None, donate_argnames=None,
               static_argnums=None, static_argnames=None, on_copy: OnCopy = "warn",
               min_bytes: int = 1024, compiler_options=None, **jit_kwargs):
    if on_copy not in ON_COPY:
      raise ValueError(f"on_copy must be one of {ON_COPY}, got {on_copy!r}")
    if not callable(fun):
      raise TypeError(f"inplace_jax.jit expects a callable, got {type(fun).__name__}")
    if int(min_bytes) < 0:
      raise ValueError(f"min_bytes must be >= 0, got {min_bytes}")
    _check_duplicates(donate_argnums, "donate_argnums")
    _check_duplicates(donate_argnames, "donate_argnames")
    self._fun = fun
    self.on_copy = on_copy
    self.min_bytes = int(min_bytes)
    self._platform = jit_kwargs.get("backend") or jax.default_backend()
    self._user_options = tuple((compiler_options or {}).items())
    self._compiler_options = C.merge_compiler_options(
        C.backend_compiler_options(self._platform), compiler_options)
    self._our_options = tuple(self._compiler_options.items())
    # Where jax.jit erases every barrier before fusion, so do we for the barriers
    # we did not add (jax.checkpoint's), to compile what jax.jit compiles.
    self._erase_remat = C.backend_erases_barriers(self._platform)
    # jax.jit parses and validates the arguments, with its own errors.
    jitted = jax.jit(fun, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                     static_argnums=static_argnums, static_argnames=static_argnames,
                     compiler_options=self._compiler_options, **jit_kwargs)
    self._info = C.jit_info(jitted)
    # Unique to this object: it keys the dispatcher's cache entries, and runs the
    # function under `jax.disable_jit()`.
    self._key = functools.wraps(fun)(lambda *a, **k: fun(*a, **k))
    self._dispatch = C.cpp_dispatch(getattr(fun, "__name__", "fun"), self._key,
                                    C.api_boundary(self._cache_miss), self._info)
    self._signatures: dict[int, tuple[Any, Signature]] = {}
    self._nested: dict[int, tuple[Any, Any]] = {}
    self._order: list[Signature] = []
    # The signature of the latest call, `.lower()` or `.trace()` that reached Python
    # (a signature's first call, or any call that is not a warm one).
    self._last: Signature | None = None
    self._ref_sites: dict[tuple[str, int], set[str]] = {}   # of the signature deciding
    self._warned_nesting = False
    functools.update_wrapper(self, fun)
    # Calls go straight to the C++ dispatcher: a class of this object's own whose
    # `__call__` is the dispatcher (no Python frame in between).
    self.__class__ = type(type(self).__name__, (type(self),),
                          {"__call__": staticmethod(self._dispatch),
                           "__module__": type(self).__module__})

  def __call__(self, *args, **kwargs):   # replaced per object in __init__
    return self._dispatch(*args, **kwargs)

  # ------------------------------------------------------------------ dispatch

  def _infer(self, args, kwargs):
    if not C.trace_state_clean():
      return C.infer_params(self._fun, self._info, args, kwargs)
    with _outer_trace():
      return C.infer_params(self._fun, self._info, args, kwargs)

  def _cache_miss(self, *args, **kwargs):
    nested = not C.trace_state_clean()
    p, args_flat = self._infer(args, kwargs)
    if nested:
      outs, _ = C.run_params(self._nested_params(p), args_flat, self._fun, args, kwargs)
      return outs, None, False
    sig = self._signature(p, args_flat)
    if self.on_copy == "raise":
      self._raise_if_copies(sig)
    q = C.with_params(p, jaxpr=sig.chosen.jaxpr, compiler_options_kvs=sig.chosen.options)
    outs, fastpath = C.run_compiled(q, sig.chosen.compiled, args_flat, self._fun,
                                    args, kwargs)
    return outs, fastpath, False

  def _nested_params(self, p):
    """Under another trace: bound as a nested jit (compiler options are for
    top-level jits only). Inside an outer inplace_jax.jit, jax.jit's program,
    inlined: the outer one decides and sequences the whole program. Elsewhere the sequenced
    program, whose barriers a compilation that keeps them honours."""
    if _inside_ours():
      # Inlined, as XLA inlines calls anyway: the outer analysis sees one program.
      return C.with_params(p, compiler_options_kvs=(), inline=True)
    jaxpr = C.params_jaxpr(p)
    hit = self._nested.get(id(jaxpr))
    if hit is None or hit[0]() is not jaxpr:
      new, _ = sequence_jaxpr(jaxpr, C.params_donated(p), boundary=False,
                              erase_remat_barriers=self._erase_remat)
      self._nested[id(jaxpr)] = (weakref.ref(jaxpr), new)
      hit = self._nested[id(jaxpr)]
    self._warn_if_erased()
    return C.with_params(p, jaxpr=hit[1], compiler_options_kvs=())

  def _warn_if_erased(self) -> None:
    if self._warned_nesting or C.barriers_kept(self._platform, C.outer_jit_options()):
      return
    self._warned_nesting = True
    warnings.warn(
        f"inplace_jax.jit({self.__name__}) is called inside a transformation whose "
        f"compilation erases optimization barriers on {self._platform} (plain "
        "jax.jit, or jax.grad/jax.vmap outside any jit): the values are right, but "
        "copies it would remove may remain. Decorate the outer function with "
        "inplace_jax.jit, or pass compiler_options=inplace_jax.compiler_options() "
        "to the outer jax.jit.", InplaceNestingWarning, stacklevel=user_stacklevel())

  # ------------------------------------------------------------------ signatures

  def _signature(self, p, args_flat) -> Signature:
    jaxpr = C.params_jaxpr(p)
    hit = self._signatures.get(id(jaxpr))
    if hit is not None and hit[0]() is jaxpr:
      self._last = hit[1]
      return hit[1]
    sig = self._decide(p, args_flat)
    self._signatures[id(jaxpr)] = (weakref.ref(jaxpr), sig)
    self._order.append(sig)
    self._last = sig
    if self.on_copy == "warn":
      self._warn(sig)
    return sig

  @staticmethod
  def _compiled(p, args_flat, jaxpr, options):
    """`jaxpr` compiled for these arguments with exactly `options`."""
    q = C.with_params(p, jaxpr=jaxpr, compiler_options_kvs=tuple(options))
    return C.traced(q, args_flat).lower().compile()

  def _compile(self, p, args_flat, program: Program, jaxpr, options,
               plain: Candidate | None = None, dump: bool = False) -> Candidate:
    """`jaxpr` compiled with `options` and inspected; a candidate compared with
    `plain`, and where `dump` jax.jit's program, is compiled with its kernels' IR
    dumped (`_compiled_with_kernels`)."""
    kernels = None
    if plain is not None or dump:
      compiled, kernels = self._compiled_with_kernels(p, args_flat, jaxpr, options)
    else:
      compiled = self._compiled(p, args_flat, jaxpr, options)
    report, modules = inspect_compiled(compiled)
    fp = _fingerprint.fingerprint(modules[0]) if len(modules) == 1 else None
    changed: tuple = ()
    if plain is not None:
      if fp is None or plain.fingerprint is None:
        changed = ("the compiled programs could not be compared",)
      else:
        changed = tuple(_fingerprint.differences(plain.fingerprint, fp))
    small = len(modules) == 1 and _fingerprint.has_small_calls(modules[0])
    return Candidate(program, jaxpr, tuple(options), report, fp, changed,
                     kernels=kernels, compiled=compiled, small_calls=small)

  def _compiled_with_kernels(self, p, args_flat, jaxpr, options):
    """`jaxpr` compiled with its kernels' LLVM IR dumped, and the IR, read on
    first use (an `_llvm.Dump`; None where there is none: the user dumps too, no
    IR written). The dump changes no code: the executable runs as one compiled
    without it."""
    if any(str(k).startswith(C.DUMP_PREFIX) for k, _ in options):
      return self._compiled(p, args_flat, jaxpr, options), None
    box: list = []
    texts = C.optimised_ir(lambda folder: box.append(self._compiled(
        p, args_flat, jaxpr, tuple(options) + ((C.DUMP_OPTION, folder),))))
    compiled = box[0] if box else self._compiled(p, args_flat, jaxpr, options)
    return compiled, None if texts is None else _llvm.Dump(texts, compiled.as_text)

  def _settle(self, p, args_flat, cand: Candidate, plain: Candidate,
              plain_ir: dict) -> Candidate:
    """`cand` judged by its kernels' LLVM IR (`_llvm.py`) as well as its HLO:

    * where every operation the HLO shows in another form is elementwise or a
      reduction (`_fingerprint.elementwise`), it may
      run if both programs' kernels compute the same floating-point expressions,
      or the same ones where one stores a value the other recomputes
      (`_llvm.same_up_to_materialisation`), or round every value alike read as
      one lane's operations (`_llvm.same_semantics`) (`settled_by_ir`);
    * where the HLO shows the same arithmetic, it may not run if the kernels'
      multiply-adds differ (`changed` names `_llvm.CONTRACTIONS`), in their
      lane-free shares and in their semantic forms.

    Where no IR can be read, the HLO's verdict stands. `plain_ir` memoises
    jax.jit's program's kernels for the signature: read from its own compile
    where that dumped them (anything donated), else compiled once more."""
    if cand.kernels is None or not all(_fingerprint.elementwise(o) for o in cand.changed):
      return cand
    try:
      return self._settled(p, args_flat, cand, plain, plain_ir)
    except RecursionError:
      # Kernels whose expressions nest too deep to read (a lowered conditional of
      # a Diffrax solver step): nothing is settled, nothing assumed the same.
      return cand if cand.changed else dataclasses.replace(
          cand, changed=(_llvm.CONTRACTIONS,))

  def _settled(self, p, args_flat, cand: Candidate, plain: Candidate,
               plain_ir: dict) -> Candidate:
    mine = cand.kernels.kernels()
    if mine is None:
      return cand
    if "dump" not in plain_ir:
      plain_ir["dump"] = plain.kernels or self._compiled_with_kernels(
          p, args_flat, plain.jaxpr, plain.options)[1]
    dump = plain_ir["dump"]
    theirs = None if dump is None else dump.kernels()
    if theirs is None:
      return cand
    if not _llvm.folds_alike(mine, theirs):
      # LLVM folded some element's arithmetic away in one program's kernels only
      # (fuzz seed 8800 #4642): the elements differ where an operand is subnormal.
      return cand if cand.changed else dataclasses.replace(cand, changed=(_llvm.FOLDS,))
    same = _same_kernels(mine, theirs, bool(cand.changed))
    if not same and (mine.scaled or theirs.scaled):
      # Each reading is exact on its own, so either one's "the same" is: an exact
      # scaling one program stores and the other does not reads as a division in
      # one and a product in the other (fuzz seed 7600 #101).
      mine_raw, theirs_raw = cand.kernels.kernels(False), dump.kernels(False)
      same = mine_raw is not None and theirs_raw is not None and _same_kernels(
          mine_raw, theirs_raw, bool(cand.changed))
    if cand.changed:
      return dataclasses.replace(cand, changed=(), settled_by_ir=cand.changed) \
          if same else cand
    return cand if same else dataclasses.replace(cand, changed=(_llvm.CONTRACTIONS,))

  def _decide(self, p, args_flat) -> Signature:
    self._ref_sites = _ref_sites(C.params_jaxpr(p))
    # jax.jit's kernels' IR is dumped where a candidate may follow, so that no
    # candidate needs jax.jit's program compiled once more to compare: where the
    # first round's plan over every donated buffer places a tie. Where it places
    # none (a KV-cache decode, a rollout written in place), the dump, about a
    # third of a compile, is not paid; should a later round compile a candidate
    # after all, `_settled` compiles jax.jit's program once more for its IR.
    donated = C.params_donated(p)
    first = {donated: self._sequenced(p, donated, _plan.Hints())} if any(donated) else {}
    plain = self._compile(p, args_flat, "jax.jit", C.params_jaxpr(p), self._user_options,
                          dump=any(self._compilable(*v) for v in first.values()))
    threshold = significant_bytes(plain.report, self.min_bytes)
    if plain.report.verified and not plain.report.buffer_copies(threshold) and \
        not plain.report.loop_temporaries(loop_bytes(threshold)):
      # The report lists the smaller buffer copies it does make: say where the line is.
      reason = ("jax.jit's program copies no buffer" if not plain.report.buffer_copies()
                else f"jax.jit's program copies no buffer of {threshold:,} bytes or more")
      return self._made(plain, None, (plain,), reason, threshold)
    # Only the buffers jax.jit's program copies are sequenced: the others it
    # already updates in place, and are left exactly as they are.
    buffers = _copied_buffers(p, plain.report, threshold)
    # Small loops hoisted as jax.jit's compile hoists them, where it did: else
    # they run as loops of kernels (`_compat.small_loops_hoisted`).
    options = (C.small_loops_hoisted(self._our_options, self._user_options)
               if plain.small_calls else self._our_options)
    try:
      best, best_plan, plans, candidates = self._rounds(
          p, args_flat, buffers, plain, options, threshold, first)
    finally:
      _llvm.forget()
    return self._made(best, best_plan or plans[-1], tuple(candidates),
                      _why(best, plain, candidates, threshold), threshold,
                      notes=[k for q in plans for k in q.all_conflicts()])

  def _rounds(self, p, args_flat, buffers, plain: Candidate, options, threshold,
              first: dict | None = None):
    """The sequenced candidates, round by round (`_next_hints`): the best one, its
    plan, every plan and every candidate compiled (jax.jit's first).

    Where buffer copies remain after those rounds, a clone round sequences the
    program with each cheap elementwise value computed once per reader
    (`Hints.clone`), as XLA computes it in each reader's fusion: a read's fusion
    then keeps jax.jit's form while the update recomputes the chain after the
    barrier (`_passes.clone_shared`). Where copies still remain, another clones
    slices, reshapes and broadcasts too: `CLONE_COMPILES` compiles in all, each
    level `CLONE_LEVEL_COMPILES` at most. Where copies still remain, one compile
    with slices and reshapes moved above the elementwise operations they read
    (the sink round, `_passes.SINK_LEVEL`). Where copies still remain
    and some candidate's copy names no read to tie, one more compile
    materialises each update (`Hints.materialise`). Last, where a remaining copy is
    about a read the analysis left untied because it predicted that a barrier
    would change arithmetic, up to `BOLD_COMPILES` compiles set those predictions
    aside (`Hints.bold`): the compiled fingerprint and kernels judge each
    candidate, as they judge every other."""
    candidates, plans, seen = [plain], [], []
    plain_ir: dict[str, _llvm.Dump | None] = {}   # jax.jit's kernels, read once, where needed
    best, best_plan = plain, None

    def run(hints: _plan.Hints, limit: int, bufs=buffers) -> _plan.Hints:
      nonlocal best, best_plan
      last = plain
      while len(candidates) <= limit:
        if first and hints == _plan.Hints() and bufs in first:
          new, plan = first.pop(bufs)          # sequenced by `_decide` already
        else:
          new, plan = self._sequenced(p, bufs, hints)
        plans.append(plan)
        # Printed only where it may be compiled (printing a large program costs
        # more than sequencing it). A program XLA would miscompile with its
        # barriers kept is never compiled.
        # A candidate left with no barrier (every tie of this round withdrawn) and
        # no conditional lowered is jax.jit's program restructured only where XLA
        # restructures it too (calls inlined, clones merged again by CSE): not
        # compiled (`optax.MultiSteps`' second round compiled jax.jit's program,
        # the same copies and arithmetic, again).
        text = str(new.jaxpr) if self._compilable(new, plan) and (
            hints.lower or _rewrite.holds(new.jaxpr, C.optimization_barrier_p)) else None
        if text is not None and text not in seen and \
            not _rewrite.reads_across_barrier(new.jaxpr):
          seen.append(text)
          try:
            # A barrier in a loop body that XLA:CPU may hoist as a small loop
            # aborts the compile (`_rewrite.barrier_in_small_loop`): such a
            # candidate is compiled with the hoisting off.
            last = self._compile(
                p, args_flat, "sequenced", new,
                self._our_options if options != self._our_options and
                _rewrite.barrier_in_small_loop(new.jaxpr) else options, plain)
          except jax.errors.JaxRuntimeError:
            # XLA rejects the sequenced program (fuzz seed 5300 #8012: "Unhandled
            # opcode for elemental IR emission: opt-barrier", a barrier left
            # inside a fusion of a clone round's candidate): no candidate, and no
            # more rounds of these hints; jax.jit's program compiled and may run.
            break
          last = dataclasses.replace(self._settle(p, args_flat, last, plain, plain_ir),
                                     clone=hints.clone,
                                     materialised=hints.materialise,
                                     lowered=hints.lower, bold=hints.bold)
          candidates.append(last)
          if _improves(last, best, plain, threshold):
            best, best_plan = last, plan
        nxt = _next_hints(hints, last, plain, threshold, plan)
        if nxt is None or nxt == hints:
          break
        hints = nxt
      return hints

    hints = run(_plan.Hints(), 1 + REFINE_ROUNDS)
    # The later rounds keep what the refinement rounds learnt.
    learnt = _plan.Hints(tie=hints.tie, through_updates=True, leave=hints.leave)

    def copies_remain() -> bool:
      return best.report.verified and bool(_bytes(best, threshold)[0])

    start = len(candidates)
    for level in CLONE_LEVELS:
      if not copies_remain() or len(candidates) >= start + CLONE_COMPILES:
        break
      run(dataclasses.replace(learnt, clone=level),
          min(start + CLONE_COMPILES, len(candidates) + CLONE_LEVEL_COMPILES) - 1)
    # Where copies still remain, one compile with data movement moved above the
    # elementwise operations it reads (`_passes._moves_sunk`): a read of an
    # elementwise result of a buffer, sliced, is then a slice of the buffer, which
    # a barrier may follow, and the operation stays in its reader's fusion.
    if copies_remain():
      run(dataclasses.replace(learnt, clone=_passes.SINK_LEVEL), len(candidates))
    # Copies that name no read to tie (the new value computed in another buffer
    # and copied in): one more compile with each update materialised and the
    # named updates' own reads tied (`Hints.materialise`). A round of its own, so
    # that it adds a candidate and changes none of the others.
    writers = frozenset().union(*(_unnamed_writers(c.report, threshold)
                                  for c in candidates if c.report.verified))
    if copies_remain() and writers:
      materialised = dataclasses.replace(learnt, tie_into=writers, materialise=True)
      run(materialised, len(candidates))
      # Where that candidate computes some operation otherwise (a reduction
      # that jax.jit fuses with the update it reads, now reading the update's
      # stored result: fuzz seed 8800 #999), one more compile with the values
      # XLA computes again in each reader cloned (`Hints.clone`), the update
      # among them.
      last = candidates[-1]
      if copies_remain() and last.materialised and last.changed:
        run(dataclasses.replace(materialised, clone=2), len(candidates))
    # Copies at a conditional the analysis predicted XLA keeps in place as it is
    # (a branch that passes a buffer through beside one that rewrites it and
    # reads the result, jax#16661), or inside one: every conditional that
    # updates a buffer lowered to zero-or-one-trip loops, each update
    # materialised; where copies still remain, lowered with clones of data
    # movement instead (a read of the new value that jax.jit computes again from
    # the old buffer keeps that form). One compile each (`Hints.lower`). The
    # conditionals' sites are found only where copies remain.
    sites = _cond_sites(C.params_jaxpr(p)) if copies_remain() else frozenset()
    for lowered in (dataclasses.replace(learnt, tie_into=writers, materialise=True,
                                        lower=True),
                    dataclasses.replace(learnt, clone=2, lower=True)):
      if sites and best.report.verified and any(
          _at_conditional(c, sites) for c in best.report.buffer_copies(threshold)):
        run(lowered, len(candidates))
    # Copies of donated buffers that jax.jit's program does not copy, made by the
    # candidates' own restructuring (a conditional lowered to loops, whose index,
    # read from such a buffer, a pick after the loops reads again once the buffer
    # is updated: fuzz seed 6800 #5953): one round that sequences those buffers
    # too, with what the refinement rounds learnt.
    if copies_remain():
      copied = [_copied_buffers(p, c.report, threshold) for c in candidates
                if c.report.verified]
      wider = tuple(any(flags) for flags in zip(buffers, *copied, strict=True))
      if wider != buffers:
        run(learnt, len(candidates), wider)
    # Copies whose reads the analysis left untied, predicting that a tie changes
    # arithmetic: one round with those predictions set aside (`Hints.bold`), the
    # compiled fingerprint and kernels judging instead.
    if copies_remain() and _untied_by_prediction(best, plans, threshold):
      # Kept away from every operation an earlier candidate's barriers changed:
      # only ties the predictions refused are new (where that changes nothing, no
      # compile: `optax.MultiSteps`, whose adds every candidate changed).
      avoid = frozenset(o.key for c in candidates for o in c.changed
                        if not isinstance(o, str) and o.key)
      run(dataclasses.replace(learnt, bold=True, avoid=avoid),
          len(candidates) + BOLD_COMPILES - 1)
    return best, best_plan, plans, candidates

  def _compilable(self, new, plan) -> bool:
    """Whether a sequenced program may be compiled as a candidate: its plan placed
    a tie, or the user's own barriers compile otherwise under our options."""
    return plan.changed or (self._our_options != self._user_options
                            and _rewrite.holds(new.jaxpr, C.optimization_barrier_p))

  def _sequenced(self, p, buffers, hints):
    # Calls XLA inlines are spliced in the clone rounds and the bold round: the
    # reads a clone round's analysis left untied may sit inside a call (a
    # `custom_vjp` body that updates one buffer and reads it into another, fuzz
    # seed 7000 #412), which the bold round must see to tie.
    return _sequence_jaxpr(C.params_jaxpr(p), C.params_donated(p), buffers=buffers,
                           erase_remat_barriers=self._erase_remat, hints=hints,
                           inline_calls=True if hints.clone > 0 or hints.bold
                           else "moves")

  def _made(self, chosen: Candidate, plan, candidates, reason: str,
            threshold: int | None = None, notes=None) -> Signature:
    threshold = self.min_bytes if threshold is None else threshold
    if notes is None:
      notes = plan.all_conflicts() if plan is not None else ()
    report = _explained(dataclasses.replace(chosen.report, program=chosen.program),
                        _unique(notes), candidates, threshold)
    report = _in_ref_terms(report, self._ref_sites, threshold)
    report = dataclasses.replace(report, program=chosen.program, decision=reason)
    # Only the executable that runs is kept; the others', and every IR, are freed.
    kept = [dataclasses.replace(c, kernels=None, compiled=c.compiled if c is chosen else None)
            for c in candidates]
    chosen = kept[[c is chosen for c in candidates].index(True)]
    return Signature(chosen.program, report, plan, tuple(kept), reason, threshold,
                     chosen)

  # ------------------------------------------------------------------ messages

  def _warn(self, sig: Signature) -> None:
    report = sig.report
    wasted = [d for d in report.wasted_donations() if d.nbytes >= sig.threshold]
    level = user_stacklevel()
    if wasted:
      # JAX says nothing when it prunes an unused donated argument; say it here.
      names = ", ".join(f"{d.argument} ({d.dtype}{list(d.shape)})" for d in wasted)
      warnings.warn(
          f"inplace_jax.jit({self.__name__}): donated argument(s) {names} are not "
          "updated in place or returned: no output reuses their buffer, so "
          "donating them gains nothing. Stop donating them, or return the "
          "updated value.", InplaceDonationWarning, stacklevel=level)
    if report.buffer_copies(sig.threshold) or not report.verified:
      warnings.warn(_copy_message(self.__name__, report, sig.threshold),
                    InplaceCopyWarning, stacklevel=level)

  def _raise_if_copies(self, sig: Signature) -> None:
    report = sig.report
    copies = report.buffer_copies(sig.threshold)
    if not copies and report.verified:
      return
    definite = [c for c in (sig.plan.all_conflicts() if sig.plan else ())
                if c.kind in _plan.DEFINITE
                and (c.nbytes is None or c.nbytes >= sig.threshold)]
    if definite:
      raise ConflictError(_conflict_message(self.__name__, definite), definite)
    raise CopiesFoundError(_copy_message(self.__name__, report, sig.threshold),
                           report=report, copies=copies)

  # ------------------------------------------------------------------ jax.jit API

  def _params(self, args, kwargs):
    p, args_flat = self._infer(args, kwargs)
    sig = self._signature(p, args_flat)
    if self.on_copy == "raise":
      self._raise_if_copies(sig)
    q = C.with_params(p, jaxpr=sig.chosen.jaxpr, compiler_options_kvs=sig.chosen.options)
    return q, args_flat, sig

  def trace(self, *args, **kwargs):
    """`jax.stages.Traced` of the program a call with these arguments runs."""
    q, args_flat, _ = self._params(args, kwargs)
    return C.traced(q, args_flat)

  def lower(self, *args, **kwargs):
    """`jax.stages.Lowered` of the program a call with these arguments runs; its
    `.compile()` gives the executable compiled to decide (nothing is compiled again)."""
    q, args_flat, sig = self._params(args, kwargs)
    lowered = C.traced(q, args_flat).lower()
    return C.with_executable(lowered, sig.chosen.compiled)

  def eval_shape(self, *args, **kwargs):
    """The output shapes and dtypes of a call (nothing is compiled)."""
    p, args_flat = self._infer(args, kwargs)
    return C.traced(p, args_flat).out_info

  def clear_cache(self) -> None:
    C.clear_dispatch(self._dispatch, self._key)
    self._signatures.clear()
    self._nested.clear()
    self._order.clear()
    self._last = None

  @property
  def signatures(self) -> tuple[Signature, ...]:
    """What each compiled signature runs, in the order they were first called."""
    return tuple(self._order)

  @property
  def reports(self) -> list[CopyReport]:
    """The `CopyReport` of each compiled signature, in order."""
    return [s.report for s in self._order]

  @property
  def last_report(self) -> CopyReport | None:
    """The report of the signature of the latest call, `.lower()` or `.trace()`
    that reached Python: a signature's first call (warm calls run in C++ and
    change nothing here)."""
    return self._last.report if self._last is not None else None

  @property
  def plan(self) -> _plan.Plan | None:
    """The sequencing plan of `last_report`'s signature (None if nothing had to be
    analysed: jax.jit's program copied no buffer)."""
    return self._last.plan if self._last is not None else None

  def _inplace_check(self, *args, compiler_options=None, **kwargs) -> CopyReport:
    """`inplace_jax.check` on this function: the report of the program it runs."""
    q, args_flat, sig = self._params(args, kwargs)
    if not compiler_options:
      return sig.report
    compiled = C.traced(q, args_flat).lower().compile(compiler_options=compiler_options)
    return check_compiled(compiled)

  def __get__(self, obj, objtype=None):
    if obj is None:
      return self
    return functools.partial(self, obj)

  def __repr__(self) -> str:
    return f"inplace_jax.jit({getattr(self._fun, '__qualname__', self._fun)!r})"


# Compiles after the first sequenced one, where copies of buffers remain.
REFINE_ROUNDS = 2
# The clone rounds, where copies remain (`_rounds`): elementwise values cloned per
# reader, then data movement too (`Hints.clone`), in at most this many compiles,
# each level at most `CLONE_LEVEL_COMPILES`.
CLONE_LEVELS = (1, 2)
CLONE_COMPILES = 3
CLONE_LEVEL_COMPILES = 2
# The last round, where copies remain and the analysis left reads untied as
# predicted to change arithmetic: those predictions set aside (`Hints.bold`).
BOLD_COMPILES = 2


def _bytes(c: Candidate, min_bytes: int) -> tuple[int, int, int]:
  """(buffer copy bytes, loop temporary bytes per call, all copy bytes) of copies
  of at least `min_bytes` (loop temporaries: `loop_bytes(min_bytes)`), each counted
  once but loop temporaries, counted per iteration where XLA knows the trip count."""
  r = c.report
  return (sum(x.nbytes for x in r.buffer_copies(min_bytes)),
          sum(x.nbytes * (x.trip_count or 1)
              for x in r.loop_temporaries(loop_bytes(min_bytes))),
          sum(x.nbytes for x in r.copies_over(min_bytes)))


# A temporary copied in a loop body (a backward scan's cotangent buffer, say)
# costs its bytes every iteration; from this size on it is worth a second compile.
LOOP_TEMPORARY_BYTES = 64 * 1024


def loop_bytes(threshold: int) -> int:
  """The size from which a loop body's copy of a temporary is sequenced."""
  return max(threshold, LOOP_TEMPORARY_BYTES)


# A copy of less than this fraction of the donated bytes costs next to nothing next to
# the work on them (a loop counter, a random key, a small carry beside a large
# buffer): it is listed in the report, never warned about, and never sequenced.
SIGNIFICANT_FRACTION = 0.01


def significant_bytes(report: CopyReport, min_bytes: int) -> int:
  """The size from which a buffer copy matters: `min_bytes`, or 1% of the donated
  bytes if that is more."""
  donated = sum(d.nbytes for d in report.donations if d.donated)
  return max(int(min_bytes), int(donated * SIGNIFICANT_FRACTION))


def _cond_sites(jaxpr) -> frozenset[tuple[str, int]]:
  """The user's (file, line) of every conditional in `jaxpr` and of every equation in
  its branches, at any depth (a lowered conditional's loops keep its line)."""
  out: set[tuple[str, int]] = set()

  def visit(j, inside: bool) -> None:
    for e in j.eqns:
      cond = e.primitive is C.cond_p
      if cond or inside:
        frame = C.user_frame(e)
        if frame is not None:
          out.add((frame.file_name, frame.start_line))
      for sub in C.sub_jaxprs(e.params):
        visit(sub, inside or cond)
  visit(jaxpr, False)
  return frozenset(out)


def _at_conditional(c, sites) -> bool:
  """Whether buffer copy `c` is in a branch, or its site, writer or a reader is a
  conditional's (`_cond_sites`)."""
  if c.role == "branch":
    return True
  places = [c.location] + [a.location for a in (*c.readers, c.writer) if a is not None]
  return any(loc is not None and (loc.file, loc.line) in sites for loc in places)


def _next_hints(hints: _plan.Hints, cand: Candidate, plain: Candidate, min_bytes: int,
                plan: _plan.Plan | None = None):
  """What the next round should do differently, or None to stop: keep barriers away
  from operations whose arithmetic this candidate changed (first only the barriers
  after such updates, where `plan` placed one: `Hints.unposted`); leave alone the
  buffers jax.jit does not copy, if this candidate copies one; else tie the reads
  behind the copies that remain."""
  if cand.changed:
    keys = {o.key for o in cand.changed if not isinstance(o, str) and o.key}
    if not keys:
      return None
    posted = keys & _posted_updates(plan) - hints.unposted
    if posted:
      return dataclasses.replace(hints, unposted=hints.unposted | posted)
    return dataclasses.replace(hints, avoid=hints.avoid | frozenset(keys))
  if not cand.report.verified or not cand.report.buffer_copies(min_bytes):
    return None
  theirs = {c.buffer for c in plain.report.buffer_copies(min_bytes)}
  if not hints.leave and any(c.buffer not in theirs
                             for c in cand.report.buffer_copies(min_bytes)):
    return dataclasses.replace(hints, leave=True)
  return dataclasses.replace(hints, tie=hints.tie | _reader_keys(cand.report, min_bytes),
                             through_updates=True)


def _posted_updates(plan: _plan.Plan | None) -> frozenset:
  """The source keys of the updates `plan` and its sub-plans place a barrier
  after (in a `custom_jvp` body too: fuzz seed 7600 #3926)."""
  if plan is None:
    return frozenset()
  return frozenset(source_key(q.jaxpr.eqns[b.update]) for q in plan.plans()
                   for b in q.barriers if b.kind == "post")


def _improves(cand: Candidate, best: Candidate, plain: Candidate, min_bytes: int) -> bool:
  """Whether `cand` should run instead of `best`: verified, computing jax.jit's
  arithmetic, fewer buffer bytes than `best`, and fewer bytes in all than jax.jit's
  program."""
  if not cand.report.verified or cand.changed:
    return False
  if not plain.report.verified:
    return best is plain or _bytes(cand, min_bytes)[0] < _bytes(best, min_bytes)[0]
  cb, cl, ct = _bytes(cand, min_bytes)
  bb, bl, _ = _bytes(best, min_bytes)
  # Fewer buffer bytes, or as many and fewer bytes copied in loops; and fewer
  # bytes in all, too: a buffer copy that only turned into a copy of another kind
  # (the same matrix copied each step, its lineage lost) is no gain.
  return (cb, cl) < (bb, bl) and ct < _bytes(plain, min_bytes)[2]


def _why(best: Candidate, plain: Candidate, candidates, min_bytes: int) -> str:
  pb, pl, pt = _bytes(plain, min_bytes)
  if best is not plain:
    sb, sl, _ = _bytes(best, min_bytes)
    if sb == pb:
      return (f"the sequenced program copies {sl:,} bytes per call in loop bodies "
              f"where jax.jit's copies {pl:,}")
    return (f"the sequenced program copies {sb:,} buffer bytes where jax.jit's copies "
            f"{pb:,}")
  tried = [c for c in candidates if c is not plain]
  if not tried:
    # Not "because of arithmetic": a plan can also find nothing to tie (an old
    # value returned, bfloat16 updates, a donation JAX pairs with another output),
    # or only a program XLA would miscompile (`_rewrite.reads_across_barrier`).
    return ("nothing was sequenced: the analysis found no tie to place that keeps "
            "jax.jit's values and arithmetic and would remove a copy (see the copies' "
            "causes); jax.jit's program runs")
  exact = [c for c in tried if not c.changed]
  if not exact:
    return ("every sequenced program computes some operation differently from "
            "jax.jit's (see the copies' causes): jax.jit's program runs")
  sb, _, st = min(_bytes(c, min_bytes) for c in exact)
  return (f"no sequenced program that computes jax.jit's arithmetic copies fewer "
          f"buffer bytes and fewer bytes in all (best: {sb:,} buffer bytes, {st:,} "
          f"in all; jax.jit's: {pb:,}, {pt:,}): jax.jit's program runs")


def _at(location: str | None, access) -> bool:
  """Whether a `file:line[:col] (function)` summary is the source line of `access`."""
  if not location or access is None or access.location is None:
    return False
  return location.startswith(f"{access.location.file}:{access.location.line}:") or \
      location.startswith(f"{access.location.file}:{access.location.line} ")


_REF_READS = frozenset({"slice", "dynamic_slice", "gather", "squeeze", "reshape"})
_REF_WRITES = frozenset({"dynamic_update_slice", "scatter", "scatter-add", "add"})
_REF_WORDS = {"read": "a Ref read", "write": "a Ref write", "add": "a Ref +="}


def _ref_sites(jaxpr) -> dict[tuple[str, int], set[str]]:
  """The kinds of Ref access ("read", "write", "add") on each user source line."""
  sites: dict[tuple[str, int], set[str]] = {}
  for kind, eqn in C.ref_accesses(jaxpr):
    frame = C.user_frame(eqn)
    if frame is not None:
      sites.setdefault((frame.file_name, frame.start_line), set()).add(kind)
  return sites


def _ref_access(access, sites, writer: bool):
  """`access` named in Ref terms where its line holds a Ref access of its kind (the
  discharged Ref reads are slices, its writes updates)."""
  if access is None or access.location is None or access.op is None:
    return access
  kinds = sites.get((access.location.file, access.location.line), set())
  if writer and access.op in _REF_WRITES:
    kind = "add" if "add" in kinds else "write" if "write" in kinds else None
  elif not writer and access.op in _REF_READS and "read" in kinds:
    kind = "read"
  else:
    kind = None
  if kind is None:
    return access
  return dataclasses.replace(access, op=f"{access.op} ({_REF_WORDS[kind]})")


def _in_ref_terms(report: CopyReport, sites, threshold: int) -> CopyReport:
  """`report` with each buffer copy's reads and update named as the Ref reads and
  writes the user wrote, where they are."""
  if not sites:
    return report
  copies = report.buffer_copies(threshold)
  out = []
  for c in report.copies:
    if c not in copies:
      out.append(c)
      continue
    readers = tuple(_ref_access(a, sites, False) for a in c.readers)
    writer = _ref_access(c.writer, sites, True)
    cause = c.cause
    for old, new in list(zip(c.readers, readers)) + [(c.writer, writer)]:
      if cause and old is not None and new is not old:
        cause = cause.replace(str(old), str(new))
    out.append(dataclasses.replace(c, readers=readers, writer=writer, cause=cause))
  return dataclasses.replace(report, copies=tuple(out))


def _unique(items) -> tuple:
  out: list = []
  for x in items:
    if x not in out:
      out.append(x)
  return tuple(out)


def _about(k: _plan.Conflict, c, buffer_type: str | None) -> bool:
  """Whether conflict `k` is about the buffer that copy `c` copies (`buffer_type`:
  that donated argument's type): the argument it names, else a read or the update
  at the copy's source lines, of a buffer of its type (the copy's own, per device,
  or the argument's). One source line can read and update several buffers (an
  optimizer's `p + u` over a tree): a conflict about a float32[512,64] buffer
  says nothing about a float32[64,512] one."""
  if not _of_buffer(k, c, buffer_type):
    return False
  at = any(_at(k.read, a) for a in c.readers) or _at(k.update, c.writer)
  # A conflict with source lines explains the copy at those lines, not every copy
  # of its argument (an untied dot read at line 2 said nothing about the copy a
  # slice at line 8 and a scatter at line 12 force: fuzz seed 3400 #46).
  return at or (k.argument is not None and not (k.read or k.update))


def _explained(report: CopyReport, conflicts, candidates, threshold: int) -> CopyReport:
  """`report` with what the analysis knows added to each buffer copy's cause: the
  conflicts and untied reads at the copy's reads and update, and the arithmetic a
  sequenced program would have changed. The report's findings are those that
  explain a copy it lists (nothing about copies that are not there)."""
  copies = report.buffer_copies(threshold)
  if not copies:
    return report

  def ops(cands) -> str:
    return "; ".join(sorted({str(o) for k in cands for o in k.changed
                             if not isinstance(o, str)
                             or o in (_llvm.CONTRACTIONS, _llvm.FOLDS)})[:3])

  def of(r: CopyReport, buffer) -> int:
    return sum(c.nbytes for c in r.buffer_copies(threshold) if c.buffer_parameter == buffer)

  changed = [k for k in candidates if ops((k,))]
  runs = ("jax.jit's program runs" if report.program != "sequenced"
          else "a sequenced program that keeps this copy runs")
  donated = _donated_types(report)
  used: list = []
  out = []
  for c in report.copies:
    if c not in copies:
      out.append(c)
      continue
    notes = [k for k in conflicts if _about(k, c, donated.get(c.buffer_parameter))]
    used += [k for k in notes if k not in used]
    # One sentence once: conflicts that differ only in the read's line say the same.
    extra = list(dict.fromkeys(k.message for k in notes))
    if changed and not notes:
      # Only a candidate that copies less of this buffer is the reason it stays.
      mine = of(report, c.buffer_parameter)
      fewer = [k for k in changed if k.report.verified
               and of(k.report, c.buffer_parameter) < mine]
      if fewer:
        extra.append(f"the sequenced program that copies less of {c.buffer} computes "
                     f"{ops(fewer)} differently from jax.jit, so {runs}")
      elif not c.cause:
        extra.append(f"no sequenced program tried copies less of {c.buffer} (those "
                     f"that compute {ops(changed)} differently from jax.jit neither)")
    cause = "; ".join(([c.cause] if c.cause else []) + extra) or None
    out.append(dataclasses.replace(c, cause=cause))
  report = dataclasses.replace(report, copies=tuple(out))
  return report.with_findings(findings_from(used))


def _untied_by_prediction(best: Candidate, plans, threshold: int) -> bool:
  """Whether a buffer copy of `best` is about a read some round's analysis left
  untied as one whose tie would change arithmetic."""
  conflicts = [k for q in plans for k in q.all_conflicts()
               if k.kind is _plan.FindingKind.WOULD_CHANGE_ARITHMETIC]
  if not conflicts:
    return False
  donated = _donated_types(best.report)
  return any(_about(k, c, donated.get(c.buffer_parameter)) or
             (_names_no_read(c) and _of_buffer(k, c, donated.get(c.buffer_parameter)))
             for c in best.report.buffer_copies(threshold) for k in conflicts)


def _names_no_read(c) -> bool:
  """Whether buffer copy `c` names no read of the old value but its own update's
  (the new value computed in another buffer and copied in): then the read that
  forces it is found by no source line."""
  return all(r == c.writer for r in c.readers)


def _of_buffer(k: _plan.Conflict, c, buffer_type: str | None) -> bool:
  """Whether conflict `k` is about a buffer that may be the one copy `c` copies:
  its argument, else a buffer of its type."""
  if k.argument is not None:
    return k.argument == c.buffer
  return k.buffer_type is None or k.buffer_type in (c.type_str, buffer_type)


def _donated_types(report: CopyReport) -> dict[int | None, str]:
  """Each donated argument's type (`dtype[shape]`), by its parameter number."""
  return {d.parameter: f"{d.dtype}[{','.join(str(n) for n in d.shape)}]"
          for d in report.donations if d.parameter is not None}


def _copied_buffers(p, report: CopyReport, min_bytes: int) -> tuple[bool, ...]:
  """The donation vector of `p` (one flag per jaxpr input) restricted to the donated
  arguments whose buffers `report` shows copied."""
  params = {c.buffer_parameter for c in report.buffer_copies(min_bytes)}
  copied = {j for j, d in enumerate(report.donations) if d.parameter in params}
  donated = C.params_donated(p)
  if not report.buffer_copies(min_bytes):
    # Only loop temporaries are copied: the loops' carries are analysed whatever
    # flows into them; no donated buffer is touched.
    return tuple(False for _ in donated)
  offset = len(donated) - len(report.donations)
  if offset < 0 or not params:
    return donated
  return tuple(d and (i - offset) in copied for i, d in enumerate(donated))


def _reader_keys(report: CopyReport, min_bytes: int) -> frozenset:
  """Source keys (file, line, operation) of the reads behind the buffer copies."""
  keys = set()
  for c in report.buffer_copies(min_bytes):
    for a in c.readers:
      if a.op and a.location is not None:
        keys.add((a.location.file, a.location.line, a.op))
  return frozenset(keys)


def _unnamed_writers(report: CopyReport, min_bytes: int) -> frozenset:
  """(file, line) of the updates behind the buffer copies that name no read but
  the update itself (XLA fused a copy of the update into a reader of its result,
  which then reads the update's operand: fuzz seed 5500 #9594)."""
  # A loop whose body copies a carry, with no read named, is no update to
  # materialise (Diffrax's solve: its loop carries y0's copy; tying into it only
  # costs a compile). A loop whose result is copied outside any loop body is (fuzz
  # seed 7000 #461: a one-trip loop, which XLA inlines, updates the buffer before
  # the loop inside it, while a row of the buffer that the inner loop takes as an
  # operand is read only then): tying the reads of the loop that holds it, as
  # `_analysis._tied_into` does, orders them before the update.
  return frozenset((c.writer.location.file, c.writer.location.line)
                   for c in report.buffer_copies(min_bytes)
                   if c.writer is not None and c.writer.location is not None
                   and all(r == c.writer for r in c.readers)
                   and not (c.writer.op == "while" and not c.readers
                            and c.role == "while_body"))


def _check_duplicates(spec, name: str) -> None:
  if spec is None or isinstance(spec, (int, str)):
    return
  spec = list(spec)
  dups = sorted({x for x in spec if spec.count(x) > 1}, key=str)
  if dups:
    raise ValueError(f"{name} names {dups} more than once; each argument can be "
                     "donated once.")


def _conflict_message(name: str, conflicts) -> str:
  lines = [f"inplace_jax.jit({name}): {len(conflicts)} copy(ies) no ordering can "
           "remove:"]
  for c in conflicts:
    lines.append(f"  - {c.message}")
    for loc in c.locations():
      lines.append(f"      {loc}")
  lines.append("Restructure the code so the old value is read before the update, "
               "or pass on_copy='warn' to accept the copy.")
  return "\n".join(lines)


def _copy_message(name: str, report: CopyReport, min_bytes: int) -> str:
  if not report.verified:
    return (f"inplace_jax.jit({name}): the compiled program could not be verified: "
            + "; ".join(report.problems))
  copies = report.buffer_copies(min_bytes)
  lines = [f"inplace_jax.jit({name}): {len(copies)} cop"
           f"{'y' if len(copies) == 1 else 'ies'} of buffers to update in place "
           f"remain (at least {min_bytes} bytes each):"]
  for c in copies:
    where = f" in {c.role}" + (f" (x{c.trip_count})" if c.trip_count else "")
    loc = f" at {c.location}" if c.location else ""
    what = c.buffer or c.what_str
    lines.append(f"  - {c.nbytes} bytes {c.type_str}{where}, copying {what}{loc}"
                 + (f": {c.cause}" if c.cause else ""))
  for f in report.findings:
    lines.append(f"  why: {f.message}" + (" [" + "; ".join(f.locations) + "]"
                                           if f.locations else ""))
  return "\n".join(lines)


def jit(fun: Callable | None = None, *, donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None,
        static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        on_copy: OnCopy = "warn", min_bytes: int = 1024,
        compiler_options: dict[str, Any] | None = None, **jit_kwargs):
  """A drop-in for `jax.jit` whose donated buffers are updated in place, verified.

  Each signature runs plain `jax.jit`'s program when that program copies no buffer
  the user asked to update in place; otherwise the reads of each donated buffer are
  sequenced before its updates and the program is compiled with the options XLA
  needs to honour that order, and whichever copies less runs. Warm calls go straight
  to jax.jit's C++ dispatch.

  Args:
    fun: the function to compile. Usable bare (`inplace_jax.jit(f, ...)`) or as a
      decorator (`@inplace_jax.jit(donate_argnums=0)`).
    donate_argnums, donate_argnames, static_argnums, static_argnames: as `jax.jit`.
    on_copy: what to do when a copy of a donated buffer (or a loop or branch carry
      of one) of at least `min_bytes` remains: `"warn"` (an `InplaceCopyWarning`,
      once per signature), `"raise"` (`ConflictError` naming the read and the
      update when no ordering can remove it, else `CopiesFoundError`, before the
      call runs) or `"ignore"`. Layout changes and temporaries are listed in the
      report, never warned about.
    min_bytes: copies smaller than this are not warned about.
    compiler_options: XLA options, merged with ours (`xla_disable_hlo_passes`
      lists are joined); jax.jit's program is compiled with yours alone.
    **jit_kwargs: passed to `jax.jit` (`in_shardings`, `out_shardings`,
      `keep_unused`, ...).

  Examples:
    >>> import jax.numpy as jnp, inplace_jax
    >>> @inplace_jax.jit(donate_argnums=0)
    ... def f(x):
    ...   y = x[0, 0]
    ...   return x.at[0, 0].add(1.0), y
    >>> x, y = f(jnp.zeros((64, 64)))
    >>> f.last_report.buffer_copies()
    ()
  """
  kw = dict(donate_argnums=donate_argnums, donate_argnames=donate_argnames,
            static_argnums=static_argnums, static_argnames=static_argnames,
            on_copy=on_copy, min_bytes=min_bytes, compiler_options=compiler_options,
            **jit_kwargs)
  if fun is None:
    return lambda f: InplaceJitted(f, **kw)
  return InplaceJitted(fun, **kw)


C.hide_frames(_HERE)


def _same_kernels(mine: _llvm.Kernels, theirs: _llvm.Kernels, changed: bool) -> bool:
  """Whether two programs' kernels, read alike, compute the same values: where the
  HLO shows operations computed in other forms (`changed`), the same expressions,
  up to what one stores and the other recomputes, or the same per-lane rounding;
  where it shows the same arithmetic, the same multiply-adds. Either way, no
  expression formed two ways whose elements are not known
  (`_llvm.kernels_of_ambiguous_forms_differ`, fuzz seed 5100 #6690)."""
  if changed:
    alike = mine.values == theirs.values or (
        _llvm.same_up_to_materialisation(mine, theirs)
        and not _llvm.recomputes_unloadably(mine, theirs))
  else:
    alike = mine.contractions == theirs.contractions or (
        _llvm.contractions_match(mine, theirs)
        and not _llvm.recomputes_unloadably(mine, theirs))
  if not alike and not _llvm.same_semantics(mine, theirs):
    return False
  return not _llvm.kernels_of_ambiguous_forms_differ(mine, theirs)
