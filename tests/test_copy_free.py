"""Programs that have an in-place order but copy under `jax.jit`: under
`inplace_jax.jit` copy-free and bit-equal to `jax.jit`.

The four programs of two or three operations from the issue "Copy-free wherever an
in-place order exists" (x donated, f32[16, 8192]) and its two workloads. Each needed
the compiled HLO in the loop (`_explain.py`, `Hints`): a read that feeds a later
version's update, or a read of the new version XLA forwards to the old buffer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from conftest import ON_CPU, compare

SHAPE = (16, 8192)
FULL = SHAPE[0] * SHAPE[1] * 4


def _x(k=0):
  return jnp.asarray(np.random.default_rng(k).normal(size=SHAPE), jnp.float32)


def swap_then_read(x, k):
  a, b = x[1], x[14]
  x = x.at[1].set(b).at[14].set(a)
  return x, x[k].sum()


def read_between_updates(x):
  x = x.at[8, :16].max(0.25)
  r = x[3].sum()
  return x.at[10].set(x[8] * 0.5 + r)


def noop_branch_and_swap(x, p, k):
  return lax.cond(p, lambda x: (x, jnp.float32(0)), lambda x: swap_then_read(x, k), x)


def swap_in_one_step_scan(x, k):
  def body(x, _):
    i = k % 16
    a, b = x[i], x[(i + 13) % 16]
    x = x.at[i].set(b).at[(i + 13) % 16].set(a)
    return x, x[(k + 3) % 16].sum()
  return lax.scan(body, x, length=1)


def gauss_seidel_with_change(x, b):
  """A Gauss-Seidel sweep that records how much each row changed: it reads the old
  row after computing (and writing) the new one."""
  n = x.shape[0]
  def body(i, c):
    x, change = c
    new = 0.5 * (b[i] - 0.1 * x[(i + 1) % n])
    x2 = x.at[i].set(new)
    change = change.at[i].set(jnp.abs(new - x[i]).max())
    return x2, change
  return lax.fori_loop(0, n, body, (x, jnp.zeros((n,), jnp.float32)))


def sparse_momentum(state, idx, g):
  """Gather rows by an index vector, scatter-set the momentum rows, scatter-add into
  the params (indices may repeat) and re-read the updated rows."""
  p, m = state["params"], state["momentum"]
  rows = p[idx]
  mrows = m[idx] * 0.9 + g
  m = m.at[idx].set(mrows)
  p = p.at[idx].add(-0.01 * mrows)
  return ({"params": p, "momentum": m, "count": state["count"] + 1},
          p[idx].sum() + rows.sum())


def clip_to_column(x, j):
  """`jnp.where` over the buffer with a broadcast of its own column: the new value
  reads the buffer other than element by element, so the column is read first
  (`select_n` lists the broadcast column before the buffer; fuzz seed 2035 #10)."""
  col = lax.dynamic_slice_in_dim(x, j, 1, 1)
  return jnp.where(x > 0, x, jnp.resize(col, x.shape))


def step_reading_the_buffer_then_row_set(x, y):
  """`y - 0.01 * x` reads all of x before x's row is set (fuzz seed 2040 #370,
  shrunk): the product may not be tied (an FMA would split), so the whole
  expression is, its multiply-add in one fusion as under jax.jit."""
  y = y - 0.01 * x
  return x.at[0].set(x[17]), y


def step_returning_its_square(x, w):
  """An elementwise step that also returns a product it is computed from, then a
  dot of the new value added into a block of it (fuzz seed 3500 #1004): XLA
  computes `x * x` in the fusion of the output and again in the step's, so the
  read is tied where those fusions end, and the step recomputes its chain from the
  buffer after the barrier (`_passes.clone_shared`), not from a
  stored product."""
  sq = x * x
  x = x * 0.99 - 0.01 * sq
  r = x @ w * 0.125
  x = x.at[:, 4:8].add(r)
  return r, x.at[17:].set(-2.0), sq


def step_summed_and_sliced_then_set(x, g, j):
  """An elementwise step whose result is summed and sliced before an element of
  it is updated (fuzz seed 3500 #1950, shrunk): XLA computes the step inside the
  sum's fusion and the slice's, from the old buffer, and again where it writes the
  buffer. The slice is cloned per reader too (clone level 2), so the read is tied
  where the slice's own fusion ends, not as a stored step both fusions load."""
  x = x * 0.99 - 0.01 * g
  s = jnp.sum(x)
  v = lax.dynamic_slice(x, (jnp.int32(0), j), (16, 3))
  return v, x.at[-9, -15].add(1.0), s


def step_minus_scaled_column(x):
  """An elementwise step that subtracts a scaled column of the buffer, then a row
  update by that column (fuzz seed 3700 #115, shrunk): tied, the column is
  materialised and the step's loop runs as scalar code where jax.jit's runs as
  vector code with the column's product splat across lanes. Each lane computes the
  same multiply-add; the kernels' reading (`_llvm.same_semantics`) sees it only
  where `c - splat(a * b)` reads as `c + splat((-a) * b)` as the scalar code's
  `c - a * b` does."""
  c = x[:, 43:44]
  x = x * 0.99 - 0.5 * c
  return x.at[21, 24:38].mul(c[:14, 0])


def sine_of_a_row_set_then_step(x, y):
  """A row set to a sine, then the sine of the whole buffer and a step by it (fuzz
  seed 3700 #715, shrunk): jax.jit fuses the row update into the sine's loop,
  which takes `sin(y)` or the old element and computes its sine; in place, the
  loop loads the element the update stored. The pick reads as a load where the
  other program stores its computed choice (`_llvm._Semantics.picks_leaves`)."""
  x = x.at[jnp.argmax(x[5]) % 16].set(jnp.sin(y[0]))
  v = jnp.sin(x)
  return x - 0.1 * v, v


def step_minus_row_then_mean(x):
  """An elementwise step by a row of the buffer, then its column means (fuzz seed
  3700 #435, shrunk). The step's loop would read the row after writing it: the
  row is tied where it is read (data movement). Small, XLA computes the step
  again inside the mean's fusion, so that fusion runs first, its result tied
  after the division that ends it (a division by a scalar is a multiply XLA
  fuses into each reader); larger, the mean reads the stored step."""
  r = x[13]
  x = x * 0.99 - 0.25 * r
  return jnp.mean(x, axis=0), x


def step_plus_column_then_mean(x):
  """`step_minus_row_then_mean` with a column and the mean of everything."""
  x = x * 0.5 + x[:, 2:3]
  return jnp.mean(x), x


def _peek_fn(b):
  return b, jnp.sum(b[0, 0])


def _peek_jvp(primals, tangents):
  return _peek_fn(*primals), _peek_fn(*tangents)


_peek_custom_jvp = jax.custom_jvp(_peek_fn)
_peek_custom_jvp.defjvp(_peek_jvp)
_peek_custom_vjp = jax.custom_vjp(_peek_fn)
_peek_custom_vjp.defvjp(lambda b: (_peek_fn(b), None), lambda _, g: (g[0],))


def _read_in_call_then_scatter(peek):
  def fn(x):
    """A call reads an element of the buffer it passes through; a scatter after it
    adds the element back (fuzz seed 4100 #623). The call's body was sequenced on
    its own, and the scatter after it on its own; XLA inlines the call and copies
    the buffer."""
    x = x * 0.5 + 1.5
    x, s = peek(x)
    return x.at[27, jnp.array([2, 11, 7])].add(-s)
  return fn


def _gather_in_call_then_step(peek_rows):
  def fn(x):
    """A call gathers rows of the buffer it passes through, then an elementwise
    step after it (fuzz seed 4100 #341)."""
    x, m = peek_rows(x)
    return x * 2 + 1, m
  return fn


def _rows_fn(b):
  b = b.at[:, jnp.array([23])].add(0)
  return b, jnp.max(b[jnp.array([0, 3, 6])])


_rows_custom_jvp = jax.custom_jvp(_rows_fn)
_rows_custom_jvp.defjvp(lambda p, t: (_rows_fn(*p), _rows_fn(*t)))


def _normal(*shapes):
  return lambda: tuple(jnp.asarray(np.random.default_rng(k).normal(size=s), jnp.float32)
                       for k, s in enumerate(shapes))


def _ints(shape=(16, 32), k=0):
  return lambda: (jnp.asarray(np.random.default_rng(k).integers(-50, 50, size=shape),
                              jnp.int32),)


def square_step_then_window_of_square(x):
  """Fuzz seed 4400 #179, by hand. The square is read after the step overwrites x,
  so it is tied before: a barrier after a product that only a multiply by a
  literal reads, whose result the step subtracts. That product with 0.5 is the
  multiply-add XLA may contract, whatever the square's own fusion; only an add
  whose other operand is scaled by the same literal (`v * c + w * c`, factored by
  XLA) would expose the square to an add. Copied before that distinction."""
  v = x * x
  x = x - 0.5 * v
  return lax.dynamic_update_slice(x, jnp.resize(v, (8, 20)), (jnp.argmax(x[9]) % 9, 2))


def row_add_step_then_column_add(x):
  """Fuzz seed 4100 #5073, by hand. XLA fuses the row add, the whole-buffer step
  and the column add into kernels that do not run in place: the new value is
  computed in another buffer and copied into the donated one, and the copy names
  no read to tie. The materialising round (`Hints.materialise`, `Hints.tie_into`)
  removed it first; since a scaled result counts as added only where the add is
  factorable (`_exactness._added`), the first round ties after the row add."""
  x = x.at[13].add(-2)
  x = x * 2 + 1
  return x.at[:, 11].add(x[5, :16])


def row_add_step_row_set_then_window_add(x):
  """The same with a row set and a dynamically placed window read (#5073 whole)."""
  x = x.at[13:14].add(-2)
  x = x * 2 + 1
  x = x.at[6:8].set(7)
  v = lax.dynamic_slice(x, (jnp.argmin(x[:, 12]) % 5 + 5, 4), (12, 29))
  return x.at[:, 11].add(jnp.resize(v, (16,)) * 2 + 1)


def square_resized_into_a_window_after_a_matmul_add(b0, b1):
  """Fuzz seed 5600 #3062, its dead read left out. `b1 * b1` reaches b0's update
  only through `jnp.resize`, a nested jit that only moves data: spliced into the
  program (`_passes.inline_calls`), the product's window is a chain of equations
  the analysis follows to its tie; kept as a call, one copy of each buffer
  remained."""
  v1 = b1 * b1
  v2 = jax.vmap(lambda r: r @ (jnp.arange(128, dtype=jnp.float32).reshape(16, 8) % 3 - 1)
                * 0.125)(b0)
  b1 = b1.at[0:48, 4:12].add(v2[0:48, 0:8])
  b0 = b0.at[33:37, 2:5].set(jnp.resize(v1, (4, 3)) * 0.5 + 1)
  return b0, b1, v2


def known_switch_writes_a_window_then_column_read(b0, b1):
  """Fuzz seed 5600 #4942, by hand. The switch's index is a literal: XLA folds
  it and inlines the branch taken, and so does inplace_jax now
  (`_passes.fold_known_conditionals`); the column read before it and the window
  written inside are then ordered as in a straight program. Kept a conditional,
  jax.jit's two copies of b1 remained."""
  v3 = b1[:, 12]

  def br0(b1, b0):
    b1 = lax.dynamic_update_slice(b1, jnp.full((23, 3), 0.0),
                                  (jnp.argmin(b0[:, 3]) % 2, 4))
    return b1, jnp.sum(v3)

  def br1(b1, b0):
    return b1, jnp.float32(0)
  b1, s = lax.switch(jnp.int32(0), [br0, br1], b1, b0)
  return b1, s, lax.dynamic_index_in_dim(b1, jnp.argmax(b1[9]) % 24, 1, keepdims=False)


def matmul_read_returned_then_added_into_window(b0):
  """Fuzz seed 5600 #301, reduced. The vmapped matmul's result is returned (stored
  anyway) and added into a window of b0 after a point set; a mean reads the
  result. The analysis predicts that a barrier after a value that feeds a dot
  changes arithmetic and ties nothing, so jax.jit's program ran; the last round
  sets that prediction aside (`Hints.bold`), and its candidate computes jax.jit's
  arithmetic (its fingerprint equal) without the copy."""
  v2 = jax.vmap(lambda r: r @ (jnp.arange(128, dtype=jnp.float32).reshape(16, 8) % 3 - 1)
                * 0.125)(b0)
  b0 = b0.at[25, 10].set(1.5)
  b0 = b0.at[0:32, 6:14].add(v2[0:32, 0:8])
  return jnp.mean(b0, axis=0), b0, v2


def square_returned_then_step_and_its_difference(b0):
  """Fuzz seed 5800 #237 (as generated). jax.jit recomputes `b0 * b0` in the
  update's loop and in `v1 - v1`'s; the sequenced program loads the stored square
  in both. The same bits: the update's product `0.25 * v1` is the one the
  subtraction contracts either way, and `v1 - v1` shares its product between two
  operands, which x86 never contracts (`_llvm._Semantics.shared_product`)."""
  v1 = b0 * b0
  b0 = b0 - 0.25 * v1
  v2 = v1 - v1
  return b0, v2, v1


def sine_returned_then_step(b0):
  """Fuzz seed 6000 #990. `sin(b0)` is returned (stored by both programs) and feeds
  the step `b0 * 0.99 - 0.1 * sin(b0)`: jax.jit's step kernel recomputes the sine,
  the sequenced one loads it. Both products of the subtract may be contracted;
  LLVM takes the first in both kernels, as their IR reads (`_llvm._Semantics`)."""
  v1 = b0[-35, 15]
  v2 = jnp.sin(b0)
  b0 = b0 * 0.99 - 0.1 * v2
  return v1, b0, v2


def square_returned_then_two_steps(b0):
  """Fuzz seed 6000 #4832: a returned square feeds a step, and a row picked from the
  stepped buffer feeds a second step."""
  v1 = b0 * b0
  b0 = b0 * 0.99 - 0.5 * v1
  v2 = b0[jnp.argmin(b0[:, 2]) % 16]
  b0 = b0 * 0.99 - 0.01 * v2
  return b0, v1, v2


def two_steps_each_read_by_a_later_update(b0):
  """Fuzz seed 6300 #5685. The first round's barriers after both steps (`b0 + v *
  c`, whose results argmin and a row read slice) changed the steps' arithmetic: under
  jax.jit XLA computes those reads again from the step's expression. The next round
  leaves those two barriers out and keeps the rest (`Hints.unposted`), copy-free
  and exact; before, it kept every barrier away from the steps and copied."""
  v1 = lax.dynamic_slice(b0, (jnp.argmax(b0[4]) % 23, jnp.int32(0)), (11, 29))
  v3 = b0[jnp.argmax(b0[7]) % 33 + 33]
  b0 = b0 + v3 * -0.01
  b0 = b0.at[jnp.argmin(b0[:, 30]) % 33, jnp.int32(10)].mul(jnp.max(v1))
  v5 = b0[3]
  b0 = b0 + v5 * -0.1
  b0 = b0.at[jnp.argmax(b0[2]) % 33].max(v5)
  return v5, v1, v3, b0


def column_step_then_argmin_of_the_new_column(b1, b0):
  """Fuzz seed 6500 #4846. `b1 - 0.25 * b1[:, 7:8]`, whose column 15 an argmin
  reads: jax.jit's program computes that column again in the argmin's loop,
  unrolled six times, with the product contracted (an FMA), and the step itself
  in its own loop without. The candidate that keeps that argmin before the update
  computes the same two forms in the same two loops, its argmin's loop vectorized
  instead: which elements take which form is the same, though the two kernels
  hold their form a different number of times (`_llvm._form_table`)."""
  v1 = b1[:, 7:8]
  b1 = b1 - 0.25 * v1
  b0 = lax.dynamic_update_slice(b0, jnp.resize(v1, (6, 1)),
                                (jnp.argmin(b1[:, 15]) % 27, jnp.int32(20)))
  return v1, b1, b0


def matmul_then_step_both_read_by_a_product(b0, b1):
  """Fuzz seed 6600 #337 (shrunk). A vmapped matmul and `b0 * b0` both read `b0`
  before its step `b0 + (b0 * b0) * -0.5`, and their product is returned. One
  kernel the two programs compile alike (the scaled matmul added into `b1`)
  recomputes a stored product next to an add, which refused the semantic
  comparison for every candidate; that comparison now reads past a refusing
  kernel both programs share, as `_llvm.recomputes_unloadably` does."""
  v1 = jax.vmap(lambda r: r @ (jnp.arange(192, dtype=jnp.float32).reshape(48, 4) % 3 - 1)
                * 0.125)(b0)
  b1 = b1.at[0:33, 41:45].add(v1[0:33, 0:4])
  v2 = b0 * b0
  b0 = b0 + v2 * -0.5
  return b0, v1 * jnp.resize(v2, (33, 4)), v1, b1


def step_branch_swap_then_max_of_abs(b0):
  """Fuzz seed 6500 #100 (shrunk). `jnp.max(jnp.abs(b0))` after a step, a
  conditional and a row swap: jax.jit's program computes the maximum in a loop
  that recomputes its operand, the candidate's loads it. A vector reduction by
  `fmaximum` is exact in any order, so its `reassoc` flag keeps no operand
  placed (`_llvm._EXACT_REDUCE`); before, the comparison refused it and the copy
  stayed."""
  v1 = b0[21]
  b0 = b0 - 0.1 * v1

  def br0(b0):
    return b0.at[:, 13].set(jnp.resize(v1, (24,))), jnp.max(jnp.mean(b0, axis=0))

  def br1(b0):
    return b0, jnp.max(v1)
  b0, v2 = lax.cond(b0[20, 10] > 0, br0, br1, b0)
  v7 = jnp.abs(b0)
  v8 = b0[16]
  b0 = b0.at[16].set(b0[7])
  b0 = b0.at[7].set(v8)
  b0 = b0.at[jnp.argmax(b0[17]) % 24, jnp.argmin(b0[:, 0]) % 16].set(jnp.max(v7))
  return b0, v7, v2


def column_add_then_sine(b):
  """Fuzz seed 6700 #770 (shrunk). jax.jit copies the buffer twice: its sine
  kernel recomputes the updated column from the old buffer (the scatter-add
  fused in as a pick of the old element or `x + 0.5`). The candidate updates in
  place and takes the sine of the buffer it loads; the update's kernel stores
  the same pick, so each choice is a stored value and the two programs compute
  the same sines (`_llvm._Semantics.stored`)."""
  b = b.at[:, 53].add(0.5)
  return b, jnp.sin(b)


def element_set_then_column_means_written_back(b):
  """Fuzz seed 6700 #7609. jax.jit copies the buffer: its column sums reduce the
  old buffer with the set element fused in. The candidate sets the element in
  place and sums the stored buffer in a kernel of the reduction alone, which XLA
  passes its initial 0.0 as an argument where jax.jit's fused kernel holds it as
  a literal; the add it starts reads the same value either way
  (`_llvm._constant_loads`), and the two programs sum alike."""
  b = b.at[-14, 20].set(0.0)
  v = jnp.mean(b, axis=0)
  return lax.dynamic_update_slice(b, -jnp.resize(v, (24, 15)), (jnp.int32(0), jnp.int32(2)))


def squares_step_then_loop_reads_a_square(b0):
  """Fuzz seed 6800 #2570. `v1 = b0 * b0`, returned and read again in the scan,
  must be computed before `b0 - 0.1 * v1` updates the buffer; the analysis leaves
  the read untied, predicting that a barrier after a product changes arithmetic.
  jax.jit's copy names no read (the scan's result is computed in another buffer
  and copied in), so no source line tied the copy to that prediction and the
  bold round never ran. It now runs where a copy names no read and a prediction
  left a read of that buffer untied; its candidate is copy-free and computes
  jax.jit's arithmetic."""
  v1 = b0 * b0
  b0 = b0 - 0.1 * v1

  def body(b0, _):
    b0 = b0.at[2:3, 5:6].set(jnp.resize(v1, (1, 1)))
    return b0, b0[5]
  b0, v2 = lax.scan(body, b0, length=3, reverse=True)
  return v2, b0, v1


def window_add_scaled_then_added_to_a_square(b0, b2):
  """Fuzz seed 6800 #6073. `b2.at[:, :8].add(v)`, then `b2 * 0.9 + b0 * b0`:
  jax.jit fuses the scatter-add into the step, which then reads b2 other than
  element by element and is written to another buffer and copied in. A barrier
  after the scatter-add was predicted to let XLA's simplifier move the add in
  front of it, as in `w * c + v * c` (fuzz seed 3900 #2539); but `b0 * b0`, a
  product of an argument, shares no constant factor with `w * 0.9`, so nothing is
  factored (`_exactness._scaled_by`). Tied there, the step runs in place."""
  v1 = jax.vmap(lambda r: r @ (jnp.arange(128, dtype=jnp.float32)
                               .reshape(16, 8) % 5 - 2) * 0.125)(b0)
  b2 = b2.at[0:16, 0:8].add(v1[0:16, 0:8])
  b2 = b2 * 0.9 + b0 * b0
  b0 = b0 - 0.01 * b2
  return b0, b2


def column_by_helper_then_one_trip_loop_sets_a_row(b0):
  """Fuzz seed 6800 #1358, reduced. The column read by `lax.dynamic_index_in_dim`
  (a jitted jax helper) is used in a loop of one trip that sets a row: XLA inlines
  the loop and fuses the slice after the set, so jax.jit copies b0. The clone
  round splices the helper's call into the program (`_passes.inline_calls`); its
  body, traced by jax with no user frame, used to be named after the frame that
  lowered the spliced program (inplace_jax's own), so the copy's read matched no
  source line the next round could tie. Spliced operations are now the call's,
  by file and line."""
  v = lax.dynamic_index_in_dim(b0, 5, 1, keepdims=False)

  def body(c):
    i, b0, a = c
    b0 = b0.at[0].set(1.0)
    return i + 1, b0, a + jnp.max(v) * b0[1, 2]
  _, b0, a = lax.while_loop(lambda c: c[0] < 1, body, (jnp.int32(0), b0, jnp.float32(0)))
  return b0, a


def scan_over_b1_reading_b0_then_both_updated(b0, b1):
  """Fuzz seed 6800 #8088 (as generated). The first scan carries b1 and sums an
  element of b0, so it is a read of b0, and the last scan's update of b0 must
  follow it. Tied whole, the barrier held the scan's b1 result too, which the
  scatter-add and the read between them update and read: XLA copied b1 twice
  (jax.jit copies b0 twice instead). Only a read's results computed from the
  version updated are tied now (`_analysis._read_outputs`)."""
  b1 = b1.at[:, jnp.array([26], dtype=jnp.int32)].set(3)

  def body1(c1, i1):
    (b1,) = c1
    b1 = b1.at[jnp.argmin(b1[:, 31]) % 24, 11:33].set(3)
    return (b1,), jnp.sum(b0[0, 0]).astype(jnp.float32)
  (b1,), v1 = lax.scan(body1, (b1,), jnp.arange(2, dtype=jnp.int32), reverse=True)
  b1 = b1.at[jnp.argmin(b0[:, 3]) % 24].add(1)
  v2 = lax.dynamic_slice(b0, (jnp.argmin(b0[:, 11]) % 6, jnp.argmin(b1[:, 21]) % 13),
                         (19, 4))

  def body3(c3, i3):
    (b0, b1) = c3
    b0 = b0.at[:, jnp.array([1, 10, 0, 12, 0], dtype=jnp.int32)].add(
        jnp.resize(v1, (24, 5)).astype(jnp.int32))
    return (b0, b1), jnp.float32(0)
  (b0, b1), v3 = lax.scan(body3, (b0, b1), jnp.arange(2, dtype=jnp.int32))
  return b0, v2, b1, v3


def switch_writes_b1_from_b0_then_both_updated(b0, b1):
  """Fuzz seed 6800 #2701 (as generated). The switch's first branch writes values
  of b0 into b1, so the switch is a read of b0, tied before b0's rows are
  swapped; lowered to loops, its b1 result is also what `b1 + v9 * -0.5` updates
  in place. Results of loops that a barrier ties are used as they are afterwards;
  this one, held by the barrier while the update wrote it, was copied. A result
  computed from an operand that an update takes in place is now used through the
  barrier (`_rewrite._kept_control`)."""
  v1 = jnp.argmax(b0[1])

  def br2_0(b1):
    a2 = jnp.float32(0)
    v3 = b0[-3, -29]
    b1 = lax.dynamic_update_slice(b1, jnp.full((28, 3), v3),
                                  (jnp.argmin(b1[:, 15]) % 5, jnp.int32(11)))
    v5 = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32)
                                 .reshape(32, 8) % 5 - 2) * 0.125)(b0)
    b1 = b1.at[10:26, 5:13].set(v5[0:16, 0:8])
    a2 = a2 + jnp.sum(v5).astype(jnp.float32)
    return (b1, a2)

  def br2_1(b1):
    a2 = jnp.float32(0)
    v6 = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32)
                                 .reshape(16, 16) % 3 - 1) * 0.125)(b1)
    b1 = b1 + v6 * -0.01
    b1 = b1.at[10:11].set(3.0)
    a2 = a2 + jnp.sum(b0[-14, 23]).astype(jnp.float32)
    return (b1, a2)

  def br2_2(b1):
    return (b1, jnp.float32(0))
  (b1, v2) = lax.switch(jnp.argmin(b1[:, 7]) % 3, [br2_0, br2_1, br2_2], b1)
  v9 = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32)
                               .reshape(16, 16) % 7 - 3) * 0.125)(b1)
  b1 = b1 + v9 * -0.5
  v11 = b0[1]
  b0 = b0.at[1].set(b0[v1 % 16])
  b0 = b0.at[v1 % 16].set(v11)
  return (b1, b0, v2)


