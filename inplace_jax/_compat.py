"""Every JAX-version-specific detail inplace_jax relies on, in one place.

The rest of the package imports JAX internals only through this module. When JAX
renames a primitive or moves a helper, this is the file to change, and the tests say
which assumption broke (`tests/test_plans.py` checks every primitive the trait table
and the rules name; a walker that silently stops finding, say, nested jits is the
failure mode this module exists to prevent).

Supported: jax/jaxlib 0.10.2 (the registry's version when this was written).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jaxlib
from jax._src import config as _config
from jax._src import core as _core
from jax._src import linear_util as _lu
from jax._src import source_info_util as _siu
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax import lax as _lax
from jax._src.lax import slicing as _slicing
from jax._src.lax.control_flow import conditionals as _conditionals
from jax._src.lax.control_flow import loops as _loops

JAX_VERSION: str = jax.__version__
JAXLIB_VERSION: str = jaxlib.__version__

# --------------------------------------------------------------------------- core

Var = _core.Var
Literal = _core.Literal
DropVar = _core.DropVar
Jaxpr = _core.Jaxpr
ClosedJaxpr = _core.ClosedJaxpr
JaxprEqn = _core.JaxprEqn
Primitive = _core.Primitive
ShapedArray = _core.ShapedArray
no_effects = _core.no_effects
new_jaxpr_eqn = _core.new_jaxpr_eqn
check_jaxpr = _core.check_jaxpr
jaxpr_as_fun = _core.jaxpr_as_fun
dce_jaxpr = _pe.dce_jaxpr
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr


def new_var(aval: Any) -> Var:
  """A fresh jaxpr variable of the given abstract value."""
  return _core.Var(aval)


def scratch_jaxpr(invars, outvars, eqns, effects) -> Any:
  """A jaxpr built only to be analysed (never traced from a function)."""
  return _core.Jaxpr([], invars, outvars, eqns, effects,
                     _lu.DebugInfo("inplace_jax", "<inplace_jax>", None, None))


def loose_debug_info(debug_info: Any) -> Any:
  """A jaxpr's debug info without argument names and result paths, for a rebuilt
  jaxpr whose inputs or outputs no longer match the traced function's."""
  if debug_info is not None and hasattr(debug_info, "with_unknown_names"):
    return debug_info.with_unknown_names()
  return debug_info


def is_drop_var(v: Any) -> bool:
  return isinstance(v, _core.DropVar)


def is_literal(v: Any) -> bool:
  return isinstance(v, _core.Literal)


# --------------------------------------------------------------------------- primitives
# Dispatch is on primitive objects, never on names (kfac-jax's walker broke when
# `pjit` became `jit`).

dynamic_update_slice_p = _slicing.dynamic_update_slice_p
dynamic_slice_p = _slicing.dynamic_slice_p
slice_p = _slicing.slice_p
gather_p = _slicing.gather_p
scatter_p = _slicing.scatter_p
scatter_add_p = _slicing.scatter_add_p
scatter_sub_p = _slicing.scatter_sub_p
scatter_mul_p = _slicing.scatter_mul_p
scatter_min_p = _slicing.scatter_min_p
scatter_max_p = _slicing.scatter_max_p
optimization_barrier_p = _lax.optimization_barrier_p
copy_p = _lax.copy_p
convert_element_type_p = _lax.convert_element_type_p
select_n_p = _lax.select_n_p
reshape_p = _lax.reshape_p
squeeze_p = _lax.squeeze_p
dot_general_p = _lax.dot_general_p
transpose_p = _lax.transpose_p
broadcast_in_dim_p = _lax.broadcast_in_dim_p
div_p = _lax.div_p

while_p = _loops.while_p
scan_p = _loops.scan_p
cond_p = _conditionals.cond_p

from jax._src.pjit import jit_p  # noqa: E402
from jax._src.ad_checkpoint import remat_p  # noqa: E402
from jax._src.custom_derivatives import custom_jvp_call_p, custom_vjp_call_p  # noqa: E402

closed_call_p = _core.closed_call_p
core_call_p = _core.call_p


def plain_nested_jit(params: dict) -> bool:
  """Whether a nested `jit` equation's params lower to nothing but a call of its
  body (which XLA inlines): no shardings, layouts or compiler options of its own."""
  from jax._src.sharding_impls import UnspecifiedValue
  return (all(isinstance(s, UnspecifiedValue)
              for s in (*params.get("in_shardings", ()), *params.get("out_shardings", ())))
          and all(x is None for x in (*params.get("in_layouts", ()),
                                       *params.get("out_layouts", ())))
          and not params.get("compiler_options_kvs"))

