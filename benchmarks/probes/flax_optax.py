"""Probe programs in the styles of Flax (linen, NNX), Optax and JAX Refs (see `benchmarks/probes/__init__.py`)."""


import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx
from flax.training import train_state
from jax import lax

from inplace_jax.testing.realworld import RealProgram


# ============================================================ 1. linen CNN + TrainState
class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Conv(features=32, kernel_size=(3, 3))(x)
    x = nn.relu(x)
    x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    x = nn.Conv(features=64, kernel_size=(3, 3))(x)
    x = nn.relu(x)
    x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(features=256)(x)
    x = nn.relu(x)
    return nn.Dense(features=10)(x)


_CNN = CNN()


@jax.jit
def _cnn_init(key):
  params = _CNN.init(key, jnp.ones([1, 28, 28, 1]))["params"]
  return train_state.TrainState.create(apply_fn=_CNN.apply, params=params,
                                       tx=optax.sgd(0.01, momentum=0.9))


def _cnn_args():
  state = _cnn_init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (16, 28, 28, 1), jnp.float32)
  y = jnp.arange(16) % 10
  return state, (x, y)


def cnn_train_step(state, batch):
  x, y = batch

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, logits

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (loss, logits), grads = grad_fn(state.params)
  state = state.apply_gradients(grads=grads)
  acc = jnp.mean(jnp.argmax(logits, -1) == y)
  return state, {"loss": loss, "accuracy": acc}


def _state_next(args, out):
  return (out[0],) + tuple(args[1:])


# ============================================================ 2. NNX Dropout + Rngs
class DropoutMLP(nnx.Module):
  def __init__(self, din, dh, dout, *, rngs: nnx.Rngs):
    self.l1 = nnx.Linear(din, dh, rngs=rngs)
    self.drop = nnx.Dropout(0.2, rngs=rngs)
    self.l2 = nnx.Linear(dh, dh, rngs=rngs)
    self.l3 = nnx.Linear(dh, dout, rngs=rngs)

  def __call__(self, x):
    x = self.drop(nnx.relu(self.l1(x)))
    x = self.drop(nnx.relu(self.l2(x)))
    return self.l3(x)


@nnx.jit
def _create_dropout():
  model = DropoutMLP(128, 512, 10, rngs=nnx.Rngs(params=0, dropout=1))
  optimizer = nnx.Optimizer(model, optax.adamw(3e-4, weight_decay=1e-2), wrt=nnx.Param)
  return model, optimizer


def _dropout_args():
  graphdef, state = nnx.split(_create_dropout())
  x = jax.random.normal(jax.random.key(5), (32, 128), jnp.float32)
  y = jnp.argmax(x[:, :10], axis=-1)
  return graphdef, state, x, y


def nnx_dropout_step(graphdef, state, x, y):
  model, optimizer = nnx.merge(graphdef, state)
  model.train()

  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss, nnx.state((model, optimizer))


def _nnx_next(args, out):
  graphdef = args[0]
  _, state = out
  return (graphdef, state) + tuple(args[2:])


# ============================================================ 3. NNX vmap-created, scan-applied layers
class Block(nnx.Module):
  def __init__(self, d, *, rngs: nnx.Rngs):
    self.linear = nnx.Linear(d, d, rngs=rngs)
    self.norm = nnx.LayerNorm(d, rngs=rngs)

  def __call__(self, x):
    return x + nnx.gelu(self.linear(self.norm(x)))


class StackedMLP(nnx.Module):
  def __init__(self, d, n_layers, *, rngs: nnx.Rngs):
    @nnx.split_rngs(splits=n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create_block(rngs: nnx.Rngs):
      return Block(d, rngs=rngs)

    self.blocks = create_block(rngs)
    self.head = nnx.Linear(d, 10, rngs=rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(x, block):
      return block(x)

    x = forward(x, self.blocks)
    return self.head(x)


@nnx.jit
def _create_stacked():
  model = StackedMLP(256, 4, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  return model, optimizer


def _stacked_args():
  graphdef, state = nnx.split(_create_stacked())
  x = jax.random.normal(jax.random.key(2), (32, 256), jnp.float32)
  y = jnp.argmax(x[:, :10], axis=-1)
  return graphdef, state, x, y


def nnx_scan_layers_step(graphdef, state, x, y):
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss, nnx.state((model, optimizer))


# ============================================================ 4. linen transformer block + nn.remat
# + optax.chain(clip_by_global_norm, adamw(warmup_cosine_decay_schedule))
class TransformerBlock(nn.Module):
  d: int
  heads: int

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    h = nn.SelfAttention(num_heads=self.heads, qkv_features=self.d)(h)
    x = x + h
    h = nn.LayerNorm()(x)
    h = nn.Dense(4 * self.d)(h)
    h = nn.gelu(h)
    x = x + nn.Dense(self.d)(h)
    return x


class TinyLM(nn.Module):
  vocab: int = 512
  d: int = 128
  heads: int = 4
  layers: int = 2

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab, self.d)(tokens)
    RematBlock = nn.remat(TransformerBlock)
    for _ in range(self.layers):
      x = RematBlock(self.d, self.heads)(x)
    x = nn.LayerNorm()(x)
    return nn.Dense(self.vocab)(x)


_LM = TinyLM()
_LM_SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-3, warmup_steps=2,
                                                  decay_steps=100)
_LM_TX = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(_LM_SCHEDULE, weight_decay=0.1))


@jax.jit
def _lm_init(key):
  params = _LM.init(key, jnp.ones((1, 32), jnp.int32))["params"]
  return train_state.TrainState.create(apply_fn=_LM.apply, params=params, tx=_LM_TX)


def _lm_args():
  state = _lm_init(jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (8, 33), 0, 512)
  return state, tokens


def lm_train_step(state, tokens):
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def loss_fn(params):
    logits = state.apply_fn({"params": params}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  state = state.apply_gradients(grads=grads)
  return state, loss, optax.global_norm(grads)


# ============================================================ 5. linen BatchNorm + params EMA,
# returning the old params as well
class BNNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Dense(512)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x)
    x = nn.Dense(512)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x)
    return nn.Dense(10)(x)


_BN = BNNet()


class EMATrainState(train_state.TrainState):
  batch_stats: Any = None
  ema_params: Any = None


@jax.jit
def _bn_init(key):
  variables = _BN.init(key, jnp.ones((1, 128)), train=False)
  return EMATrainState.create(apply_fn=_BN.apply, params=variables["params"],
                              batch_stats=variables["batch_stats"],
                              ema_params=variables["params"],
                              tx=optax.sgd(0.05, momentum=0.9, nesterov=True))


def _bn_args():
  state = _bn_init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(3), (64, 128), jnp.float32)
  y = jnp.argmax(x[:, :10], axis=-1)
  return state, x, y


