"""Flax programs: NNX and Linen autoregressive decoding with a KV cache, and an NNX
optimizer step, written as the Flax docs write them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx

from . import RealProgram

# Decoding sizes: a KV cache of BATCH x MAX_LEN x FEATURES f32 per key and per value.
BATCH = 4
MAX_LEN = 256
FEATURES = 256
HEADS = 8


# --------------------------------------------------------------------------- NNX decode
# The NNX attention docs: `nnx.MultiHeadAttention(..., decode=True)`, `init_cache`, then
# one token per call. For jax.jit with donation, the NNX "performance" guide splits the
# model into a graphdef (static) and a state (donated), and merges/splits inside.


class NNXDecoder(nnx.Module):
  def __init__(self, features: int, heads: int, *, rngs: nnx.Rngs):
    self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=features,
                                       qkv_features=features, decode=True, rngs=rngs)
    self.norm = nnx.LayerNorm(features, rngs=rngs)
    self.mlp = nnx.Linear(features, features, rngs=rngs)

  def __call__(self, x):
    x = x + self.attn(self.norm(x))
    return x + nnx.gelu(self.mlp(x))


@nnx.jit   # creation under nnx.jit, as the NNX docs do for larger models
def _create_decoder():
  model = NNXDecoder(FEATURES, HEADS, rngs=nnx.Rngs(0))
  model.attn.init_cache((BATCH, MAX_LEN, FEATURES))
  return model


def _nnx_decode_args():
  graphdef, state = nnx.split(_create_decoder())
  x = jax.random.normal(jax.random.key(1), (BATCH, 1, FEATURES), jnp.float32)
  return graphdef, state, x


def nnx_decode_step(graphdef, state, x):
  model = nnx.merge(graphdef, state)
  y = model(x)
  _, state = nnx.split(model)
  return state, y


def _nnx_decode_next(args, out):
  graphdef, _, _ = args
  state, y = out
  return graphdef, state, y   # the output becomes the next token's input


# --------------------------------------------------------------------------- Linen decode
# Linen: `nn.MultiHeadDotProductAttention(decode=True)`; `init` with a full-length input
# creates the 'cache' collection; each step calls `apply(..., mutable=['cache'])`.


class LinenBlock(nn.Module):
  features: int
  heads: int

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads,
                                            qkv_features=self.features,
                                            decode=True)(h)
    return x + nn.gelu(nn.Dense(self.features)(x))


class LinenDecoder(nn.Module):
  features: int
  heads: int
  layers: int

  @nn.compact
  def __call__(self, x):
    for _ in range(self.layers):
      x = LinenBlock(self.features, self.heads)(x)
    return x


_LINEN_DECODER = LinenDecoder(FEATURES, HEADS, layers=2)
_LINEN_INIT = jax.jit(_LINEN_DECODER.init)   # `jax.jit(model.init)`, as the docs do


def _linen_decode_args():
  variables = _LINEN_INIT(jax.random.key(0),
                          jnp.ones((BATCH, MAX_LEN, FEATURES), jnp.float32))
  params, cache = variables["params"], variables["cache"]
  x = jax.random.normal(jax.random.key(1), (BATCH, 1, FEATURES), jnp.float32)
  return params, cache, x


def linen_decode_step(params, cache, x):
  y, mutated = _LINEN_DECODER.apply({"params": params, "cache": cache}, x,
                                    mutable=["cache"])
  return y, mutated["cache"]


def _linen_decode_next(args, out):
  params, _, _ = args
  y, cache = out
  return params, cache, y


# --------------------------------------------------------------------------- Linen nn.scan
# Layers stacked with `nn.scan` over a layer axis (the Flax "scan over layers" idiom),
# `variable_axes={'params': 0, 'cache': 0}`, each layer decoding with its own cache.


class ScanBlock(nn.Module):
  features: int
  heads: int

  @nn.compact
  def __call__(self, x, _):
    h = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads,
                                            qkv_features=self.features,
                                            decode=True)(h)
    x = x + nn.gelu(nn.Dense(self.features)(x))
    return x, None


class ScanDecoder(nn.Module):
  features: int
  heads: int
  layers: int

  @nn.compact
  def __call__(self, x):
    blocks = nn.scan(ScanBlock, variable_axes={"params": 0, "cache": 0},
                     split_rngs={"params": True}, in_axes=nn.broadcast,
                     length=self.layers)
    x, _ = blocks(self.features, self.heads, name="blocks")(x, None)
    return x


# 4 layers x 2 x 256 x 256 f32: a 2 MiB stacked cache per key and per value.
_SCAN_BATCH = 2
_SCAN_DECODER = ScanDecoder(FEATURES, HEADS, layers=4)


_SCAN_INIT = jax.jit(_SCAN_DECODER.init)


def _linen_scan_args():
  variables = _SCAN_INIT(jax.random.key(0),
                         jnp.ones((_SCAN_BATCH, MAX_LEN, FEATURES), jnp.float32))
  params, cache = variables["params"], variables["cache"]
  x = jax.random.normal(jax.random.key(1), (_SCAN_BATCH, 1, FEATURES), jnp.float32)
  return params, cache, x


def linen_scan_decode_step(params, cache, x):
  y, mutated = _SCAN_DECODER.apply({"params": params, "cache": cache}, x,
                                   mutable=["cache"])
  return y, mutated["cache"]


# --------------------------------------------------------------------------- NNX optimizer
# The NNX "MNIST tutorial" step (`nnx.Optimizer(model, optax.adam, wrt=nnx.Param)`,
# `nnx.value_and_grad`, `optimizer.update(model, grads)`), in the split/merge form the
# NNX performance guide uses with `jax.jit(..., donate_argnums=...)`.


class MLP(nnx.Module):
  def __init__(self, din: int, dhidden: int, dout: int, *, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
    self.linear2 = nnx.Linear(dhidden, dhidden, rngs=rngs)
    self.linear3 = nnx.Linear(dhidden, dout, rngs=rngs)

  def __call__(self, x):
    x = nnx.relu(self.linear1(x))
    x = nnx.relu(self.linear2(x))
    return self.linear3(x)


@nnx.jit
def _create_model_and_optimizer():
  model = MLP(128, 512, 10, rngs=nnx.Rngs(0))   # 512x512 and 128x512 f32 weights
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  return model, optimizer


def _nnx_optimizer_args():
  graphdef, state = nnx.split(_create_model_and_optimizer())
  x = jax.random.normal(jax.random.key(1), (64, 128), jnp.float32)
  y = jnp.argmax(x[:, :10], axis=-1)   # labels: a function of the inputs
  return graphdef, state, x, y


def nnx_optimizer_step(graphdef, state, x, y):
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  state = nnx.state((model, optimizer))
  return loss, state


def _nnx_optimizer_next(args, out):
  graphdef, _, x, y = args
  _, state = out
  return graphdef, state, x, y


# --------------------------------------------------------------------------- NNX BatchNorm
# The NNX BatchNorm training step (`model.train()`, batch statistics as `BatchStat`
# state updated beside the `Param`s), with `nnx.Optimizer(optax.adamw)`, in the same
# split/merge form; the whole (model, optimizer) state donated.


class BNClassifier(nnx.Module):
  def __init__(self, *, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(64, 512, rngs=rngs)
    self.bn = nnx.BatchNorm(512, rngs=rngs)
    self.linear2 = nnx.Linear(512, 10, rngs=rngs)

  def __call__(self, x):
    return self.linear2(nnx.relu(self.bn(self.linear1(x))))


@nnx.jit
def _create_bn_classifier():
  model = BNClassifier(rngs=nnx.Rngs(0))
  model.train()
  optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
  return model, optimizer


def _nnx_batchnorm_args():
  graphdef, state = nnx.split(_create_bn_classifier())
  x = jax.random.normal(jax.random.key(3), (32, 64), jnp.float32)
  y = jnp.argmax(x[:, :10], axis=-1)
  return graphdef, state, x, y


def nnx_batchnorm_step(graphdef, state, x, y):
  model, optimizer = nnx.merge(graphdef, state)

  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  loss, grads = nnx.value_and_grad(loss_fn)(model)
  optimizer.update(model, grads)
  return loss, nnx.state((model, optimizer))


PROGRAMS = [
    RealProgram(
        name="flax_nnx_decode",
        library="flax",
        description="NNX MultiHeadAttention(decode=True)+init_cache block, one-token "
                    "decode on a donated nnx.split state (merge/split inside)",
        fn=nnx_decode_step,
        make_args=_nnx_decode_args,
        donate_argnums=(1,),
        static_argnums=(0,),
        next_args=_nnx_decode_next,
    ),
    RealProgram(
        name="flax_linen_decode",
        library="flax",
        description="Linen 2-layer decoder, MultiHeadDotProductAttention(decode=True), "
                    "apply(mutable=['cache']) with the 'cache' collection donated",
        fn=linen_decode_step,
        make_args=_linen_decode_args,
        donate_argnums=(1,),
        next_args=_linen_decode_next,
    ),
    RealProgram(
        name="flax_linen_scan_decode",
        library="flax",
        description="Linen nn.scan over 4 decode=True blocks, variable_axes "
                    "{'params': 0, 'cache': 0}, stacked 'cache' donated",
        fn=linen_scan_decode_step,
        make_args=_linen_scan_args,
        donate_argnums=(1,),
        next_args=_linen_decode_next,
    ),
    RealProgram(
        name="flax_nnx_optimizer",
        library="flax",
        description="NNX MLP + nnx.Optimizer(optax.adam) train step, "
                    "nnx.value_and_grad, split (model, optimizer) state donated",
        fn=nnx_optimizer_step,
        make_args=_nnx_optimizer_args,
        donate_argnums=(1,),
        static_argnums=(0,),
        next_args=_nnx_optimizer_next,
    ),
    RealProgram(
        name="flax_nnx_batchnorm",
        library="flax",
        description="NNX Linear+BatchNorm classifier in train mode, nnx.Optimizer("
                    "optax.adamw), batch statistics updated beside the params; split "
                    "(model, optimizer) state donated",
        fn=nnx_batchnorm_step,
        make_args=_nnx_batchnorm_args,
        donate_argnums=(1,),
        static_argnums=(0,),
        next_args=_nnx_optimizer_next,
    ),
]