def cond_on_b2_then_window_added_into_b2(b0, b1, b2):
  """Fuzz seed 6800 #5953 (as generated). jax.jit copies b0 only (the branch's
  scatter-add beside a pass-through branch, jax#16661), so only b0 is sequenced at
  first. Lowered to loops, the conditional's index `b2[2, 15] > 0` is read again
  by the pick of its scalar output after the loops (`_passes.pick_given_outputs`),
  once the window add has written b2 in place: the candidates copy b2, which
  jax.jit does not. A last round sequences every donated buffer a candidate
  copied, b2 too, and is copy-free."""
  def br1_0(b0, b1, b2):
    return (b0, b1, b2, jnp.float32(0))

  def br1_1(b0, b1, b2):
    a1 = jnp.float32(0)
    v2 = jnp.full((16, 32), 0.0, jnp.float32)
    b1 = b1 + v2 * -0.1
    v3 = jax.vmap(lambda r: r @ (jnp.arange(128, dtype=jnp.float32)
                                 .reshape(32, 4) % 3 - 1) * 0.125)(b1)
    a1 = a1 + jnp.sum(v3).astype(jnp.float32)
    b0 = b0.at[-8, 3].add(-jnp.max(v2))
    v4 = lax.dynamic_index_in_dim(b2, jnp.argmax(b2[5]) % 16, 1, keepdims=False)
    a1 = a1 + jnp.sum(v4).astype(jnp.float32)
    return (b0, b1, b2, a1)
  (b0, b1, b2, v1) = lax.cond(b2[2, 15] > 0, br1_0, br1_1, b0, b1, b2)
  v5 = b0[(jnp.arange(5, dtype=jnp.int32) * 2 + jnp.argmax(b1[6]) % 24) % 24]
  v6 = jnp.einsum('ij,jk->ik', b0, (jnp.arange(64, dtype=jnp.float32)
                                    .reshape(16, 4) % 5 - 2) * 0.125)
  b2 = b2.at[0:24, 6:10].add(v6[0:24, 0:4])
  return (b0, b1, v1, v5, b2)


def swap_then_branch_step_with_its_row_kept(b1, b0):
  """Fuzz seed 6300 #50. The branch's `b1 - 0.25 * b1[13]` keeps `b1[13]` for
  later, so the sequenced program ties the row into its own buffer; the branch's
  kernels then read it from there. One kernel that both programs compile alike
  recomputes a stored product next to an add, which used to refuse the
  comparison for every candidate (`_llvm.recomputes_unloadably` now reads only
  the kernels the two programs do not share)."""
  v1 = b0[10]
  b0 = b0.at[10].set(b0[6])
  b0 = b0.at[6].set(v1)
  v3 = jnp.abs(b1)
  b0 = -b0

  def br0(b1):
    return b1, jnp.float32(0)

  def br1(b1):
    v7 = b1[13]
    b1 = b1 - 0.25 * v7
    b1 = lax.dynamic_update_slice(b1, jnp.full((16, 24), 0.5, jnp.float32),
                                  (jnp.int32(0), jnp.argmax(b0[5]) % 1))
    b1 = b1.at[(jnp.arange(1, dtype=jnp.int32) * 3 + jnp.argmin(b0[:, 10]) % 24) % 24].set(
        jnp.maximum(jnp.resize(v3, (1, 24)), 0))
    v8 = v7 - jnp.resize(v1, (24,))
    return b1, jnp.float32(0) + jnp.max(v8)
  b1, v4 = lax.cond(b0[5, 3] > 0, br0, br1, b1)
  v9 = jax.vmap(lambda r: r @ (jnp.arange(192, dtype=jnp.float32).reshape(24, 8) % 7 - 3)
                * 0.125)(b1)
  b0 = b0.at[0:12, 1:9].add(v9[0:12, 0:8])
  return b1, v9, b0