try:  # shard_map moved between modules over JAX versions.
  from jax._src.shard_map import shard_map_p  # noqa: E402
except ImportError:  # pragma: no cover - other JAX versions
  shard_map_p = None  # type: ignore[assignment]

SCATTER_PRIMITIVES = (scatter_p, scatter_add_p, scatter_sub_p, scatter_mul_p,
                      scatter_min_p, scatter_max_p)


def _primitive_index() -> dict[str, Primitive]:
  """Every primitive the modules JAX defines its lax primitives in export, by name."""
  from jax._src import ad_util as _ad_util
  from jax._src.lax import special as _special
  from jax._src.lax.control_flow import loops as _loops_mod
  index: dict[str, Primitive] = {}
  for mod in (_lax, _slicing, _special, _loops_mod, _conditionals, _ad_util, jax.lax):
    for value in vars(mod).values():
      if isinstance(value, _core.Primitive):
        index.setdefault(value.name, value)
  return index


_PRIMITIVES = _primitive_index()


def primitive_by_name(name: str) -> Primitive | None:
  """The lax primitive called `name` in this JAX (`None` if there is none).

  Used once, to resolve the trait table (`_traits.py`); everything else dispatches on
  primitive objects.
  """
  return _PRIMITIVES.get(name)


# --------------------------------------------------------------------------- sub-jaxprs


def jaxprs_in_params(params: dict) -> tuple[str, ...]:
  """Keys of params that hold (closed or open) jaxprs, or sequences of them."""
  memo = _PARAMS_MEMO
  if memo is not None:
    hit = memo.get(id(params))
    if hit is not None and hit[0] is params:
      return hit[1]
  keys = []
  for k, v in params.items():
    kind = _PARAM_KINDS.get(type(v))
    if kind is None:
      kind = _param_kind(type(v))
    if kind == _JAXPR or (kind == _SEQUENCE and v and all(
        isinstance(x, (_core.Jaxpr, _core.ClosedJaxpr)) for x in v)):
      keys.append(k)
  out = tuple(keys)
  if memo is not None:
    memo[id(params)] = (params, out)    # keeps `params` alive: its id stays its own
  return out


# `jaxprs_in_params` per params dict, while a transform runs (`params_memoised`):
# its passes ask about each equation's params several times each.
_PARAMS_MEMO: dict[int, tuple[dict, tuple[str, ...]]] | None = None


@contextlib.contextmanager
def params_memoised():
  """Within: `jaxprs_in_params` answers each params dict once (nested uses share
  the outermost memo; it is dropped when that one exits)."""
  global _PARAMS_MEMO
  if _PARAMS_MEMO is not None:
    yield
    return
  _PARAMS_MEMO = {}
  try:
    yield
  finally:
    _PARAMS_MEMO = None


# What a param's type says about it (`jaxprs_in_params` runs on every equation of
# every pass, and the type decides once what `isinstance` would each time).
_OTHER, _JAXPR, _SEQUENCE = 0, 1, 2
_PARAM_KINDS: dict[type, int] = {}


def _param_kind(t: type) -> int:
  kind = (_JAXPR if issubclass(t, (_core.Jaxpr, _core.ClosedJaxpr)) else
          _SEQUENCE if issubclass(t, (tuple, list)) else _OTHER)
  _PARAM_KINDS[t] = kind
  return kind


# --------------------------------------------------------------------------- source info


def source_summary(eqn: JaxprEqn) -> str:
  """`file:line (function)` of the user frame that created `eqn`."""
  return _siu.summarize(eqn.source_info)


def user_frame(eqn: JaxprEqn):
  """The innermost user frame of `eqn` (file_name, start_line, function_name) or None."""
  return _siu.user_frame(eqn.source_info.traceback)


def new_source_info():
  return _siu.new_source_info()


# --------------------------------------------------------------------------- state