def bn_ema_step(state, x, y):
  old_params = state.params

  def loss_fn(params):
    logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                     x, train=True, mutable=["batch_stats"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, updates

  (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  state = state.replace(batch_stats=updates["batch_stats"])
  ema = optax.incremental_update(state.params, state.ema_params, step_size=0.01)
  state = state.replace(ema_params=ema)
  return state, old_params, loss


# ============================================================ optax params-dict helpers
_SHAPES = {"w1": (256, 512), "w2": (512, 512), "w3": (512, 10)}


@jax.jit
def _init_params(key):
  keys = jax.random.split(key, len(_SHAPES))
  params = {}
  for k, (name, (fi, fo)) in zip(keys, _SHAPES.items()):
    params[name] = jax.random.normal(k, (fi, fo), jnp.float32) / jnp.sqrt(float(fi))
    params["b" + name[1:]] = jnp.zeros((fo,), jnp.float32)
  return params


def _mlp(params, x):
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  h = jax.nn.relu(h @ params["w2"] + params["b2"])
  return h @ params["w3"] + params["b3"]


def _loss(params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(_mlp(params, x), y).mean()


@jax.jit
def _batch():
  x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
  return x, jnp.argmax(x[:, :10], axis=-1)


def _optax_args(tx, wrap=lambda p: p):
  init = jax.jit(tx.init)

  def make_args():
    params = wrap(_init_params(jax.random.key(0)))
    x, y = _batch()
    return params, init(params), x, y
  return make_args


def _optax_next(args, out):
  params, opt_state = out[0], out[1]
  return (params, opt_state) + tuple(args[2:])


def _optax_step(tx):
  def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, loss
  return step


# ============================================================ 6. inject_hyperparams, lr changed by hand
_INJECT = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=1e-4)


def inject_step(params, opt_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  # reduce-on-plateau-ish: user lowers lr in the state
  opt_state.hyperparams["learning_rate"] = jnp.where(
      loss > 1.0, opt_state.hyperparams["learning_rate"],
      opt_state.hyperparams["learning_rate"] * 0.5)
  updates, opt_state = _INJECT.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, loss


# ============================================================ 7. multi_transform + masked weight decay
def _labels(params):
  return {k: ("frozen" if k == "w3" else ("bias" if k.startswith("b") else "weight"))
          for k in params}


_MULTI = optax.multi_transform(
    {"weight": optax.chain(optax.add_decayed_weights(1e-4,
                                                     mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
                           optax.adam(1e-3)),
     "bias": optax.sgd(1e-2),
     "frozen": optax.set_to_zero()},
    _labels)


# ============================================================ 8. lookahead
_LOOKAHEAD = optax.lookahead(optax.adam(1e-3), sync_period=2, slow_step_size=0.5)


def lookahead_step(params, opt_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params.fast, x, y)
  updates, opt_state = _LOOKAHEAD.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return params, opt_state, loss


# ============================================================ 9. optax.ema tracker of params (separate state)
_SGD_NESTEROV = optax.sgd(1e-2, momentum=0.9, nesterov=True)
_EMA = optax.ema(0.99, debias=True)


def _ema_args():
  params = _init_params(jax.random.key(0))
  x, y = _batch()
  return params, jax.jit(_SGD_NESTEROV.init)(params), jax.jit(_EMA.init)(params), x, y


def ema_tracker_step(params, opt_state, ema_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, opt_state = _SGD_NESTEROV.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  ema_params, ema_state = _EMA.update(params, ema_state)
  eval_loss = _loss(ema_params, x, y)
  return params, opt_state, ema_state, loss, eval_loss


def _ema_next(args, out):
  return (out[0], out[1], out[2]) + tuple(args[3:])


# ============================================================ 10. contrib: schedule_free_adamw
_SF = optax.contrib.schedule_free_adamw(1e-3, warmup_steps=2)


def sf_step(params, opt_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, opt_state = _SF.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  eval_params = optax.contrib.schedule_free_eval_params(opt_state, params)
  return params, opt_state, loss, _loss(eval_params, x, y)


# ============================================================ 11. contrib muon
_MUON = optax.contrib.muon(1e-3)


# ============================================================ 12. mixed precision: bf16 params,
# f32 master copy, int step counter, dynamic loss scale; returns old and new bf16 params
_MP_TX = optax.adam(1e-3)


def _mp_args():
  master = _init_params(jax.random.key(0))
  params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), master)
  opt_state = jax.jit(_MP_TX.init)(master)
  x, y = _batch()
  state = {"params": params, "master": master, "opt_state": opt_state,
           "step": jnp.zeros((), jnp.int32), "loss_scale": jnp.float32(2.0 ** 10)}
  return state, x.astype(jnp.bfloat16), y


def mixed_precision_step(state, x, y):
  def scaled_loss(p):
    logits = _mlp(p, x).astype(jnp.float32)
    l = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return l * state["loss_scale"].astype(jnp.bfloat16), l

  (_, loss), grads = jax.value_and_grad(scaled_loss, has_aux=True)(state["params"])
  grads = jax.tree.map(lambda g: g.astype(jnp.float32) / state["loss_scale"], grads)
  finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
  updates, new_opt = _MP_TX.update(grads, state["opt_state"], state["master"])
  new_master = optax.apply_updates(state["master"], updates)
  master = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_master, state["master"])
  opt_state = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new_opt, state["opt_state"])
  new_state = {"params": jax.tree.map(lambda p: p.astype(jnp.bfloat16), master),
               "master": master, "opt_state": opt_state,
               "step": state["step"] + 1,
               "loss_scale": jnp.where(finite, state["loss_scale"], state["loss_scale"] / 2)}
  return new_state, state["params"], loss


# ============================================================ 13. Refs: KV cache written through a Ref
_KV_B, _KV_L, _KV_H, _KV_D = 4, 128, 4, 64   # 512 KiB each for k and v


def _kv_args():
  k = jax.random.normal(jax.random.key(0), (_KV_B, _KV_L, _KV_H, _KV_D), jnp.float32)
  cache = {"k": jnp.zeros_like(k), "v": jnp.zeros_like(k), "index": jnp.int32(5)}
  w = jax.random.normal(jax.random.key(1), (3, _KV_H * _KV_D, _KV_H * _KV_D), jnp.float32) * 0.05
  x = jax.random.normal(jax.random.key(2), (_KV_B, _KV_H * _KV_D), jnp.float32)
  return w, cache, x


def ref_kv_decode_step(w, cache, x):
  k_ref = jax.new_ref(cache["k"])
  v_ref = jax.new_ref(cache["v"])
  idx = cache["index"]
  q = (x @ w[0]).reshape(_KV_B, _KV_H, _KV_D)
  k = (x @ w[1]).reshape(_KV_B, 1, _KV_H, _KV_D)
  v = (x @ w[2]).reshape(_KV_B, 1, _KV_H, _KV_D)
  k_ref[:, pl_ds(idx, 1)] = k
  v_ref[:, pl_ds(idx, 1)] = v
  keys, values = k_ref[...], v_ref[...]
  s = jnp.einsum("bhd,blhd->bhl", q, keys) / jnp.sqrt(_KV_D)
  mask = jnp.arange(_KV_L) <= idx
  s = jnp.where(mask[None, None], s, -1e9)
  p = jax.nn.softmax(s, -1)
  y = jnp.einsum("bhl,blhd->bhd", p, values).reshape(_KV_B, -1)
  new_cache = {"k": jax.ref.freeze(k_ref), "v": jax.ref.freeze(v_ref), "index": idx + 1}
  return y, new_cache


def pl_ds(start, size):
  # dynamic slice index for a Ref (jax.ref indexing takes pl.ds-style slices)
  from jax.experimental import pallas as pl
  return pl.ds(start, size)


def _kv_next(args, out):
  w, _, _ = args
  y, cache = out
  return w, cache, y


# ============================================================ 14. Refs: SGD-momentum update through Refs
def ref_sgd_step(params, momentum, x, y):
  p_refs = jax.tree.map(jax.new_ref, params)
  m_refs = jax.tree.map(jax.new_ref, momentum)
  loss, grads = jax.value_and_grad(_loss)(jax.tree.map(lambda r: r[...], p_refs), x, y)

  def upd(p, m, g):
    m[...] = 0.9 * m[...] + g
    p[...] -= 1e-2 * m[...]
  jax.tree.map(upd, p_refs, m_refs, grads)
  return jax.tree.map(jax.ref.freeze, p_refs), jax.tree.map(jax.ref.freeze, m_refs), loss


def _ref_sgd_args():
  params = _init_params(jax.random.key(0))
  x, y = _batch()
  return params, jax.tree.map(jnp.zeros_like, params), x, y


# ============================================================ 15. Refs: scan loop writing a buffer through a Ref
def ref_scan_accumulate(buf, xs):
  """A rollout buffer of (T, B, D) filled row by row inside lax.scan through a Ref,
  and a running-sum stats Ref updated with addupdate."""
  buf_ref = jax.new_ref(buf)
  stats = jax.new_ref(jnp.zeros(buf.shape[1:], buf.dtype))

  def body(h, t):
    h = jnp.tanh(h * 0.9 + xs[t])
    buf_ref[t] = h
    jax.ref.addupdate(stats, ..., h)
    return h, None

  h, _ = lax.scan(body, jnp.zeros(buf.shape[1:], buf.dtype), jnp.arange(buf.shape[0]))
  return jax.ref.freeze(buf_ref), jax.ref.freeze(stats), h


def _ref_scan_args():
  buf = jnp.zeros((64, 16, 256), jnp.float32)   # 1 MiB
  xs = jax.random.normal(jax.random.key(0), (64, 16, 256), jnp.float32)
  return buf, xs


def _ref_scan_next(args, out):
  return out[0], args[1] + 1.0


PROGRAMS = [
    RealProgram("flax_linen_cnn_trainstate", "flax",
                "linen CNN, TrainState(sgd momentum).apply_gradients, state donated",
                cnn_train_step, _cnn_args, (0,), _state_next),
    RealProgram("flax_nnx_dropout_rngs", "flax",
                "NNX MLP with Dropout + Rngs(params, dropout), adamw; state (with rng counts) donated",
                nnx_dropout_step, _dropout_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("flax_nnx_scan_layers", "flax",
                "NNX nnx.vmap-created stacked blocks applied with nnx.scan, adam; state donated",
                nnx_scan_layers_step, _stacked_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("flax_linen_remat_transformer", "flax",
                "linen 2-block transformer LM with nn.remat, chain(clip_by_global_norm, "
                "adamw(warmup_cosine)), TrainState donated",
                lm_train_step, _lm_args, (0,), _state_next),
    RealProgram("flax_linen_bn_ema_oldparams", "flax",
                "linen BatchNorm TrainState with batch_stats + ema_params, sgd nesterov; "
                "returns old params too; state donated",
                bn_ema_step, _bn_args, (0,), _state_next),
    RealProgram("optax_inject_hyperparams", "optax",
                "inject_hyperparams(adamw), lr modified in state inside step; params+opt_state donated",
                inject_step, _optax_args(_INJECT), (0, 1), _optax_next),
    RealProgram("optax_multi_transform_masked", "optax",
                "multi_transform(weight: chain(masked add_decayed_weights, adam), bias: sgd, "
                "frozen: set_to_zero); params+opt_state donated",
                _optax_step(_MULTI), _optax_args(_MULTI), (0, 1), _optax_next),
    RealProgram("optax_lookahead", "optax",
                "optax.lookahead(adam, sync_period=2) on LookaheadParams; params+opt_state donated",
                lookahead_step, _optax_args(_LOOKAHEAD, lambda p: optax.LookaheadParams(p, jax.tree.map(jnp.copy, p))),
                (0, 1), _optax_next, steps=4),
    RealProgram("optax_ema_nesterov", "optax",
                "sgd nesterov + separate optax.ema(debias) tracker of params, eval with EMA; "
                "params, opt_state, ema_state donated",
                ema_tracker_step, _ema_args, (0, 1, 2), _ema_next),
    RealProgram("optax_schedule_free", "optax",
                "contrib.schedule_free_adamw + schedule_free_eval_params; params+opt_state donated",
                sf_step, _optax_args(_SF), (0, 1), _optax_next),
    RealProgram("optax_muon", "optax",
                "contrib.muon (Newton-Schulz orthogonalisation); params+opt_state donated",
                _optax_step(_MUON), _optax_args(_MUON), (0, 1), _optax_next),
    RealProgram("optax_mixed_precision", "optax",
                "bf16 params + f32 master + adam + int step + dynamic loss scale with "
                "jnp.where skip; returns old bf16 params; state dict donated",
                mixed_precision_step, _mp_args, (0,), _state_next),
    RealProgram("flax_ref_kv_decode", "flax",
                "KV cache dict donated, written through jax.new_ref + pl.ds index, freeze",
                ref_kv_decode_step, _kv_args, (1,), _kv_next),
    RealProgram("optax_ref_sgd_momentum", "optax",
                "params and momentum donated, wrapped in Refs, updated with ref[...] -=",
                ref_sgd_step, _ref_sgd_args, (0, 1), _optax_next),
    RealProgram("flax_ref_scan_rollout", "flax",
                "rollout buffer donated, written per row through a Ref in lax.scan + addupdate stats",
                ref_scan_accumulate, _ref_scan_args, (0,), _ref_scan_next),
]


# ############################################################ second batch: loops, conds, refs
# ============================================================ 16. many train steps in one jit: lax.scan
# over batches with the TrainState as carry (the "scan over steps" idiom)
_SCAN_TX = optax.adam(1e-3)


def _scan_train_args():
  params = _init_params(jax.random.key(0))
  opt_state = jax.jit(_SCAN_TX.init)(params)
  xs = jax.random.normal(jax.random.key(4), (4, 32, 256), jnp.float32)
  ys = jnp.argmax(xs[..., :10], -1)
  return params, opt_state, xs, ys


def scan_many_steps(params, opt_state, xs, ys):
  def one(carry, batch):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(_loss)(params, *batch)
    updates, opt_state = _SCAN_TX.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  (params, opt_state), losses = lax.scan(one, (params, opt_state), (xs, ys))
  return params, opt_state, losses


# ============================================================ 17. gradient accumulation with fori_loop
# over microbatches, grads accumulator carried, then one sgd-momentum update
_ACC_TX = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2, momentum=0.9))


def _acc_args():
  params, _, xs, ys = _scan_train_args()
  return params, jax.jit(_ACC_TX.init)(params), xs, ys


def grad_accum_step(params, opt_state, xs, ys):
  def body(i, acc):
    g = jax.grad(_loss)(params, xs[i], ys[i])
    return jax.tree.map(jnp.add, acc, g)

  grads = lax.fori_loop(0, xs.shape[0], body, jax.tree.map(jnp.zeros_like, params))
  grads = jax.tree.map(lambda g: g / xs.shape[0], grads)
  updates, opt_state = _ACC_TX.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, optax.global_norm(grads)


# ============================================================ 18. sparse embedding update (word2vec-ish):
# table.at[ids].add(-lr * grad rows), plus Adagrad-style accumulator rows
def _emb_args():
  table = jax.random.normal(jax.random.key(0), (4096, 64), jnp.float32) * 0.1   # 1 MiB
  acc = jnp.full((4096, 64), 0.1, jnp.float32)
  ctx = jax.random.randint(jax.random.key(1), (128,), 0, 4096)
  tgt = jax.random.randint(jax.random.key(2), (128,), 0, 4096)
  return table, acc, ctx, tgt


def sparse_embedding_step(table, acc, ctx, tgt):
  def loss(rows_c, rows_t):
    logits = jnp.sum(rows_c * rows_t, -1)
    return -jnp.mean(jax.nn.log_sigmoid(logits))
  rc, rt = table[ctx], table[tgt]
  l, (gc, gt) = jax.value_and_grad(loss, argnums=(0, 1))(rc, rt)
  acc = acc.at[ctx].add(gc * gc).at[tgt].add(gt * gt)
  table = table.at[ctx].add(-0.1 * gc / jnp.sqrt(acc[ctx]))
  table = table.at[tgt].add(-0.1 * gt / jnp.sqrt(acc[tgt]))
  return table, acc, l


def _emb_next(args, out):
  return out[0], out[1], args[3], args[2]


# ============================================================ 19. params history ring buffer (for SWA /
# checkpoint averaging): history.at[step % K].set(params), plus running average
_HIST_K = 4
_HIST_TX = optax.sgd(1e-2)


def _hist_args():
  params = _init_params(jax.random.key(0))
  hist = jax.tree.map(lambda p: jnp.zeros((_HIST_K,) + p.shape, p.dtype), params)
  x, y = _batch()
  return {"params": params, "hist": hist, "step": jnp.int32(0)}, x, y


def history_step(state, x, y):
  loss, grads = jax.value_and_grad(_loss)(state["params"], x, y)
  updates, _ = _HIST_TX.update(grads, _HIST_TX.init(state["params"]))
  params = optax.apply_updates(state["params"], updates)
  slot = state["step"] % _HIST_K
  hist = jax.tree.map(lambda h, p: h.at[slot].set(p), state["hist"], params)
  swa = jax.tree.map(lambda h: h.mean(0), hist)
  return {"params": params, "hist": hist, "step": state["step"] + 1}, swa, loss


# ============================================================ 20. NNX model: KV cache read + EMA of params
# updated in the same step (self-distillation style: teacher = EMA of student)
class EMAStudent(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(256, 512, rngs=rngs)
    self.l2 = nnx.Linear(512, 256, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.gelu(self.l1(x)))


@nnx.jit
def _create_ema_pair():
  student = EMAStudent(nnx.Rngs(0))
  teacher = EMAStudent(nnx.Rngs(1))
  opt = nnx.Optimizer(student, optax.adam(1e-3), wrt=nnx.Param)
  return student, teacher, opt


def _ema_pair_args():
  graphdef, state = nnx.split(_create_ema_pair())
  x = jax.random.normal(jax.random.key(7), (32, 256), jnp.float32)
  return graphdef, state, x


def nnx_ema_teacher_step(graphdef, state, x):
  student, teacher, opt = nnx.merge(graphdef, state)
  target = jax.lax.stop_gradient(teacher(x))

  def loss_fn(student):
    return jnp.mean((student(x) - target) ** 2)

  loss, grads = nnx.value_and_grad(loss_fn)(student)
  opt.update(student, grads)
  s_params = nnx.state(student, nnx.Param)
  t_params = nnx.state(teacher, nnx.Param)
  new_t = jax.tree.map(lambda t, s: 0.99 * t + 0.01 * s, t_params, s_params)
  nnx.update(teacher, new_t)
  return loss, nnx.state((student, teacher, opt))


# ============================================================ 21. linen nn.scan over layers, train step
class ScanLayer(nn.Module):
  d: int

  @nn.compact
  def __call__(self, x, _):
    h = nn.LayerNorm()(x)
    return x + nn.Dense(self.d)(nn.gelu(nn.Dense(self.d)(h))), None


class ScanMLP(nn.Module):
  d: int = 256
  n: int = 4

  @nn.compact
  def __call__(self, x):
    layers = nn.scan(nn.remat(ScanLayer), variable_axes={"params": 0},
                     split_rngs={"params": True}, length=self.n)
    x, _ = layers(self.d, name="layers")(x, None)
    return nn.Dense(10)(x)


_SCANMLP = ScanMLP()
_SCANMLP_TX = optax.chain(optax.clip(1.0), optax.lion(1e-4))


@jax.jit
def _scanmlp_init(key):
  params = _SCANMLP.init(key, jnp.ones((1, 256)))["params"]
  return train_state.TrainState.create(apply_fn=_SCANMLP.apply, params=params, tx=_SCANMLP_TX)


def _scanmlp_args():
  x = jax.random.normal(jax.random.key(9), (32, 256), jnp.float32)
  return _scanmlp_init(jax.random.key(0)), x, jnp.argmax(x[:, :10], -1)


def scanmlp_step(state, x, y):
  def loss_fn(p):
    return optax.softmax_cross_entropy_with_integer_labels(state.apply_fn({"params": p}, x), y).mean()
  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), loss


# ============================================================ 22. Refs inside fori_loop + cond: ring-buffer
# KV cache with dynamic position, writes guarded by a lax.cond on a 'valid' flag
def ref_cond_ring_step(cache, pos, xs, valid):
  c_ref = jax.new_ref(cache)

  def body(i, p):
    def write(_):
      c_ref[pl_ds(p % cache.shape[0], 1)] = xs[i][None] * 2.0
      return p + 1
    return lax.cond(valid[i], write, lambda _: p, None)

  pos = lax.fori_loop(0, xs.shape[0], body, pos)
  out = jax.ref.freeze(c_ref)
  return out, pos, out.sum(0)


def _ref_ring_args():
  cache = jnp.zeros((256, 1024), jnp.float32)   # 1 MiB
  xs = jax.random.normal(jax.random.key(0), (8, 1024), jnp.float32)
  valid = jnp.array([True, False, True, True, False, True, True, True])
  return cache, jnp.int32(250), xs, valid


def _ref_ring_next(args, out):
  return out[0], out[1], args[2] + 1.0, ~args[3]


# ============================================================ 23. optax.contrib.reduce_on_plateau chained
_RoP = optax.chain(optax.adam(1e-3),
                   optax.contrib.reduce_on_plateau(patience=1, factor=0.5, accumulation_size=1))


def rop_step(params, opt_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, opt_state = _RoP.update(grads, opt_state, params, value=loss)
  return optax.apply_updates(params, updates), opt_state, loss


# ============================================================ 24. optax.contrib.sam (sharpness-aware)
_SAM = optax.contrib.sam(optax.sgd(1e-2), optax.sgd(5e-2), sync_period=2, opaque_mode=True)


def sam_step(params, opt_state, x, y):
  grad_fn = jax.grad(_loss)
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, opt_state = _SAM.update(grads, opt_state, params,
                                   grad_fn=lambda p, _: grad_fn(p, x, y))
  return optax.apply_updates(params, updates), opt_state, loss


# ============================================================ 25. NNX with Variable refs (var_defaults(ref=True))
def nnx_ref_vars_step(graphdef, state, x, y):
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  # the update itself on Ref-backed Variables (in-place writes into Refs)
  model, optimizer = nnx.with_vars((model, optimizer), ref=True)
  optimizer.update(model, grads)
  model, optimizer = nnx.with_vars((model, optimizer), ref=False)
  return loss, nnx.state((model, optimizer))


@nnx.jit
def _create_bn2():
  model = BNClassifierRef(rngs=nnx.Rngs(0))
  model.train()
  return model, nnx.Optimizer(model, optax.sgd(1e-2, momentum=0.9), wrt=nnx.Param)


class BNClassifierRef(nnx.Module):
  def __init__(self, *, rngs):
    self.l1 = nnx.Linear(128, 512, rngs=rngs)
    self.bn = nnx.BatchNorm(512, rngs=rngs)
    self.l2 = nnx.Linear(512, 10, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.bn(self.l1(x))))


def _bn2_args():
  graphdef, state = nnx.split(_create_bn2())
  x = jax.random.normal(jax.random.key(3), (32, 128), jnp.float32)
  return graphdef, state, x, jnp.argmax(x[:, :10], -1)


PROGRAMS += [
    RealProgram("optax_scan_many_steps", "optax",
                "4 adam steps in one jit via lax.scan with (params, opt_state) carry; donated",
                scan_many_steps, _scan_train_args, (0, 1), _optax_next),
    RealProgram("optax_grad_accum_fori", "optax",
                "fori_loop grad accumulation over 4 microbatches + chain(clip_by_global_norm, "
                "sgd momentum); params+opt_state donated",
                grad_accum_step, _acc_args, (0, 1), _optax_next),
    RealProgram("optax_sparse_embedding_adagrad", "optax",
                "word2vec-style table.at[ids].add sparse rows + adagrad accumulator rows; "
                "table+acc donated",
                sparse_embedding_step, _emb_args, (0, 1), _emb_next),
    RealProgram("optax_params_history_ring", "optax",
                "sgd + params history ring buffer hist.at[step%4].set(params) + SWA mean; "
                "state dict donated",
                history_step, _hist_args, (0,), _state_next),
    RealProgram("flax_nnx_ema_teacher", "flax",
                "NNX student trained against EMA teacher, teacher updated via nnx.update; "
                "(student, teacher, opt) state donated",
                nnx_ema_teacher_step, _ema_pair_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("flax_linen_scan_remat_train", "flax",
                "linen nn.scan(nn.remat(layer)) 4 layers, chain(clip, lion), TrainState donated",
                scanmlp_step, _scanmlp_args, (0,), _state_next),
    RealProgram("flax_ref_cond_ring", "flax",
                "ring-buffer cache written through a Ref inside fori_loop + lax.cond; cache+pos donated",
                ref_cond_ring_step, _ref_ring_args, (0, 1), _ref_ring_next),
    RealProgram("optax_reduce_on_plateau", "optax",
                "chain(adam, contrib.reduce_on_plateau); params+opt_state donated",
                rop_step, _optax_args(_RoP), (0, 1), _optax_next),
    RealProgram("optax_sam", "optax",
                "contrib.sam(sgd, sgd, sync_period=2, opaque_mode); params+opt_state donated",
                sam_step, _optax_args(_SAM), (0, 1), _optax_next, steps=4),
    RealProgram("flax_nnx_ref_vars", "flax",
                "NNX BatchNorm model + Optimizer(sgd momentum) merged under var_defaults(ref=True)",
                nnx_ref_vars_step, _bn2_args, (1,), _nnx_next, static_argnums=(0,)),
]


# ############################################################ third batch: adversarial-ish
# ============================================================ 26. DQN: online + target params,
# optax.periodic_update (hard) and incremental_update (soft), step counter
_DQN_TX = optax.adam(1e-3)


def _dqn_args():
  online = _init_params(jax.random.key(0))
  target = jax.tree.map(jnp.copy, online)
  x, y = _batch()
  return {"online": online, "target": target, "opt": jax.jit(_DQN_TX.init)(online),
          "step": jnp.int32(1)}, x, y


def dqn_step(state, x, y):
  def td_loss(p):
    q = _mlp(p, x)
    q_next = _mlp(state["target"], x * 0.5)
    tgt = jax.lax.stop_gradient(jax.nn.one_hot(y, 10) + 0.99 * q_next.max(-1, keepdims=True))
    return jnp.mean((q - tgt) ** 2)
  loss, grads = jax.value_and_grad(td_loss)(state["online"])
  updates, opt = _DQN_TX.update(grads, state["opt"], state["online"])
  online = optax.apply_updates(state["online"], updates)
  target = optax.periodic_update(online, state["target"], state["step"], 2)
  soft = optax.incremental_update(online, target, 0.005)
  return {"online": online, "target": soft, "opt": opt, "step": state["step"] + 1}, loss


# ============================================================ 27. whole greedy generation in one jit:
# lax.while_loop over tokens with the linen decode cache as carry, early stop
class GenLM(nn.Module):
  vocab: int = 256
  d: int = 128

  @nn.compact
  def __call__(self, tok):
    x = nn.Embed(self.vocab, self.d)(tok)
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=self.d, decode=True)(h)
    x = x + nn.Dense(self.d)(nn.gelu(nn.Dense(self.d)(x)))
    return nn.Dense(self.vocab)(x)


_GEN = GenLM()
_GEN_INIT = jax.jit(_GEN.init)


def _gen_args():
  v = _GEN_INIT(jax.random.key(0), jnp.ones((4, 256), jnp.int32))
  return v["params"], v["cache"], jnp.zeros((4, 1), jnp.int32), jnp.int32(12)


def generate(params, cache, tok, n):
  def cond(c):
    i, _, tok, _, done = c
    return (i < n) & ~done

  def body(c):
    i, cache, tok, out, done = c
    logits, mut = _GEN.apply({"params": params, "cache": cache}, tok, mutable=["cache"])
    nxt = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
    out = out.at[:, i].set(nxt[:, 0])
    return i + 1, mut["cache"], nxt, out, jnp.all(nxt == 0)

  _, cache, tok, out, _ = lax.while_loop(
      cond, body, (jnp.int32(0), cache, tok, jnp.zeros((4, 16), jnp.int32), jnp.bool_(False)))
  return cache, tok, out


def _gen_next(args, out):
  return args[0], out[0], out[1], args[3]


# ============================================================ 28. returns old and new cache (a copy
# is required), bf16 cache with dynamic_update_slice
def _cache_both_args():
  cache = jnp.zeros((8, 512, 128), jnp.bfloat16)   # 1 MiB
  new = jax.random.normal(jax.random.key(0), (8, 1, 128)).astype(jnp.bfloat16)
  return cache, new, jnp.int32(3)


def cache_old_and_new(cache, new, idx):
  updated = lax.dynamic_update_slice(cache, new, (0, idx, 0))
  return updated, cache, idx + 1


def _cache_both_next(args, out):
  return out[0], args[1] * 1.5, out[2]


# ============================================================ 29. outputs in a different order than
# inputs, frozen params passed through unchanged, same-shape buffers
def _swap_args():
  p = _init_params(jax.random.key(0))
  frozen = {"emb": jax.random.normal(jax.random.key(5), (512, 512))}
  x, y = _batch()
  return p, jax.jit(_ADAMW.init)(p), frozen, x, y


_ADAMW = optax.adamw(1e-3)


def swapped_outputs_step(params, opt_state, frozen, x, y):
  def l(p):
    h = jax.nn.relu(x @ p["w1"] + p["b1"]) @ frozen["emb"]
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    return optax.softmax_cross_entropy_with_integer_labels(h @ p["w3"] + p["b3"], y).mean()
  loss, grads = jax.value_and_grad(l)(params)
  updates, opt_state = _ADAMW.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  return loss, frozen, opt_state, params


def _swap_next(args, out):
  loss, frozen, opt_state, params = out
  return params, opt_state, frozen, args[3], args[4]


# ============================================================ 30. ping-pong double buffer swap
# (e.g. Jacobi iteration / Lookahead-like), state {"cur", "prev"} donated
def _pingpong_args():
  a = jax.random.normal(jax.random.key(0), (512, 512))
  return {"cur": a, "prev": jnp.zeros_like(a)}, jnp.float32(0.25)


def pingpong_step(state, w):
  cur = state["cur"]
  new = cur + w * (jnp.roll(cur, 1, 0) + jnp.roll(cur, -1, 0) + jnp.roll(cur, 1, 1)
                   + jnp.roll(cur, -1, 1) - 4 * cur)
  return {"cur": new, "prev": cur}, jnp.abs(new - cur).max()


# ============================================================ 31. per-row max-norm renormalisation of a
# donated embedding table in a fori_loop (rows .at[i].set), after a sparse sgd update
def _renorm_args():
  t = jax.random.normal(jax.random.key(0), (2048, 128), jnp.float32)  # 1 MiB
  ids = jax.random.randint(jax.random.key(1), (64,), 0, 2048)
  return t, ids


def renorm_step(table, ids):
  table = table.at[ids].add(-0.01 * table[ids])
  def body(i, t):
    row = t[ids[i]]
    n = jnp.linalg.norm(row)
    return t.at[ids[i]].set(jnp.where(n > 1.0, row / n, row))
  table = lax.fori_loop(0, ids.shape[0], body, table)
  return table, table[ids].sum()


def _renorm_next(args, out):
  return out[0], (args[1] * 7 + 3) % 2048


# ============================================================ 32. custom_vjp + jax.checkpoint policy +
# user optimization_barrier in a train step
@jax.custom_vjp
def _clip_grad_relu(x):
  return jax.nn.relu(x)


def _cgr_fwd(x):
  return jax.nn.relu(x), x


def _cgr_bwd(x, g):
  return (jnp.clip(g * (x > 0), -1.0, 1.0),)


_clip_grad_relu.defvjp(_cgr_fwd, _cgr_bwd)


def custom_vjp_step(params, opt_state, x, y):
  @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  def block(p, x):
    h = _clip_grad_relu(x @ p["w1"] + p["b1"])
    return _clip_grad_relu(h @ p["w2"] + p["b2"])

  def l(p):
    h = block(p, x)
    return optax.softmax_cross_entropy_with_integer_labels(h @ p["w3"] + p["b3"], y).mean()
  loss, grads = jax.value_and_grad(l)(params)
  grads, params = lax.optimization_barrier((grads, params))
  updates, opt_state = _ADAM2.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


_ADAM2 = optax.adam(1e-3)


# ============================================================ 33. Refs in while_loop with early exit,
# old value read from the Ref before overwriting (returned)
def ref_while_step(buf, thresh):
  r = jax.new_ref(buf)
  old_row0 = r[0]

  def cond(c):
    i, s = c
    return (i < buf.shape[0]) & (s < thresh)

  def body(c):
    i, s = c
    row = r[i]
    r[i] = row * 0.5 + 1.0
    return i + 1, s + row.sum()

  i, s = lax.while_loop(cond, body, (jnp.int32(0), jnp.float32(0)))
  return jax.ref.freeze(r), old_row0, i, s


def _ref_while_args():
  return jax.random.uniform(jax.random.key(0), (256, 1024)), jnp.float32(5e4)


def _ref_while_next(args, out):
  return out[0], args[1]


PROGRAMS += [
    RealProgram("optax_dqn_target_periodic", "optax",
                "DQN online/target params, adam, optax.periodic_update(period 2) + "
                "incremental_update; state dict donated",
                dqn_step, _dqn_args, (0,), _state_next, steps=4),
    RealProgram("flax_linen_generate_while", "flax",
                "greedy generation of up to 12 tokens in one jit: lax.while_loop, linen "
                "decode cache carried; cache donated",
                generate, _gen_args, (1,), _gen_next),
    RealProgram("flax_cache_old_and_new", "flax",
                "bf16 KV cache dynamic_update_slice, returns both new and old cache "
                "(copy required); cache donated",
                cache_old_and_new, _cache_both_args, (0,), _cache_both_next),
    RealProgram("optax_swapped_outputs_frozen", "optax",
                "adamw step returning (loss, frozen, opt_state, params) in a different order "
                "from inputs, frozen 512x512 passed through; params, opt_state, frozen donated",
                swapped_outputs_step, _swap_args, (0, 1, 2), _swap_next),
    RealProgram("flax_pingpong_swap", "flax",
                "double buffer {'cur','prev'}: new cur from stencil, prev <- old cur; state donated",
                pingpong_step, _pingpong_args, (0,), _state_next),
    RealProgram("optax_embedding_renorm_fori", "optax",
                "sparse sgd on embedding rows + fori_loop per-row max-norm .at[i].set; table donated",
                renorm_step, _renorm_args, (0,), _renorm_next),
    RealProgram("optax_custom_vjp_checkpoint", "optax",
                "custom_vjp clipped relu + jax.checkpoint(dots policy) + user optimization_barrier, "
                "adam; params+opt_state donated",
                custom_vjp_step, _optax_args(_ADAM2), (0, 1), _optax_next),
    RealProgram("flax_ref_while_early_exit", "flax",
                "Ref over a donated buffer updated row-wise in while_loop with early exit; "
                "old row 0 returned",
                ref_while_step, _ref_while_args, (0,), _ref_while_next),
]


# ############################################################ fourth batch
# ============================================================ 34. nnx.scan over training steps: model and
# optimizer carried through nnx.scan (several steps per jit call)
@nnx.jit
def _create_small_mlp():
  model = MLPSmall(nnx.Rngs(0))
  return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)


class MLPSmall(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(128, 512, rngs=rngs)
    self.l2 = nnx.Linear(512, 10, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.l1(x)))


def _nnx_scan_steps_args():
  graphdef, state = nnx.split(_create_small_mlp())
  xs = jax.random.normal(jax.random.key(1), (3, 32, 128))
  return graphdef, state, xs, jnp.argmax(xs[..., :10], -1)


def nnx_scan_steps(graphdef, state, xs, ys):
  model, optimizer = nnx.merge(graphdef, state)

  @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
  def train(mo, x, y):
    model, optimizer = mo
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return (model, optimizer), loss

  _, losses = train((model, optimizer), xs, ys)
  return losses, nnx.state((model, optimizer))


# ============================================================ 35. nnx.cond: update only on even steps
def nnx_cond_step(graphdef, state, x, y, step):
  model, optimizer = nnx.merge(graphdef, state)

  def do_update(model, optimizer):
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  def skip(model, optimizer):
    return jnp.float32(0)

  loss = nnx.cond(step % 2 == 0, do_update, skip, model, optimizer)
  return loss, nnx.state((model, optimizer))


def _nnx_cond_args():
  graphdef, state = nnx.split(_create_small_mlp())
  x = jax.random.normal(jax.random.key(1), (32, 128))
  return graphdef, state, x, jnp.argmax(x[:, :10], -1), jnp.int32(0)


def _nnx_cond_next(args, out):
  return args[0], out[1], args[2], args[3], args[4] + 1


# ============================================================ 36. sliding-window KV cache: roll + set last
def _window_args():
  k = jnp.zeros((4, 256, 8, 32), jnp.float32)   # 1 MiB
  return {"k": k, "v": jnp.zeros_like(k)}, jax.random.normal(jax.random.key(0), (4, 8, 32))


def sliding_window_step(cache, new):
  k = jnp.roll(cache["k"], -1, axis=1).at[:, -1].set(new)
  v = jnp.roll(cache["v"], -1, axis=1).at[:, -1].set(new * 2)
  att = jax.nn.softmax(jnp.einsum("bhd,blhd->bhl", new, k), -1)
  return {"k": k, "v": v}, jnp.einsum("bhl,blhd->bhd", att, v)


def _window_next(args, out):
  return out[0], out[1]


# ============================================================ 37. one-hot jnp.where cache update (TPU-style)
def onehot_cache_step(cache, new, pos):
  mask = (jnp.arange(cache.shape[1]) == pos)[None, :, None]
  cache = jnp.where(mask, new[:, None, :], cache)
  return cache, cache.sum(1), pos + 1


def _onehot_args():
  return jnp.zeros((16, 512, 64), jnp.float32), jax.random.normal(jax.random.key(0), (16, 64)), jnp.int32(0)


def _onehot_next(args, out):
  return out[0], out[1] * 0.01, out[2]


# ============================================================ 38. scatter flavours: mode='drop',
# unique_indices, indices_are_sorted; counts table (int32) + values (f32)
def scatter_modes_step(table, counts, ids, vals):
  table = table.at[ids].add(vals, mode="drop")
  sids = jnp.sort(jnp.unique(ids, size=ids.shape[0], fill_value=table.shape[0] + 5))
  table = table.at[sids].multiply(0.5, mode="drop", unique_indices=True, indices_are_sorted=True)
  counts = counts.at[ids].add(1, mode="drop")
  return table, counts, table.mean()


def _scatter_args():
  ids = jax.random.randint(jax.random.key(0), (256,), 0, 4200)   # some out of range
  return (jnp.zeros((4096, 64), jnp.float32), jnp.zeros((4096,), jnp.int32), ids,
          jax.random.normal(jax.random.key(1), (256, 64)))


def _scatter_next(args, out):
  return out[0], out[1], (args[2] * 5 + 1) % 4200, args[3]


# ============================================================ 39. nnx.remat transformer-ish block + Optimizer
class RematNNX(nnx.Module):
  def __init__(self, rngs):
    self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=128, qkv_features=128,
                                       decode=False, rngs=rngs)
    self.n1 = nnx.LayerNorm(128, rngs=rngs)
    self.n2 = nnx.LayerNorm(128, rngs=rngs)
    self.up = nnx.Linear(128, 512, rngs=rngs)
    self.down = nnx.Linear(512, 128, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.n1(x))
    @nnx.remat
    def mlp(up, down, h):
      return down(nnx.gelu(up(h)))
    return x + mlp(self.up, self.down, self.n2(x))