def gathered_rows_added_then_one_trip_loop_reads_a_row(b0):
  """Fuzz seed 7000 #461. jax.jit copies b0 for the gather of rows 10 and 18,
  read before the row add. Tied there, XLA still copies: it inlines the one-trip
  outer loop, whose step `b0 + (b0 @ m) * c` overwrites the buffer while the
  inner loop's operand, row 7 negated, is read from it only then. The copy names
  the inner loop and no read, which was taken for a loop that carries a copy and
  not materialised; copied outside any loop body, it is now, and the outer
  loop's reads are tied before it."""
  v1 = b0[jnp.array([10, 18, 18], dtype=jnp.int32)]
  b0 = b0.at[11].add(-2.0)
  b0 = b0.at[jnp.array([13, 6, 7, 21, 6]), jnp.array([6, 9, 12, 15, 2])].add(
      jnp.maximum(jnp.resize(v1, (5,)), 0))
  v3 = b0[jnp.array([7, 7], dtype=jnp.int32)]

  def outer(i, b0):
    m = jnp.arange(256, dtype=jnp.float32).reshape(16, 16) % 7 - 3
    b0 = b0 + (b0 @ m) * -0.0125

    def inner(j, b0):
      return b0.at[5].add(-jnp.resize(v3, (16,)))
    return lax.fori_loop(0, 2, inner, b0)
  return lax.fori_loop(0, 1, outer, b0)


def column_step_scaled_into_other_then_window_set(b0, b2):
  """After fuzz seed 7200 #2089. `b2 * 0.5 + b2[:, 2:3]` is read by b0's update
  and by `max`, before b2's row is set. The clone rounds computed the step once
  per reader, then tied each copy whole: stored, it rounds as b2's own update
  (the column's product once per row), while jax.jit computes it again inside
  the reader's fusion, contracted. A multiply-add is now followed into its
  readers' fusions and tied where they end."""
  v4 = b2[:, 2:3]
  b2 = b2 * 0.5 + v4
  b0 = b0 - 0.25 * b2
  b0 = b0.at[9:16, 14:16].set(0.5)
  b2 = b2.at[11].set(jnp.max(v4))
  return b0, b2


def where_then_row_scaled_out(b0):
  """Fuzz seed 7200 #17. jax.jit computes row 22 of the `where` from the buffer,
  with the multiply folded into the select by LLVM (`b > 0 ? b * 0.01 :
  0.015`); the sequenced program stores the `where` and multiplies its load.
  The kernels' reading now sees the fold (`_llvm._Semantics.unfolded`)."""
  b0 = jnp.where(b0 > 0, b0, 1.5)
  v3 = b0[22]
  return (b0 - 0.01 * v3,)


def negated_int_column_steps_other(b0, b1):
  """Fuzz seed 1000 #62, shrunk. jax.jit converts a column of `-b1` to float32
  from the old int32 buffer, in the fusion of the step; the sequenced program
  stores `-b1` and converts its load. Integer arithmetic is exact, so the
  kernels' reading takes a computed integer for the stored one
  (`_llvm._Semantics.form`)."""
  b1 = -b1
  v = lax.dynamic_index_in_dim(b1, jnp.argmin(b0[:, 0]) % 32, 1, keepdims=False)
  b0 = b0 - 0.25 * jnp.resize(v, b0.shape).astype(jnp.float32)
  return b0, b1


def max_of_square_scales_a_picked_element(b):
  """Fuzz seed 1000 #98. jax.jit's reduce kernel ends the max of `b * b` in a
  vector reduction by maximum; the sequenced program's fusion reduces the stored
  square by shuffles and lane maximums. Maximums pick an operand in any order and
  grouping, so the kernels' reading takes the two for the same pick
  (`_llvm._Semantics.lattice`)."""
  sq = b * b
  b = b + sq * -0.1
  i, j = jnp.argmax(b[7]) % 32, jnp.argmin(b[:, 13]) % 24
  return b.at[i, j].mul(jnp.max(sq) * 0.5 + 1), sq


def loop_over_a_buffer_in_place_then_where(b1, b2):
  """Fuzz seed 7400 #294, shrunk. jax.jit copies b1 only (its row is read before
  the `where`); the loop updates b2 in place. The loop's body tied its own read
  of the b2 carry anyway, and XLA copied b2 twice; once b2 is left alone the body
  is too (`_rules.loops._owned`)."""
  b2 = lax.dynamic_update_slice(b2, jnp.full((11, 23), 1.5, jnp.float32),
                                (jnp.int32(10), jnp.argmax(b2[6]) % 11))
  def body(i, b2):
    b2 = b2.at[1:9].add(3.0)
    b2 = b2.at[(i + 2) % 24].set(0.5)
    return b2.at[10:22, 21:31].set(-2.0)
  b2 = lax.fori_loop(0, 1, body, b2)
  b2 = lax.dynamic_update_slice(b2, jnp.full((3, 13), 1.0, jnp.float32),
                                (jnp.argmax(b1[4]) % 22, jnp.int32(11)))
  return b2, jnp.where(b1 > 0, b1, 3.0)


def step_passed_into_one_trip_scan_that_updates_its_buffer(b0, b1):
  """Fuzz seed 7400 #1199, shrunk. `b0 * 0.5 + 1` is computed before a one-trip
  scan whose body updates b0 and then reads the value into b1. XLA unrolls the
  loop and fuses the value into its reader after the update: jax.jit copies b0.
  A refinement round now ties the value where it enters the loop, whole
  (`_analysis._unrolled_loop`), its multiply-add in one fusion."""
  v = b0 * 0.5 + 1.0
  def body(c, i):
    b0, b1 = c
    b0 = b0.at[1, -9].max(2.0)
    b1 = b1.at[jnp.array([8, 8, 18]), (jnp.arange(3) * 3 + (i + 1) % 32) % 32].add(
        jnp.resize(v, (3,)))
    return (b0, b1), b0[0, 0]
  (b0, b1), s = lax.scan(body, (b0, b1), jnp.arange(1))
  return b0, b1, s


def window_set_to_a_constant_then_stepped(b0, b1):
  """Fuzz seed 7400 #2611, shrunk. jax.jit fuses the window's set into the step,
  computing `-2.0 - p` for the window's elements; the sequenced program sets the
  window in place and loads it. A constant some kernel stores now reads as the
  load the other program makes (`_llvm._Semantics.operand`)."""
  s = jnp.max(b1)
  j = jnp.argmin(b0[:, 7]) % 12
  b0 = b0.at[jnp.argmax(b0[1]) % 16, 8:16].set(-2.0, mode="clip")
  return b0 + jnp.full(b0.shape, s) * -0.25, j


def matmul_rows_set_in_nested_branches(b0):
  """Fuzz seed 7400 #1954 (as generated, dead code left out). Rows and a column
  of `b0 @ w * 0.125` (`jnp.resize`) are set into b0 inside nested branches after
  b0 is stepped. Every earlier round tied the whole scaled product or changed its
  arithmetic; the sink round moves the resize's slices above the scaling
  (`_passes._moves_sunk`), so that the slice of the product is what is read, and
  its candidate is copy-free and computes what jax.jit computes."""
  v1 = b0 @ (jnp.arange(128, dtype=jnp.float32).reshape(32, 4) % 7 - 3) * 0.125
  v2 = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32).reshape(32, 8) % 3 - 1) * 0.125)(b0)
  def br3_0(b0):
    v4 = b0[:, 10:11]
    b0 = b0 * 0.99 - 0.01 * v4
    def br5_0(b0):
      b0 = b0.at[:, 29].set(jnp.resize(v1, (24,)))
      v8 = b0[:, 20]
      return (b0, jnp.sum(v8))
    def br5_1(b0):
      return (b0, jnp.float32(0))
    (b0, v5) = lax.cond(jnp.sum(b0[22]) > 0, br5_0, br5_1, b0)
    b0 = b0.at[22:24].set(-2.0)
    b0 = b0.at[12].set(jnp.resize(v1, (32,)) * 0.5 + 1)
    return (b0, jnp.max(v5))
  def br3_1(b0):
    return (b0, jnp.float32(0))
  (b0, v3) = lax.cond(b0[11, 19] > 0, br3_0, br3_1, b0)
  b0 = b0.at[11:24, 31:32].add(jnp.resize(v2, (13, 1)))
  b0 = lax.dynamic_update_slice(b0, jnp.full((15, 18), v3), (jnp.argmax(b0[18]) % 10, jnp.argmin(b0[:, 12]) % 15))
  return (b0,)


def where_continues_the_row_set_not_the_square(b0):
  """Fuzz seed 7600 #8263. `jnp.where(b0 > 0, b0, -v1)` has two operands of the
  buffer's type: the updated b0 and `-v1`, made elementwise from b0 before its
  updates. The select continues the updated b0 (`_analysis._made_strongly_first`);
  continuing `-v1` instead, the plan followed no chain from b0 to the output and
  tied nothing."""
  b0 = b0.at[jnp.int32(13)].set(-2.0)
  v1 = b0 * b0
  b0 = b0.at[10, 17].set(jnp.max(v1))
  b0 = jnp.where(b0 > 0, b0, -v1)
  v2 = b0[jnp.array([10, 6, 9], dtype=jnp.int32)]
  return (b0, v2)


def half_plus_one_set_back_in_rows_and_columns(b0):
  """Fuzz seed 7600 #4984. `v1 = b0 * 0.5 + 1` is read after b0's updates. jax.jit
  recomputes it in each reader's fusion, contracted; the sequenced program
  computes it once. A product by a power of two with a constant added rounds alike
  fused or not (`_llvm._exact_scalings`); read as different, every candidate was
  refused."""
  v1 = b0 * 0.5 + 1.0
  b0 = b0.at[jnp.argmin(b0[:, 17]) % 24, 7:30].set(-jnp.resize(v1, (23,)))
  v2 = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32).reshape(32, 8) % 7 - 3)
                * 0.125)(b0)
  b0 = b0.at[0:24, 14:22].set(v2[0:24, 0:8])
  b0 = b0.at[jnp.argmax(b0[20]) % 24, 30:32].set(jnp.resize(v1, (2,)))
  return (b0, v2, v1)


def rows_set_to_three_then_halved_in_a_switch(b0, b1):
  """Fuzz seed 7600 #101, shrunk. In jax.jit's kernels the product `0.5 * b1` of
  `3 - 0.5 * b1` (the rows set to 3) has no other use and reads as the division
  `b1 / 2` (`_llvm._exact_scalings`); in the sequenced program's kernels it has
  other uses and reads as a product. Each reading alone is exact; read without the
  divisions, the two programs compute the same values up to what one stores, and
  the candidate runs (`_jit._same_kernels` on either reading)."""
  b0 = b0.at[18:24].set(3.0)
  b0 = b0 - 0.5 * b1

  def halved(b0):
    return b0 * 0.5 + b0[23]

  b0 = lax.switch(jnp.argmax(b1[5]) % 4, [halved, lambda b0: b0], b0)
  return (b0, b1)


def loop_carries_a_buffer_unchanged_then_stepped(b0, b1):
  """Fuzz seed 7800 #580, shrunk by hand. A while loop whose condition reads b1
  carries it unchanged while its body updates b0; JAX forwards the loop's result
  for b1 to b1 itself, so `b1 * 2 + 7` reads b1, not the loop. The loop was b1's
  only strong update and led to no output, so no chain reached b1's output and
  nothing was tied; XLA ran the step before the loop and copied b1. The step now
  continues b1, and the loop is a read of it, tied before the step
  (`_analysis.pick_successors`)."""
  def cond(c):
    return c[0] < 1 + (c[2][13, 1] > 0).astype(jnp.int32)

  def body(c):
    i, b0, b1 = c
    return (i + 1, b0.at[i % 8].add(1.0), b1)

  _, b0, b1 = lax.while_loop(cond, body, (0, b0, b1))
  return b0, b1 * 2 + 7


def rows_swapped_then_a_loop_sums_a_column(b1, b0):
  """Fuzz seed 7900 #1253, shrunk. Rows of b0 and b1 swapped, then a while loop
  carries b1 unchanged (JAX returns the swapped b1 itself for the loop's result)
  while summing a column read after the swap. The loop, b1's last strong update,
  led to no output; chosen to continue b1 anyway, it ended the chain at a value
  nothing returns, and the whole chain, the swap's ordering included, was dropped
  (`_analysis.pick_successors`)."""
  v8 = b0[20, 0:32]
  v9 = b1[13, 0:32]
  b0 = b0.at[20, 0:32].set(v9)
  b1 = b1.at[13, 0:32].set(v8)
  col = b1[:, 22]

  def cond(c):
    return c[0] < (c[1][13, 8] > 0).astype(jnp.int32)

  def body(c):
    i, b1, acc = c
    return (i + 1, b1, acc + jnp.sum(col))

  _, b1, total = lax.while_loop(cond, body, (0, b1, jnp.float32(0)))
  return total, b1, b0


def row_step_window_and_swap_in_custom_jvp(b0):
  """Fuzz seed 7600 #3926 (dead code left out). Inside a `custom_jvp` body, b0 is
  stepped by its row 9, a window set from that row, and rows 13 and 29 swapped.
  The barrier after the window's update changed the arithmetic of the step that
  reads it; the next round now drops it (`_jit._posted_updates` of the changed
  operation's operands, in sub-plans too) instead of untying the reads."""
  v1 = jax.vmap(lambda r: r @ (jnp.arange(1024, dtype=jnp.float32).reshape(32, 32) % 7 - 3)
                * 0.125)(b0)
  b0 = b0 + v1 * -0.25
  def fn2(b0):
    v3 = b0[9]
    b0 = b0 + v3 * -0.01
    b0 = lax.dynamic_update_slice(b0, -jnp.resize(v3, (32, 19)),
                                  (jnp.argmin(b0[:, 29]) % 1, jnp.argmin(b0[:, 3]) % 14))
    v4 = b0[13]
    b0 = b0.at[13].set(b0[29])
    b0 = b0.at[29].set(v4)
    return (b0, jnp.max(v4))
  fn2c = jax.custom_jvp(fn2)
  fn2c.defjvp(lambda p, t: (fn2(*p), fn2(*t)))
  (b0, _) = fn2c(b0)
  return (b0,)