def discharge_refs(jaxpr: Jaxpr, consts) -> tuple[Jaxpr, list]:
  """Turns the mutable refs `jaxpr` creates (`jax.new_ref`) into values, their reads
  and writes into slices and updates; refs passed in stay refs (jax.jit threads
  those), so the inputs and outputs are unchanged."""
  from jax._src.state.discharge import discharge_state
  closed = discharge_state(_core.ClosedJaxpr(jaxpr, list(consts)),
                           should_discharge=[False] * len(jaxpr.invars))
  return closed.jaxpr, list(closed.consts)


def eqn_context(eqn: JaxprEqn):
  """A context in which traced operations carry `eqn`'s source information (the
  user's line) and name stack, not the frame that emits them."""
  name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
  return _siu.user_context(eqn.source_info.traceback, name_stack=name_stack)


def bind_eqn(eqn: JaxprEqn, vals: Sequence[Any]) -> list[Any]:
  """Binds `eqn`'s primitive to `vals` under the current trace, with its source
  information and name stack (as `jax.core.eval_jaxpr` does); its outputs."""
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  name_stack = _siu.current_name_stack() + eqn.source_info.name_stack
  with _siu.user_context(eqn.source_info.traceback, name_stack=name_stack), \
      eqn.ctx.manager:
    ans = eqn.primitive.bind(*vals, **bind_params)
  return list(ans) if eqn.primitive.multiple_results else [ans]


def sub_jaxprs(params: dict):
  """The open jaxprs an equation's params hold (closed ones unwrapped)."""
  for key in jaxprs_in_params(params):
    value = params[key]
    for inner in (value if isinstance(value, (tuple, list)) else (value,)):
      yield inner.jaxpr if isinstance(inner, _core.ClosedJaxpr) else inner


def ref_accesses(jaxpr: Jaxpr):
  """Each Ref read, write and `+=` in `jaxpr` (and the jaxprs inside it), as
  (kind, equation): kind `"read"` (`r[i]`), `"write"` (`r[i] = v`, a swap) or
  `"add"` (`r[i] += v`)."""
  from jax._src.state import primitives as state_p
  kinds = {state_p.get_p: "read", state_p.swap_p: "write", state_p.addupdate_p: "add"}
  for e in jaxpr.eqns:
    kind = kinds.get(e.primitive)
    if kind is not None:
      yield kind, e
    for inner in sub_jaxprs(e.params):
      yield from ref_accesses(inner)


def creates_refs(jaxpr: Jaxpr) -> bool:
  """Whether `jaxpr` (or a jaxpr inside it) creates a mutable ref."""
  for e in jaxpr.eqns:
    if e.primitive is _core.ref_p or _core.internal_mutable_array_effect in e.effects:
      return True
  return _core.internal_mutable_array_effect in jaxpr.effects


# --------------------------------------------------------------------------- jit

def jit_cache_size(jitted: Any) -> int:
  """Number of compiled entries in a `jax.jit` object's C++ dispatch cache."""
  return jitted._cache_size()


# --------------------------------------------------------------------------- compile options
# CPU erases optimization barriers (pass `cse_barrier_expander`) before copy insertion,
# so the order they express is lost and copies come back (docs/xla_notes.md). Keeping the
# pass disabled lets barriers reach copy insertion. On GPU the expander runs after
# scheduling, so nothing is needed. `small-while-loop-hoisting` (after copy insertion)
# would emit the small loops a lowered conditional becomes as one kernel, where
# jax.jit's branch fusions are kernels of their own: rounding could differ.
BARRIER_EXPANDER_PASS = "cse_barrier_expander"
SMALL_LOOP_PASS = "small-while-loop-hoisting"


def backend_compiler_options(platform: str) -> dict[str, Any]:
  if platform == "cpu":
    return {"xla_disable_hlo_passes": f"{BARRIER_EXPANDER_PASS},{SMALL_LOOP_PASS}"}
  return {}


def small_loops_hoisted(options, user_options) -> tuple[tuple[str, Any], ...]:
  """`options` (key/value pairs) with `small-while-loop-hoisting` on again, unless
  the user's own options turn it off: for a program whose jax.jit compile hoisted
  small loops, which would otherwise run as while loops of kernels (2.4x slower
  warm calls of the Flashbax prioritised add-then-sample step)."""
  theirs = str(dict(user_options or ()).get("xla_disable_hlo_passes", "")).split(",")
  if SMALL_LOOP_PASS in theirs:
    return tuple(options)
  out = []
  for k, v in options:
    if k == "xla_disable_hlo_passes":
      v = ",".join(q for q in str(v).split(",") if q and q != SMALL_LOOP_PASS)
      if not v:
        continue
    out.append((k, v))
  return tuple(out)


