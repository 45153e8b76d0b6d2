"""A transformer decode step that reads its KV cache and writes it in the same step.

The caches `k_cache`, `v_cache` (`[layers, heads, max_len, head_dim]`) are donated.
Each layer projects the new token to q, k, v, attends over the cached positions
`< pos` *and* the new token (the cache is read before the new entry is written, as
implementations that write the cache at the end of the step do), then writes k and
v at `pos` with `lax.dynamic_update_slice`. Under `jax.jit` on CPU the reads of the
old cache and the in-place writes conflict and XLA copies both caches once per
layer; under `inplace_jax.jit` nothing is copied::

  python examples/kv_cache.py --size 2048
  python -m inplace_jax check examples/kv_cache.py:decode_step \\
      --args-factory examples/kv_cache.py:make_args --donate 0,1

Three more functions, for comparison:

* `decode_step_write_first` writes the new entry first and attends over the updated
  cache (mask `<= pos`). It reads only the new version, so it has no conflict to
  begin with (a different summation order, so its values differ in the last bits
  from `decode_step`'s; each is compared with itself under `jax.jit`).
* `decode_step_thd` is `decode_step` with the cache laid out
  `[layers, max_len, heads, head_dim]`. Its attention contracts over `max_len` with
  `heads` as the batch dimension, so XLA transposes each layer's K and V into a
  temporary before the dot: those transposes show up in the report as copies inside
  fusions (a layer's worth each, under both `jax.jit` and `inplace_jax.jit`). They
  are a property of the layout, not of the in-place update; the head-major layout
  avoids them.
* `decode_step_scan` is `decode_step` written as `lax.scan` over the layers, the
  caches scanned as `xs` and returned as `ys`. Under `jax.jit` XLA copies both
  whole stacks on entry (and each layer's slice per step); inplace_jax.jit carries
  them instead, updated in place.
"""

from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from _example_common import compare, parser, print_result

LAYERS, HEADS, HEAD_DIM = 4, 8, 64
D_MODEL = HEADS * HEAD_DIM


def _project(params, l, x):
  q = (x @ params["wq"][l]).reshape(HEADS, HEAD_DIM)
  k = (x @ params["wk"][l]).reshape(HEADS, HEAD_DIM)
  v = (x @ params["wv"][l]).reshape(HEADS, HEAD_DIM)
  return q, k, v


def _attend_old_and_new(q, k, v, k_old, v_old, pos, spec):
  """Softmax attention over the cached positions `< pos` and the new token."""
  max_len = k_old.shape[spec.index("t")]
  scale = 1.0 / math.sqrt(HEAD_DIM)
  scores = jnp.einsum(f"hd,{spec}->ht", q, k_old) * scale
  scores = jnp.where(jnp.arange(max_len)[None, :] < pos, scores, -jnp.inf)
  s_new = jnp.sum(q * k, axis=-1, keepdims=True) * scale      # [H, 1]
  w = jax.nn.softmax(jnp.concatenate([scores, s_new], axis=1), axis=1)
  return jnp.einsum(f"ht,{spec}->hd", w[:, :max_len], v_old) + w[:, max_len:] * v


def decode_step(k_cache, v_cache, params, x, pos):
  """One token through every layer; caches `[layers, heads, max_len, head_dim]`.

  Attends over the old cache and the new token, then writes the new k, v at
  `pos`. Returns `(k_cache, v_cache, x)`.
  """
  for l in range(k_cache.shape[0]):
    q, k, v = _project(params, l, x)
    out = _attend_old_and_new(q, k, v, k_cache[l], v_cache[l], pos, "htd")
    k_cache = lax.dynamic_update_slice(k_cache, k[None, :, None], (l, 0, pos, 0))
    v_cache = lax.dynamic_update_slice(v_cache, v[None, :, None], (l, 0, pos, 0))
    x = x + out.reshape(-1) @ params["wo"][l]
  return k_cache, v_cache, x


def decode_step_write_first(k_cache, v_cache, params, x, pos):
  """The control: write the new k, v at `pos` first, then attend over `<= pos`."""
  max_len = k_cache.shape[2]
  scale = 1.0 / math.sqrt(HEAD_DIM)
  for l in range(k_cache.shape[0]):
    q, k, v = _project(params, l, x)
    k_cache = lax.dynamic_update_slice(k_cache, k[None, :, None], (l, 0, pos, 0))
    v_cache = lax.dynamic_update_slice(v_cache, v[None, :, None], (l, 0, pos, 0))
    scores = jnp.einsum("hd,htd->ht", q, k_cache[l]) * scale
    scores = jnp.where(jnp.arange(max_len)[None, :] <= pos, scores, -jnp.inf)
    w = jax.nn.softmax(scores, axis=1)
    out = jnp.einsum("ht,htd->hd", w, v_cache[l])
    x = x + out.reshape(-1) @ params["wo"][l]
  return k_cache, v_cache, x