def window_set_and_matmul_in_custom_vjp_then_step(b0, b1, b2):
  """Fuzz seed 7000 #412. A `custom_vjp` function sets a window of b2, then reads
  b2 through a matmul into a window of b1; after it, `b2 * 0.5 + v4` updates b2.
  The clone rounds splice the call and find the matmul read, but leave it untied
  (a barrier after a dot was predicted to change arithmetic); the bold round,
  which sets that prediction aside, kept the call whole and saw no read to tie.
  It now splices calls as the clone rounds do."""
  def fn(b1, b2):
    b2 = lax.dynamic_update_slice(b2, jnp.full((17, 8), -2.0, jnp.float32),
                                  (jnp.argmin(b1[:, 29]) % 8, jnp.argmax(b1[3]) % 25))
    v = b2 @ (jnp.arange(256, dtype=jnp.float32).reshape(32, 8) % 3 - 1) * 0.125
    return b1.at[0:16, 6:14].set(v[0:16, 0:8]), b2, jnp.float32(0)
  fnc = jax.custom_vjp(fn)
  fnc.defvjp(lambda *a: (fn(*a), None), lambda _, g: g[:2])
  b1, b2, v1 = fnc(b1, b2)
  b1 = b1.at[8:11].max(jnp.maximum(v1, 0))
  v4 = jax.vmap(lambda r: r @ (jnp.arange(1024, dtype=jnp.float32)
                               .reshape(32, 32) % 3 - 1) * 0.125)(b2)
  b2 = b2 * 0.5 + v4
  return b0 - 0.5 * b2, b2, v4, b1


def loop_passes_buffer_through_then_row_set(b0, b1, b2):
  """Fuzz seed 7000 #6811. The loop's condition reads b0, which its body passes
  through unchanged; XLA's simplifier then takes the row set after the loop to
  update the loop's operand, which the loop still reads, and copies b0. The
  analysis saw the set take the loop's result, ordered after the loop by data;
  the result is now read as the operand it equals
  (`_passes.forward_passed_carries`), and the loop's read is tied before the
  set."""
  b0 = b0 - 0.01 * jnp.sin(b0)

  def cond(c):
    return c[0] < 1 + (c[1][6, 5] > 0).astype(jnp.int32)

  def body(c):
    i, b0, b2, a = c
    return i + 1, b0, -b2, a
  _, b0, b2, a = lax.while_loop(cond, body, (jnp.int32(0), b0, b2, jnp.float32(0)))
  b0 = lax.dynamic_update_index_in_dim(b0, jnp.maximum(jnp.full((16,), a), 0),
                                       jnp.argmin(b1[:, 11]) % 32, 0)
  b2 = lax.dynamic_update_slice(b2, jnp.zeros((11, 16)), (39, 8))
  return a, b2, b0, b1


def one_branch_reads_what_the_other_updates(b1, b2):
  """Fuzz seed 8200 #885, reduced. The conditional is lowered to one loop per
  branch, the second after the first. The first carries `b2` through unchanged
  and reads it; XLA forwarded that loop's `b2` result to its operand, so the
  second loop's in-place `maximum` no longer followed the first loop's read, and
  every candidate copied `b2` (jax.jit's program, copying `b1`, ran). The read
  carry now leaves the first loop behind a barrier."""
  def step_b2(b1, b2):
    return b1, jnp.maximum(b2, 0.5)

  def swap_rows_of_b1(b1, b2):
    v = b1[14]
    b1 = b1.at[14].set(b1[7] * b2[53, 11])
    return b1.at[7].set(v), b2
  return lax.cond(b1[4, 3] > 0, step_b2, swap_rows_of_b1, b1, b2)


CASES = {
    "step_summed_and_sliced_then_set": (
        step_summed_and_sliced_then_set,
        lambda: _normal((16, 32), (16, 32))() + (jnp.int32(5),), (0,), ()),
    "step_returning_its_square": (
        step_returning_its_square,
        lambda: tuple(jnp.asarray(np.random.default_rng(k).normal(size=s), jnp.float32)
                      for k, s in ((0, (32, 24)), (2, (24, 4)))), (0,), ()),
    "step_minus_scaled_column": (
        step_minus_scaled_column,
        lambda: (jnp.asarray(np.random.default_rng(0).normal(size=(32, 48)), jnp.float32),),
        (0,), ()),
    "sine_of_a_row_set_then_step": (
        sine_of_a_row_set_then_step,
        lambda: tuple(jnp.asarray(np.random.default_rng(k).normal(size=(16, 32)),
                                  jnp.float32) for k in (0, 1)),
        (0,), ()),
    "step_minus_row_then_mean": (
        step_minus_row_then_mean, _normal((16, 32)), (0,), ()),
    "wide_step_minus_row_then_mean": (
        step_minus_row_then_mean, _normal((64, 128)), (0,), ()),
    "step_plus_column_then_mean": (
        step_plus_column_then_mean, _normal((16, 32)), (0,), ()),
    "read_in_custom_jvp_then_scatter": (
        _read_in_call_then_scatter(_peek_custom_jvp), _normal((32, 24)), (0,), ()),
    "read_in_custom_vjp_then_scatter": (
        _read_in_call_then_scatter(_peek_custom_vjp), _normal((32, 24)), (0,), ()),
    "read_in_checkpoint_then_scatter": (
        _read_in_call_then_scatter(jax.checkpoint(_peek_fn)), _normal((32, 24)), (0,),
        ()),
    "gather_in_custom_jvp_then_step": (
        _gather_in_call_then_step(_rows_custom_jvp), _normal((24, 33)), (0,), ()),
    "step_reading_the_buffer_then_row_set": (
        step_reading_the_buffer_then_row_set, lambda: (_x(), _x(1)), (0, 1), ()),
    "clip_to_column": (clip_to_column, lambda: (_x(), jnp.int32(5)), (0,), ()),
    "swap_then_read": (swap_then_read, lambda: (_x(), 3), (0,), (1,)),
    "read_between_updates": (read_between_updates, lambda: (_x(),), (0,), ()),
    "noop_branch_and_swap": (noop_branch_and_swap,
                             lambda: (_x(), jnp.bool_(False), 3), (0,), (2,)),
    "swap_in_one_step_scan": (swap_in_one_step_scan, lambda: (_x(), jnp.int32(3)),
                              (0,), ()),
    "gauss_seidel_with_change": (gauss_seidel_with_change, lambda: (_x(), _x(1)),
                                 (0,), ()),
    "row_add_step_then_column_add": (row_add_step_then_column_add, _ints(), (0,), ()),
    "square_step_then_window_of_square": (square_step_then_window_of_square,
                                          _normal((16, 24)), (0,), ()),
    "row_add_step_row_set_then_window_add": (
        row_add_step_row_set_then_window_add, _ints(k=1), (0,), ()),
    "square_resized_into_a_window_after_a_matmul_add": (
        square_resized_into_a_window_after_a_matmul_add, _normal((48, 16), (48, 16)),
        (0, 1), ()),
    "known_switch_writes_a_window_then_column_read": (
        known_switch_writes_a_window_then_column_read, _normal((24, 24), (24, 24)),
        (1,), ()),
    "matmul_read_returned_then_added_into_window": (
        matmul_read_returned_then_added_into_window, _normal((32, 16)), (0,), ()),
    "square_returned_then_step_and_its_difference": (
        square_returned_then_step_and_its_difference, _normal((24, 32)), (0,), ()),
    "sine_returned_then_step": (sine_returned_then_step, _normal((64, 16)), (0,), ()),
    "square_returned_then_two_steps": (square_returned_then_two_steps,
                                       _normal((16, 16)), (0,), ()),
    "two_steps_each_read_by_a_later_update": (two_steps_each_read_by_a_later_update,
                                              _normal((33, 32)), (0,), ()),
    "column_step_then_argmin_of_the_new_column": (
        column_step_then_argmin_of_the_new_column, _normal((48, 16), (32, 32)), (0, 1), ()),
    "matmul_then_step_both_read_by_a_product": (
        matmul_then_step_both_read_by_a_product, _normal((33, 48), (48, 48)), (0, 1), ()),
    "step_branch_swap_then_max_of_abs": (step_branch_swap_then_max_of_abs,
                                         _normal((24, 16)), (0,), ()),
    "column_add_then_sine": (column_add_then_sine, _normal((24, 64)), (0,), ()),
    "element_set_then_column_means_written_back": (
        element_set_then_column_means_written_back, _normal((32, 24)), (0,), ()),
    "squares_step_then_loop_reads_a_square": (
        squares_step_then_loop_reads_a_square, _normal((16, 32)), (0,), ()),
    "window_add_scaled_then_added_to_a_square": (
        window_add_scaled_then_added_to_a_square, _normal((16, 16), (16, 16)), (0, 1), ()),
    "column_by_helper_then_one_trip_loop_sets_a_row": (
        column_by_helper_then_one_trip_loop_sets_a_row, _normal((32, 33)), (0,), ()),
    "scan_over_b1_reading_b0_then_both_updated": (
        scan_over_b1_reading_b0_then_both_updated,
        lambda: (_ints((24, 16))()[0], _ints((24, 33), 1)()[0]), (0, 1), ()),
    "switch_writes_b1_from_b0_then_both_updated": (
        switch_writes_b1_from_b0_then_both_updated, _normal((16, 32), (32, 16)), (0, 1), ()),
    "cond_on_b2_then_window_added_into_b2": (
        cond_on_b2_then_window_added_into_b2, _normal((24, 16), (16, 32), (24, 16)),
        (0, 1, 2), ()),
    "gathered_rows_added_then_one_trip_loop_reads_a_row": (
        gathered_rows_added_then_one_trip_loop_reads_a_row, _normal((24, 16)), (0,), ()),
    "column_step_scaled_into_other_then_window_set": (
        column_step_scaled_into_other_then_window_set, _normal((16, 16), (16, 16)),
        (0, 1), ()),
    "where_then_row_scaled_out": (where_then_row_scaled_out, _normal((32, 16)), (0,), ()),
    "matmul_rows_set_in_nested_branches": (
        matmul_rows_set_in_nested_branches, _normal((24, 32)), (0,), ()),
    "where_continues_the_row_set_not_the_square": (
        where_continues_the_row_set_not_the_square, _normal((16, 24)), (0,), ()),
    "half_plus_one_set_back_in_rows_and_columns": (
        half_plus_one_set_back_in_rows_and_columns, _normal((24, 32)), (0,), ()),
    "rows_set_to_three_then_halved_in_a_switch": (
        rows_set_to_three_then_halved_in_a_switch, _normal((24, 32), (24, 32)), (0, 1), ()),
    "loop_carries_a_buffer_unchanged_then_stepped": (
        loop_carries_a_buffer_unchanged_then_stepped, _normal((16, 16), (32, 32)), (0, 1), ()),
    "rows_swapped_then_a_loop_sums_a_column": (
        rows_swapped_then_a_loop_sums_a_column, _normal((16, 32), (24, 64)), (0, 1), ()),
    "row_step_window_and_swap_in_custom_jvp": (
        row_step_window_and_swap_in_custom_jvp, _normal((32, 32)), (0,), ()),
    "window_set_to_a_constant_then_stepped": (
        window_set_to_a_constant_then_stepped, _normal((16, 16), (8, 12)), (0,), ()),
    "step_passed_into_one_trip_scan_that_updates_its_buffer": (
        step_passed_into_one_trip_scan_that_updates_its_buffer, _normal((16, 16), (24, 32)),
        (0, 1), ()),
    "loop_over_a_buffer_in_place_then_where": (
        loop_over_a_buffer_in_place_then_where, _normal((24, 32), (24, 33)), (0, 1), ()),
    "negated_int_column_steps_other": (
        negated_int_column_steps_other,
        lambda: (_normal((32, 16))()[0], _ints((24, 32))()[0]), (0, 1), ()),
    "max_of_square_scales_a_picked_element": (
        max_of_square_scales_a_picked_element, _normal((32, 24)), (0,), ()),
    "window_set_and_matmul_in_custom_vjp_then_step": (
        window_set_and_matmul_in_custom_vjp_then_step,
        _normal((24, 32), (16, 32), (24, 32)), (0, 1, 2), ()),
    "loop_passes_buffer_through_then_row_set": (
        loop_passes_buffer_through_then_row_set,
        _normal((32, 16), (8, 12), (64, 24)), (0, 1, 2), ()),
    "swap_then_branch_step_with_its_row_kept": (
        swap_then_branch_step_with_its_row_kept, _normal((24, 24), (12, 12)), (0, 1), ()),
    "sparse_momentum": (sparse_momentum,
                        lambda: ({"params": _x(), "momentum": _x(1) * 0.1,
                                  "count": jnp.int32(0)},
                                 jnp.array([1, 5, 5, 9]), jnp.ones((4, SHAPE[1]))),
                        (0,), ()),
    "one_branch_reads_what_the_other_updates": (
        one_branch_reads_what_the_other_updates, _normal((16, 24), (64, 24)), (0, 1),
        ()),
}


# Programs whose copy-free program would compute some operation differently (the
# copy kept and explained). None at present: the Gauss-Seidel sweep was listed
# here (its multiply-add `0.5 * (b[i] - 0.1 * x[j])` in another fused expression)
# until the kernels' IR settled it; `assert_kept_for_arithmetic` now fails where no
# copy is kept, and it showed the sweep copy-free and exact.
KEPT_FOR_ARITHMETIC: set[str] = set()


@pytest.mark.parametrize("name", sorted(CASES))
def test_copy_free_and_exact(name):
  fn, make_args, donate, static = CASES[name]
  args = make_args()
  r = compare(fn, *args, donate_argnums=donate, static_argnums=static)
  full = args[0].nbytes if isinstance(args[0], jax.Array) else FULL
  if ON_CPU:
    assert r.ref_report.buffer_copies(full), "jax.jit should copy here"
  if name in KEPT_FOR_ARITHMETIC:
    r.assert_kept_for_arithmetic(full)
    return
  assert r.report.buffer_copies(full) == (), r.report


def where_row_add_then_cond_of_updates(b0):
  """Fuzz seed 4400 #1087 (as generated, dead code left out). jax.jit copies b0
  twice; the first rounds and the clone rounds leave one or two copies, and only
  the materialising round's candidate (a barrier after each update) is copy-free."""
  b0 = jnp.where(b0 > 0, b0, -2.0)
  b0 = b0.at[27].add(-2.0)
  v1 = b0[8:20, 19:23]
  v2 = b0[-27, 5]

  def fn3(b0):
    def br0(b0):
      return b0.at[18].min(-2.0), jnp.sum(v2 * v2 * 0.5 + 1)

    def br1(b0):
      v7 = jnp.einsum("ij,jk->ik", b0, (jnp.arange(192, dtype=jnp.float32)
                                        .reshape(24, 8) % 3 - 1) * 0.125)
      b0 = b0.at[0:32, 0:8].set(v7[0:32, 0:8])
      b0 = b0.at[4, -7].add(jnp.max(v1))
      return b0, jnp.max(v7)
    b0, v4 = lax.cond(jnp.sum(b0[27]) > 0, br0, br1, b0)
    return b0, jnp.sum(v4)
  b0, v3 = jax.jit(fn3)(b0)
  b0 = b0.at[13:16].set(3.0)
  b0 = b0.at[jnp.array([9], dtype=jnp.int32)].set(v3, unique_indices=True)
  return v1, v2, b0