def backend_erases_barriers(platform: str) -> bool:
  """Whether plain `jax.jit` on this platform erases optimization barriers before
  fusion (so a program compiled with barriers kept fuses differently)."""
  return platform == "cpu"


def barriers_kept(platform: str, options) -> bool:
  """Whether a compilation with these options (key/value pairs) keeps barriers."""
  if not backend_erases_barriers(platform):
    return True
  passes = dict(options or ()).get("xla_disable_hlo_passes", "")
  return BARRIER_EXPANDER_PASS in str(passes).split(",")


def merge_compiler_options(ours: dict[str, Any],
                           user: dict[str, Any] | None) -> dict[str, Any]:
  """User options win, except `xla_disable_hlo_passes`, whose lists are joined."""
  merged = dict(ours)
  for k, v in (user or {}).items():
    if k == "xla_disable_hlo_passes" and k in merged:
      passes = [p for p in str(merged[k]).split(",") if p]
      passes += [p for p in str(v).split(",") if p and p not in passes]
      merged[k] = ",".join(passes)
    else:
      merged[k] = v
  return merged


def as_weak_type(x):
  """`x` with a weakly-typed dtype, as JAX gives Python scalars."""
  return _lax._convert_element_type(x, x.dtype, weak_type=True)


# --------------------------------------------------------------------------- inspector
# Private attributes of `jax.stages.Compiled` the copy inspector reads (jax 0.10.2). Each
# accessor returns None when the attribute is gone, and the inspector then falls back to
# what the HLO text says (see `_check._donations`).


def compiled_kept_var_idx(compiled: Any) -> frozenset[int] | None:
  """Indices of the flat inputs (constants first, then argument leaves) that survived
  JAX's pruning of unused arguments; the HLO has one parameter per kept index, in order."""
  try:
    return frozenset(int(i) for i in compiled._executable._kept_var_idx)
  except (AttributeError, TypeError):
    return None


def compiled_num_const_args(compiled: Any) -> int:
  """Constants JAX hoisted into leading HLO parameters (0 unless
  `jax_use_simplified_jaxpr_constants` is on)."""
  try:
    return len(compiled._params.const_args)
  except (AttributeError, TypeError):
    return 0


def compiled_arg_names(compiled: Any) -> tuple[str, ...] | None:
  """Names of all flat inputs before pruning, as JAX writes them in parameter
  `op_name` metadata ("x", "state['cache']"); "" for hoisted constants."""
  try:
    names = compiled._executable._all_args_info.debug_info.arg_names
  except AttributeError:
    return None
  return tuple(str(n) for n in names) if names is not None else None


def compiled_platform(compiled: Any) -> str | None:
  """Platform ("cpu", "cuda", "tpu", ...) the program was compiled for."""
  try:
    return str(compiled.runtime_executable().client.platform)
  except Exception:  # noqa: BLE001 - any failure: try the shardings instead
    pass
  try:
    for s in jax.tree_util.tree_leaves(compiled.input_shardings):
      for d in s.device_set:
        return str(d.platform)
  except Exception:  # noqa: BLE001
    pass
  return None


def arg_info_aval(info: Any) -> Any:
  """The abstract value of a `jax.stages.ArgInfo` (a private field in 0.10.2)."""
  aval = getattr(info, "aval", None)
  return aval if aval is not None else getattr(info, "_aval", None)


eval_jaxpr = _core.eval_jaxpr


def checks_enabled() -> bool:
  return bool(_config.enable_checks.value)


def resolve_argnums(fun, donate_argnums, donate_argnames, static_argnums,
                    static_argnames):
  """(donate_argnums, donate_argnames, static_argnums, static_argnames), completed and
  validated against `fun`'s signature exactly as `jax.jit` does."""
  from jax._src import api_util
  sig = api_util.fun_signature(fun)
  return api_util.resolve_argnums(fun, sig, donate_argnums, donate_argnames,
                                  static_argnums, static_argnames)


def resolve_donation(fun, donate_argnums, donate_argnames):
  nums, names, _, _ = resolve_argnums(fun, donate_argnums, donate_argnames, None,
                                      None)
  return nums, names