@nnx.jit
def _create_remat_nnx():
  model = RematNNX(nnx.Rngs(0))
  return model, nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0),
                                                 optax.adamw(1e-3)), wrt=nnx.Param)


def _remat_nnx_args():
  graphdef, state = nnx.split(_create_remat_nnx())
  x = jax.random.normal(jax.random.key(1), (4, 32, 128))
  return graphdef, state, x


def remat_nnx_step(graphdef, state, x):
  model, optimizer = nnx.merge(graphdef, state)
  loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
  optimizer.update(model, grads)
  return loss, nnx.state((model, optimizer))


# ============================================================ 40. Ref closed over in lax.switch branches
def ref_switch_step(buf, which, row):
  r = jax.new_ref(buf)

  def b0(_):
    r[pl_ds(row, 1)] = r[pl_ds(row, 1)] + 1.0
    return jnp.float32(0)

  def b1(_):
    r[...] = r[...] * 0.5
    return jnp.float32(1)

  def b2(_):
    return r[pl_ds(row, 1)].sum()

  v = lax.switch(which, (b0, b1, b2), None)
  return jax.ref.freeze(r), v


def _ref_switch_args():
  return jax.random.normal(jax.random.key(0), (512, 512)), jnp.int32(0), jnp.int32(7)


def _ref_switch_next(args, out):
  return out[0], (args[1] + 1) % 3, (args[2] * 3) % 512