def test_materialising_round_is_the_one_that_runs():
  # Only the materialising round removes these copies: the candidate that runs is
  # its, the last one compiled, and the others are not labelled as it.
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  from inplace_jax.testing.fuzz import Buf, make_inputs
  (x,) = make_inputs((Buf("b0", (32, 24), "float32"),), 373178449, "integer")
  r = compare(where_row_add_then_cond_of_updates, jnp.asarray(x))
  assert r.ref_report.buffer_copies(1024), r.ref_report
  sig = r.fn.signatures[-1]
  assert sig.chosen is sig.candidates[-1] and sig.chosen.materialised, sig.candidates
  assert not any(c.materialised for c in sig.candidates[:-1]), sig.candidates
  assert any(c.clone for c in sig.candidates), sig.candidates   # the rounds before
  assert r.report.buffer_copies(1024) == (), r.report


def test_bold_round_is_the_one_that_runs():
  # Only the last round, the analysis's arithmetic predictions set aside, removes
  # the copy: its candidate runs, and no earlier one is labelled as it.
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  r = compare(matmul_read_returned_then_added_into_window, *_normal((32, 16))())
  assert r.ref_report.buffer_copies(1024), r.ref_report
  sig = r.fn.signatures[-1]
  assert sig.chosen is not None and sig.chosen.bold, sig.candidates
  assert not any(c.bold for c in sig.candidates if c is not sig.chosen), sig.candidates
  assert r.report.buffer_copies(1024) == (), r.report


def test_bold_round_runs_for_a_copy_that_names_no_read():
  # jax.jit's copy names no read, only the scan that computes the new value: the
  # bold round runs for the read a prediction left untied, and its candidate runs.
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  r = compare(squares_step_then_loop_reads_a_square, *_normal((16, 32))())
  copies = r.ref_report.buffer_copies(1024)
  assert copies and all(all(a == c.writer for a in c.readers) for c in copies), copies
  sig = r.fn.signatures[-1]
  assert sig.chosen is not None and sig.chosen.bold, sig.candidates
  assert r.report.buffer_copies(1024) == (), r.report


def attend_over_ring_then_push(ring, w, x, ptr):
  """A memory network's step (the probe `eqx_stateindex_read_then_push`): attend
  over a ring buffer's old contents, then write the new features at the pointer.
  The ring is read twice, the second product computed from the first through the
  softmax; jax.jit copies it twice. The tie goes after the second (by the bold
  round where the analysis predicts it changes the product, which the compiled
  program's kernels then judge); the first read (a transpose into a product,
  left untied) feeds it and so runs before the barrier by data. Placed after the
  barrier, as an untied read is, it closed a cycle and nothing was sequenced."""
  h = x @ w
  out = jax.nn.softmax(h @ ring.T / 16.0, axis=-1) @ ring
  return out, lax.dynamic_update_slice_in_dim(ring, h, ptr, axis=0)


def test_a_read_that_feeds_a_tied_read_runs_before_the_barrier():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  rng = np.random.default_rng(3)
  ring, w, x = (jnp.asarray(rng.normal(size=s), jnp.float32)
                for s in ((512, 64), (64, 64), (16, 64)))
  r = compare(attend_over_ring_then_push, ring, w, x, jnp.int32(40))
  assert sum(c.nbytes for c in r.ref_report.buffer_copies(1024)) >= 2 * ring.nbytes, \
      r.ref_report
  assert r.report.buffer_copies(1024) == (), r.report


def _vmapped_layer(w, b, x):
  return w @ x + b


def _mlp_loss(p, xs, ys):
  def mlp(x):
    h = jax.nn.relu(_vmapped_layer(p["w1"], p["b1"], x))
    return _vmapped_layer(p["w2"], p["b2"], h)
  out = jax.vmap(mlp)(xs)
  return jnp.mean(jax.nn.logsumexp(out, -1)
                  - jnp.take_along_axis(out, ys[:, None], 1)[:, 0])


def _mlp_inputs():
  rng = np.random.default_rng(0)
  p = {"w1": rng.normal(size=(256, 128)), "b1": np.zeros(256),
       "w2": rng.normal(size=(128, 256)) * 0.05, "b2": np.zeros(128)}
  p = {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}
  xs = jnp.asarray(rng.normal(size=(64, 128)), jnp.float32)
  ys = jnp.asarray(rng.integers(0, 128, 64), jnp.int32)
  return p, xs, ys


def vmapped_mlp_sgd_step(p, xs, ys):
  """An SGD step of a two-layer MLP applied per example (`jax.vmap`, as an
  `eqx.nn.MLP` is; the probe `eqx_shared_tied_embedding`). The second weight's
  backward product (tied, in a clone round) is computed from its forward product
  (untied: a barrier after a product may change it) through the ReLU's mask; the
  forward product runs before the barrier by data. Placed after it, it closed a
  cycle and nothing was sequenced (jax.jit: one 128 KiB copy)."""
  l, g = jax.value_and_grad(_mlp_loss)(p, xs, ys)
  return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), l


def test_a_forward_product_that_feeds_a_tied_backward_product_stays_before_the_tie():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  r = compare(vmapped_mlp_sgd_step, *_mlp_inputs())
  assert r.ref_report.buffer_copies(1024), r.ref_report
  assert r.report.buffer_copies(1024) == (), r.report


def vmapped_mlp_adam_step(p, state, xs, ys):
  """`vmapped_mlp_sgd_step` with an Adam update written as Optax writes it: each
  leaf's moments divided by one shared bias correction, `mu / (1 - 0.9 ** t)`.
  A clone round gave each division its own copy of that scalar, so XLA multiplied
  by its reciprocal instead of dividing (`_passes._scalar_divisors`), and every
  candidate changed arithmetic (the real-library `eqx_mlp_adam`, jax.jit: one
  copy of the second weight)."""
  loss, g = jax.value_and_grad(lambda p: _mlp_loss(p, xs, ys))(p)
  mu, nu, t = state
  t = t + 1
  mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, mu, g)
  nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, nu, g)
  c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
  p = jax.tree.map(lambda a, m, v: a - 0.001 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8),
                   p, mu, nu)
  return p, (mu, nu, t), loss


def test_a_shared_bias_correction_keeps_jax_jits_divisions():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  p, xs, ys = _mlp_inputs()
  state = (jax.tree.map(jnp.zeros_like, p), jax.tree.map(jnp.zeros_like, p),
           jnp.float32(0))
  r = compare(vmapped_mlp_adam_step, p, state, xs, ys, donate_argnums=(0, 1))
  assert r.ref_report.buffer_copies(1024), r.ref_report
  assert r.report.buffer_copies(1024) == (), r.report


def step_read_by_a_product_then_scaled_again(b0, b1):
  """Fuzz seed 8800 #2206, dead code left out. jax.jit folds the two scalings of
  `b1` into one product by 0.9801 (XLA's simplifier reassociates constants: one
  rounding); the first candidate ties `b1` between them for the product's read,
  so it multiplies twice (two roundings, the eager values). The fingerprint listed
  each line's products by kind only and ran it; it now lists their constants, and
  the clone round's candidate, which keeps jax.jit's product, runs."""
  b1 = b1 * 0.99 - 0.25 * jnp.zeros((24, 24), jnp.float32)
  w = (jnp.arange(192, dtype=jnp.float32).reshape(24, 8) % 3 - 1) * 0.125
  v2 = jax.vmap(lambda r: r @ w)(b1)
  b0 = b0.at[0:9, 0:8].set(v2[0:9, 0:8].astype(jnp.int32))
  b1 = b1 * 0.99
  return b0, v2, b1


def test_a_constant_chain_kept_apart_by_a_tie_is_not_run():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  rng = np.random.default_rng(0)
  b0 = jnp.asarray(rng.integers(-5, 5, (32, 16)), jnp.int32)
  b1 = jnp.asarray(rng.normal(size=(24, 24)) * 3, jnp.float32)
  r = compare(step_read_by_a_product_then_scaled_again, b0, b1, donate_argnums=(0, 1))
  assert r.ref_report.buffer_copies(1024), r.ref_report


def masked_step_averaged_into_a_row_then_rows_swapped(b0, k):
  """Fuzz seed 8800 #672, its class: a whole-buffer `jnp.where` that reads a
  block of the buffer, its column means added into a row, then two rows
  swapped. jax.jit copies b0 for the swap. The first round ties the block and
  the mask before the `where`, so the mean, which jax.jit fuses with the `where`
  over the old buffer, sums stored values and may round otherwise; tied where
  jax.jit's fusions read, the `where` computed again for the mean before the
  tie and the mean's result stored as jax.jit stores it, the candidate copies
  nothing and computes every operation alike."""
  v1 = b0[6:10, 8:15]
  b0 = jnp.where(b0 > 0, b0, jnp.resize(v1, (24, 16)) * 0.5 + 1)
  v2 = jnp.mean(b0, axis=0)
  b0 = b0.at[21, 1:8].add(-v2[:7])
  a, b = b0[15], b0[k]
  return b0.at[15].set(b).at[k].set(a)


def test_a_reduction_of_a_whole_buffer_update_keeps_jax_jits_fusion():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  x = jnp.asarray(np.random.default_rng(0).normal(size=(24, 16)), jnp.float32)
  r = compare(masked_step_averaged_into_a_row_then_rows_swapped, x, jnp.int32(3))
  assert r.ref_report.buffer_copies(1024), r.ref_report
  assert not r.report.buffer_copies(1024), r.report


def block_clipped_then_row_set_and_summed(b0):
  """Fuzz seed 8800 #999, its class: a row set at an index read from the
  buffer, then the buffer returned with its sum. jax.jit fuses the row's update
  into the sum, which so reads the buffer before the update, and copies it for
  the update. The sum, given its own copy of the update, is tied before it and
  keeps jax.jit's fusion."""
  b0 = b0.at[3:8].min(-2.0)
  b0 = lax.dynamic_update_index_in_dim(b0, jnp.full((32,), 1.5, jnp.float32),
                                       jnp.argmax(b0[10]) % 24, 0)
  return b0, jnp.sum(b0)


def block_set_clipped_then_row_set_and_summed(b0):
  """The same after a block set at indices read from the buffer: the block's
  update is computed in another buffer and copied in unless each update is
  materialised (`Hints.materialise`), and that round needs the sum's own copy
  of the row's update too."""
  b0 = lax.dynamic_update_slice(b0, jnp.full((3, 24), 3.0, jnp.float32),
                                (jnp.argmax(b0[3]) % 22, jnp.argmax(b0[6]) % 9))
  return block_clipped_then_row_set_and_summed(b0)


@pytest.mark.parametrize("f", [block_clipped_then_row_set_and_summed,
                               block_set_clipped_then_row_set_and_summed])
def test_a_sum_of_an_update_is_tied_before_it(f):
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  x = jnp.asarray(np.random.default_rng(0).normal(size=(24, 32)), jnp.float32)
  r = compare(f, x)
  assert r.ref_report.buffer_copies(1024), r.ref_report
  assert not r.report.buffer_copies(1024), r.report


def rows_exchanged_across_dtypes_then_step_and_sum(b0, b1):
  """Fuzz seed 7200 #620 (as generated, dead code left out). Row 5 of b1 is read
  before that row is set, and subtracted from the whole updated buffer before
  its sum: the read has no frontier (its values reach the reduction after the
  update), so every round left it untied. The bold round ties it where it is
  read (data movement only) and its candidate runs, with one of jax.jit's
  copies of b1 left."""
  v2 = b0[16, 0:16]
  v3 = b1[5, 0:16]
  b0 = b0.at[16, 0:16].set(v3.astype(jnp.int32))
  b1 = b1.at[5, 0:16].set(v2.astype(jnp.float32))
  b1 = b1.at[7:8].mul(jnp.resize(v2, (1, 16)).astype(jnp.float32))
  b1 = b1 * 0.5 + -jnp.resize(v3, (16, 16))
  return jnp.sum(b1), b1, b0


def test_bold_round_ties_a_read_that_only_moves_data():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  from inplace_jax.testing.fuzz import Buf, make_inputs
  b0, b1 = make_inputs((Buf("b0", (32, 32), "int32"), Buf("b1", (16, 16), "float32")),
                       550929303, "integer")
  r = compare(rows_exchanged_across_dtypes_then_step_and_sum, jnp.asarray(b0),
              jnp.asarray(b1), donate_argnums=(0, 1))
  before = sum(c.nbytes for c in r.ref_report.buffer_copies(1024))
  after = sum(c.nbytes for c in r.report.buffer_copies(1024))
  sig = r.fn.signatures[-1]
  assert sig.chosen is not None and sig.chosen.bold, sig.candidates
  assert 0 < after < before and after < min(
      sum(c.nbytes for c in k.report.buffer_copies(1024))
      for k in sig.candidates if not k.bold), sig.candidates


def column_step_in_switch_beside_pass_through(b0, b1):
  """Fuzz seed 4600 #865 (as generated). A branch that passes b0 through (the
  second) beside one that rewrites it elementwise from its own column: jax.jit
  copies b0 in the pass-through branch and into the donated buffer (jax#16661).
  Predicted to stay in place as a conditional, it is not lowered in the first
  rounds; only the lowering round's candidate (zero-or-one-trip loops, each
  update materialised) is copy-free."""
  b0 = b0.at[:, 10].add(0.5)

  def br1_0(b0):
    v2 = b0[:, 12:13]
    return b0 * 0.99 - 0.01 * v2, jnp.float32(0)

  def br1_1(b0):
    return b0, jnp.float32(0)
  b0, v1 = lax.switch(jnp.argmin(b1[:, 7]) % 2 + 2, [br1_0, br1_1], b0)
  return b1, v1, b0


def test_lowering_round_is_the_one_that_runs():
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  from inplace_jax.testing.fuzz import Buf, make_inputs
  bufs = (Buf("b0", (32, 16), "float32"), Buf("b1", (16, 16), "float32"))
  args = [jnp.asarray(a) for a in make_inputs(bufs, 2136922539, "normal")]
  r = compare(column_step_in_switch_beside_pass_through, *args, donate_argnums=(0, 1))
  assert r.ref_report.buffer_copies(1024), r.ref_report
  sig = r.fn.signatures[-1]
  assert sig.chosen is sig.candidates[-1] and sig.chosen.lowered, sig.candidates
  assert not any(c.lowered for c in sig.candidates[:-1]), sig.candidates
  assert r.report.buffer_copies(1024) == (), r.report