def used_vars(jaxpr) -> set:
  """The variables `jaxpr`'s equations or outputs read (at its own level)."""
  used = {v for e in jaxpr.eqns for v in e.invars if not is_literal(v)}
  used |= {v for v in jaxpr.outvars if not is_literal(v)}
  return used


def _compiled_outputs(jaxpr, donated):
  """(position, variable) of the outputs that are the compiled module's: not
  literals, and not undonated inputs, which `jit` forwards without XLA."""
  index = {v: i for i, v in enumerate(jaxpr.invars)}
  for o, w in enumerate(jaxpr.outvars):
    if not (is_literal(w) or (w in index and not donated[index[w]])):
      yield o, w


def predicted_aliases(jaxpr, donated) -> list[int | None]:
  """Which output `jax.jit` aliases to each donated input (None: none), as
  `mlir._set_up_aliases` decides in jax 0.10.2: outputs in order each take the
  earliest donated input of the same shape and dtype. Inputs the program does not
  use are pruned first; outputs that are undonated inputs are forwarded by `jit`
  without going through XLA."""
  import collections
  used = used_vars(jaxpr)
  queues: dict = collections.defaultdict(collections.deque)
  for i, (v, d) in enumerate(zip(jaxpr.invars, donated, strict=True)):
    if d and v in used:
      queues[(tuple(v.aval.shape), v.aval.dtype)].append(i)
  aliases: list[int | None] = [None] * len(jaxpr.invars)
  for o, w in _compiled_outputs(jaxpr, donated):
    q = queues.get((tuple(w.aval.shape), w.aval.dtype))
    if q:
      aliases[q.popleft()] = o
  return aliases


def predicted_donors(jaxpr, donated, aliases) -> list[bool]:
  """Which donated inputs without an alias (`predicted_aliases`) `jax.jit` still
  gives XLA as buffer donors, as `mlir._set_up_aliases` decides in jax 0.10.2: in
  order, each takes an output no input is aliased to with as many elements, any
  shape and dtype. XLA may then write an output of the same byte size over the
  donor (`may-alias` in the compiled module), or none."""
  import collections
  used = used_vars(jaxpr)
  taken = {a for a in aliases if a is not None}
  sizes: collections.Counter = collections.Counter()
  for o, w in _compiled_outputs(jaxpr, donated):
    if o not in taken and hasattr(w.aval, "shape"):   # not a token
      sizes[math.prod(w.aval.shape)] += 1
  donors = [False] * len(jaxpr.invars)
  for i, (v, d, a) in enumerate(zip(jaxpr.invars, donated, aliases, strict=True)):
    size = math.prod(getattr(v.aval, "shape", (-1,)))
    if d and a is None and v in used and sizes[size] > 0:
      sizes[size] -= 1
      donors[i] = True
  return donors


# --------------------------------------------------------------------------- jit dispatch
# `inplace_jax.jit` decides per signature which program runs, then hands the compiled
# executable to jax.jit's C++ dispatch, so that warm calls cost what jax.jit's do. It
# builds its dispatcher the way `pjit._cpp_pjit` does, with its own cache-miss
# handler, and runs the chosen parameters through jax.jit's own Python path
# (`_run_python_pjit`), which lowers and compiles through jax's caches: a program
# compiled for inspection (`traced(...).lower().compile()`) is the one that runs.

from jax._src import dispatch as _dispatch  # noqa: E402
from jax._src import pjit as _pjit  # noqa: E402
from jax._src import stages as _stages  # noqa: E402
from jax._src import traceback_util as _traceback_util  # noqa: E402
from jax._src import tree_util as _tree_util  # noqa: E402
from jax._src.interpreters import pxla as _pxla  # noqa: E402
from jax._src.lib import _jax as _jax_ext  # noqa: E402


def jit_info(jitted: Any) -> Any:
  """The parsed arguments (`PjitInfo`) of a `jax.jit` object."""
  return jitted._jit_info


def jit_compiler_options(info: Any) -> tuple[tuple[str, Any], ...]:
  return tuple(info.compiler_options_kvs)


# XLA:CPU writes each kernel's LLVM IR, after LLVM's optimisations, to the folder
# given as the compile option `xla_dump_to`, as `<module>.<kernel>.ir-with-opt.ll`
# (jaxlib 0.10.2; tests/test_llvm.py re-reads it). Options starting with
# `xla_dump` are the user's own dump: inplace_jax then reads no IR.
DUMP_OPTION = "xla_dump_to"
DUMP_PREFIX = "xla_dump"
OPTIMISED_IR_SUFFIX = ".ir-with-opt.ll"