# ============================================================ 41. linen Dropout with PRNG key in the
# TrainState (typed key donated, split every step)
class DropNet(nn.Module):
  @nn.compact
  def __call__(self, x, train):
    x = nn.Dense(512)(x)
    x = nn.Dropout(0.3, deterministic=not train)(nn.relu(x))
    return nn.Dense(10)(x)


_DROPNET = DropNet()


class KeyState(train_state.TrainState):
  key: Any = None


@jax.jit
def _dropnet_init(key):
  params = _DROPNET.init(key, jnp.ones((1, 256)), train=False)["params"]
  return KeyState.create(apply_fn=_DROPNET.apply, params=params, tx=optax.rmsprop(1e-3),
                         key=jax.random.key(42))


def _dropnet_args():
  x, y = _batch()
  return _dropnet_init(jax.random.key(0)), x, y


def dropnet_step(state, x, y):
  key, sub = jax.random.split(state.key)

  def loss_fn(p):
    logits = state.apply_fn({"params": p}, x, train=True, rngs={"dropout": sub})
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads).replace(key=key), loss


PROGRAMS += [
    RealProgram("flax_nnx_scan_train_steps", "flax",
                "nnx.scan over 3 training steps with (model, optimizer) as nnx.Carry; state donated",
                nnx_scan_steps, _nnx_scan_steps_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("flax_nnx_cond_update", "flax",
                "nnx.cond(step % 2 == 0, update, skip, model, optimizer); state donated",
                nnx_cond_step, _nnx_cond_args, (1,), _nnx_cond_next, static_argnums=(0,), steps=4),
    RealProgram("flax_sliding_window_cache", "flax",
                "sliding-window KV cache: jnp.roll(-1).at[:, -1].set(new); cache dict donated",
                sliding_window_step, _window_args, (0,), _window_next),
    RealProgram("flax_onehot_where_cache", "flax",
                "cache = jnp.where(arange == pos, new, cache) one-hot update; cache donated",
                onehot_cache_step, _onehot_args, (0,), _onehot_next),
    RealProgram("optax_scatter_modes", "optax",
                "table.at[ids].add(mode='drop') + .multiply(unique_indices, sorted) + int32 "
                "counts; table+counts donated",
                scatter_modes_step, _scatter_args, (0, 1), _scatter_next),
    RealProgram("flax_nnx_remat_block", "flax",
                "NNX attention block with nnx.remat MLP, Optimizer(chain(clip, adamw)); state donated",
                remat_nnx_step, _remat_nnx_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("flax_ref_switch", "flax",
                "Ref over a donated 1 MiB buffer closed over in lax.switch branches "
                "(row add / scale all / read)",
                ref_switch_step, _ref_switch_args, (0,), _ref_switch_next),
    RealProgram("flax_linen_dropout_key_state", "flax",
                "linen Dropout, PRNG key in TrainState split each step, rmsprop; state donated",
                dropnet_step, _dropnet_args, (0,), _state_next),
]


# ############################################################ fifth batch: leaf-type edge cases
# ============================================================ 42. weak-typed python scalars in the donated
# state, the new params returned twice, and a donated buffer passed through unchanged
_SGD = optax.sgd(1e-2)


def _weak_args():
  p = _init_params(jax.random.key(0))
  x, y = _batch()
  return {"params": p, "lr_scale": 1.0, "count": 0,
          "frozen": jnp.ones((256, 256))}, x, y


def weak_dup_step(state, x, y):
  loss, grads = jax.value_and_grad(_loss)(state["params"], x, y)
  params = jax.tree.map(lambda p, g: p - 1e-2 * state["lr_scale"] * g, state["params"], grads)
  new = {"params": params, "lr_scale": state["lr_scale"] * 0.9, "count": state["count"] + 1,
         "frozen": state["frozen"]}
  return new, params, loss


# ============================================================ 43. complex params with
# optax.contrib.split_real_and_imaginary(adam)
_CPLX_TX = optax.contrib.split_real_and_imaginary(optax.adam(1e-3))


def _cplx_args():
  k1, k2 = jax.random.split(jax.random.key(0))
  w = (jax.random.normal(k1, (256, 256)) + 1j * jax.random.normal(k2, (256, 256))).astype(jnp.complex64) * 0.05
  params = {"w": w, "b": jnp.zeros((256,), jnp.complex64)}
  x = jax.random.normal(jax.random.key(3), (32, 256)).astype(jnp.complex64)
  return params, jax.jit(_CPLX_TX.init)(params), x


def complex_step(params, opt_state, x):
  def l(p):
    h = x @ p["w"] + p["b"]
    return jnp.mean(jnp.abs(h - x) ** 2)
  loss, grads = jax.value_and_grad(l)(params)
  grads = jax.tree.map(jnp.conj, grads)
  updates, opt_state = _CPLX_TX.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def _cplx_next(args, out):
  return out[0], out[1], args[2]


# ============================================================ 44. int8 quantised KV cache with f32
# per-position scales, bool valid mask, uint32 counter, float16 stats
def _q_args():
  cache = {"k": jnp.zeros((8, 512, 128), jnp.int8),          # 512 KiB
           "scale": jnp.ones((8, 512), jnp.float32),
           "valid": jnp.zeros((8, 512), jnp.bool_),
           "n": jnp.uint32(0),
           "stats": jnp.zeros((8, 128), jnp.float16)}
  return cache, jax.random.normal(jax.random.key(0), (8, 128))


def quant_cache_step(cache, new):
  pos = (cache["n"] % 512).astype(jnp.int32)
  s = jnp.max(jnp.abs(new), -1) / 127.0 + 1e-8
  q = jnp.round(new / s[:, None]).astype(jnp.int8)
  k = lax.dynamic_update_slice(cache["k"], q[:, None, :], (0, pos, 0))
  scale = cache["scale"].at[:, pos].set(s)
  valid = cache["valid"].at[:, pos].set(True)
  deq = k.astype(jnp.float32) * scale[..., None]
  att = jax.nn.softmax(jnp.where(valid, jnp.einsum("bd,bld->bl", new, deq), -1e9), -1)
  out = jnp.einsum("bl,bld->bd", att, deq)
  stats = (cache["stats"].astype(jnp.float32) * 0.9 + 0.1 * out).astype(jnp.float16)
  return {"k": k, "scale": scale, "valid": valid, "n": cache["n"] + jnp.uint32(1),
          "stats": stats}, out


# ============================================================ 45. zero-size and empty leaves in the donated
# state (optax EmptyState, None, a (0, 128) buffer)
_CHAIN_EMPTY = optax.chain(optax.identity(), optax.scale_by_adam(), optax.scale(-1e-3))


def _empty_args():
  params = _init_params(jax.random.key(0))
  params["unused"] = jnp.zeros((0, 128), jnp.float32)
  x, y = _batch()
  return params, jax.jit(_CHAIN_EMPTY.init)(params), {"none": None, "empty": jnp.zeros((0,))}, x, y


def empty_leaves_step(params, opt_state, extra, x, y):
  loss, grads = jax.value_and_grad(lambda p: _loss(p, x, y))(params)
  updates, opt_state = _CHAIN_EMPTY.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, extra, loss


def _empty_next(args, out):
  return out[0], out[1], out[2], args[3], args[4]


PROGRAMS += [
    RealProgram("optax_weak_scalars_dup_output", "optax",
                "state with python float/int leaves (weak types), params returned twice, "
                "a frozen 256 KiB buffer passed through; state donated",
                weak_dup_step, _weak_args, (0,), _state_next),
    RealProgram("optax_complex_split_real_imag", "optax",
                "complex64 params, contrib.split_real_and_imaginary(adam); params+opt_state donated",
                complex_step, _cplx_args, (0, 1), _cplx_next),
    RealProgram("flax_int8_quant_cache", "flax",
                "int8 KV cache + f32 scales + bool valid + uint32 counter + f16 stats; cache donated",
                quant_cache_step, _q_args, (0,), _window_next),
    RealProgram("optax_empty_leaves", "optax",
                "chain(identity, scale_by_adam, scale) with EmptyState, a (0,128) param, None and "
                "(0,) leaves; params, opt_state, extra donated",
                empty_leaves_step, _empty_args, (0, 1, 2), _empty_next),
]


# ############################################################ sixth batch: old values read late
# ============================================================ 46. logging of update ratio ||dp||/||p|| and
# of old moments after the update (reads of old params/opt_state after new ones exist)
_LOG_TX = optax.adam(1e-3)


def logging_step(params, opt_state, x, y):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, new_opt = _LOG_TX.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  ratio = jax.tree.map(lambda n, o: jnp.linalg.norm(n - o) / (jnp.linalg.norm(o) + 1e-8),
                       new_params, params)
  mu_change = jax.tree.map(lambda n, o: jnp.abs(n - o).max(), new_opt[0].mu, opt_state[0].mu)
  return new_params, new_opt, loss, ratio, mu_change, updates


# ============================================================ 47. FedProx-style local training: fori_loop of
# SGD steps from the donated global params with a proximal term to them (closure read of the
# donated input inside the loop, while the carry starts from it)
def fedprox_step(params, x, y):
  def body(i, w):
    def l(w):
      prox = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(params)))
      return _loss(w, x * (1.0 + 0.1 * i), y) + 0.05 * prox
    g = jax.grad(l)(w)
    return jax.tree.map(lambda a, b: a - 1e-2 * b, w, g)
  w = lax.fori_loop(0, 3, body, params)
  delta = jax.tree.map(lambda a, b: a - b, w, params)
  return w, delta