def row_step_in_loop_then_corner(b0):
  """Fuzz seed 4600 #9035 (as generated). In the loop body, `b0 - 0.25 * b0[21]`
  and then a read of the new `b0[0, 0]`: jax.jit computes that element again from
  the old buffer inside the read's fusion (and copies b0 to keep it), which a
  multiply-add can round otherwise than the stored one. Only a candidate that
  clones the broadcast row too (clone level 2) keeps both forms and is in place."""
  v1 = lax.dynamic_slice(b0, (jnp.argmin(b0[:, 40]) % 32, jnp.argmax(b0[7]) % 18),
                         (2, 31))

  def body2(i2, c2):
    b0, a2 = c2
    v3 = b0[21]
    b0 = b0 - 0.25 * v3
    a2 = a2 + jnp.max(b0[0, 0]).astype(jnp.float32)
    return b0, a2
  b0, v2 = lax.fori_loop(0, jnp.argmin(b0[:, 23]) % 3 + 0, body2, (b0, jnp.float32(0)))
  b0 = b0.at[22:29].mul(v2)
  return b0, v1


def row_step_in_cond_beside_pass_through(b0):
  """Fuzz seed 4600 #2079 (as generated). As `row_step_in_loop_then_corner`, in the
  second branch of a conditional whose first passes b0 through (jax#16661): only the
  lowering round's candidate with clones of data movement is copy-free and exact
  (with each update materialised instead, the new `b0[0, 0]` is read from memory
  where jax.jit computes it again, a multiply-add apart)."""
  def br1_0(b0):
    return b0, jnp.float32(0)

  def br1_1(b0):
    v2 = b0[4]
    b0 = b0 - 0.5 * v2
    return b0, jnp.float32(0) + jnp.sum(b0[0, 0]).astype(jnp.float32)
  b0, v1 = lax.cond(b0[10, 5] > 0, br1_0, br1_1, b0)
  b0 = jnp.maximum(b0, -v1)
  return b0, v1


@pytest.mark.parametrize("fn, shape, lowered", [
    (row_step_in_loop_then_corner, (33, 48), False),
    (row_step_in_cond_beside_pass_through, (24, 32), True)])
def test_clones_of_data_movement_keep_a_recomputed_read(fn, shape, lowered):
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  from inplace_jax.testing.fuzz import Buf, make_inputs
  (x,) = make_inputs((Buf("b0", shape, "float32"),), 7, "normal")
  x = x.at[10, 5].set(-1.0)     # the branch that updates
  r = compare(fn, jnp.asarray(x))
  assert r.ref_report.buffer_copies(1024), r.ref_report
  sig = r.fn.signatures[-1]
  assert sig.chosen.clone == 2 and sig.chosen.lowered == lowered, sig.candidates
  assert r.report.buffer_copies(1024) == (), r.report


def reads_of_two_buffers_index_each_others_updates(b0, b1):
  """Fuzz seed 5300 #9670. `b0`'s row-column add is a read-modify-write split, whose
  gather needs `b1`'s sum and row argmax first; `b1`'s reads (windows at `b0`'s
  column argmins) need `b0`'s tied reads first. With the split, the two barriers
  close a cycle and `b1` was left to XLA; without it, both are honoured."""
  v1 = lax.dynamic_slice(b1, (jnp.argmin(b0[:, 15]) % 5, jnp.argmax(b1[14]) % 16),
                         (12, 1))
  v2 = jnp.sum(b1)
  v3 = lax.dynamic_slice(b1, (v2 % 8, jnp.argmin(b0[:, 12]) % 5), (9, 12))
  b0 = b0.at[jnp.argmax(b1[13]) % 16, v2 % 16].add(jnp.max(v3))
  b1 = b1.at[v2 % 16, 7:12].min(jnp.resize(v3, (5,)))
  return (v3, v1, b0, b1)


def test_a_split_that_closes_a_cycle_is_dropped():
  r = compare(reads_of_two_buffers_index_each_others_updates,
              _ints((16, 16), 3)()[0], _ints((16, 16), 4)()[0], donate_argnums=(0, 1))
  if ON_CPU:
    assert r.ref_report.buffer_copies(1024), "jax.jit should copy here"
  assert r.report.buffer_copies(1024) == (), r.report


def test_copy_into_buffer_names_the_reads_behind_it():
  # jax.jit computes the `where` in another buffer and copies it into the donated
  # one; the cause names the read of the column that keeps XLA from writing over it.
  r = compare(clip_to_column, _x(), jnp.int32(5), donate_argnums=(0,))
  if not ON_CPU:
    pytest.skip("the copy is XLA:CPU's")
  (copy,) = r.ref_report.buffer_copies(FULL)
  assert "computed in another buffer" in copy.cause, copy.cause
  assert [a.op for a in copy.readers] == ["dynamic_slice"], copy.readers
  assert "other than element by element (dynamic_slice at" in copy.cause, copy.cause


def test_copy_into_buffer_names_the_reads_of_the_old_value():
  # jax.jit shifts the buffer into another one (the argmax still reads the old
  # value) and scatters there: the cause names that read, which the refinement
  # round then ties.
  x = jnp.asarray(np.random.default_rng(4).normal(size=(24, 16)), jnp.float32)
  r = compare(add_at_argmax_then_shift, x, donate_argnums=(0,))
  if not ON_CPU:
    pytest.skip("the copy is XLA:CPU's")
  (copy,) = r.ref_report.buffer_copies(1024)
  assert "computed in another buffer" in copy.cause, copy.cause
  assert "the old value is also read by slice at" in copy.cause, copy.cause
  assert "slice" in [a.op for a in copy.readers], copy.readers
  assert r.report.buffer_copies(1024) == (), r.report


def test_buffers_jax_jit_does_not_copy_are_left_alone():
  # Sequencing b1 (which jax.jit copies) had made XLA copy b0 (which it does not):
  # a refinement round leaves b0's versions as they are.
  import fuzz_regressions_programs as programs
  from inplace_jax.testing import fuzz
  case = next(c for c in programs.REGRESSIONS
              if c.fn is programs.sequencing_one_buffer_leaves_the_other)
  r = compare(case.fn, *fuzz.make_inputs(case.bufs, case.data_seed, case.data),
              donate_argnums=(0, 1, 2))
  if not ON_CPU:
    pytest.skip("the copies are XLA:CPU's")
  theirs = r.ref_report.buffer_copies(1024)
  assert theirs and {c.buffer for c in theirs} == {"b1"}, r.ref_report
  assert r.report.program == "sequenced", r.report.decision
  ours = r.report.buffer_copies(1024)
  assert sum(c.nbytes for c in ours) < sum(c.nbytes for c in theirs), r.report
  assert "b0" not in {c.buffer for c in ours}, r.report


def attend_then_write(k_cache, v_cache, pos, q, k_new, v_new):
  """A decode step that attends over the old cache and the new token (einsums and a
  softmax read both caches), then writes the token at `pos`."""
  t, scale = k_cache.shape[1], 1.0 / np.sqrt(q.shape[-1])
  s_old = jnp.einsum("hd,htd->ht", q, k_cache) * scale
  s_old = jnp.where((jnp.arange(t) < pos)[None], s_old, -jnp.inf)
  s_new = jnp.sum(q * k_new, -1, keepdims=True) * scale
  w = jax.nn.softmax(jnp.concatenate([s_old, s_new], 1), axis=-1)
  out = jnp.einsum("ht,htd->hd", w[:, :t], v_cache) + w[:, t:] * v_new
  k_cache = lax.dynamic_update_slice(k_cache, k_new[:, None], (0, pos, 0))
  v_cache = lax.dynamic_update_slice(v_cache, v_new[:, None], (0, pos, 0))
  return k_cache, v_cache, out