def optimised_ir(compile_in: Callable[[str], Any]) -> list[str] | None:
  """The optimised LLVM IR of every kernel of the program `compile_in(folder)`
  compiles with `xla_dump_to=folder`, or None where XLA wrote none (a persistent
  compilation cache hit, another backend) or the compile failed."""
  with tempfile.TemporaryDirectory(prefix="inplace_jax_ir_") as folder:
    try:
      compile_in(folder)
    except Exception:   # a dump that fails only costs the finer check
      return None
    names = sorted(n for n in os.listdir(folder) if n.endswith(OPTIMISED_IR_SUFFIX))
    if not names:
      return None
    texts = []
    for n in names:
      with open(os.path.join(folder, n), encoding="utf-8", errors="replace") as f:
        texts.append(f.read())
    return texts


def cpp_dispatch(name: str, fun: Callable, cache_miss: Callable, info: Any) -> Any:
  """A jax.jit C++ dispatcher over `fun` whose cache misses call `cache_miss(*args,
  **kwargs) -> (outputs, fastpath_data, rebuild)`; `fun` keys its cache entries (it
  must be unique to the caller and stay alive with it) and runs under
  `jax.disable_jit()`."""
  key = _pxla.JitGlobalCppCacheKeys(
      donate_argnums=info.donate_argnums, donate_argnames=info.donate_argnames,
      device=info.device, backend=info.backend,
      in_shardings_treedef=info.in_shardings_treedef,
      in_shardings_leaves=info.in_shardings_leaves,
      out_shardings_treedef=info.out_shardings_treedef,
      out_shardings_leaves=info.out_shardings_leaves,
      in_layouts_treedef=info.in_layouts_treedef,
      in_layouts_leaves=info.in_layouts_leaves,
      out_layouts_treedef=info.out_layouts_treedef,
      out_layouts_leaves=info.out_layouts_leaves,
      compiler_options_kvs=info.compiler_options_kvs)
  cache = _pjit._get_cpp_global_cache(key.contains_explicit_attributes)
  return _jax_ext.pjit(name, fun, cache_miss, info.static_argnums,
                       info.static_argnames, key, _tree_util.dispatch_registry,
                       _pxla.cc_shard_arg, cache)


def clear_dispatch(dispatch: Any, fun: Callable) -> None:
  """What `jax.jit(...).clear_cache()` does, for a dispatcher from `cpp_dispatch`."""
  dispatch._clear_cache()
  _pe.trace_to_jaxpr.evict_weakref(fun)
  _pjit._infer_params_cached.cache_clear()


def infer_params(fun: Callable, info: Any, args: tuple, kwargs: dict):
  """JAX's trace of `fun` for these arguments (cached by JAX per signature): the jit
  parameters (`params['jaxpr']`, `params['donated_invars']`, ...) and the flat
  dynamic arguments."""
  return _pjit._infer_params(fun, info, args, kwargs)


def params_jaxpr(p: Any) -> Any:
  return p.params["jaxpr"]


def params_donated(p: Any) -> tuple[bool, ...]:
  return tuple(p.params["donated_invars"])


def with_params(p: Any, **changes) -> Any:
  """`p` with some of its jit parameters replaced (`jaxpr`, `compiler_options_kvs`)."""
  return p._replace(params=dict(p.params, **changes))


def traced(p: Any, args_flat) -> Any:
  """The `jax.stages.Traced` of parameters `p` for these flat arguments."""
  arg_types = [_pjit.convert_to_metaty(a) for a in args_flat]
  return _stages.Traced(arg_types, p.params, p.in_tree, p.out_tree, p.consts)


def run_params(p: Any, args_flat, fun: Callable, args: tuple, kwargs: dict):
  """Runs (at top level) or binds (under a trace) parameters `p`, as jax.jit's cache
  miss does; returns the outputs and the C++ fast-path data (None under a trace)."""
  (outs, out_flat, out_tree, args_flat, jaxpr, executable, profiler,
   const_args) = _pjit._run_python_pjit(p, args_flat, fun, args, kwargs)
  fastpath = _pjit._get_fastpath_data(executable, out_tree, args_flat, out_flat,
                                      jaxpr.effects, jaxpr.consts, profiler,
                                      const_args)
  return outs, fastpath