def _fedprox_args():
  x, y = _batch()
  return _init_params(jax.random.key(0)), x, y


def _fedprox_next(args, out):
  return (out[0],) + tuple(args[1:])


# ============================================================ 48. Reptile meta-update: inner adam in scan,
# then params + eps * (inner - params)
_INNER = optax.adam(1e-2)


def reptile_step(params, xs, ys):
  def inner(carry, b):
    w, s = carry
    g = jax.grad(_loss)(w, *b)
    u, s = _INNER.update(g, s, w)
    return (optax.apply_updates(w, u), s), None
  (w, _), _ = lax.scan(inner, (params, _INNER.init(params)), (xs, ys))
  return jax.tree.map(lambda p, q: p + 0.5 * (q - p), params, w)


def _reptile_args():
  params, _, xs, ys = _scan_train_args()
  return params, xs[:3], ys[:3]


def _reptile_next(args, out):
  return (out,) + tuple(args[1:])


# ============================================================ 49. GAN: discriminator then generator update
# in one step, G's loss uses D's NEW params; both param sets and opt states donated
_G_TX, _D_TX = optax.adam(2e-4, b1=0.5), optax.adam(2e-4, b1=0.5)


def _gan_init(key):
  k1, k2, k3, k4 = jax.random.split(key, 4)
  g = {"w1": jax.random.normal(k1, (64, 512)) * 0.05, "w2": jax.random.normal(k2, (512, 256)) * 0.05}
  d = {"w1": jax.random.normal(k3, (256, 512)) * 0.05, "w2": jax.random.normal(k4, (512, 1)) * 0.05}
  return g, d