def test_attend_then_write_is_copy_free_and_exact():
  # The ties follow the dots' results to values XLA computes the same with a
  # barrier after them; the compiled program differs from jax.jit's only by a
  # bitcast of a fusion's input, which the fingerprint reads as the input itself.
  h, t, d = 4, 512, 64
  rng = np.random.default_rng(0)
  mk = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  args = (mk(h, t, d), mk(h, t, d), jnp.int32(t // 2), mk(h, d), mk(h, d), mk(h, d))
  r = compare(attend_then_write, *args, donate_argnums=(0, 1))
  if ON_CPU:
    assert r.ref_report.buffer_copies(h * t * d * 4), "jax.jit should copy here"
  assert r.report.buffer_copies(1024) == (), r.report


def swap_across_buffers_indexed_by_both(a, b):
  """Rows swapped between two buffers after an update of `a` whose value is read
  from `b`, and a window of `b` read at an index computed from the updated `a`:
  each buffer's reads feed the other's update (fuzz seed 2040 #230)."""
  a = a.at[jnp.argmin(b[:, 3]) % a.shape[0], 2].max(jnp.max(b[0:6, 3]))
  window = lax.dynamic_slice(b, (jnp.argmin(a[:, 9]) % 3, 0), (8, 8))
  ra, rb = a[8, :16], b[1, :16]
  return a.at[8, :16].set(rb), b.at[1, :16].set(ra), window


def update_fed_by_reduction_of_carry(x, y):
  """A one-step scan whose scatter adds the max of a column gathered from the carry
  before the loop: XLA inlines the loop and fuses the gather into the scatter
  (fuzz seed 2040 #34)."""
  x = x.at[jnp.argmin(x[:, 7]) % x.shape[0], jnp.argmax(x[21]) % x.shape[1]].max(1.5)
  col = x[:, jnp.array([18])]
  def body(c, _):
    x, y = c
    x = x.at[jnp.argmax(y[19]) % x.shape[0], 5].add(-jnp.max(col), mode="clip")
    return (x, y), y[0, 0]
  (x, y), s = lax.scan(body, (x, y), length=1)
  return x, y, s


def loop_result_picks_branch_reading_buffer(a, b, c):
  """A loop carries `a` and `c`; its `c` picks a branch that reads `a` and
  updates `b`; then `a` and `c` are updated (fuzz seed 2040 #305)."""
  def body(carry):
    i, a, c = carry
    c = jnp.minimum(c, -2)
    a = a.at[:, (i + 2) % a.shape[1]].add(1.0)
    return i + 1, a, c
  _, a, c = lax.while_loop(lambda t: t[0] < 2, body, (jnp.int32(0), a, c))
  window = c[3:7, 0:12]
  def reads_a(b):
    return b.at[5, jnp.argmax(a[5]) % 12].set(0), jnp.sum(a[11])
  b, s = lax.cond(c[3, 3] > 0, lambda b: (b, jnp.float32(0)), reads_a, b)
  a = a.at[16].set(jnp.resize(window, (a.shape[1],)).astype(a.dtype))
  rb, rc = b[3, 0:12], c[2, 0:12]
  return s, b.at[3, 0:12].set(rc), a, c.at[2, 0:12].set(rb)


def one_step_loop_then_read(x, y):
  """An elementwise update in a loop of one trip (XLA inlines it), then a read of
  the result: XLA recomputed the update in the read's fusion, from the old buffer
  (fuzz seed 2040 #13, minimised)."""
  def body(i, c):
    x, s = c
    return -x - 0.25, s
  x, s = lax.fori_loop(0, 1, body, (x, y[0, 0]))
  return jnp.argmax(x[6]), x


def update_then_call_slicing_it(x, y):
  """In a loop: an elementwise update, then a nested jit that finds a row from a
  column of the result and sets it (fuzz seed 2040 #13)."""
  @jax.jit
  def set_row(x):
    return x.at[jnp.argmin(x[:, 19]) % x.shape[0]].set(0.0)
  def body(i, x):
    return set_row(-x - 0.125)
  x = lax.fori_loop(0, 3, body, x)
  return x, y


def step_adding_its_own_sine(b0, b1):
  """Fuzz seed 3000 #609: `sin(b1)` is returned and added into b1's update. XLA
  fuses the sine into the update and into the output's kernel, so it keeps b1's
  old value; tied after the sine (a refinement round, `Trait.LANE_WISE`), the
  update adds the stored sine, which is the same bits: XLA:CPU's vector and scalar
  sine agree, and an add takes the call's result as it is."""
  v = jnp.sin(b1)
  b1 = b1 * 0.5 + v
  return b0 - 0.5 * b1, b1, v


def scatter_add_read_and_shifted(x):
  """Fuzz seed 3300 #745's class: an additive scatter whose result is read (a row)
  as well as added to. XLA moves an add in front of a scatter-add only where the
  add is its one user, so a tie after the scatter changes no arithmetic here."""
  x = x.at[5:6, 2:9].add(0.3)
  r = x[1]
  return x + r * -0.25, r


def add_at_argmax_then_shift(x):
  """Fuzz seed 3300 #2675's class: XLA moves the whole-buffer shift in front of the
  scatter-add (one user) into another buffer, because the argmax still reads the
  old value; that read is named in the copy's cause, and tied in a refinement
  round: the shift then runs in place, reassociated as under jax.jit."""
  x = x.at[jnp.argmax(x[3]) % x.shape[0], 7].add(1.25)
  return x - 0.375


def set_at_argmax_then_affine(x):
  """Fuzz seed 3300 #668's class: jax.jit fuses the dynamic-update-slice into the
  multiply-add, which picks the update or the loaded element (a phi of a load and
  a constant); the sequenced program loads the element the update wrote. A pick
  of memory and constants rounds nothing: it reads as a load."""
  x = x.at[jnp.argmax(x[9]) % x.shape[0], 3].set(0.0)
  return x * 0.5 + -1.5


def one_trip_while_then_read(x, y):
  """Fuzz seed 3400 #39's class: a `while_loop` of one trip (XLA inlines it, as it
  does a call) makes an elementwise update, then a read of the result picks a row.
  XLA recomputes the update in the read's fusion, from the old buffer; a barrier
  after the loop's result makes the read read memory."""
  def body(c):
    i, x = c
    return i + 1, x - 0.25 * jnp.full(x.shape, -2.0, x.dtype)
  _, x = lax.while_loop(lambda c: c[0] < 1, body, (jnp.int32(0), x))
  return x, x[jnp.argmin(x[:, 13]) % x.shape[0]], y


def both_branches_update_flag_from_buffer(x):
  """Fuzz seed 3400 #95's class: a conditional lowered to loops, whose index is
  read from the buffer both branches update. XLA recomputed the second loop's trip
  count from the buffer after the first loop had updated it; every trip count is
  now computed (and tied) before the first loop."""
  win = lax.dynamic_slice(x, (jnp.argmax(x[7]) % 8, jnp.argmin(x[:, 14]) % 6), (9, 11))
  def br0(x):
    x = x.at[:, jnp.array([11, 11])].set(jnp.resize(win, (16, 2)))
    return x - 0.01 * jnp.abs(x)
  def br1(x):
    x = x.at[jnp.argmax(x[10]) % 16].mul(jnp.resize(win, (16,)))
    return lax.dynamic_update_index_in_dim(x, jnp.resize(win, (16,)), 6, 0)
  x = lax.cond(x[11, 12] > 0, br0, br1, x)
  x = x.at[:, jnp.array([12, 0, 5, 5])].min(jnp.resize(win, (16, 4)))
  x = x.at[10].add(jnp.resize(win, (16,)))
  return x + x[4] * -0.25


def update_recomputed_in_its_reader(x):
  """Fuzz seed 3400 #14's class: XLA fuses an update into its readers' fusions (the
  row set into the slices read after it; the block set into `abs` before the sum),
  so those read the old buffer. The copy's cause names the update itself as a read;
  a refinement round puts a barrier on the update's result."""
  def br1(x):
    x = lax.dynamic_update_slice(x, jnp.full((11, 5), 2.0, x.dtype),
                                 (jnp.argmin(x[:, 14]) % 6, jnp.int32(12)))
    return x, jnp.sum(jnp.abs(x))
  x = x.at[-9, 30].set(3.0)
  v = jnp.argmax(x[15])
  x, s = lax.cond(x[10, 23] > 0, lambda x: (x, jnp.float32(0)), br1, x)
  return s, v, x


def read_feeding_one_trip_scan(x, y):
  """Fuzz seed 4700 #4681's class: a read of `y` feeds only a one-trip scan's
  constant. XLA inlines the scan, so the read is fused into the elementwise update
  and reads `y` at another index than it writes. The sequenced program's copy is
  explained by that fused read (through the barrier's output), which the next round
  ties."""
  v = jnp.max(y, axis=0)
  x = x.at[jnp.argmin(x[:, 13]) % 16].add(v)
  c = y[8, -2]
  def body(y, _):
    return y + jnp.full(y.shape, c) * -0.1, None
  y, _ = lax.scan(body, y, jnp.arange(1))
  return x, v, y


def zero_trip_loop_over_both_then_matmul(x, y):
  """Fuzz seed 4700 #9029's class: a loop carries both buffers, and jax.jit copies
  only `y`. The loop's result for `x` is computed without `y` (carry by carry, to
  the fixpoint), so it is not tied as a read of `y`: tied, the barrier read the old
  `x` unordered with its in-place update, and XLA copied `x` instead."""
  def body(i, c):
    x, y = c
    return x.at[:, 1].set(0.0), y.at[1].min(7.0)
  x, y = lax.fori_loop(0, jnp.int32(0) + 0, body, (x, y))
  m = jnp.min(y, axis=1)
  w = jax.vmap(lambda r: r @ (jnp.arange(256, dtype=jnp.float32).reshape(16, 16) % 3 - 1))(x)
  x = x + w * -0.01
  y = lax.dynamic_update_slice(y, w[:12, :12],
                               (jnp.argmin(x[:, 13]) % 13, jnp.argmax(y[17]) % 3))
  return y, x, m


def lowered_cond_with_a_side_output(x, y):
  """Fuzz seed 4700 #9680's class: a conditional lowered to loops keeps its scalar
  output in a conditional of its own. Both need the index, read from `x`: XLA
  computed it again in front of that conditional, unordered against the loop's
  in-place write of `x`, and copied `x`. The index is read once, before a
  barrier."""
  v = lax.dynamic_slice(x, (jnp.argmin(y[:, 11]) % 26, jnp.argmin(y[:, 0]) % 16), (7, 1))
  def br0(x, y):
    return x, y, jnp.float32(0)
  def br1(x, y):
    y = lax.dynamic_update_slice(y, jnp.resize(v, (9, 8)),
                                 (jnp.int32(5), jnp.argmax(y[19]) % 9))
    x = x.at[3].set(jnp.maximum(jnp.resize(v, (16,)), 0))
    return x, y, jnp.float32(0)
  x, y, s = lax.cond(x[21, 5] > 0, br0, br1, x, y)
  y = y.at[6:7, 14:16].set(3.0)
  x = x.at[jnp.argmin(y[:, 4]) % 32].set(s)
  return x * 0.5 + s, v, y


def second_branch_loop_reads_a_column(x):
  """Fuzz seed 4700 #4896's class: both branches update `x`, so the conditional
  becomes two loops, and only the second reads a column of `x` taken before the
  conditional. Unordered against the first loop's in-place write, that read cost a
  copy; it is tied before the first loop with the trip counts."""
  v1 = jnp.max(x, axis=0)
  x = x.at[50:64, 19:22].mul(jnp.resize(v1, (14, 3)))
  v2 = lax.dynamic_index_in_dim(x, jnp.argmin(x[:, 1]) % 32, 1, keepdims=False)
  def br0(x):
    return x.at[:, jnp.array([5, 10, 15, 30], dtype=jnp.int32)].add(
        -jnp.resize(v2, (64, 4)))
  def br1(x):
    return x.at[jnp.argmax(x[56]) % 64, jnp.argmax(x[59]) % 32].set(3.0)
  x = lax.cond(x[51, 25] > 0, br0, br1, x)
  return lax.dynamic_update_slice(x, jnp.full((35, 4), 7.0),
                                  (jnp.argmin(x[:, 3]) % 30, jnp.argmin(x[:, 16]) % 29))


def row_update_beside_sum_of_a_column(x):
  """Fuzz seed 4700 #898's class: the updating branch also sums a column read
  before the conditional. XLA moves that sum out of a conditional (not out of a
  loop), so a conditional whose loops would sum it is not lowered; the sum's output
  stays in a conditional of its own, so this one is, and is in place."""
  v = x[:, 20]
  def br0(x):
    return x, jnp.float32(0)
  def br1(x):
    return x.at[16].mul(1.5), jnp.sum(v)
  x, s = lax.cond(x[28, 30] > 0, br0, br1, x)
  return v, x.at[42:45, 3:13].set(s)


def one_step_scan_corner_feeds_scatter(x):
  """Fuzz seed 4700 #9197's class: a one-step scan's result reads the carry it
  returns, and feeds a scatter into that carry. XLA inlines the scan and fuses the
  read into the scatter, which then reads what it overwrites: tied before the
  scatter, the result is used through the barrier, as a slice is."""
  def body(x, _):
    x = x.at[13].add(7.0)
    return x, jnp.max(x[0, 0])
  x, m = lax.scan(body, x, jnp.arange(1))
  return x.at[jnp.argmin(x[:, 9]) % 32, 1].max(jnp.max(m))


def loop_passes_through_buffers_updated_before(x, y, z):
  """Fuzz seed 4700 #2494's class: a loop passes `y` and `z` through, which JAX
  forwards around it, leaving them behind as constants the body never reads. They
  made the loop wait for `z`'s update, and so the tie of `y`'s column read (by
  that update's index) came after it, a barrier output nothing used, which XLA
  drops. Constants the loop does not read are dead code."""
  a = y[2]
  y = y.at[2].set(y[5])
  y = y.at[5].set(a)
  v = x[4:7, 7:8]
  z = lax.dynamic_update_slice(z, jnp.full((29, 24), 1.5),
                               (jnp.argmin(y[:, 13]) % 4, jnp.int32(0)))
  def body(c):
    i, x, y, z, s = c
    x = x.at[:, jnp.array([4, 2, 8], dtype=jnp.int32)].add(1.0)
    return i + 1, x, y, z, s + jnp.sum(v - -v)
  _, x, y, z, s = lax.while_loop(lambda c: c[0] < 0, body,
                                 (jnp.int32(0), x, y, z, jnp.float32(0)))
  y = y.at[jnp.array([18], dtype=jnp.int32)].set(-s)
  return z, x, y


def one_trip_loop_reads_a_column_by_argmax(x):
  """Fuzz seed 5100 #298 (shrunk): a column picked by an argmax over a row feeds a
  one-trip loop that updates the buffer, which XLA inlines. The copy names the
  column's gather; tied before the loop, it needs its index, so the row read the
  argmax reduces is tied there too (left after the barrier, it closed a cycle and
  no barrier was placed)."""
  v = x[:, (jnp.arange(1, dtype=jnp.int32) * 0 + jnp.argmax(x[19]) % 16) % 16]

  def body(i, c):
    x, a = c
    return x.at[0, 0].mul(-jnp.max(v)), a
  x, _ = lax.fori_loop(0, 1, body, (x, jnp.float32(0)))
  return x + x[:, 5:6] * -0.25


def one_trip_loop_reads_rows_it_sets(b0):
  """Fuzz seed 5100 #298 (as generated). As `one_trip_loop_reads_a_column_by_argmax`,
  and rows `v2` read before the loop are written by its row set: with the column
  tied, the copy names no read. The loop holds the update the copy names, so
  the loop's own reads (its operands) are tied before it."""
  v1 = b0[:, (jnp.arange(1, dtype=jnp.int32) * 0 + jnp.argmax(b0[19]) % 16) % 16]
  v2 = b0[(jnp.arange(3, dtype=jnp.int32) * 2 + jnp.int32(27)) % 32]

  def body3(i3, c3):
    (b0, a3) = c3
    b0 = b0.at[jnp.argmin(b0[:, 14]) % 32, jnp.argmax(b0[15]) % 16].mul(-jnp.max(v1))
    b0 = lax.dynamic_update_index_in_dim(b0, jnp.maximum(jnp.resize(v2, (16,)), 0),
                                         jnp.argmax(b0[8]) % 32, 0)
    v4 = v2 - v2
    a3 = a3 + jnp.max(v4).astype(jnp.float32)
    return (b0, a3)
  (b0, v3) = lax.fori_loop(0, 1, body3, (b0, jnp.float32(0)))
  b0 = b0.at[:, (jnp.arange(1, dtype=jnp.int32) * 2 + jnp.int32(7)) % 16].set(1.5)
  v7 = b0[:, 5:6]
  b0 = b0 + v7 * -0.25
  return (v7, b0,)


def cond_sums_a_corner_beside_pass_through(b1, b2):
  """Fuzz seed 5300 #5655, in floats. A conditional that passes `b1` through in one
  branch and adds to a row of it in the other (jax#16661), that branch also summing
  one element of `b2`, updated before. The "sum" reduces nothing (a bitcast once
  compiled): the conditional may be lowered to loops with no arithmetic moved."""
  b2 = b2.at[24, 14].set(1.5)

  def br0(b1):
    return (b1, jnp.float32(0))

  def br1(b1):
    b1 = b1.at[5].add(-2.0)
    return (b1, jnp.float32(0) + jnp.sum(b2[0, 0]))
  (b1, v1) = lax.cond(b1[10, 23] > 0, br0, br1, b1)
  return (b1, b2, v1)


def one_step_scan_sums_a_corner_then_rows_set(b0):
  """Fuzz seed 5300 #1732, in floats. A one-trip scan updates `b0` and returns a
  sum of `b0[0, 0]`, which sets rows of `b0` after it. XLA inlines the scan and
  fuses that read into the row set, after the scan's update: the scan's result is
  tied with `b0` before the row set, and the users of the result run after the
  barrier, reading it."""
  def body(c, i):
    (b0,) = c
    b0 = b0.at[jnp.argmax(b0[16]) % 24].min(-2.0)
    b0 = lax.dynamic_update_slice(b0, jnp.full((22, 4), -2.0, jnp.float32),
                                  (jnp.int32(0), jnp.argmax(b0[12]) % 21))
    return (b0,), jnp.float32(0) + jnp.sum(b0[0, 0])
  (b0,), v1 = lax.scan(body, (b0,), jnp.arange(1, dtype=jnp.int32))
  b0 = b0.at[0:12].set(jnp.resize(v1, (12, 24)))
  return (b0,)


def scatter_multiply_then_step_returning_its_square(b0):
  """Fuzz seed 5400 #8381, reduced. A row window of `b0` is scaled by a
  scatter-multiply, then `b0` takes a step `b0 - 0.1 * b0 * b0` and the square
  `b0 * b0` is also returned. XLA recomputes the square inside the step's fusion
  and computes the returned one in a fusion of its own, which it may not run
  after the step: the square is tied with `b0` before the step (a product nothing
  adds; the step's multiply-add is `0.1 * v`'s). The scatter-multiply's combiner
  is no call whose result a product could be."""
  b0 = b0.at[3, 13:21].mul(0.0)
  v1 = b0 * b0
  b0 = b0 - 0.1 * v1
  v2 = lax.dynamic_slice(b0, (jnp.argmax(b0[5]) % 17, jnp.argmin(b0[:, 21]) % 3),
                         (8, 22))
  return (b0, v1, v2)


def where_keeps_a_returned_sine(b0):
  """Fuzz seed 5400 #3709, reduced. `where(b0 > 0, b0, sin(b0))` is `b0`'s next
  version, and `sin(b0)` is returned too. The select reads two values of `b0`'s
  type made from it; the one it continues is `b0`, not the sine, which must stay
  (written over, it would be a second value to keep). The sine is tied with `b0`
  before the select, which XLA otherwise computes first, recomputing the sine."""
  v1 = jnp.sin(b0)
  b0 = jnp.where(b0 > 0, b0, v1)
  return (b0, v1)


def swap_whose_row_a_loop_sums(b0, b1):
  """Fuzz seed 5400 #9792. Rows 4 and 8 of `b1` are swapped; row 8, read first, is
  returned, written into `b0`, and summed inside a two-trip `fori_loop` after the
  swap. The loop takes the row as an operand, materialised under jax.jit too: in
  a refinement round the row is tied with `b1` before the first row set."""
  v1 = b1[8]
  b1 = b1.at[8].set(b1[4])
  b1 = b1.at[4].set(v1)
  b0 = lax.dynamic_update_slice(b0, jnp.resize(v1, (29, 20)),
                                (jnp.argmin(b0[:, 22]) % 4, jnp.int32(4)))

  def body(i, c):
    (b1, a) = c
    return (b1, a + jnp.sum(v1 + -2.0))
  (b1, v2) = lax.fori_loop(0, 2, body, (b1, jnp.float32(0)))
  return (v1, b0, v2, b1)


def branch_sums_a_product_computed_outside(b0, b2):
  """Fuzz seed 5500 #4751, reduced. A branch sets a row of `b2` (chosen by a row
  it reads first) and sums `v1`, a product computed outside the conditional;
  the other branch passes `b2` through, which XLA copies (jax#16661). Lowered to
  loops the conditional is copy-free, but a sum in a loop would not be fused with
  the product as XLA fuses it when it hoists the sum out of the conditional: the
  sum stays in a conditional of its own (`lower_cond`'s side outputs), large
  operand and all."""
  w = jnp.arange(256, dtype=jnp.float32).reshape(16, 16) % 5 - 2
  v1 = jax.vmap(lambda r: r @ w * 0.125)(b2)
  b2 = b2 * 0.5 + v1

  def skip(b0, b2):
    return b0, b2, jnp.float32(0)

  def update(b0, b2):
    b2 = lax.dynamic_update_index_in_dim(b2, jnp.full((16,), -1.0),
                                         jnp.argmax(b2[4]) % 16, 0)
    return b0, b2, jnp.sum(v1)
  b0, b2, s = lax.cond(jnp.argmax(b0[6]) % 2 == 0, skip, update, b0, b2)
  return b0[17, 18], b2, b0, v1, s


def step_or_sum_of_a_product(b0, b1):
  """Fuzz seed 5500 #5704, reduced. One branch takes a row step of `b0` and sets
  two rows of `b1`, the other sums `v4`, a product computed outside the switch,
  and passes both buffers through: XLA copies them (jax#16661). The sum could be
  predicted to move out of the switch and fuse with the product, which a loop
  would not allow, so the first round keeps the switch; in the lowering round the
  fingerprint decides instead (XLA sums `v4` materialised in its branch, as the
  loop does)."""
  w = jnp.arange(256, dtype=jnp.float32).reshape(32, 8) % 7 - 3
  v4 = b0 @ w * 0.125
  b1 = b1.at[6:22, 19:27].set(v4[0:16])

  def step(b0, b1):
    v6 = b0[0]
    b0 = b0 - 0.1 * v6
    b1 = b1.at[jnp.array([12, 9])].min(-1.0, unique_indices=True)
    return b0, b1, jnp.sum(v6)

  def total(b0, b1):
    return b0, b1, jnp.sum(v4)
  b0, b1, s = lax.switch(jnp.argmin(b0[:, 9]) % 2, [step, total], b0, b1)
  return b1, s, b0


def swap_then_one_step_scan_reading_a_row(b0):
  """Fuzz seed 5500 #9594, reduced. Rows 12 and 6 swap, then a one-step scan
  (inlined by XLA) takes a step with row 13. XLA fuses a copy of the second row
  set into the slice of row 13 that the step reads, which then reads the first
  set's result while the second set overwrites it in place: the copy names the
  set itself as the reader. Such a copy names no other read to tie, so the
  materialising round runs (each update materialised)."""
  v1 = b0[12]
  b0 = b0.at[12].set(b0[6])
  b0 = b0.at[6].set(v1)

  def body(c, i):
    (b0,) = c
    return (b0 * 0.99 - 0.1 * b0[13],), jnp.sum(b0[13])
  (b0,), s = lax.scan(body, (b0,), jnp.arange(1))
  return b0, s


def row_add_then_step_by_another_buffer(b0, b1):
  """Fuzz seed 5500 #8783, reduced. A row add of `b1`, then the step
  `b1 - 0.25 * b0`, whose result picks where `b0` is written. XLA fuses the row
  add into the step, which then reads `b1` other than element by element and
  runs in another buffer. A barrier after the row add was refused: XLA's
  simplifier moves an add in front of a scatter-add, but not a subtract of a
  value it does not know (`_exactness.reassociated`; pinned below)."""
  b1 = b1.at[9].add(1.5)
  b1 = b1 - 0.25 * b0
  b0 = lax.dynamic_update_slice(b0, jnp.full((13, 12), 1.0),
                                (jnp.argmin(b1[:, 14]) % 12, jnp.argmax(b1[8]) % 5))
  return b0, b1


@pytest.mark.parametrize("fn, shapes", [
    (scatter_add_read_and_shifted, ((32, 24),)),
    (add_at_argmax_then_shift, ((24, 16),)),
    (set_at_argmax_then_affine, ((24, 16),)),
    (step_adding_its_own_sine, ((32, 24), (32, 24))),
    (swap_across_buffers_indexed_by_both, ((64, 24), (32, 32))),
    (update_fed_by_reduction_of_carry, ((32, 32), (32, 32))),
    (loop_result_picks_branch_reading_buffer, ((24, 64), (8, 12), (9, 12))),
    (one_step_loop_then_read, ((24, 24), (4, 4))),
    (update_then_call_slicing_it, ((24, 24), (4, 4))),
    (one_trip_while_then_read, ((64, 32), (4, 4))),
    (both_branches_update_flag_from_buffer, ((16, 16),)),
    (update_recomputed_in_its_reader, ((16, 33),)),
    (read_feeding_one_trip_scan, ((16, 24), (16, 24))),
    (zero_trip_loop_over_both_then_matmul, ((32, 16), (24, 24))),
    (lowered_cond_with_a_side_output, ((32, 16), (32, 16))),
    (second_branch_loop_reads_a_column, ((64, 32),)),
    (row_update_beside_sum_of_a_column, ((48, 32),)),
    (one_step_scan_corner_feeds_scatter, ((32, 32),)),
    (loop_passes_through_buffers_updated_before, ((8, 9), (16, 24), (32, 24))),
    (one_trip_loop_reads_a_column_by_argmax, ((32, 16),)),
    (one_trip_loop_reads_rows_it_sets, ((32, 16),)),
    (cond_sums_a_corner_beside_pass_through, ((16, 32), (32, 16))),
    (one_step_scan_sums_a_corner_then_rows_set, ((24, 24),)),
    (scatter_multiply_then_step_returning_its_square, ((24, 24),)),
    (where_keeps_a_returned_sine, ((24, 24),)),
    (swap_whose_row_a_loop_sums, ((32, 24), (32, 16))),
    (branch_sums_a_product_computed_outside, ((33, 24), (16, 16))),
    (step_or_sum_of_a_product, ((16, 32), (33, 33))),
    (swap_then_one_step_scan_reading_a_row, ((16, 16),)),
    (row_add_then_step_by_another_buffer, ((24, 16), (24, 16)))],
    ids=["scatter_add_read_and_shifted", "add_at_argmax_then_shift",
         "set_at_argmax_then_affine", "step_adding_its_own_sine", "swap_across_buffers",
         "update_fed_by_reduction_of_carry",
         "loop_result_picks_branch_reading_buffer", "one_step_loop_then_read",
         "update_then_call_slicing_it", "one_trip_while_then_read",
         "both_branches_update_flag_from_buffer", "update_recomputed_in_its_reader",
         "read_feeding_one_trip_scan", "zero_trip_loop_over_both_then_matmul",
         "lowered_cond_with_a_side_output", "second_branch_loop_reads_a_column",
         "row_update_beside_sum_of_a_column", "one_step_scan_corner_feeds_scatter",
         "loop_passes_through_buffers_updated_before",
         "one_trip_loop_reads_a_column_by_argmax", "one_trip_loop_reads_rows_it_sets",
         "cond_sums_a_corner_beside_pass_through",
         "one_step_scan_sums_a_corner_then_rows_set",
         "scatter_multiply_then_step_returning_its_square",
         "where_keeps_a_returned_sine", "swap_whose_row_a_loop_sums",
         "branch_sums_a_product_computed_outside", "step_or_sum_of_a_product",
         "swap_then_one_step_scan_reading_a_row",
         "row_add_then_step_by_another_buffer"])
def test_reads_the_copy_needs_are_found(fn, shapes):
  rng = np.random.default_rng(3)
  args = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
  r = compare(fn, *args, donate_argnums=tuple(range(len(shapes))))
  if ON_CPU:
    assert r.ref_report.buffer_copies(1024), "jax.jit should copy here"
  assert r.report.buffer_copies(1024) == (), r.report


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's simplifier, measured on CPU")
@pytest.mark.parametrize("update", ["row", "window", "dynamic_row", "repeated"])
@pytest.mark.parametrize("step", ["+ c", "+ c * -0.5", "+ 3", "- 3", "- c", "- 0.5 * c",
                                  "- b[3] * 0.5", "- moved 0.5 * c"])
def test_adds_xla_moves_in_front_of_a_scatter_add_are_predicted(update, step):
  """`_exactness.reassociated` against XLA. Inputs where the two orders round
  differently (`b + u`, u half an ulp of `b`, rounds back to `b`) show, in
  jax.jit's values, whether XLA's simplifier moved the step in front of the
  scatter-add (`scatter_add(b + y, i, u)`) or left it after; the rule must
  predict the same (a wrong "left" would let a barrier change the arithmetic
  where no check sees it: the fingerprint lists no plain adds). "- moved 0.5 * c"
  reaches the argument through seven equations (a product reshaped and
  transposed, as `jnp.resize` moves a value): no constant, at any depth."""
  from inplace_jax import _exactness as X
  from inplace_jax._graph import Graph
  b0, c0, u = {"+ c": (1.0, -1.0, 2.0 ** -24), "+ c * -0.5": (1.0, 2.0, 2.0 ** -24),
               "+ 3": (-3.0, 0.0, 2.0 ** -23), "- 3": (3.0, 0.0, 2.0 ** -23),
               "- c": (1.0, 1.0, 2.0 ** -24), "- 0.5 * c": (1.0, 2.0, 2.0 ** -24),
               "- b[3] * 0.5": (2.0, 0.0, 2.0 ** -23),
               "- moved 0.5 * c": (1.0, 2.0, 2.0 ** -24)}[step]
  updates = {
      "row": (lambda b, c: b.at[9].add(u), (9, 0), 1),
      "window": (lambda b, c: b.at[5:6, 2:5].add(u), (5, 2), 1),
      "dynamic_row": (lambda b, c: b.at[jnp.argmax(c[0]) % 24].add(u), (0, 0), 1),
      "repeated": (lambda b, c: b.at[jnp.array([1, 1, 2])].add(u), (1, 0), 2)}
  steps = {
      "+ c": (lambda s, b, c: s + c, lambda: c0),
      "+ c * -0.5": (lambda s, b, c: s + c * -0.5, lambda: np.float32(c0) * np.float32(-0.5)),
      "+ 3": (lambda s, b, c: s + 3.0, lambda: 3.0),
      "- 3": (lambda s, b, c: s - 3.0, lambda: -3.0),
      "- c": (lambda s, b, c: s - c, lambda: -c0),
      "- 0.5 * c": (lambda s, b, c: s - 0.5 * c, lambda: -(np.float32(0.5) * np.float32(c0))),
      "- b[3] * 0.5": (lambda s, b, c: s - b[3] * 0.5,
                       lambda: -(np.float32(b0) * np.float32(0.5))),
      "- moved 0.5 * c": (lambda s, b, c: s - jnp.transpose(jnp.transpose(
          (0.5 * c).reshape(384).reshape(24, 16).reshape(384).reshape(24, 16))),
          lambda: -(np.float32(0.5) * np.float32(c0)))}
  upd, where, times = updates[update]
  stp, rhs = steps[step]

  def f(b, c):
    return stp(upd(b, c), b, c)
  f32 = np.float32
  after = f32(b0)
  for _ in range(times):
    after = f32(after + f32(u))
  after = f32(after + f32(rhs()))
  moved = f32(f32(b0) + f32(rhs()))
  for _ in range(times):
    moved = f32(moved + f32(u))
  assert after != moved        # the inputs tell the two orders apart
  b = jnp.full((24, 16), b0, jnp.float32)
  c = jnp.full((24, 16), c0, jnp.float32)
  got = np.asarray(jax.jit(f)(b, c))[where]
  assert got in (after, moved), (got, after, moved)
  jaxpr = jax.make_jaxpr(f)(b, c).jaxpr
  g = Graph(jaxpr)
  k = next(i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "scatter-add")
  var = jaxpr.eqns[k].outvars[0]
  assert X.reassociated(jaxpr.eqns[k], var, jaxpr.eqns, g.consumers, g.outvars,
                        parameters=frozenset(jaxpr.invars)) == (got == moved)


_W16 = np.random.default_rng(1).normal(size=(64, 8))
_EXCESS_PRECISION_CASES = {
    # name: (the 16-bit value, what reads it), all on a bfloat16 x[64, 64]
    "product widened": (lambda x: x * jnp.bfloat16(1.1),
                        lambda y: y.astype(jnp.float32) + 1.0),
    "dot widened": (lambda x: x @ jnp.asarray(_W16, jnp.bfloat16),
                    lambda y: y.astype(jnp.float32)),
    "dot sliced, then widened": (lambda x: x @ jnp.asarray(_W16, jnp.bfloat16),
                                 lambda y: y[0:64, 0:8].astype(jnp.float32)),
    "product read by a bfloat16 product": (lambda x: x * jnp.bfloat16(1.1),
                                           lambda y: y * jnp.bfloat16(1.3)),
    "slice widened": (lambda x: x[3:5], lambda y: y.astype(jnp.float32) * 1.1),
    "dot, a sub-slice widened": (lambda x: x @ jnp.asarray(_W16, jnp.bfloat16),
                                 lambda y: y[3:40, 1:5].astype(jnp.float32)),
    "product reshaped, then widened": (lambda x: x * jnp.bfloat16(1.1),
                                       lambda y: y.reshape(4096).astype(jnp.float32)),
    "product transposed, then widened": (lambda x: x * jnp.bfloat16(1.1),
                                         lambda y: y.T.astype(jnp.float32)),
}


@pytest.mark.parametrize("case", sorted(_EXCESS_PRECISION_CASES))
def test_rounding_xla_drops_for_excess_precision_is_predicted(case):
  """`_exactness.excess_precision` against XLA: where a barrier after a bfloat16
  value changes what jax.jit computes from it (XLA:CPU drops a float32-bfloat16-
  float32 round trip, `xla_allow_excess_precision`), the rule must say so (a wrong
  "no" lets a tie change values: fuzz seed 6400 #1065)."""
  from inplace_jax import _exactness as X
  from inplace_jax._graph import Graph
  make, read = _EXCESS_PRECISION_CASES[case]
  x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.bfloat16)

  def f(x, tie):
    y = make(x)
    return read(lax.optimization_barrier(y) if tie else y)
  plain = np.asarray(jax.jit(lambda x: f(x, False))(x)).astype(np.float32)
  tied = np.asarray(jax.jit(lambda x: f(x, True))(x)).astype(np.float32)
  changed = bool((plain != tied).any())
  jaxpr = jax.make_jaxpr(lambda x: f(x, False))(x).jaxpr
  g = Graph(jaxpr)
  y = jax.make_jaxpr(make)(x).jaxpr.outvars[0]
  k = len(jax.make_jaxpr(make)(x).jaxpr.eqns) - 1   # `make`'s last equation
  var = jaxpr.eqns[k].outvars[0]
  assert var.aval.shape == y.aval.shape
  assert X.excess_precision(jaxpr.eqns[k], var, jaxpr.eqns, g.consumers) == changed