def with_executable(lowered: Any, compiled: Any) -> Any:
  """`lowered` (a `jax.stages.Lowered`) whose `.compile()` without options gives the
  executable of `compiled` (compiled from the same program, its IR dumped or not),
  instead of compiling it again: `MeshComputation.compile` returns the executable
  it holds (jax 0.10.2)."""
  lowering = getattr(lowered, "_lowering", None)
  executable = getattr(compiled, "_executable", None)
  if (isinstance(lowering, _pxla.MeshComputation) and isinstance(executable, _pxla.MeshExecutable)
      and getattr(lowering, "_executable", None) is None):
    lowering._executable = executable
  return lowered


# The `jax.monitoring` duration event of every XLA compile (jax._src.dispatch).
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def run_compiled(p: Any, compiled: Any, args_flat, fun: Callable, args: tuple,
                 kwargs: dict):
  """`run_params` with an executable compiled for `p` already (a `jax.stages.Compiled`
  of `traced(p, args_flat)`), so that the call compiles nothing again: the one
  inplace_jax compiled to inspect, dumped or not. Where jax.jit's call path does
  more than run (a trace, NaN/Inf debugging, key-reuse checks, profile-guided
  recompiles) or an argument is not one it runs as is, `run_params`."""
  plain_path = (compiled is None or not _core.trace_state_clean()
                or _config.debug_key_reuse.value or _config.debug_nans.value
                or _config.debug_infs.value or _config.enable_pgle.value
                or p.params["jaxpr"].jaxpr.is_high
                or not isinstance(getattr(compiled, "_executable", None),
                                  _pxla.MeshExecutable))
  if not plain_path:
    try:
      for arg in args_flat:
        _dispatch.check_arg(arg)
      lowered = [_core.full_lower(a) for a in args_flat]
      _core.check_eval_args(lowered)
    except Exception:   # jax.jit's own path raises its own error for it
      plain_path = True
  if plain_path:
    return run_params(p, args_flat, fun, args, kwargs)
  executable = compiled._executable
  const_args = executable.shard_const_args(compiled._params.const_args)
  out_flat = executable.unsafe_call(*const_args, *lowered)
  outs = _tree_util.tree_unflatten(p.out_tree, out_flat)
  jaxpr = p.params["jaxpr"]
  fastpath = _pjit._get_fastpath_data(executable, p.out_tree, lowered, out_flat,
                                      jaxpr.effects, jaxpr.consts, None, const_args)
  return outs, fastpath


def trace_state_clean() -> bool:
  """Whether no transformation is tracing (a call at top level)."""
  return _core.trace_state_clean()


def outer_jit_options() -> tuple[tuple[str, Any], ...] | None:
  """The compiler options of the outermost `jax.jit` being traced right now (read
  from the frame of its `_trace_for_jit`), or None when no jit is being traced (a
  call under `jax.grad` or `jax.vmap` outside any jit, which JAX compiles as a jit
  of its own, without options)."""
  import sys
  code = _pjit._trace_for_jit.__code__
  frame: Any = sys._getframe(1)
  found = None
  while frame is not None:
    if frame.f_code is code:
      info = frame.f_locals.get("ji")
      found = tuple(getattr(info, "compiler_options_kvs", ()) or ())
    frame = frame.f_back
  return found


def api_boundary(fn: Callable) -> Callable:
  """`fn` as an entry point of JAX's: its tracebacks are filtered as jax.jit's are."""
  return _traceback_util.api_boundary(fn)


def hide_frames(path: str) -> None:
  """Hides the frames of files under `path` from user tracebacks, as JAX hides its
  own (and Equinox its)."""
  _traceback_util.register_exclusion(path)


def is_ref(x: Any) -> bool:
  """Whether `x` is a mutable JAX Ref (`jax.new_ref`), concrete or traced."""
  from jax._src.state.types import AbstractRef
  try:
    return isinstance(jax.typeof(x), AbstractRef)
  except TypeError:
    return False


# --------------------------------------------------------------------------- chex


def chex_assertion(fn: Callable, name: str) -> Callable:
  """`fn` (raising `AssertionError`) as a chex host assertion: chex's message prefix,
  `custom_message=` and `exception_type=`, and `chex.disable_asserts()`."""
  from chex._src.asserts_internal import chex_assertion as _chex_assertion
  return _chex_assertion(fn, None, name=name)