def decode_step_thd(k_cache, v_cache, params, x, pos):
  """`decode_step` with caches `[layers, max_len, heads, head_dim]`."""
  for l in range(k_cache.shape[0]):
    q, k, v = _project(params, l, x)
    out = _attend_old_and_new(q, k, v, k_cache[l], v_cache[l], pos, "thd")
    k_cache = lax.dynamic_update_slice(k_cache, k[None, None], (l, pos, 0, 0))
    v_cache = lax.dynamic_update_slice(v_cache, v[None, None], (l, pos, 0, 0))
    x = x + out.reshape(-1) @ params["wo"][l]
  return k_cache, v_cache, x


def decode_step_scan(k_cache, v_cache, params, x, pos):
  """`decode_step` as `lax.scan` over the layers, the caches scanned as `xs` and
  returned as `ys` (how layer-stacked models are usually written)."""
  def layer(x, inp):
    k_l, v_l, wq, wk, wv, wo = inp
    q, k, v = ((x @ w).reshape(HEADS, HEAD_DIM) for w in (wq, wk, wv))
    out = _attend_old_and_new(q, k, v, k_l, v_l, pos, "htd")
    k_l = lax.dynamic_update_slice(k_l, k[:, None], (0, pos, 0))
    v_l = lax.dynamic_update_slice(v_l, v[:, None], (0, pos, 0))
    return x + out.reshape(-1) @ wo, (k_l, v_l)
  x, (k_cache, v_cache) = lax.scan(
      layer, x, (k_cache, v_cache, params["wq"], params["wk"], params["wv"],
                 params["wo"]))
  return k_cache, v_cache, x


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def make_args(max_len: int = 2048, layers: int = LAYERS, layout: str = "htd") -> tuple:
  """`(k_cache, v_cache, params, x, pos)` with the first half of the cache filled."""
  cache = (layers, HEADS, max_len, HEAD_DIM)
  weight = (layers, D_MODEL, D_MODEL)
  sizes = [math.prod(cache)] * 2 + [math.prod(weight)] * 4 + [D_MODEL]
  # One draw, cut into pieces: a jitted function with one random call compiles fast.
  flat = jax.random.normal(jax.random.key(0), (sum(sizes),))
  pieces = jnp.split(flat, np.cumsum(sizes)[:-1])
  filled = (jnp.arange(max_len) < max_len // 2)[None, None, :, None]
  k_cache = jnp.where(filled, pieces[0].reshape(cache), 0.0)
  v_cache = jnp.where(filled, pieces[1].reshape(cache), 0.0)
  if layout == "thd":
    k_cache, v_cache = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
  wq, wk, wv, wo = (p.reshape(weight) / math.sqrt(D_MODEL) for p in pieces[2:6])
  params = {"wq": wq, "wk": wk, "wv": wv, "wo": wo}
  return k_cache, v_cache, params, pieces[6], jnp.int32(max_len // 2)


def next_args(out, args, max_len: int):
  """The next token: the updated caches, the layer output, the next position."""
  k_cache, v_cache, x = out
  return k_cache, v_cache, args[2], x, jnp.minimum(args[4] + 1, max_len - 1)


def main(argv=None, results: list | None = None) -> int:
  """Prints copies and time under jax.jit and inplace_jax.jit; 0 if values agree.

  `results`, if given, receives the measured dicts (see `compare`), for tests.
  """
  opts = parser(__doc__.splitlines()[0], 2048).parse_args(argv)
  layers = 2 if opts.size < 256 else LAYERS
  ok = True
  for fn, layout in ((decode_step, "htd"), (decode_step_write_first, "htd"),
                     (decode_step_thd, "thd"), (decode_step_scan, "htd")):
    dims = (layers, HEADS, opts.size, HEAD_DIM) if layout == "htd" else (
        layers, opts.size, HEADS, HEAD_DIM)
    r = compare(f"kv_cache.{fn.__name__}, caches f32[{','.join(map(str, dims))}] "
                "donated", fn, lambda layout=layout: make_args(opts.size, layers, layout),
                donate=(0, 1), next_args=functools.partial(next_args, max_len=opts.size),
                repeat=opts.repeat)
    print_result(r, results)
    ok &= r["equal"]
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
