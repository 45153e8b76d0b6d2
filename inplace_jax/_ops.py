"""Helper ops that state an in-place intent explicitly: `after`, `swap`, `update`.

`inplace_jax.jit` finds reads of donated buffers and orders them before updates by
itself. These ops are for code that wants the order written down: inside a plain
`jax.jit` (with `inplace_jax.compiler_options()`), inside another library's
transform, or where the analysis cannot see the intent:

* `after(value, *deps)`: `value`, ordered after everything `deps` needed.
* `swap(x, idx, new)`: write `new` at `x[idx]` and return the old slice.
* `update(x, idx, fn)`: write `fn(x[idx])` at `x[idx]` and return the old slice.

Each op is an `optimization_barrier` around ordinary `jax.numpy` indexing, so it
works under `jax.jit`, `jax.vmap` and `jax.grad`, and computes exactly what the
plain `x.at[idx].set(...)` spelling computes, bit for bit. `swap` and `update` take
their derivative from the plain spelling (a `jax.custom_jvp`): a barrier in the
derivative would stop XLA fusing the gradient arithmetic as it does for the plain
spelling, and change its rounding. So the forward pass is in place, and gradients
equal, bit for bit, and cost, what plain JAX's do.

.. warning:: On CPU, XLA erases optimization barriers (the `cse_barrier_expander`
   pass) before copy insertion. The order these ops state is only kept, and the
   copies only avoided, under `inplace_jax.jit` or a `jax.jit` compiled with
   `compiler_options=inplace_jax.compiler_options()`. Elsewhere the values are still
   right; the copies may remain.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from . import _compat as C

T = TypeVar("T")

# What `.at[...]` accepts: an int, a slice, an array, `None`, `Ellipsis`, or a tuple
# of those.
Index = Any


def after(value: T, *deps: Any) -> T:
  """Returns `value`, ordered after the computations that produced `deps`.

  `value` and `deps` are pytrees. Anything that later consumes the returned value
  runs after all of `deps` have been computed. Use it to make reads of a buffer
  happen before the buffer is updated in place: pass the buffer as `value` and the
  read results as `deps`, then update the returned buffer.

  A read result that is used again *after* the update should travel inside `value`
  (`x, row = after((x, row))`) and be used from there: XLA duplicates cheap reads
  such as slices into their later consumers, so `row * 2` computed from the `row`
  outside the barrier may re-read the old buffer after the write, which forces a
  copy of it.

  On CPU the order is kept only under `inplace_jax.jit` or with
  `compiler_options=inplace_jax.compiler_options()`; otherwise XLA drops the barrier
  (the value is unchanged either way).

  Args:
    value: a pytree of arrays.
    *deps: pytrees of arrays that must be computed first.

  Returns:
    `value`, unchanged.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> def step(x):
    ...   total = x.sum()                  # a read of the old buffer ...
    ...   x = inplace_jax.after(x, total)  # ... done before x is updated
    ...   return x.at[0, 0].set(1.0), total
    >>> f = jax.jit(step, donate_argnums=0,
    ...             compiler_options=inplace_jax.compiler_options())
    >>> x, total = f(jnp.ones((3, 3)))
    >>> float(x[0, 0]), float(total)
    (1.0, 9.0)
    >>> x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    >>> inplace_jax.check(f, x).copies
    ()
  """
  _no_refs("after", value, *deps)
  # One barrier over value and deps: its outputs exist only once all its operands do,
  # so every consumer of the returned value waits for `deps`.
  value, _ = jax.lax.optimization_barrier((value, deps))
  return value


def swap(x: jax.Array, idx: Index, new: Any) -> tuple[jax.Array, jax.Array]:
  """Writes `new` at `x[idx]` and returns `(new_x, old)`, with `old` the slice read.

  Equal to `(x.at[idx].set(new), x[idx])`, bit for bit, but the read is ordered
  before the write, so with `x` donated the write happens in place and `old` still
  holds the old values.

  Args:
    x: the array to update (donate it to update in place).
    idx: any index `x.at[idx]` accepts: ints, slices, `None`, `...`, integer
      arrays, or a tuple of those. Out-of-bounds indices behave as in `.at[]`.
    new: the values to write; broadcast to the shape of `x[idx]` as `.set` does.

  Returns:
    `(new_x, old)` with `new_x = x.at[idx].set(new)` and `old = x[idx]`.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> @inplace_jax.jit(donate_argnums=0)
    ... def swap_rows(x):
    ...   x, row0 = inplace_jax.swap(x, 0, x[1])
    ...   x, _ = inplace_jax.swap(x, 1, row0)
    ...   return x
    >>> swap_rows(jnp.arange(6.0).reshape(3, 2)).tolist()
    [[2.0, 3.0], [0.0, 1.0], [4.0, 5.0]]
    >>> x = swap_rows(jnp.arange(512.0 * 256).reshape(512, 256))
    >>> swap_rows.last_report.buffer_copies()
    ()
  """
  _no_refs("swap", x, new)
  spec, dynamic = _split_index(idx)
  return _swap(spec, x, dynamic, jax.numpy.asarray(new))


def update(x: jax.Array, idx: Index,
           fn: Callable[[jax.Array], Any]) -> tuple[jax.Array, jax.Array]:
  """Writes `fn(x[idx])` at `x[idx]` and returns `(new_x, old)`: read-modify-write.

  Equal to `(x.at[idx].set(fn(x[idx])), x[idx])`, bit for bit, but the read of
  `x[idx]` is ordered before the write. With `x` donated, the write is in place and
  touches only the slice, where `x.at[idx].add(v)` compiles, on CPU, to a loop over
  the whole buffer.

  `fn` may close over other traced values (`lambda row: row * w`); gradients flow
  to them as in the plain spelling.

  Args:
    x: the array to update (donate it to update in place).
    idx: any index `x.at[idx]` accepts: ints, slices, `None`, `...`, integer
      arrays, or a tuple of those. Out-of-bounds indices behave as in `.at[]`.
    fn: maps the old slice to the new one (broadcast to the slice's shape).

  Returns:
    `(new_x, old)` with `new_x = x.at[idx].set(fn(x[idx]))` and `old = x[idx]`.

  Examples:
    >>> import jax, jax.numpy as jnp, inplace_jax
    >>> @inplace_jax.jit(donate_argnums=0)
    ... def bump(x, i):
    ...   x, old = inplace_jax.update(x, i, lambda row: row * 2.0 + 1.0)
    ...   return x, old
    >>> x, old = bump(jnp.ones((3, 2)), 1)
    >>> x.tolist(), old.tolist()
    ([[1.0, 1.0], [3.0, 3.0], [1.0, 1.0]], [1.0, 1.0])
    >>> x, old = bump(jnp.ones((512, 256)), 1)
    >>> bump.last_report.buffer_copies()
    ()
  """
  _no_refs("update", x)
  spec, dynamic = _split_index(idx)
  old = jax.eval_shape(lambda x, d: x[_join_index(spec, d)], x, dynamic)
  # The derivative rule needs `fn`'s closed-over traced values as explicit inputs,
  # or gradients with respect to them would be silently zero.
  fn, consts = jax.closure_convert(fn, old)
  return _update(spec, fn, x, dynamic, *consts)


# --------------------------------------------------------------------------- refs

_REF_HINT = {
    "after": "a Ref is read and written in the order the code does it; pass the "
             "values read from it (r[...]) instead",
    "swap": "on a Ref write `old = r[idx]; r[idx] = new`: JAX updates a Ref in "
            "place, and inplace_jax.jit orders the read before the write",
    "update": "on a Ref write `old = r[idx]; r[idx] = fn(old)`: JAX updates a Ref "
              "in place, and inplace_jax.jit orders the read before the write",
}


def _no_refs(op: str, *trees: Any) -> None:
  for leaf in jax.tree.leaves(trees, is_leaf=C.is_ref):
    if C.is_ref(leaf):
      raise TypeError(f"inplace_jax.{op} takes arrays, not a JAX Ref: "
                      f"{_REF_HINT[op]}.")


# --------------------------------------------------------------------------- index


class _Static:
  """A static index part (int, slice, None, Ellipsis, NumPy array), hashable so that
  it can be a `nondiff_argnums` argument (slices are unhashable before 3.12)."""

  def __init__(self, value: Any):
    self.value = value
    if isinstance(value, np.ndarray):
      self._key: Any = ("ndarray", value.dtype.str, value.shape, value.tobytes())
    else:
      self._key = (type(value).__name__, repr(value))

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, _Static) and self._key == other._key


def _is_dynamic(part: Any) -> bool:
  # JAX arrays and tracers become operands; NumPy arrays stay constants, as they
  # are in the plain spelling (a NumPy boolean mask must stay concrete).
  return isinstance(part, jax.Array)


def _split_index(idx: Index) -> tuple[tuple[bool, tuple], tuple]:
  """`idx` -> (hashable static structure, tuple of JAX-array parts)."""
  parts = idx if isinstance(idx, tuple) else (idx,)
  static = tuple(None if _is_dynamic(p) else _Static(p) for p in parts)
  dynamic = tuple(p for p in parts if _is_dynamic(p))
  return (isinstance(idx, tuple), static), dynamic


def _join_index(spec: tuple[bool, tuple], dynamic: tuple) -> Index:
  is_tuple, static = spec
  it = iter(dynamic)
  parts = tuple(next(it) if s is None else s.value for s in static)
  return parts if is_tuple else parts[0]


# --------------------------------------------------------------------------- ops


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _swap(spec, x, dynamic, new):
  idx = _join_index(spec, dynamic)
  old = x[idx]
  # `new` goes through the barrier too: when it was read from `x` (a swap of two
  # rows), that read must also finish before the write, and XLA would otherwise
  # fuse it into the in-place write, which forces a copy of `x`.
  x, old, new = jax.lax.optimization_barrier((x, old, new))
  return x.at[idx].set(new), old


@_swap.defjvp
def _swap_jvp(spec, primals, tangents):
  x, dynamic, new = primals
  tx, _, tnew = tangents

  def plain(x, new):
    idx = _join_index(spec, dynamic)
    return x.at[idx].set(new), x[idx]

  _, tangent_out = jax.jvp(plain, (x, new), (tx, tnew))
  return _swap(spec, x, dynamic, new), tangent_out


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _update(spec, fn, x, dynamic, *consts):
  idx = _join_index(spec, dynamic)
  old = x[idx]
  x, old = jax.lax.optimization_barrier((x, old))
  # `fn` is applied to a re-read of the ordered buffer, inside the write, as in the
  # plain spelling: XLA fuses that read into the in-place write. Applying it to the
  # kept `old` would compile `fn` in another fusion, where XLA CPU rounded
  # `sin(v) * 1.7 + v * v` on a column differently in the last bit.
  return x.at[idx].set(fn(x[idx], *consts)), old


@_update.defjvp
def _update_jvp(spec, fn, primals, tangents):
  x, dynamic, *consts = primals
  tx, _, *tconsts = tangents

  def plain(x, *consts):
    idx = _join_index(spec, dynamic)
    return x.at[idx].set(fn(x[idx], *consts)), x[idx]

  _, tangent_out = jax.jvp(plain, (x, *consts), (tx, *tconsts))
  return _update(spec, fn, x, dynamic, *consts), tangent_out
