"""Realistic steps that read a donated buffer before updating it.

* LU-style pivoting: a `fori_loop` that swaps rows `i` and `piv[i]` of an n x n
  matrix, at n = 500, 1000, 2000 (a copy here runs on every iteration); and, as an
  extra, a whole LU factorization (pivot search, swap, rank-1 update per step).
* A KV-cache decode step ([heads, time, dim] caches): attention over the old cache
  and the new token, then the new key and value are written at `pos` (and, for
  comparison, the common write-then-attend order); and the attend-then-write step
  as `lax.scan` over layer-stacked caches (`xs` in, updated `ys` out).
* A replay buffer: sample a batch of rows, then insert a batch at the ring pointer.
* A cond-masked update, in both branch orders (jax#16661: a no-op branch is free
  only in position 0).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ._harness import Case, pseudo_random

GROUP = "cases"


# --------------------------------------------------------------------------- pivoting


def row_swaps(a, piv):
  def body(i, a):
    p = piv[i]
    ri, rp = a[i], a[p]
    return a.at[i].set(rp).at[p].set(ri)
  return lax.fori_loop(0, a.shape[0], body, a)


def row_swaps_floor(a, piv):
  return a


def make_pivot(n):
  @jax.jit
  def make_args():
    a = (jnp.arange(n * n, dtype=jnp.float32).reshape(n, n) % 89.0) - 44.0
    i = jnp.arange(n, dtype=jnp.int32)
    piv = i + (i * 7919 + 13) % (n - i)     # LU pivots: piv[i] >= i
    return a, piv
  return make_args


def pivot_case(n: int, group: str = GROUP, name: str | None = None) -> Case:
  return Case(
      name=name or f"LU row swaps fori n={n}", group=group, fn=row_swaps,
      floor=row_swaps_floor, make_args=make_pivot(n), donate=(0,),
      thread=lambda out, args: (out, args[1]), params={"n": n})


def lu_factor(a):
  """LU with partial pivoting: pivot search, row swap, column scale, rank-1 update."""
  n = a.shape[0]
  rows = jnp.arange(n)
  def body(k, c):
    a, perm = c
    p = jnp.argmax(jnp.where(rows >= k, jnp.abs(a[:, k]), -1.0))
    rk, rp = a[k], a[p]
    a = a.at[k].set(rp).at[p].set(rk)
    qk, qp = perm[k], perm[p]
    perm = perm.at[k].set(qp).at[p].set(qk)
    l = jnp.where(rows > k, a[:, k] / a[k, k], 0.0)
    u = jnp.where(rows > k, a[k], 0.0)
    a = a - jnp.outer(l, u)
    a = a.at[:, k].set(jnp.where(rows > k, l, a[:, k]))
    return a, perm
  return lax.fori_loop(0, n, body, (a, rows.astype(jnp.int32)))


def make_lu(n):
  @jax.jit
  def make_args():
    return (pseudo_random((n, n), 1) + jnp.eye(n, dtype=jnp.float32),)
  return make_args


# --------------------------------------------------------------------------- KV cache


def _scores(q, k):
  return jnp.einsum("hd,htd->ht", q, k) / math.sqrt(q.shape[-1])


def kv_attend_then_write(k_cache, v_cache, pos, q, k_new, v_new):
  """Attends over the old cache plus the new token, then writes the token at `pos`."""
  t = k_cache.shape[1]
  s_old = jnp.where((jnp.arange(t) < pos)[None], _scores(q, k_cache), -jnp.inf)
  s_new = jnp.sum(q * k_new, -1, keepdims=True) / math.sqrt(q.shape[-1])
  w = jax.nn.softmax(jnp.concatenate([s_old, s_new], 1), axis=-1)
  out = jnp.einsum("ht,htd->hd", w[:, :t], v_cache) + w[:, t:] * v_new
  k_cache = lax.dynamic_update_slice(k_cache, k_new[:, None], (0, pos, 0))
  v_cache = lax.dynamic_update_slice(v_cache, v_new[:, None], (0, pos, 0))
  return k_cache, v_cache, (pos + 1) % t, out


def kv_write_then_attend(k_cache, v_cache, pos, q, k_new, v_new):
  """Writes the token, then attends over the updated cache (reads only the new one)."""
  t = k_cache.shape[1]
  k_cache = lax.dynamic_update_slice(k_cache, k_new[:, None], (0, pos, 0))
  v_cache = lax.dynamic_update_slice(v_cache, v_new[:, None], (0, pos, 0))
  s = jnp.where((jnp.arange(t) <= pos)[None], _scores(q, k_cache), -jnp.inf)
  out = jnp.einsum("ht,htd->hd", jax.nn.softmax(s, axis=-1), v_cache)
  return k_cache, v_cache, (pos + 1) % t, out


def kv_floor(k_cache, v_cache, pos, q, k_new, v_new):
  return k_cache, v_cache, (pos + 1) % k_cache.shape[1], q


def make_kv(h, t, d):
  @jax.jit
  def make_args():
    return (pseudo_random((h, t, d), 1), pseudo_random((h, t, d), 2),
            jnp.int32(t // 2), pseudo_random((h, d), 3), pseudo_random((h, d), 4),
            pseudo_random((h, d), 5))
  return make_args


def kv_scan_layers(k_stack, v_stack, pos, q, k_new, v_new):
  """`kv_attend_then_write` for every layer, as `lax.scan` over layer-stacked caches
  (`xs`) returning the updated stacks (`ys`)."""
  def step(carry, inp):
    k_l, v_l, q_l, kn_l, vn_l = inp
    k_l, v_l, _, out = kv_attend_then_write(k_l, v_l, pos, q_l, kn_l, vn_l)
    return carry, (k_l, v_l, out)
  _, (k_stack, v_stack, out) = lax.scan(step, None, (k_stack, v_stack, q, k_new, v_new))
  return k_stack, v_stack, (pos + 1) % k_stack.shape[2], out


def kv_scan_floor(k_stack, v_stack, pos, q, k_new, v_new):
  return k_stack, v_stack, (pos + 1) % k_stack.shape[2], q


def make_kv_stack(layers, h, t, d):
  @jax.jit
  def make_args():
    return (pseudo_random((layers, h, t, d), 1), pseudo_random((layers, h, t, d), 2),
            jnp.int32(t // 2), pseudo_random((layers, h, d), 3),
            pseudo_random((layers, h, d), 4), pseudo_random((layers, h, d), 5))
  return make_args


def kv_thread(out, args):
  return (out[0], out[1], out[2]) + tuple(args[3:])


# --------------------------------------------------------------------------- replay


def replay_sample_insert(buf, ptr, sample_idx, new):
  sample = buf[sample_idx]
  buf = lax.dynamic_update_slice(buf, new, (ptr, 0))
  return buf, (ptr + new.shape[0]) % buf.shape[0], sample


def replay_floor(buf, ptr, sample_idx, new):
  return buf, (ptr + new.shape[0]) % buf.shape[0], new


def make_replay(capacity, features, batch):
  @jax.jit
  def make_args():
    buf = (jnp.arange(capacity * features, dtype=jnp.float32)
           .reshape(capacity, features) % 101.0)
    idx = (jnp.arange(batch, dtype=jnp.int32) * 104729) % capacity
    new = jnp.full((batch, features), -1.0, jnp.float32)
    return buf, jnp.int32(batch * 3), idx, new
  return make_args


# --------------------------------------------------------------------------- cond


def cond_update_first(x, t, v):
  """`cond(p, update, identity)`: the identity sits in position 0 (free)."""
  x = lax.cond(t % 2 == 0, lambda x: x.at[1].set(v), lambda x: x, x)
  return x, t + 1


def cond_identity_first(x, t, v):
  """`cond(p, identity, update)`: the identity sits in position 1 (jax#16661)."""
  x = lax.cond(t % 2 == 1, lambda x: x, lambda x: x.at[1].set(v), x)
  return x, t + 1


def cond_floor(x, t, v):
  return x, t + 1


def make_cond(n, m):
  @jax.jit
  def make_args():
    x = jnp.arange(n * m, dtype=jnp.float32).reshape(n, m) % 13.0
    return x, jnp.int32(0), jnp.full((m,), 7.0, jnp.float32)
  return make_args


# --------------------------------------------------------------------------- cases


def cases(quick: bool) -> list[Case]:
  out = [pivot_case(n) for n in ((100, 200) if quick else (500, 1000, 2000))]
  n_lu = 64 if quick else 500
  out.append(Case(
      name=f"LU factor (pivoting) n={n_lu}", group=GROUP, fn=lu_factor,
      floor=lambda a: (a, jnp.arange(a.shape[0], dtype=jnp.int32)),
      make_args=make_lu(n_lu), donate=(0,), thread=lambda o, a: (o[0],),
      params={"n": n_lu, "note": "extra: full LU with rank-1 updates"}))
  h, t, d = (4, 512, 64) if quick else (8, 4096, 128)
  for name, fn in (("KV decode attend->write", kv_attend_then_write),
                   ("KV decode write->attend", kv_write_then_attend)):
    out.append(Case(
        name=name, group=GROUP, fn=fn, floor=kv_floor, make_args=make_kv(h, t, d),
        donate=(0, 1), thread=kv_thread, params={"cache": [h, t, d]}))
  layers, h, t, d = (2, 4, 256, 32) if quick else (4, 8, 1024, 64)
  out.append(Case(
      name="KV decode, scan over layers", group=GROUP, fn=kv_scan_layers,
      floor=kv_scan_floor, make_args=make_kv_stack(layers, h, t, d), donate=(0, 1),
      thread=kv_thread, params={"cache": [layers, h, t, d]}))
  cap, feat, batch = (16384, 32, 64) if quick else (262144, 32, 256)
  out.append(Case(
      name="replay sample->insert", group=GROUP, fn=replay_sample_insert,
      floor=replay_floor, make_args=make_replay(cap, feat, batch), donate=(0,),
      thread=lambda o, a: (o[0], o[1], a[2], a[3]),
      params={"capacity": cap, "features": feat, "batch": batch}))
  n, m = (256, 256) if quick else (2000, 2000)
  for name, fn in (("cond update,identity", cond_update_first),
                   ("cond identity,update", cond_identity_first)):
    out.append(Case(
        name=name, group=GROUP, fn=fn, floor=cond_floor, make_args=make_cond(n, m),
        donate=(0,), thread=lambda o, a: (o[0], o[1], a[2]),
        params={"shape": [n, m], "predicate": "alternates per call"}))
  return out


def targets(row) -> list[dict]:
  return []