def _gan_args():
  g, d = jax.jit(_gan_init)(jax.random.key(0))
  real = jax.random.normal(jax.random.key(1), (32, 256))
  z = jax.random.normal(jax.random.key(2), (32, 64))
  return {"g": g, "d": d, "g_opt": jax.jit(_G_TX.init)(g), "d_opt": jax.jit(_D_TX.init)(d)}, real, z


def _G(g, z):
  return jnp.tanh(jax.nn.relu(z @ g["w1"]) @ g["w2"])


def _D(d, x):
  return (jax.nn.leaky_relu(x @ d["w1"]) @ d["w2"])[:, 0]


def gan_step(state, real, z):
  g, d = state["g"], state["d"]

  def d_loss(d):
    fake = _G(g, z)
    return (optax.sigmoid_binary_cross_entropy(_D(d, real), jnp.ones(32)).mean()
            + optax.sigmoid_binary_cross_entropy(_D(d, fake), jnp.zeros(32)).mean())
  dl, dg = jax.value_and_grad(d_loss)(d)
  du, d_opt = _D_TX.update(dg, state["d_opt"], d)
  d = optax.apply_updates(d, du)

  def g_loss(g):
    return optax.sigmoid_binary_cross_entropy(_D(d, _G(g, z)), jnp.ones(32)).mean()
  gl, gg = jax.value_and_grad(g_loss)(g)
  gu, g_opt = _G_TX.update(gg, state["g_opt"], g)
  g = optax.apply_updates(g, gu)
  return {"g": g, "d": d, "g_opt": g_opt, "d_opt": d_opt}, dl, gl


