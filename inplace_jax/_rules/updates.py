"""Updates: `dynamic_update_slice` and the scatter family write operand 0 in place.

Where is scatter-add handled? Here: `_scatter_rule` says what it updates and whether
it may be split; `split_read`/`split_write` build the split. A unique-index
read-modify-write scatter (`x.at[i].add(v)`) compiles, fused, to a loop over the whole
buffer on CPU even when no copy is made; split into read -> barrier -> write it
touches only the window (the #20440 step at 10^8 elements: 174 ms -> 7 us).
"""

from __future__ import annotations

from typing import Any

from jax import lax

from .. import _compat as C
from .._plan import EqnInfo, InplaceUse
from . import _build
from ._registry import register

# Read-modify-write scatters whose combiner is one exact IEEE operation, applied as
# combiner(old, update): splitting them into gather -> combiner -> scatter gives
# bit-identical results. (`.at[].apply` is a `scatter` with an arbitrary update
# jaxpr; it is not split, since a vectorised transcendental need not match XLA's
# scalar one bit for bit.)
RMW_COMBINERS: dict[C.Primitive, Any] = {
    C.scatter_add_p: lax.add,
    C.scatter_sub_p: lax.sub,
    C.scatter_mul_p: lax.mul,
    C.scatter_min_p: lax.min,
    C.scatter_max_p: lax.max,
}
# Scatters that accumulate: the addend may not be split off a multiply (an FMA).
ADDITIVE = frozenset({C.scatter_add_p, C.scatter_sub_p})


def _dus_rule(eqn, is_version, ctx):
  del ctx
  if not is_version[0]:
    return EqnInfo()
  return EqnInfo(uses=(InplaceUse(0, 0),), forwards_reads=True)


def _scatter_rule(eqn, is_version, ctx):
  del ctx
  if not is_version[0]:
    return EqnInfo()
  # A scatter-add with indices that may repeat must keep its accumulation, so only
  # unique-index read-modify-writes are split.
  splittable = (eqn.primitive in RMW_COMBINERS
                and bool(eqn.params.get("unique_indices"))
                and not eqn.params.get("update_consts")
                and _one_window(eqn))
  return EqnInfo(uses=(InplaceUse(0, 0),), forwards_reads=True,
                 splittable=splittable)


def _one_window(eqn) -> bool:
  """Whether the scatter updates one window (per batch element, under vmap).

  That is the case the split is for (`x.at[i].add(v)`, fused, rewrites the whole
  buffer on CPU); gathering several windows, columns say, costs transposes.
  """
  dn = eqn.params["dimension_numbers"]
  shape = eqn.invars[1].aval.shape
  batch = set(dn.scatter_indices_batching_dims)
  n = 1
  for d, size in enumerate(shape[:-1]):   # the last dimension holds the index vector
    if d not in batch:
      n *= size
  return n == 1


def split_read(eqn: C.JaxprEqn, operand, indices) -> tuple[list[C.JaxprEqn], Any]:
  """The gather that reads what a read-modify-write scatter is about to modify."""
  p = eqn.params
  dn = p["dimension_numbers"]
  updates_aval: Any = eqn.invars[2].aval
  window = [d for d in range(operand.aval.ndim)
            if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
  slice_sizes = [1] * operand.aval.ndim
  for d, u in zip(window, dn.update_window_dims, strict=True):
    slice_sizes[d] = updates_aval.shape[u]
  gdn = lax.GatherDimensionNumbers(
      offset_dims=tuple(dn.update_window_dims),
      collapsed_slice_dims=tuple(dn.inserted_window_dims),
      start_index_map=tuple(dn.scatter_dims_to_operand_dims),
      operand_batching_dims=tuple(dn.operand_batching_dims),
      start_indices_batching_dims=tuple(dn.scatter_indices_batching_dims))

  def read(x, idx):
    return lax.gather(x, idx, gdn, tuple(slice_sizes),
                      indices_are_sorted=p["indices_are_sorted"],
                      unique_indices=p["unique_indices"], mode=p["mode"])

  eqns, (old,) = _build.trace_eqns(read, [operand, indices], eqn)
  if getattr(old.aval, "shape", None) != updates_aval.shape:
    raise AssertionError("inplace_jax internal error: gather/scatter shapes differ "
                         f"({old.aval.shape} vs {updates_aval.shape}); please report.")
  return eqns, old


def split_write(eqn: C.JaxprEqn, operand, indices, updates, old
                ) -> list[C.JaxprEqn]:
  """combiner(old, updates) written back by a plain scatter into `operand`."""
  combine = RMW_COMBINERS[eqn.primitive]
  eqns, (new,) = _build.trace_eqns(combine, [old, updates], eqn)
  params = dict(eqn.params, update_jaxpr=None, update_consts=())
  write = eqn.replace(primitive=C.scatter_p, invars=[operand, indices, new],
                      params=params)
  return eqns + [write]


def _operand_zero(eqn) -> list[tuple[int, int]]:
  return [(0, 0)]


# --------------------------------------------------------------------------- registry

register(C.dynamic_update_slice_p, analyze=_dus_rule, carries=_operand_zero)
for _p in C.SCATTER_PRIMITIVES:
  register(_p, analyze=_scatter_rule, carries=_operand_zero)