PROGRAMS += [
    RealProgram("optax_update_ratio_logging", "optax",
                "adam step that also returns ||new-old||/||old|| per leaf, max |mu_new - mu_old| "
                "and the updates; params+opt_state donated",
                logging_step, _optax_args(_LOG_TX), (0, 1), _optax_next),
    RealProgram("optax_fedprox_local", "optax",
                "FedProx local fori_loop SGD from the donated global params with proximal "
                "term to them, returns new params and delta; params donated",
                fedprox_step, _fedprox_args, (0,), _fedprox_next),
    RealProgram("optax_reptile", "optax",
                "Reptile: inner adam over 3 batches in lax.scan, params + 0.5*(inner - params); "
                "params donated",
                reptile_step, _reptile_args, (0,), _reptile_next),
    RealProgram("optax_gan_two_optimizers", "optax",
                "GAN: D adam update, then G adam update through the new D; state dict donated",
                gan_step, _gan_args, (0,), _state_next),
]


# ############################################################ seventh batch: donation that cannot alias
# ============================================================ 50. naive growing KV cache via concatenate
# (a new shape each step: a new signature, donation unusable)
def growing_cache_step(cache, new):
  k = jnp.concatenate([cache["k"], new[:, None]], axis=1)
  v = jnp.concatenate([cache["v"], 2 * new[:, None]], axis=1)
  att = jax.nn.softmax(jnp.einsum("bd,bld->bl", new, k), -1)
  return {"k": k, "v": v}, jnp.einsum("bl,bld->bd", att, v)


def _growing_args():
  k = jax.random.normal(jax.random.key(0), (8, 255, 128))
  return {"k": k, "v": k * 0.5}, jax.random.normal(jax.random.key(1), (8, 128))


# ============================================================ 51. params cast for inference: f32 donated,
# bf16 out (donation unusable), plus one same-dtype output (a layer norm scale kept f32)
def cast_for_inference(params):
  out = {k: (v.astype(jnp.bfloat16) if v.ndim == 2 else v) for k, v in params.items()}
  return out


def _cast_args():
  return (_init_params(jax.random.key(0)),)


def _cast_next(args, out):
  return (jax.tree.map(lambda a: a.astype(jnp.float32), out),)


# ============================================================ 52. KV cache layout change BLHD -> BHLD on
# write-back (square dims so shapes match: L == H*?); transposed output of the same shape
def transpose_cache_step(cache, new, pos):
  # cache (B, 64, 64, D): (B, L, H, D) in, (B, H, L, D) out -- same shape, transposed layout
  c = lax.dynamic_update_slice(cache, new[:, None], (0, pos, 0, 0))
  return jnp.swapaxes(c, 1, 2), pos + 1


def _transpose_args():
  return (jnp.zeros((4, 64, 64, 64), jnp.float32), jax.random.normal(jax.random.key(0), (4, 64, 64)),
          jnp.int32(0))


def _transpose_next(args, out):
  return jnp.swapaxes(out[0], 1, 2), args[1] + 1.0, out[1]


PROGRAMS += [
    RealProgram("flax_growing_concat_cache", "flax",
                "naive KV cache grown by jnp.concatenate each step (new shape each call); "
                "cache donated (unusable)",
                growing_cache_step, _growing_args, (0,), _window_next),
    RealProgram("flax_cast_params_bf16", "flax",
                "cast f32 params dict to bf16 for inference (2-D) keeping 1-D f32; params donated",
                cast_for_inference, _cast_args, (0,), _cast_next),
    RealProgram("flax_transpose_cache_layout", "flax",
                "dynamic_update_slice into (B,L,H,D) cache then swapaxes(1,2) to (B,H,L,D) "
                "(same shape); cache donated",
                transpose_cache_step, _transpose_args, (0,), _transpose_next),
]


# ============================================================ 53. cache returned in another shape (same size):
# (B, L, H*D) in, updated, returned as (B, L, H, D) -- XLA-level donation by size
def reshape_cache_step(cache, new, pos):
  c = lax.dynamic_update_slice(cache, new[:, None, :], (0, pos, 0))
  return c.reshape(c.shape[0], c.shape[1], 8, -1), pos + 1


def _reshape_args():
  return jnp.zeros((4, 256, 512), jnp.float32), jax.random.normal(jax.random.key(0), (4, 512)), jnp.int32(3)


def _reshape_next(args, out):
  return out[0].reshape(args[0].shape), args[1] * 1.1, out[1]


# ============================================================ 54. ravel_pytree: donated structured params,
# flat f32 vector output for an ES / L-BFGS style update, and unravelled params back
from jax.flatten_util import ravel_pytree


def flat_update_step(params, x, y):
  flat, unravel = ravel_pytree(params)
  g, _ = ravel_pytree(jax.grad(_loss)(params, x, y))
  flat = flat - 1e-2 * g
  return unravel(flat), flat


def _flat_next(args, out):
  return (out[0],) + tuple(args[1:])


PROGRAMS += [
    RealProgram("flax_reshape_cache_return", "flax",
                "(B,L,H*D) cache dynamic_update_slice, returned reshaped (B,L,H,D); cache donated",
                reshape_cache_step, _reshape_args, (0,), _reshape_next),
    RealProgram("optax_ravel_pytree_flat", "optax",
                "ravel_pytree params, flat SGD, returns unravelled params and the flat vector; "
                "params donated",
                flat_update_step, _fedprox_args, (0,), _flat_next),
]


# ============================================================ 55. combined: sequenced adam step + a cache
# returned reshaped (XLA-level donation by size) + a bf16 cast output
_COMB_TX = optax.adam(1e-3)


def combined_step(params, opt_state, cache, x, y, pos):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  updates, opt_state = _COMB_TX.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  c = lax.dynamic_update_slice(cache, x[:4, None, :], (0, pos, 0))
  return params, opt_state, c.reshape(4, 128, 8, 32), params["w2"].astype(jnp.bfloat16), loss


def _comb_args():
  params, opt_state, x, y = _optax_args(_COMB_TX)()
  return params, opt_state, jnp.zeros((4, 128, 256)), x, y, jnp.int32(2)


def _comb_next(args, out):
  return out[0], out[1], out[2].reshape(4, 128, 256), args[3], args[4], args[5] + 1


PROGRAMS += [
    RealProgram("optax_combined_sequenced_xla_donor", "optax",
                "adam step + (B,L,H*D) cache returned reshaped + bf16 cast of w2; params, "
                "opt_state, cache donated",
                combined_step, _comb_args, (0, 1, 2), _comb_next),
]


# ============================================================ 56. train step with jax.debug.callback logging
# (ordered) of the loss and grad norm, and a lax.cond-guarded debug.print
_LOGGED = []


def _log(step, loss, gnorm):
  _LOGGED.append((int(step), float(loss), float(gnorm)))


_DBG_TX = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))


def debug_callback_step(params, opt_state, x, y, step):
  loss, grads = jax.value_and_grad(_loss)(params, x, y)
  gnorm = optax.global_norm(grads)
  jax.debug.callback(_log, step, loss, gnorm, ordered=True)
  updates, opt_state = _DBG_TX.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  lax.cond(gnorm > 1e6, lambda: jax.debug.print("huge grad {g}", g=gnorm), lambda: None)
  return params, opt_state, loss, step + 1


def _dbg_args():
  p, s, x, y = _optax_args(_DBG_TX)()
  return p, s, x, y, jnp.int32(0)


def _dbg_next(args, out):
  return out[0], out[1], args[2], args[3], out[3]


# ============================================================ 57. io_callback reading a host-side value into
# the step (e.g. a learning-rate from a host scheduler), then in-place update
from jax.experimental import io_callback


def _host_lr(step):
  return np.float32(1e-2 / (1.0 + int(step)))


import numpy as np


def io_callback_step(params, x, y, step):
  lr = io_callback(_host_lr, jax.ShapeDtypeStruct((), jnp.float32), step, ordered=True)
  g = jax.grad(_loss)(params, x, y)
  return jax.tree.map(lambda p, g: p - lr * g, params, g), step + 1


def _io_args():
  x, y = _batch()
  return _init_params(jax.random.key(0)), x, y, jnp.int32(0)


def _io_next(args, out):
  return out[0], args[1], args[2], out[1]


PROGRAMS += [
    RealProgram("optax_debug_callback_logging", "optax",
                "chain(clip, adam) step with ordered jax.debug.callback logging + cond debug.print; "
                "params+opt_state donated",
                debug_callback_step, _dbg_args, (0, 1), _dbg_next),
    RealProgram("optax_io_callback_lr", "optax",
                "SGD with lr from an ordered io_callback to a host scheduler; params donated",
                io_callback_step, _io_args, (0,), _io_next),
]


# ============================================================ 58. linen nn.vmap ensemble of MLP heads
class Head(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(10)(nn.relu(nn.Dense(256)(x)))


class Ensemble(nn.Module):
  @nn.compact
  def __call__(self, x):
    heads = nn.vmap(Head, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=None, out_axes=0, axis_size=8)
    return heads(name="heads")(x)


_ENS = Ensemble()


@jax.jit
def _ens_init(key):
  params = _ENS.init(key, jnp.ones((1, 256)))["params"]
  return train_state.TrainState.create(apply_fn=_ENS.apply, params=params,
                                       tx=optax.adamw(1e-3))


def _ens_args():
  x, y = _batch()
  return _ens_init(jax.random.key(0)), x, y


def ens_step(state, x, y):
  def l(p):
    logits = state.apply_fn({"params": p}, x)   # (8, B, 10)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y[None]).mean()
  loss, grads = jax.value_and_grad(l)(state.params)
  return state.apply_gradients(grads=grads), loss


# ============================================================ 59. nnx.vmap over (model, optimizer): an
# ensemble of NNX models each with its own optimizer state
class Member(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(256, 256, rngs=rngs)
    self.l2 = nnx.Linear(256, 10, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.l1(x)))


@nnx.jit
def _create_members():
  @nnx.split_rngs(splits=4)
  @nnx.vmap(in_axes=0, out_axes=0)
  def create(rngs):
    m = Member(rngs)
    return m, nnx.Optimizer(m, optax.adam(1e-3), wrt=nnx.Param)
  return create(nnx.Rngs(0))


def _members_args():
  graphdef, state = nnx.split(_create_members())
  x, y = _batch()
  return graphdef, state, x, y


def nnx_vmap_members_step(graphdef, state, x, y):
  members, optimizers = nnx.merge(graphdef, state)

  @nnx.vmap(in_axes=(0, 0, None, None), out_axes=0)
  def train(m, opt, x, y):
    loss, grads = nnx.value_and_grad(
        lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(m)
    opt.update(m, grads)
    return loss

  losses = train(members, optimizers, x, y)
  return losses, nnx.state((members, optimizers))


# ============================================================ 60. optax.contrib.prodigy
_PRODIGY = optax.contrib.prodigy(1.0)


PROGRAMS += [
    RealProgram("flax_linen_vmap_ensemble", "flax",
                "linen nn.vmap(Head, axis_size=8) ensemble, adamw TrainState donated",
                ens_step, _ens_args, (0,), _state_next),
    RealProgram("flax_nnx_vmap_members", "flax",
                "nnx.vmap over 4 (model, Optimizer(adam)) members; state donated",
                nnx_vmap_members_step, _members_args, (1,), _nnx_next, static_argnums=(0,)),
    RealProgram("optax_prodigy", "optax",
                "contrib.prodigy(1.0); params+opt_state donated",
                _optax_step(_PRODIGY), _optax_args(_PRODIGY), (0, 1), _optax_next),
]
