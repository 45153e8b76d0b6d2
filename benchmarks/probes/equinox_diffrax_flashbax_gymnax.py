"""Probe programs in the styles of Equinox, Diffrax, Flashbax and Gymnax (see `benchmarks/probes/__init__.py`)."""


import diffrax
import equinox as eqx
import flashbax as fbx
import gymnax
import jax
import jax.numpy as jnp
import lineax
import optax
from jax import lax

from inplace_jax.testing.realworld import RealProgram


def _keep_static(make):
  """next_args helper: `make(args, out)`."""
  return make


# =========================================================================== Equinox
# ---------------------------------------------------------------- 1. CNN (MNIST-like)


class CNN(eqx.Module):
  layers: tuple

  def __init__(self, key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    self.layers = (
        eqx.nn.Conv2d(1, 16, kernel_size=3, padding=1, key=k1),
        eqx.nn.MaxPool2d(kernel_size=2, stride=2),
        jax.nn.relu,
        eqx.nn.Conv2d(16, 32, kernel_size=3, padding=1, key=k2),
        eqx.nn.MaxPool2d(kernel_size=2, stride=2),
        jax.nn.relu,
        jnp.ravel,
        eqx.nn.Linear(32 * 7 * 7, 256, key=k3),
        jax.nn.sigmoid,
        eqx.nn.Linear(256, 10, key=k4),
        jax.nn.log_softmax,
    )

  def __call__(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


_CNN_OPT = optax.adamw(3e-4)


@eqx.filter_jit
def _cnn_model():
  return CNN(jax.random.key(0))


@jax.jit
def _cnn_data():
  x = jax.random.normal(jax.random.key(1), (32, 1, 28, 28), jnp.float32)
  y = jax.random.randint(jax.random.key(2), (32,), 0, 10)
  return x, y


def _cnn_loss(model, x, y):
  pred = jax.vmap(model)(x)
  return -jnp.mean(jnp.take_along_axis(pred, y[:, None], axis=1))


def _cnn_args():
  params, static = eqx.partition(_cnn_model(), eqx.is_array)
  opt_state = jax.jit(_CNN_OPT.init)(params)
  return params, static, opt_state, *_cnn_data()


def cnn_step(params, static, opt_state, x, y):
  model = eqx.combine(params, static)
  loss, grads = eqx.filter_value_and_grad(_cnn_loss)(model, x, y)
  updates, opt_state = _CNN_OPT.update(grads, opt_state, eqx.filter(model, eqx.is_array))
  model = eqx.apply_updates(model, updates)
  params, _ = eqx.partition(model, eqx.is_array)
  return params, opt_state, loss


def _cnn_next(args, out):
  _, static, _, x, y = args
  params, opt_state, _ = out
  return params, static, opt_state, x, y


# ---------------------------------------------------------------- 2. LSTM over time


class RNN(eqx.Module):
  hidden_size: int
  cell: eqx.nn.LSTMCell
  linear: eqx.nn.Linear
  bias: jax.Array

  def __init__(self, in_size, out_size, hidden_size, *, key):
    ckey, lkey = jax.random.split(key)
    self.hidden_size = hidden_size
    self.cell = eqx.nn.LSTMCell(in_size, hidden_size, key=ckey)
    self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
    self.bias = jnp.zeros(out_size)

  def __call__(self, input):
    hidden = (jnp.zeros((self.hidden_size,)), jnp.zeros((self.hidden_size,)))

    def f(carry, inp):
      return self.cell(inp, carry), None

    (out, _), _ = lax.scan(f, hidden, input)
    return jax.nn.sigmoid(self.linear(out) + self.bias)


_RNN_OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2, momentum=0.9))


@eqx.filter_jit
def _rnn_model():
  return RNN(in_size=8, out_size=1, hidden_size=256, key=jax.random.key(0))


@jax.jit
def _rnn_data():
  x = jax.random.normal(jax.random.key(1), (64, 32, 8), jnp.float32)
  y = (jnp.sum(x[:, :, 0], axis=1, keepdims=True) > 0).astype(jnp.float32)
  return x, y


def _rnn_loss(model, x, y):
  pred = jax.vmap(model)(x)
  return -jnp.mean(y * jnp.log(pred + 1e-6) + (1 - y) * jnp.log(1 - pred + 1e-6))


def _rnn_args():
  params, static = eqx.partition(_rnn_model(), eqx.is_array)
  opt_state = jax.jit(_RNN_OPT.init)(params)
  return params, static, opt_state, *_rnn_data()


def rnn_step(params, static, opt_state, x, y):
  model = eqx.combine(params, static)
  loss, grads = eqx.filter_value_and_grad(_rnn_loss)(model, x, y)
  updates, opt_state = _RNN_OPT.update(grads, opt_state)
  params = eqx.apply_updates(params, updates)
  return params, opt_state, loss


# ---------------------------------------------------------------- 3. attention + tree_at


class Block(eqx.Module):
  norm1: eqx.nn.LayerNorm
  attn: eqx.nn.MultiheadAttention
  norm2: eqx.nn.LayerNorm
  mlp: eqx.nn.MLP

  def __init__(self, dim, heads, key):
    k1, k2 = jax.random.split(key)
    self.norm1 = eqx.nn.LayerNorm(dim)
    self.attn = eqx.nn.MultiheadAttention(heads, dim, key=k1)
    self.norm2 = eqx.nn.LayerNorm(dim)
    self.mlp = eqx.nn.MLP(dim, dim, 4 * dim, 1, activation=jax.nn.gelu, key=k2)

  def __call__(self, x):
    h = jax.vmap(self.norm1)(x)
    x = x + self.attn(h, h, h)
    h = jax.vmap(self.norm2)(x)
    return x + jax.vmap(self.mlp)(h)


DIM, HEADS, SEQ, BATCH_ATT = 128, 4, 32, 8


@eqx.filter_jit
def _block():
  return Block(DIM, HEADS, jax.random.key(0))


@jax.jit
def _att_data():
  x = jax.random.normal(jax.random.key(1), (BATCH_ATT, SEQ, DIM), jnp.float32)
  return x, jnp.roll(x, 1, axis=1)


def _att_loss(attn, rest, x, y):
  model = eqx.tree_at(lambda m: m.attn, rest, attn)
  return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _att_args():
  params, static = eqx.partition(_block(), eqx.is_array)
  return params, static, *_att_data()


def att_finetune_step(params, static, x, y):
  """Fine-tune only the attention layer: gradient w.r.t. model.attn, written back with
  eqx.tree_at (the rest of the model frozen)."""
  model = eqx.combine(params, static)
  loss, g = eqx.filter_value_and_grad(_att_loss)(model.attn, model, x, y)
  new_attn = jax.tree.map(lambda p, gg: p - 1e-2 * gg, eqx.filter(model.attn, eqx.is_array),
                          g)
  new_attn = eqx.combine(new_attn, eqx.filter(model.attn, eqx.is_array, inverse=True))
  model = eqx.tree_at(lambda m: m.attn, model, new_attn)
  params, _ = eqx.partition(model, eqx.is_array)
  return params, loss


def _att_next(args, out):
  _, static, x, y = args
  return out[0], static, x, y


# ---------------------------------------------------------------- 4. StateIndex ring buffer


RING, FEAT = 2048, 256     # 2 MiB ring buffer of past features in eqx.nn.State


class RingMemory(eqx.Module):
  linear: eqx.nn.Linear
  index: eqx.nn.StateIndex

  def __init__(self, key):
    self.linear = eqx.nn.Linear(FEAT, FEAT, key=key)
    self.index = eqx.nn.StateIndex(
        (jnp.zeros((RING, FEAT), jnp.float32), jnp.array(0, jnp.int32)))

  def __call__(self, x, state):
    buf, ptr = state.get(self.index)
    h = jax.vmap(self.linear)(x)                         # (B, FEAT)
    buf = lax.dynamic_update_slice_in_dim(buf, h, ptr, axis=0)
    ptr = (ptr + h.shape[0]) % RING
    state = state.set(self.index, (buf, ptr))
    # attend over memory
    scores = h @ buf.T / jnp.sqrt(float(FEAT))
    out = jax.nn.softmax(scores, axis=-1) @ buf
    return out, state


@eqx.filter_jit
def _ring_model():
  return eqx.nn.make_with_state(RingMemory)(jax.random.key(0))


def _ring_args():
  model, state = _ring_model()
  params, static = eqx.partition(model, eqx.is_array)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(3), (64, FEAT), jnp.float32))()
  return params, static, state, x


def ring_step(params, static, state, x):
  model = eqx.combine(params, static)
  out, state = model(x, state)
  return out, state


def _ring_next(args, out):
  params, static, _, x = args
  y, state = out
  return params, static, state, x + 0.01 * y


# ---------------------------------------------------------------- 5/6. eqx.internal.while_loop


WL_STEPS, WL_DIM = 512, 512       # buffer 512 x 512 f32 = 1 MiB


def _wl_step(kind):
  def fn(buf, y0, w):
    def cond(carry):
      i, _, _ = carry
      return i < WL_STEPS

    def body(carry):
      i, y, buf = carry
      y = jnp.tanh(w @ y)
      buf = buf.at[i].set(y)
      return i + 1, y, buf

    _, y, buf = eqx.internal.while_loop(cond, body, (jnp.array(0), y0, buf),
                                        max_steps=WL_STEPS, buffers=lambda c: c[2],
                                        kind=kind)
    return buf, y
  return fn


@jax.jit
def _wl_args():
  w = jax.random.normal(jax.random.key(0), (WL_DIM, WL_DIM), jnp.float32) / jnp.sqrt(
      float(WL_DIM))
  y0 = jax.random.normal(jax.random.key(1), (WL_DIM,), jnp.float32)
  return jnp.zeros((WL_STEPS, WL_DIM), jnp.float32), y0, w


def _wl_next(args, out):
  _, _, w = args
  buf, y = out
  return buf, y, w


def _wl_grad_step(buf, y0, w):
  """Gradient through a checkpointed while_loop that writes a buffer (as diffrax's
  RecursiveCheckpointAdjoint does); w updated by SGD, buffer donated and refilled."""
  fwd = _wl_step("checkpointed")

  def loss(w):
    b, y = fwd(buf, y0, w)
    return jnp.mean(b ** 2), b

  (l, b), g = jax.value_and_grad(loss, has_aux=True)(w)
  return b, w - 0.1 * g, l


def _wlg_next(args, out):
  _, y0, _ = args
  buf, w, _ = out
  return buf, y0, w


# =========================================================================== Diffrax
# ---------------------------------------------------------------- 7. pytree state, steps=True, PID


def _nbody_field(t, y, args):
  k, c = args
  x, v = y["x"], y["v"]
  a = -k * x - c * v + 0.1 * jnp.sin(x @ jnp.ones((x.shape[1], x.shape[1])) / x.shape[1])
  return {"x": v, "v": a}


def diffrax_steps_pid(y0, args):
  sol = diffrax.diffeqsolve(diffrax.ODETerm(_nbody_field), diffrax.Dopri5(), t0=0.0,
                            t1=2.0, dt0=0.05, y0=y0, args=args,
                            saveat=diffrax.SaveAt(steps=True),
                            stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6),
                            max_steps=64)
  # sol.ys is padded with inf after the last accepted step
  n = sol.stats["num_accepted_steps"]
  y1 = jax.tree.map(lambda a: a[n - 1], sol.ys)
  return y1, sol.ys, sol.ts


@jax.jit
def _pid_args():
  z = jax.random.normal(jax.random.key(0), (2, 256, 16), jnp.float32)
  return {"x": z[0], "v": z[1]}, (jnp.float32(1.5), jnp.float32(0.2))


def _pid_next(args, out):
  return out[0], args[1]


# ---------------------------------------------------------------- 8. dense output


N_EVAL = 256


def diffrax_dense(y0, w, ts_eval):
  def field(t, y, args):
    return jnp.tanh(y @ args) - 0.3 * y

  sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), t0=0.0, t1=1.0,
                            dt0=None, y0=y0, args=w,
                            saveat=diffrax.SaveAt(dense=True, t1=True),
                            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-5),
                            max_steps=32)
  ys = jax.vmap(sol.evaluate)(ts_eval)
  return sol.ys[-1], ys


@jax.jit
def _dense_args():
  y0 = jax.random.normal(jax.random.key(0), (128, 64), jnp.float32)
  w = jax.random.normal(jax.random.key(1), (64, 64), jnp.float32) / 8.0
  return y0, w, jnp.linspace(0.0, 1.0, N_EVAL)


def _dense_next(args, out):
  return out[0], args[1], args[2]


# ---------------------------------------------------------------- 9. neural ODE training


class Func(eqx.Module):
  mlp: eqx.nn.MLP

  def __init__(self, data_size, width, depth, *, key):
    self.mlp = eqx.nn.MLP(data_size, data_size, width, depth, activation=jax.nn.softplus,
                          final_activation=jax.nn.tanh, key=key)

  def __call__(self, t, y, args):
    return self.mlp(y)


class NeuralODE(eqx.Module):
  func: Func

  def __init__(self, data_size, width, depth, *, key):
    self.func = Func(data_size, width, depth, key=key)

  def __call__(self, ts, y0):
    sol = diffrax.diffeqsolve(diffrax.ODETerm(self.func), diffrax.Tsit5(), t0=ts[0],
                              t1=ts[-1], dt0=ts[1] - ts[0], y0=y0,
                              stepsize_controller=diffrax.PIDController(rtol=1e-3,
                                                                        atol=1e-6),
                              saveat=diffrax.SaveAt(ts=ts), max_steps=64,
                              adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=8))
    return sol.ys


_NODE_OPT = optax.adabelief(3e-3)


@eqx.filter_jit
def _node_model():
  return NeuralODE(2, 256, 2, key=jax.random.key(0))


@jax.jit
def _node_data():
  ts = jnp.linspace(0.0, 2.0, 20)
  y0 = jax.random.uniform(jax.random.key(1), (32, 2), minval=-0.6, maxval=1.0)
  ys = jax.vmap(lambda y: jnp.stack([y * jnp.cos(t) for t in ts]))(y0)
  return ts, ys


def _node_args():
  params, static = eqx.partition(_node_model(), eqx.is_array)
  opt_state = jax.jit(_NODE_OPT.init)(params)
  return params, static, opt_state, *_node_data()


def node_step(params, static, opt_state, ti, yi):
  def grad_loss(model, ti, yi):
    y_pred = jax.vmap(model, in_axes=(None, 0))(ti, yi[:, 0])
    return jnp.mean((yi - y_pred) ** 2)

  model = eqx.combine(params, static)
  loss, grads = eqx.filter_value_and_grad(grad_loss)(model, ti, yi)
  updates, opt_state = _NODE_OPT.update(grads, opt_state)
  params = eqx.apply_updates(params, updates)
  return params, opt_state, loss


# =========================================================================== Flashbax
# ---------------------------------------------------------------- 10. trajectory buffer

T_ENVS, T_LEN, T_OBS = 16, 8, 32
_TRAJ = fbx.make_trajectory_buffer(add_batch_size=T_ENVS, sample_batch_size=64,
                                   sample_sequence_length=4, period=1,
                                   min_length_time_axis=4, max_length_time_axis=2048)
_PTRAJ = fbx.make_prioritised_trajectory_buffer(add_batch_size=T_ENVS, sample_batch_size=64,
                                                sample_sequence_length=4, period=2,
                                                min_length_time_axis=4,
                                                max_length_time_axis=1024,
                                                priority_exponent=1.0)


def _traj_batch(key):
  z = jax.random.normal(key, (T_ENVS, T_LEN, T_OBS + 1), jnp.float32)
  return {"obs": z[..., :T_OBS], "reward": z[..., T_OBS],
          "done": z[..., T_OBS] > 1.5}


_traj_batch_jit = jax.jit(_traj_batch)


def _strong(x):
  return x.astype(x.dtype) if jax.typeof(x).weak_type else x


def _traj_make_args(buffer):
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0, 0], _traj_batch(jax.random.key(0)))
    state = buffer.init(ex)
    return buffer.add(state, _traj_batch(jax.random.key(5)))

  def make():
    return jax.tree.map(_strong, warm()), _traj_batch_jit(jax.random.key(1)), jax.random.key(2)
  return make


def _traj_next(args, out):
  key = args[2]
  key, k = jax.random.split(key)
  return out[0], _traj_batch_jit(k), key


def traj_add_sample(state, batch, key):
  state = _TRAJ.add(state, batch)
  sample = _TRAJ.sample(state, key)
  return state, sample.experience


def ptraj_sample_update_add(state, batch, key):
  sample = _PTRAJ.sample(state, key)
  td = jnp.abs(jnp.mean(sample.experience["reward"], axis=1)) + 1e-3
  state = _PTRAJ.set_priorities(state, sample.indices, td)
  state = _PTRAJ.add(state, batch)
  return state, sample.experience, sample.probabilities


# ---------------------------------------------------------------- 11. item buffer

_ITEM = fbx.make_item_buffer(max_length=8192, min_length=32, sample_batch_size=128,
                             add_batches=True)


def _item_batch(key):
  z = jax.random.normal(key, (32, 65), jnp.float32)
  return {"obs": z[:, :64], "target": z[:, 64]}


_item_batch_jit = jax.jit(_item_batch)


def _item_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0], _item_batch(jax.random.key(0)))
    s = _ITEM.init(ex)
    return _ITEM.add(s, _item_batch(jax.random.key(7)))
  return jax.tree.map(_strong, warm()), _item_batch_jit(jax.random.key(1)), jax.random.key(2)


def _item_next(args, out):
  key, k = jax.random.split(args[2])
  return out[0], _item_batch_jit(k), key


def item_add_sample_regress(state, batch, key):
  """Add a batch, sample a minibatch and fit a linear regressor with 1 closed-form step."""
  state = _ITEM.add(state, batch)
  s = _ITEM.sample(state, key).experience
  w = jnp.linalg.solve(s["obs"].T @ s["obs"] + jnp.eye(64), s["obs"].T @ s["target"])
  return state, w


# =========================================================================== Gymnax
# ---------------------------------------------------------------- 12. several envs, vmap


N_MULTI = 512
_ENVS = {n: gymnax.make(n) for n in ("Pendulum-v1", "MountainCar-v0", "Acrobot-v1")}


def multi_env_step(states, obs, key):
  """One step of 512 envs of each of Pendulum, MountainCar and Acrobot; env states and
  last obs donated; auto-reset is done by gymnax's step."""
  new_states, new_obs, rewards = {}, {}, {}
  for i, (name, (env, params)) in enumerate(_ENVS.items()):
    k = jax.random.fold_in(key, i)
    ka, ks = jax.random.split(k)
    if name == "Pendulum-v1":
      action = jnp.clip(-obs[name][:, 2:3] * 2.0, -2.0, 2.0)
    elif name == "MountainCar-v0":
      action = jnp.where(obs[name][:, 1] > 0, 2, 0).astype(jnp.int32)
    else:
      action = jax.random.randint(ka, (N_MULTI,), 0, 3)
    o, s, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, N_MULTI), states[name], action, params)
    new_states[name], new_obs[name], rewards[name] = s, o, r
  return new_states, new_obs, rewards


@jax.jit
def _multi_args():
  states, obs = {}, {}
  for i, (name, (env, params)) in enumerate(_ENVS.items()):
    o, s = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(i), N_MULTI), params)
    states[name], obs[name] = s, o
  return states, obs, jax.random.key(9)


def _multi_next(args, out):
  key, _ = jax.random.split(args[2])
  return out[0], out[1], key


# ---------------------------------------------------------------- 13. scan rollout -> replay


R_CAP, R_ENVS, R_STEPS = 16384, 64, 32
_CP, _CP_PARAMS = gymnax.make("CartPole-v1")


def scan_into_replay(replay, runner, w):
  """lax.scan rollout of 64 CartPoles for 32 steps; each step's transitions are written
  into a ring replay buffer (capacity 16384) at replay['ptr'] (DQN-style)."""
  def body(carry, _):
    replay, (obs, st, key) = carry
    key, ka, ks = jax.random.split(key, 3)
    q = obs @ w
    eps = jax.random.uniform(ka, (R_ENVS,)) < 0.1
    action = jnp.where(eps, jax.random.randint(ka, (R_ENVS,), 0, 2), jnp.argmax(q, -1))
    nobs, st, r, term, trunc, _ = jax.vmap(_CP.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, R_ENVS), st, action, _CP_PARAMS)
    p = replay["ptr"]
    replay = {
        "obs": lax.dynamic_update_slice_in_dim(replay["obs"], obs, p, 0),
        "next_obs": lax.dynamic_update_slice_in_dim(replay["next_obs"], nobs, p, 0),
        "action": lax.dynamic_update_slice_in_dim(replay["action"], action, p, 0),
        "reward": lax.dynamic_update_slice_in_dim(replay["reward"], r, p, 0),
        "done": lax.dynamic_update_slice_in_dim(replay["done"], term, p, 0),
        "ptr": (p + R_ENVS) % R_CAP,
    }
    return (replay, (nobs, st, key)), r.sum()

  (replay, runner), rs = lax.scan(body, (replay, runner), None, length=R_STEPS)
  return replay, runner, rs


@jax.jit
def _replay_args():
  obs, st = jax.vmap(_CP.reset, in_axes=(0, None))(
      jax.random.split(jax.random.key(0), R_ENVS), _CP_PARAMS)
  replay = {
      "obs": jnp.zeros((R_CAP, 4), jnp.float32),
      "next_obs": jnp.zeros((R_CAP, 4), jnp.float32),
      "action": jnp.zeros((R_CAP,), jnp.int32),
      "reward": jnp.zeros((R_CAP,), jnp.float32),
      "done": jnp.zeros((R_CAP,), jnp.bool_),
      "ptr": jnp.array(0, jnp.int32),
  }
  w = jnp.array([[0.0, 0.0], [0.0, 0.0], [-1.0, 1.0], [-1.0, 1.0]], jnp.float32)
  return replay, (obs, st, jax.random.key(1)), w


def _replay_next(args, out):
  return out[0], out[1], args[2]


# ---------------------------------------------------------------- 14. PPO GAE into buffer


G_STEPS, G_ENVS = 128, 512
GAMMA, LAMBDA = 0.99, 0.95
_AC, _AC_PARAMS = gymnax.make("Acrobot-v1")


def ppo_collect_gae(traj, runner, pw):
  """PureJaxRL-style: scan a rollout of Acrobot with a linear softmax policy and value,
  store (obs, action, logp, value, reward, done) in a donated trajectory buffer, then a
  reverse scan computes GAE advantages and targets into the same buffer."""
  def policy(obs):
    logits = obs @ pw["pi"]
    value = obs @ pw["v"]
    return logits, value

  def env_step(carry, t):
    traj, (obs, st, key) = carry
    key, ka, ks = jax.random.split(key, 3)
    logits, value = policy(obs)
    action = jax.random.categorical(ka, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
    nobs, st, r, term, trunc, _ = jax.vmap(_AC.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, G_ENVS), st, action, _AC_PARAMS)
    traj = dict(traj)
    traj["obs"] = traj["obs"].at[t].set(obs)
    traj["action"] = traj["action"].at[t].set(action)
    traj["logp"] = traj["logp"].at[t].set(logp)
    traj["value"] = traj["value"].at[t].set(value)
    traj["reward"] = traj["reward"].at[t].set(r)
    traj["done"] = traj["done"].at[t].set(jnp.logical_or(term, trunc))
    return (traj, (nobs, st, key)), None

  (traj, runner), _ = lax.scan(env_step, (traj, runner), jnp.arange(G_STEPS))
  _, last_val = policy(runner[0])

  def gae_step(carry, t):
    gae, next_value, traj = carry
    done, value, reward = traj["done"][t], traj["value"][t], traj["reward"][t]
    delta = reward + GAMMA * next_value * (1 - done) - value
    gae = delta + GAMMA * LAMBDA * (1 - done) * gae
    traj = dict(traj)
    traj["advantage"] = traj["advantage"].at[t].set(gae)
    traj["target"] = traj["target"].at[t].set(gae + value)
    return (gae, value, traj), None

  (_, _, traj), _ = lax.scan(gae_step, (jnp.zeros_like(last_val), last_val, traj),
                             jnp.arange(G_STEPS), reverse=True)
  return traj, runner


@jax.jit
def _gae_args():
  obs, st = jax.vmap(_AC.reset, in_axes=(0, None))(
      jax.random.split(jax.random.key(0), G_ENVS), _AC_PARAMS)
  f = lambda *s, dt=jnp.float32: jnp.zeros((G_STEPS, G_ENVS) + s, dt)
  traj = {"obs": f(6), "action": f(dt=jnp.int32),
          "logp": f(), "value": f(), "reward": f(),
          "done": jnp.zeros((G_STEPS, G_ENVS), jnp.bool_), "advantage": f(), "target": f()}
  pw = {"pi": 0.1 * jax.random.normal(jax.random.key(3), (6, 3)),
        "v": 0.1 * jax.random.normal(jax.random.key(4), (6,))}
  return traj, (obs, st, jax.random.key(1)), pw


def _gae_next(args, out):
  return out[0], out[1], args[2]


# =========================================================================== list

PROGRAMS = [
    RealProgram("eqx_cnn_adamw", "equinox",
                "Equinox CNN tutorial model (Conv2d/MaxPool2d/Linear list), adamw; params "
                "and opt_state donated", cnn_step, _cnn_args, (0, 2), _cnn_next,
                static_argnums=(1,)),
    RealProgram("eqx_lstm_scan", "equinox",
                "Equinox RNN example: eqx.nn.LSTMCell under lax.scan, clip+sgd momentum; "
                "params and opt_state donated", rnn_step, _rnn_args, (0, 2), _cnn_next,
                static_argnums=(1,)),
    RealProgram("eqx_attn_tree_at", "equinox",
                "transformer block (MultiheadAttention, LayerNorm, MLP); gradient wrt "
                "model.attn only, written back with eqx.tree_at; params donated",
                att_finetune_step, _att_args, (0,), _att_next, static_argnums=(1,)),
    RealProgram("eqx_stateindex_ring", "equinox",
                "eqx.nn.StateIndex holding a 2 MiB ring buffer + pointer, updated with "
                "dynamic_update_slice each call; state donated", ring_step, _ring_args,
                (2,), _ring_next, static_argnums=(1,)),
    RealProgram("eqx_while_checkpointed", "equinox",
                "eqx.internal.while_loop(kind='checkpointed', buffers=...) writing a 1 MiB "
                "buffer; buffer donated", _wl_step("checkpointed"), _wl_args, (0,),
                _wl_next),
    RealProgram("eqx_while_bounded", "equinox",
                "eqx.internal.while_loop(kind='bounded', buffers=...) writing a 1 MiB "
                "buffer; buffer donated", _wl_step("bounded"), _wl_args, (0,), _wl_next),
    RealProgram("eqx_while_checkpointed_grad", "equinox",
                "value_and_grad through eqx.internal.while_loop(kind='checkpointed') "
                "writing a buffer; buffer and w donated", _wl_grad_step, _wl_args, (0, 2),
                _wlg_next),
    RealProgram("diffrax_pytree_steps_pid", "diffrax",
                "diffeqsolve Dopri5 + PIDController, SaveAt(steps=True), dict state "
                "{x, v} (2 x 16 KiB); y0 pytree donated", diffrax_steps_pid, _pid_args,
                (0,), _pid_next),
    RealProgram("diffrax_dense_eval", "diffrax",
                "diffeqsolve Tsit5 + PID, SaveAt(dense=True, t1=True), sol.evaluate "
                "vmapped over 256 times; y0 donated", diffrax_dense, _dense_args, (0,),
                _dense_next),
    RealProgram("diffrax_neural_ode_train", "diffrax",
                "Diffrax neural ODE example: eqx MLP vector field, Tsit5+PID, "
                "RecursiveCheckpointAdjoint, vmap over batch, adabelief; params, opt_state "
                "donated", node_step, _node_args, (0, 2), _cnn_next, static_argnums=(1,)),
    RealProgram("flashbax_trajectory_add_sample", "flashbax",
                "fbx.make_trajectory_buffer (16 envs x 2048 time), add 16x8 then sample "
                "64 sequences of 4; state donated", traj_add_sample,
                _traj_make_args(_TRAJ), (0,), _traj_next),
    RealProgram("flashbax_prio_trajectory", "flashbax",
                "fbx.make_prioritised_trajectory_buffer(priority_exponent=1.0, period=2), "
                "sample, set_priorities, add; state donated", ptraj_sample_update_add,
                _traj_make_args(_PTRAJ), (0,), _traj_next),
    RealProgram("flashbax_item_regress", "flashbax",
                "fbx.make_item_buffer(add_batches=True), add 32 items, sample 128, "
                "closed-form ridge fit; state donated", item_add_sample_regress,
                _item_args, (0,), _item_next),
    RealProgram("gymnax_multi_env", "gymnax",
                "one vmapped step of 512 Pendulum, MountainCar, Acrobot envs each; env "
                "states and obs donated", multi_env_step, _multi_args, (0, 1),
                _multi_next),
    RealProgram("gymnax_scan_replay", "gymnax",
                "lax.scan rollout of 64 CartPoles, each step written into a ring replay "
                "buffer (16384) via dynamic_update_slice; replay and runner donated",
                scan_into_replay, _replay_args, (0, 1), _replay_next),
    RealProgram("gymnax_ppo_gae", "gymnax",
                "PureJaxRL-style Acrobot rollout into a trajectory buffer then reverse-scan "
                "GAE written into the same buffer; traj and runner donated",
                ppo_collect_gae, _gae_args, (0, 1), _gae_next),
]


# =========================================================================== variants that read
# the donated state's old value around its update (where jax.jit may copy)

# ---------------------------------------------------------------- A. StateIndex: read memory, then push


def ring_read_then_push(params, static, state, x):
  """Attend over the memory (old contents) first, then push the new features: the usual
  'memory network' order."""
  model = eqx.combine(params, static)
  buf, ptr = state.get(model.index)
  h = jax.vmap(model.linear)(x)
  out = jax.nn.softmax(h @ buf.T / jnp.sqrt(float(FEAT)), axis=-1) @ buf
  buf = lax.dynamic_update_slice_in_dim(buf, h, ptr, axis=0)
  state = state.set(model.index, (buf, (ptr + h.shape[0]) % RING))
  return out, state


# ---------------------------------------------------------------- B. DQN with Polyak target net

_Q_OPT = optax.adam(1e-3)


@eqx.filter_jit
def _qnet():
  return eqx.nn.MLP(16, 4, 512, 2, key=jax.random.key(0))


@jax.jit
def _q_data():
  z = jax.random.normal(jax.random.key(1), (256, 33))
  return {"obs": z[:, :16], "next_obs": z[:, 16:32], "reward": z[:, 32],
          "action": jax.random.randint(jax.random.key(2), (256,), 0, 4)}


def _dqn_args():
  params, static = eqx.partition(_qnet(), eqx.is_array)
  target = jax.tree.map(lambda a: a.copy(), params)
  return params, target, static, jax.jit(_Q_OPT.init)(params), _q_data()


def dqn_step(params, target, static, opt_state, batch):
  """DQN step (Equinox style): TD loss against a target network, adam on the online
  params, then Polyak averaging target <- 0.995 target + 0.005 online. online, target and
  opt_state donated."""
  def loss_fn(p):
    q = jax.vmap(eqx.combine(p, static))(batch["obs"])
    q_next = jax.vmap(eqx.combine(target, static))(batch["next_obs"])
    tgt = batch["reward"] + 0.99 * jnp.max(q_next, -1)
    qa = jnp.take_along_axis(q, batch["action"][:, None], 1)[:, 0]
    return jnp.mean(optax.huber_loss(qa, lax.stop_gradient(tgt)))

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = _Q_OPT.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  target = optax.incremental_update(params, target, 0.005)
  return params, target, opt_state, loss


def _dqn_next(args, out):
  _, _, static, _, batch = args
  params, target, opt_state, _ = out
  return params, target, static, opt_state, batch


# ---------------------------------------------------------------- C. sparse embedding row update via tree_at

VOCAB, EMB = 8192, 128       # 4 MiB embedding table


class Embedder(eqx.Module):
  embedding: eqx.nn.Embedding
  head: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.embedding = eqx.nn.Embedding(VOCAB, EMB, key=k1)
    self.head = eqx.nn.Linear(EMB, 1, key=k2)

  def __call__(self, tok):
    return self.head(self.embedding(tok))[0]


@eqx.filter_jit
def _embedder():
  return Embedder(jax.random.key(0))


def _emb_args():
  params, static = eqx.partition(_embedder(), eqx.is_array)
  toks = jax.jit(lambda: jax.random.randint(jax.random.key(1), (128,), 0, VOCAB))()
  return params, static, toks, jnp.linspace(-1.0, 1.0, 128)


def emb_sparse_step(params, static, toks, y):
  """Sparse SGD: gradient w.r.t. the looked-up rows only, scattered back into the
  embedding table with eqx.tree_at(... .at[toks].add(...)); returns the old rows too."""
  model = eqx.combine(params, static)
  rows = model.embedding.weight[toks]

  def loss(rows, head):
    pred = jax.vmap(head)(rows)[:, 0]
    return jnp.mean((pred - y) ** 2)

  l, grads = jax.value_and_grad(lambda r, h: loss(r, eqx.combine(h, eqx.filter(
      model.head, eqx.is_array, inverse=True))), argnums=(0, 1))(
          rows, eqx.filter(model.head, eqx.is_array))
  g_rows, g_head = grads
  model = eqx.tree_at(lambda m: m.embedding.weight, model,
                      model.embedding.weight.at[toks].add(-0.1 * g_rows))
  new_head = jax.tree.map(lambda p, g: p - 0.1 * g, eqx.filter(model.head, eqx.is_array),
                          g_head)
  model = eqx.tree_at(lambda m: m.head, model,
                      eqx.combine(new_head, eqx.filter(model.head, eqx.is_array,
                                                       inverse=True)))
  params, _ = eqx.partition(model, eqx.is_array)
  return params, l, rows


def _emb_next(args, out):
  _, static, toks, y = args
  return out[0], static, (toks * 7 + 3) % VOCAB, y


# ---------------------------------------------------------------- D. diffrax displacement


def diffrax_displacement(y0, args):
  """Integrate a pytree state over [0, 1] (Tsit5, constant steps) and return the new state
  and the displacement y1 - y0 (reads of the donated y0 after the solve)."""
  sol = diffrax.diffeqsolve(diffrax.ODETerm(_nbody_field), diffrax.Tsit5(), t0=0.0, t1=1.0,
                            dt0=0.1, y0=y0, args=args, saveat=diffrax.SaveAt(t1=True))
  y1 = jax.tree.map(lambda a: a[0], sol.ys)
  disp = jax.tree.map(lambda a, b: a - b, y1, y0)
  return y1, disp


@jax.jit
def _disp_args():
  z = jax.random.normal(jax.random.key(0), (2, 2048, 16), jnp.float32)   # 2 x 128 KiB
  return {"x": z[0], "v": z[1]}, (jnp.float32(1.5), jnp.float32(0.2))


# ---------------------------------------------------------------- E. item buffer sample then add


def item_sample_then_add(state, batch, key):
  s = _ITEM.sample(state, key).experience
  w = jnp.linalg.solve(s["obs"].T @ s["obs"] + jnp.eye(64), s["obs"].T @ s["target"])
  state = _ITEM.add(state, batch)
  return state, w


# ---------------------------------------------------------------- F. trajectory buffer sample then add

def traj_sample_then_add(state, batch, key):
  sample = _TRAJ.sample(state, key)
  state = _TRAJ.add(state, batch)
  return state, sample.experience


# ---------------------------------------------------------------- G. replay: sample minibatch, then scan rollout into it


def replay_sample_then_rollout(replay, runner, w, key):
  """DQN-style iteration: first sample a minibatch from the (old) replay buffer for the
  update, then roll out and write the new transitions."""
  idx = jax.random.randint(key, (512,), 0, R_CAP)
  mb = jax.tree.map(lambda a: a[idx], {k: v for k, v in replay.items() if k != "ptr"})
  replay, runner, rs = scan_into_replay(replay, runner, w)
  return replay, runner, rs, mb


def _rs_args():
  replay, runner, w = _replay_args()
  return replay, runner, w, jax.random.key(5)


def _rs_next(args, out):
  return out[0], out[1], args[2], jax.random.fold_in(args[3], 1)


# ---------------------------------------------------------------- H. PPO: normalise with old advantages then overwrite


def ppo_normalised_then_collect(traj, runner, pw):
  """Statistics of the previous iteration's advantages (kept for logging / normalisation)
  are read before the new rollout overwrites the buffer."""
  adv = traj["advantage"]
  stats = (adv.mean(), adv.std(), jnp.sum(traj["reward"] * ~traj["done"]))
  normed = (adv - stats[0]) / (stats[1] + 1e-8)
  traj, runner = ppo_collect_gae(traj, runner, pw)
  return traj, runner, stats, normed[:8]


PROGRAMS += [
    RealProgram("eqx_stateindex_read_then_push", "equinox",
                "eqx.nn.StateIndex ring memory (2 MiB): attend over old memory, then "
                "dynamic_update_slice the new rows; state donated", ring_read_then_push,
                _ring_args, (2,), _ring_next, static_argnums=(1,)),
    RealProgram("eqx_dqn_polyak", "equinox",
                "DQN with eqx.nn.MLP online+target, adam, optax.incremental_update "
                "(Polyak); params, target, opt_state donated", dqn_step, _dqn_args,
                (0, 1, 3), _dqn_next, static_argnums=(2,)),
    RealProgram("eqx_embedding_sparse_tree_at", "equinox",
                "eqx.nn.Embedding 8192x128 (4 MiB): sparse row SGD scattered back with "
                "eqx.tree_at(.at[toks].add); old rows returned; params donated",
                emb_sparse_step, _emb_args, (0,), _emb_next, static_argnums=(1,)),
    RealProgram("diffrax_displacement", "diffrax",
                "diffeqsolve Tsit5 on dict state {x, v} (2 x 128 KiB), returns y1 and "
                "y1 - y0; y0 donated", diffrax_displacement, _disp_args, (0,), _pid_next),
    RealProgram("flashbax_item_sample_then_add", "flashbax",
                "fbx.make_item_buffer: sample 128, ridge fit, then add 32; state donated",
                item_sample_then_add, _item_args, (0,), _item_next),
    RealProgram("flashbax_trajectory_sample_then_add", "flashbax",
                "fbx.make_trajectory_buffer: sample 64x4 then add 16x8; state donated",
                traj_sample_then_add, _traj_make_args(_TRAJ), (0,), _traj_next),
    RealProgram("gymnax_replay_sample_then_rollout", "gymnax",
                "gather a 512 minibatch from the replay ring, then the CartPole scan "
                "rollout writes into it; replay and runner donated",
                replay_sample_then_rollout, _rs_args, (0, 1), _rs_next),
    RealProgram("gymnax_ppo_stats_then_collect", "gymnax",
                "read old advantages/rewards (mean/std/normalised) then the Acrobot "
                "rollout + GAE overwrite the trajectory buffer; traj and runner donated",
                ppo_normalised_then_collect, _gae_args, (0, 1), _gae_next),
]


# =========================================================================== batch 3: branches,
# vmapped buffers, queues, events, bf16

# ---------------------------------------------------------------- I. flashbax: learn inside lax.cond(can_sample)

_PFLAT = fbx.make_prioritised_flat_buffer(max_length=16384, min_length=64,
                                          sample_batch_size=128, add_batch_size=8,
                                          priority_exponent=0.5)
_CQ_OPT = optax.adam(1e-3)


@eqx.filter_jit
def _cq_net():
  return eqx.nn.MLP(16, 1, 256, 2, key=jax.random.key(0))


def _cq_trans(key):
  z = jax.random.normal(key, (8, 17), jnp.float32)
  return {"obs": z[:, :16], "reward": z[:, 16]}


_cq_trans_jit = jax.jit(_cq_trans)


def _cq_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0], _cq_trans(jax.random.key(0)))
    s = _PFLAT.init(ex)
    return lax.fori_loop(0, 16, lambda i, s: _PFLAT.add(
        s, _cq_trans(jax.random.fold_in(jax.random.key(3), i))), s)
  params, static = eqx.partition(_cq_net(), eqx.is_array)
  return (jax.tree.map(_strong, warm()), params, static, jax.jit(_CQ_OPT.init)(params),
          _cq_trans_jit(jax.random.key(1)), jax.random.key(2))


def cond_learn_step(state, params, static, opt_state, trans, key):
  """Add, then `lax.cond(buffer.can_sample(state), learn, skip)`: learn samples, takes an
  adam step on an eqx.nn.MLP value net and writes new priorities. Buffer, params and
  opt_state donated (all updated inside a branch)."""
  state = _PFLAT.add(state, trans)

  def learn(operand):
    state, params, opt_state = operand
    batch = _PFLAT.sample(state, key)
    exp = batch.experience.first

    def loss(p):
      v = jax.vmap(eqx.combine(p, static))(exp["obs"])[:, 0]
      return jnp.mean((v - exp["reward"]) ** 2), jnp.abs(v - exp["reward"])

    (l, td), g = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = _CQ_OPT.update(g, opt_state, params)
    params = optax.apply_updates(params, updates)
    state = _PFLAT.set_priorities(state, batch.indices, td + 1e-3)
    return (state, params, opt_state), l

  def skip(operand):
    return operand, jnp.float32(0.0)

  (state, params, opt_state), l = lax.cond(_PFLAT.can_sample(state), learn, skip,
                                           (state, params, opt_state))
  return state, params, opt_state, l


def _cq_next(args, out):
  _, _, static, _, _, key = args
  state, params, opt_state, _ = out
  key, k = jax.random.split(key)
  return state, params, static, opt_state, _cq_trans_jit(k), key


# ---------------------------------------------------------------- J. trajectory queue

_QUEUE = fbx.make_trajectory_queue(max_length_time_axis=1024, add_batch_size=16,
                                   add_sequence_length=8, sample_sequence_length=8)


def _q_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0, 0], _traj_batch(jax.random.key(0)))
    s = _QUEUE.init(ex)
    s = _QUEUE.add(s, _traj_batch(jax.random.key(5)))
    return _QUEUE.add(s, _traj_batch(jax.random.key(6)))
  return jax.tree.map(_strong, warm()), _traj_batch_jit(jax.random.key(1)), jax.random.key(2)


def queue_pop_push(state, batch, key):
  """FIFO: pop the oldest 8 steps (sample moves the read pointer), then push 8 new ones."""
  state, sample = _QUEUE.sample(state)
  state = _QUEUE.add(state, batch)
  return state, sample.experience


# ---------------------------------------------------------------- K. vmapped per-agent buffers

N_AGENTS = 4
_AGENT_BUF = fbx.make_flat_buffer(max_length=8192, min_length=16, sample_batch_size=64,
                                  add_batch_size=4)


def _agent_trans(key):
  z = jax.random.normal(key, (N_AGENTS, 4, 9), jnp.float32)
  return {"obs": z[..., :8], "reward": z[..., 8]}


_agent_trans_jit = jax.jit(_agent_trans)


def _agents_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0, 0], _agent_trans(jax.random.key(0)))
    s = jax.vmap(lambda _: _AGENT_BUF.init(ex))(jnp.arange(N_AGENTS))
    return jax.vmap(_AGENT_BUF.add)(s, _agent_trans(jax.random.key(8)))
  return jax.tree.map(_strong, warm()), _agent_trans_jit(jax.random.key(1)), jax.random.key(2)


def agents_sample_add(state, trans, key):
  """One buffer per agent (IPPO/IDQN-style) with jax.vmap over buffer.sample / add."""
  batch = jax.vmap(_AGENT_BUF.sample)(state, jax.random.split(key, N_AGENTS))
  state = jax.vmap(_AGENT_BUF.add)(state, trans)
  return state, batch.experience


def _agents_next(args, out):
  key, k = jax.random.split(args[2])
  return out[0], _agent_trans_jit(k), key


# ---------------------------------------------------------------- L. while_loop reading old buffer


def wl_read_old_then_refill(buf, y0, w):
  """Summarise the previous trajectory (kept in the donated buffer), then refill it with a
  bounded eqx.internal.while_loop."""
  prev_mean = jnp.mean(buf, axis=0)
  prev_last = buf[-1]
  buf, y = _wl_step("bounded")(buf, y0 + 0.0 * prev_last, w)
  return buf, y, prev_mean


def _wlr_next(args, out):
  return out[0], out[1], args[2]


# ---------------------------------------------------------------- M. bf16 model with fp32 master copy

_BF_OPT = optax.adamw(1e-3)


@eqx.filter_jit
def _bf_model():
  return eqx.nn.MLP(256, 256, 1024, 2, key=jax.random.key(0), dtype=jnp.bfloat16)


def _bf_args():
  params, static = eqx.partition(_bf_model(), eqx.is_array)
  master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(1), (64, 256), jnp.bfloat16))()
  return params, master, static, jax.jit(_BF_OPT.init)(master), x


def bf16_step(params, master, static, opt_state, x):
  """Mixed precision: bf16 forward/backward, adamw on fp32 master weights, then the bf16
  params are re-cast from the master copy. params, master, opt_state donated."""
  def loss(p):
    y = jax.vmap(eqx.combine(p, static))(x)
    return jnp.mean((y.astype(jnp.float32) - jnp.tanh(x.astype(jnp.float32))) ** 2)

  l, g = jax.value_and_grad(loss)(params)
  g = jax.tree.map(lambda a: a.astype(jnp.float32), g)
  updates, opt_state = _BF_OPT.update(g, opt_state, master)
  master = optax.apply_updates(master, updates)
  params = jax.tree.map(lambda m: m.astype(jnp.bfloat16), master)
  return params, master, opt_state, l


def _bf_next(args, out):
  _, _, static, _, x = args
  params, master, opt_state, _ = out
  return params, master, static, opt_state, x


# ---------------------------------------------------------------- N. gymnax MinAtar rollout

_MA, _MA_PARAMS = gymnax.make("Breakout-MinAtar")
MA_ENVS, MA_STEPS = 64, 32


def minatar_rollout(obs_buf, runner):
  """Breakout-MinAtar, random policy, lax.scan storing the (10,10,4) bool frames into a
  donated obs buffer; runner donated."""
  def body(carry, t):
    obs_buf, (obs, st, key) = carry
    key, ka, ks = jax.random.split(key, 3)
    action = jax.random.randint(ka, (MA_ENVS,), 0, _MA.num_actions)
    nobs, st, r, term, trunc, _ = jax.vmap(_MA.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, MA_ENVS), st, action, _MA_PARAMS)
    obs_buf = obs_buf.at[t].set(obs)
    return (obs_buf, (nobs, st, key)), r

  (obs_buf, runner), rs = lax.scan(body, (obs_buf, runner), jnp.arange(MA_STEPS))
  return obs_buf, runner, rs


@jax.jit
def _ma_args():
  obs, st = jax.vmap(_MA.reset, in_axes=(0, None))(
      jax.random.split(jax.random.key(0), MA_ENVS), _MA_PARAMS)
  buf = jnp.zeros((MA_STEPS,) + obs.shape, obs.dtype)
  return buf, (obs, st, jax.random.key(1))


def _ma_next(args, out):
  return out[0], out[1]


# ---------------------------------------------------------------- O. diffrax event (bouncing)


def diffrax_event_batch(y0, g):
  """Falling particles (vmap over 4096): solve until the event 'height < 0' fires; the
  final states are the next initial conditions. y0 donated."""
  def field(t, y, args):
    return jnp.stack([y[1], -args])

  def cond_fn(t, y, args, **kwargs):
    return y[0]

  def one(y):
    sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), t0=0.0, t1=5.0,
                              dt0=0.05, y0=y, args=g, event=diffrax.Event(cond_fn),
                              max_steps=128)
    yf = sol.ys[-1]
    return jnp.stack([jnp.abs(yf[0]) + 1.0, -0.8 * yf[1]]), sol.ts[-1]

  return jax.vmap(one)(y0)


@jax.jit
def _ev_args():
  y0 = jax.random.uniform(jax.random.key(0), (4096, 2), minval=0.5, maxval=2.0)
  return y0, jnp.float32(9.81)


def _ev_next(args, out):
  return out[0], args[1]


# ---------------------------------------------------------------- P. eqx State + lax.cond reset


class EMATracker(eqx.Module):
  linear: eqx.nn.Linear
  stats: eqx.nn.StateIndex
  count: eqx.nn.StateIndex

  def __init__(self, key):
    self.linear = eqx.nn.Linear(512, 512, key=key)
    self.stats = eqx.nn.StateIndex(jnp.zeros((2, 512, 512), jnp.float32))  # 2 MiB
    self.count = eqx.nn.StateIndex(jnp.array(0, jnp.int32))

  def __call__(self, x, state):
    stats = state.get(self.stats)
    count = state.get(self.count)
    h = jax.vmap(self.linear)(x)
    cov = h.T @ h / h.shape[0]
    # reset the accumulated statistics every 2 calls, otherwise accumulate
    stats = lax.cond(count % 2 == 0,
                     lambda s: s.at[0].set(cov).at[1].set(cov * cov),
                     lambda s: s.at[0].add(cov).at[1].add(cov * cov), stats)
    state = state.set(self.stats, stats).set(self.count, count + 1)
    return h @ stats[0][:, :8], state


@eqx.filter_jit
def _ema_model():
  return eqx.nn.make_with_state(EMATracker)(jax.random.key(0))


def _ema_args():
  model, state = _ema_model()
  params, static = eqx.partition(model, eqx.is_array)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(3), (32, 512), jnp.float32))()
  return params, static, state, x


def ema_step(params, static, state, x):
  model = eqx.combine(params, static)
  out, state = model(x, state)
  return out, state


PROGRAMS += [
    RealProgram("flashbax_cond_learn", "flashbax",
                "prioritised flat buffer add, then lax.cond(can_sample, learn: sample + "
                "adam on eqx MLP + set_priorities, skip); state, params, opt_state donated",
                cond_learn_step, _cq_args, (0, 1, 3), _cq_next, static_argnums=(2,)),
    RealProgram("flashbax_queue_pop_push", "flashbax",
                "fbx.make_trajectory_queue: sample (pop) 8 steps then add 8; state donated",
                queue_pop_push, _q_args, (0,), _traj_next),
    RealProgram("flashbax_vmap_agents", "flashbax",
                "4 per-agent flat buffers, jax.vmap(buffer.sample) then "
                "jax.vmap(buffer.add); stacked state donated", agents_sample_add,
                _agents_args, (0,), _agents_next),
    RealProgram("eqx_while_read_old_then_refill", "equinox",
                "mean/last row of the old 1 MiB buffer read, then eqx.internal.while_loop"
                "(kind='bounded', buffers=...) refills it; buffer donated",
                wl_read_old_then_refill, _wl_args, (0,), _wlr_next),
    RealProgram("eqx_bf16_master_adamw", "equinox",
                "bf16 eqx.nn.MLP (dtype=bfloat16), adamw on fp32 master weights, bf16 "
                "recast; params, master, opt_state donated", bf16_step, _bf_args,
                (0, 1, 3), _bf_next, static_argnums=(2,)),
    RealProgram("gymnax_minatar_breakout", "gymnax",
                "Breakout-MinAtar random policy, lax.scan writing bool frames into a "
                "donated buffer; buffer and runner donated", minatar_rollout, _ma_args,
                (0, 1), _ma_next),
    RealProgram("diffrax_event_vmap", "diffrax",
                "vmap over 4096 of diffeqsolve Tsit5 with diffrax.Event (height<0), bounce "
                "as next y0; y0 donated", diffrax_event_batch, _ev_args, (0,), _ev_next),
    RealProgram("eqx_state_cond_reset", "equinox",
                "eqx.nn.State with two StateIndex (2 MiB stats, counter); lax.cond resets "
                "or accumulates the stats; state donated", ema_step, _ema_args, (2,),
                lambda a, o: (a[0], a[1], o[1], a[3])),
]


# =========================================================================== batch 4: PureJaxRL GAE with
# the trajectory as scan xs, minibatch reshapes, hard target updates, tied weights, uint8 frames


class Transition(eqx.Module):
  done: jax.Array
  value: jax.Array
  reward: jax.Array
  log_prob: jax.Array
  obs: jax.Array


TB_STEPS, TB_ENVS = 128, 1024


def purejaxrl_gae(traj_batch, last_val):
  """PureJaxRL's _calculate_gae: reverse lax.scan over the trajectory (the xs), returning
  (advantages, advantages + values). traj_batch donated: JAX may reuse its buffers for
  the outputs of the same shape."""
  def _get_advantages(gae_and_next_value, transition):
    gae, next_value = gae_and_next_value
    done, value, reward = transition.done, transition.value, transition.reward
    delta = reward + GAMMA * next_value * (1 - done) - value
    gae = delta + GAMMA * LAMBDA * (1 - done) * gae
    return (gae, value), gae

  _, advantages = lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                           traj_batch, reverse=True, unroll=16)
  return advantages, advantages + traj_batch.value


@jax.jit
def _tb_args():
  z = jax.random.normal(jax.random.key(0), (4, TB_STEPS, TB_ENVS), jnp.float32)
  tb = Transition(done=(z[0] > 1.5).astype(jnp.float32), value=z[1], reward=z[2],
                  log_prob=-jnp.abs(z[3]),
                  obs=jnp.zeros((TB_STEPS, TB_ENVS, 4), jnp.float32) + z[3][..., None])
  return tb, z[1, 0]


def _tb_next(args, out):
  adv, tgt = out
  tb, lv = args
  # the next iteration's trajectory: built from the outputs (fresh buffers)
  return Transition(done=(adv > 1.0).astype(jnp.float32), value=tgt * 0.5, reward=adv,
                    log_prob=adv * 0.1, obs=jnp.zeros((TB_STEPS, TB_ENVS, 4)) + adv[..., None]
                    ), lv


def _gae_obs_norm(traj_batch, last_val):
  """GAE, then in the same step the trajectory's obs normalised by a forward scan over
  time (xs -> ys of the same shape), and the trajectory flattened and shuffled into
  PPO minibatches, as PureJaxRL's _update_epoch does."""
  adv, tgt = purejaxrl_gae(traj_batch, last_val)
  mean = traj_batch.obs.mean((0, 1))
  std = traj_batch.obs.std((0, 1)) + 1e-8
  _, obs_n = lax.scan(lambda c, o: (c, (o - mean) / std), None, traj_batch.obs)
  batch = (traj_batch._replace(obs=obs_n) if hasattr(traj_batch, "_replace") else
           eqx.tree_at(lambda t: t.obs, traj_batch, obs_n), adv, tgt)
  batch = jax.tree.map(lambda x: x.reshape((TB_STEPS * TB_ENVS,) + x.shape[2:]), batch)
  perm = jax.random.permutation(jax.random.key(0), TB_STEPS * TB_ENVS)
  shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0), batch)
  minibatches = jax.tree.map(lambda x: x.reshape((8, -1) + x.shape[1:]), shuffled)
  return minibatches


def _mb_next(args, out):
  (tb, adv, tgt) = out
  lv = args[1]
  r = lambda x: x.reshape((TB_STEPS, TB_ENVS) + x.shape[2:])
  return jax.tree.map(r, tb), lv


# ---------------------------------------------------------------- hard target update


def dqn_hard_target_step(params, target, static, opt_state, batch, step):
  """DQN with a periodic hard target update: target <- params every 2 steps
  (jnp.where / optax.periodic_update), params, target, opt_state donated."""
  def loss_fn(p):
    q = jax.vmap(eqx.combine(p, static))(batch["obs"])
    q_next = jax.vmap(eqx.combine(target, static))(batch["next_obs"])
    tgt = batch["reward"] + 0.99 * jnp.max(q_next, -1)
    qa = jnp.take_along_axis(q, batch["action"][:, None], 1)[:, 0]
    return jnp.mean((qa - tgt) ** 2)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = _Q_OPT.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  target = optax.periodic_update(new_params, target, step, 2)
  return new_params, target, opt_state, loss, step + 1


def _dqnh_args():
  return (*_dqn_args(), jnp.array(1, jnp.int32))


def _dqnh_next(args, out):
  _, _, static, _, batch, _ = args
  params, target, opt_state, _, step = out
  return params, target, static, opt_state, batch, step


# ---------------------------------------------------------------- tied embeddings (eqx.nn.Shared)


class TiedLM(eqx.Module):
  shared: eqx.nn.Shared
  mlp: eqx.nn.MLP

  def __init__(self, key):
    k1, k2, k3 = jax.random.split(key, 3)
    emb = eqx.nn.Embedding(4096, 128, key=k1)                      # 2 MiB
    head = eqx.nn.Linear(128, 4096, use_bias=False, key=k2)
    where = lambda pair: pair[1].weight
    get = lambda pair: pair[0].weight
    self.shared = eqx.nn.Shared((emb, head), where, get)
    self.mlp = eqx.nn.MLP(128, 128, 256, 1, key=k3)

  def __call__(self, tok):
    emb, head = self.shared()
    return head(self.mlp(emb(tok)))


_TIED_OPT = optax.sgd(1e-2)


@eqx.filter_jit
def _tied():
  return TiedLM(jax.random.key(0))


def _tied_args():
  params, static = eqx.partition(_tied(), eqx.is_array)
  toks = jax.jit(lambda: jax.random.randint(jax.random.key(1), (64, 2), 0, 4096))()
  return params, static, jax.jit(_TIED_OPT.init)(params), toks


def tied_step(params, static, opt_state, toks):
  def loss(model):
    logits = jax.vmap(model)(toks[:, 0])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1]))

  model = eqx.combine(params, static)
  l, g = eqx.filter_value_and_grad(loss)(model)
  updates, opt_state = _TIED_OPT.update(g, opt_state)
  params = eqx.apply_updates(params, updates)
  return params, opt_state, l


def _tied_next(args, out):
  _, static, _, toks = args
  return out[0], static, out[1], toks


# ---------------------------------------------------------------- uint8 frame stack + PRNGKey


def frame_stack_step(frames, key, new_frame_f):
  """Atari-style frame stack of uint8 frames: shift the stack by one (roll) and write the
  newest frame, with an old-style PRNGKey (uint32[2]) split and carried; both donated."""
  key, k = jax.random.split(key)
  noise = jax.random.randint(k, new_frame_f.shape, 0, 3, jnp.uint8)
  new = (jnp.clip(new_frame_f, 0, 1) * 252).astype(jnp.uint8) + noise
  frames = jnp.concatenate([frames[:, 1:], new[:, None]], axis=1)
  return frames, key, frames[:, -2].astype(jnp.float32).mean()


@jax.jit
def _fs_args():
  frames = jnp.zeros((32, 4, 84, 84), jnp.uint8)   # 882 KiB
  return frames, jax.random.PRNGKey(0), jax.random.uniform(jax.random.key(1), (32, 84, 84))


def _fs_next(args, out):
  return out[0], out[1], args[2] * 0.9


# ---------------------------------------------------------------- diffrax DirectAdjoint grad


def diffrax_direct_adjoint_fit(params, y0, ys_obs):
  """Fit (k, c) of a damped oscillator to observations by SGD through diffeqsolve with
  DirectAdjoint (bounded while loop); params donated, and the whole trajectory returned."""
  def field(t, y, p):
    return jnp.stack([y[1], -p[0] * y[0] - p[1] * y[1]])

  ts = jnp.linspace(0.0, 3.0, ys_obs.shape[1])

  def loss(p):
    def one(y):
      sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Heun(), t0=0.0, t1=3.0,
                                dt0=0.05, y0=y, args=p, saveat=diffrax.SaveAt(ts=ts),
                                adjoint=diffrax.DirectAdjoint(), max_steps=64)
      return sol.ys
    pred = jax.vmap(one)(y0)
    return jnp.mean((pred - ys_obs) ** 2), pred

  (l, pred), g = jax.value_and_grad(loss, has_aux=True)(params)
  return params - 0.05 * g, l, pred


@jax.jit
def _da_args():
  y0 = jax.random.normal(jax.random.key(0), (64, 2))
  ts = jnp.linspace(0.0, 3.0, 16)
  ys = jnp.stack([jnp.exp(-0.1 * ts) * jnp.cos(2 * ts) * y[0] for y in y0[:1]] * 64)
  ys = jnp.stack([ys, -ys], -1)
  return jnp.array([3.0, 0.5]), y0, ys


def _da_next(args, out):
  return out[0], args[1], args[2]


PROGRAMS += [
    RealProgram("gymnax_purejaxrl_gae_xs", "gymnax",
                "PureJaxRL _calculate_gae: reverse lax.scan(unroll=16) over the Transition "
                "pytree as xs, returns advantages and targets; trajectory donated",
                purejaxrl_gae, _tb_args, (0,), _tb_next),
    RealProgram("gymnax_gae_normalise_minibatch", "gymnax",
                "GAE + obs normalised by a scan xs->ys + flatten/permute/reshape into 8 "
                "minibatches (PureJaxRL _update_epoch); trajectory donated",
                _gae_obs_norm, _tb_args, (0,), _mb_next),
    RealProgram("eqx_dqn_hard_target", "equinox",
                "DQN with optax.periodic_update hard target copy every 2 steps; params, "
                "target, opt_state and step donated", dqn_hard_target_step, _dqnh_args,
                (0, 1, 3, 5), _dqnh_next, static_argnums=(2,)),
    RealProgram("eqx_shared_tied_embedding", "equinox",
                "eqx.nn.Shared tying an Embedding(4096x128) and the output Linear, sgd; "
                "params and opt_state donated", tied_step, _tied_args, (0, 2), _tied_next,
                static_argnums=(1,)),
    RealProgram("gymnax_uint8_frame_stack", "gymnax",
                "Atari-style uint8 frame stack (32x4x84x84) shifted with concatenate and "
                "the new frame written; old-style PRNGKey carried; both donated",
                frame_stack_step, _fs_args, (0, 1), _fs_next),
    RealProgram("diffrax_direct_adjoint_fit", "diffrax",
                "SGD on ODE parameters through vmap(diffeqsolve(Heun, SaveAt(ts), "
                "DirectAdjoint)); params donated", diffrax_direct_adjoint_fit, _da_args,
                (0,), _da_next),
]


# =========================================================================== batch 5: overlapping
# shifts, rolls, branches that replace the buffer, relabel-and-add


def frame_shift_inplace(frames, key, new_frame_f):
  """The frame stack shifted within its own buffer: frames.at[:, :-1].set(frames[:, 1:]),
  then the newest frame written at the end."""
  key, k = jax.random.split(key)
  noise = jax.random.randint(k, new_frame_f.shape, 0, 3, jnp.uint8)
  new = (jnp.clip(new_frame_f, 0, 1) * 252).astype(jnp.uint8) + noise
  frames = frames.at[:, :-1].set(frames[:, 1:])
  frames = frames.at[:, -1].set(new)
  return frames, key, frames[:, -2].astype(jnp.float32).mean()


def _fs_args_nonzero():
  frames, key, f = _fs_args()
  frames = jax.jit(lambda: (jnp.arange(32 * 4 * 84 * 84, dtype=jnp.uint32) % 251).astype(
      jnp.uint8).reshape(32, 4, 84, 84))()
  return frames, key, f


HIST = 64


def obs_history_roll(hist, obs):
  """Gymnax-wrapper-style observation history: hist = jnp.roll(hist, -1, axis=1) then
  hist.at[:, -1].set(obs); returns the history's features before and after."""
  before = hist.mean(1)
  hist = jnp.roll(hist, -1, axis=1).at[:, -1].set(obs)
  return hist, before, hist[:, 0]


@jax.jit
def _hist_args():
  hist = jax.random.normal(jax.random.key(0), (512, HIST, 16))   # 2 MiB
  return hist, jax.random.normal(jax.random.key(1), (512, 16))


def _hist_next(args, out):
  return out[0], args[1] * 0.5 + 1.0


def episode_buffer_cond_reset(buf, t, obs, episode_done):
  """Per-episode buffer: if the episode ended, start a fresh zero buffer (lax.cond
  returning jnp.zeros_like), otherwise write obs at t."""
  def reset(args):
    buf, t = args
    return jnp.zeros_like(buf).at[0].set(obs), jnp.array(1, jnp.int32)

  def write(args):
    buf, t = args
    return buf.at[t].set(obs), t + 1

  buf, t = lax.cond(episode_done, reset, write, (buf, t))
  return buf, t, buf.sum(0)


@jax.jit
def _ep_args():
  return (jax.random.normal(jax.random.key(0), (256, 1024)), jnp.array(5, jnp.int32),
          jnp.ones((1024,)), jnp.array(False))


def _ep_next(args, out):
  buf, t, _ = out
  return buf, t, args[2] + 1.0, jnp.logical_not(args[3])


def her_relabel_add(state, batch, key):
  """Hindsight relabelling: sample from the buffer, replace the goal (last 4 obs dims) by
  the achieved state, recompute reward and add the relabelled transitions back."""
  s = _FLAT.sample(state, key).experience.first
  relabelled = {
      "obs": s["obs"].at[:, -4:].set(s["obs"][:, :4])[:8],
      "action": s["action"][:8],
      "reward": (jnp.linalg.norm(s["obs"][:8, :4] - s["obs"][:8, -4:], axis=-1) < 1.0
                 ).astype(jnp.float32),
      "done": s["done"][:8],
  }
  state = _FLAT.add(state, batch)
  state = _FLAT.add(state, relabelled)
  return state, s["reward"]


def _flat_args():
  @jax.jit
  def warm():
    def tr(key):
      z = jax.random.normal(key, (8, 17), jnp.float32)
      return {"obs": z[:, :16], "action": jnp.argmax(z[:, :4], -1).astype(jnp.int32),
              "reward": jax.nn.sigmoid(z[:, 16]), "done": jnp.zeros((8,), jnp.bool_)}
    ex = jax.tree.map(lambda x: x[0], tr(jax.random.key(0)))
    s = _FLAT.init(ex)
    return lax.fori_loop(0, 64, lambda i, s: _FLAT.add(s, tr(jax.random.fold_in(
        jax.random.key(100), i))), s), tr(jax.random.key(1))
  s, b = warm()
  return jax.tree.map(_strong, s), b, jax.random.key(2)


_FLAT = fbx.make_flat_buffer(max_length=32768, min_length=64, sample_batch_size=256,
                             add_batch_size=8)


def _her_next(args, out):
  key, _ = jax.random.split(args[2])
  return out[0], args[1], key


PROGRAMS += [
    RealProgram("gymnax_frame_shift_inplace", "gymnax",
                "uint8 frame stack shifted inside its own buffer (.at[:, :-1].set("
                "frames[:, 1:])) then newest frame set; frames and PRNGKey donated",
                frame_shift_inplace, _fs_args_nonzero, (0, 1), _fs_next),
    RealProgram("gymnax_obs_history_roll", "gymnax",
                "observation history jnp.roll(-1).at[:, -1].set(obs), mean of the old "
                "history returned; history donated", obs_history_roll, _hist_args, (0,),
                _hist_next),
    RealProgram("gymnax_episode_cond_reset", "gymnax",
                "per-episode buffer: lax.cond(done, zeros_like(buf).at[0].set(obs), "
                "buf.at[t].set(obs)); buffer and t donated", episode_buffer_cond_reset,
                _ep_args, (0, 1), _ep_next),
    RealProgram("flashbax_her_relabel_add", "flashbax",
                "HER: sample 256 from a flat buffer, relabel goals, add the new batch and "
                "8 relabelled transitions back; state donated", her_relabel_add,
                _flat_args, (0,), _her_next),
]


# =========================================================================== batch 6: switch/cond in
# loops, vmapped while with batched predicate, MultiSteps, unique scatters, scan over layers

N_TASK_ENVS, SW_STEPS = 256, 64


def multitask_switch_scan(buf, counts, obs, task_ids):
  """Multi-task logging: per step, lax.switch on a (scalar) task id picks how the step's
  observation is written into the donated log buffer (set / running add / max); the
  per-task counters are updated in the same branch."""
  def body(carry, t):
    buf, counts, obs = carry
    obs = jnp.tanh(obs * 1.1 + 0.1)
    k = task_ids[t]

    def b_set(bc):
      b, c = bc
      return b.at[t].set(obs), c.at[0].add(1)

    def b_acc(bc):
      b, c = bc
      return b.at[t].set(b[t - 1] * 0.9 + obs), c.at[1].add(1)

    def b_max(bc):
      b, c = bc
      return b.at[t].set(jnp.maximum(b[t], obs)), c.at[2].add(1)

    buf, counts = lax.switch(k, (b_set, b_acc, b_max), (buf, counts))
    return (buf, counts, obs), buf[t].sum()

  (buf, counts, obs), sums = lax.scan(body, (buf, counts, obs), jnp.arange(SW_STEPS))
  return buf, counts, obs, sums


@jax.jit
def _sw_args():
  buf = jax.random.normal(jax.random.key(0), (SW_STEPS, N_TASK_ENVS, 64))   # 4 MiB
  obs = jax.random.normal(jax.random.key(1), (N_TASK_ENVS, 64))
  tids = jax.random.randint(jax.random.key(2), (SW_STEPS,), 0, 3)
  return buf, jnp.zeros((3,), jnp.int32), obs, tids


def _sw_next(args, out):
  buf, counts, obs, _ = out
  return buf, counts, obs, (args[3] + 1) % 3


def cond_add_in_scan(state, runner, w):
  """Collect with a scan; each step adds to the flashbax buffer only when no env is done
  (lax.cond(any(done), skip, add)), as some off-policy collectors filter transitions."""
  def body(carry, _):
    state, (obs, st, key) = carry
    key, ks = jax.random.split(key)
    action = (obs @ w > 0).astype(jnp.int32)
    nobs, st, r, term, trunc, _ = jax.vmap(_CP.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, 8), st, action, _CP_PARAMS)
    trans = {"obs": jnp.pad(obs, ((0, 0), (0, 12))), "action": action, "reward": r,
             "done": term}
    state = lax.cond(jnp.any(term), lambda s: s, lambda s: _FLAT.add(s, trans), state)
    return (state, (nobs, st, key)), r.sum()

  (state, runner), rs = lax.scan(body, (state, runner), None, length=32)
  return state, runner, rs


def _cas_args():
  s, _, _ = _flat_args()

  @jax.jit
  def run():
    obs, st = jax.vmap(_CP.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 8),
                                                      _CP_PARAMS)
    return (obs, st, jax.random.key(1)), jnp.array([0.0, 0.0, 1.0, 1.0])
  r, w = run()
  return s, r, w


def _cas_next(args, out):
  return out[0], out[1], args[2]


EV_ENVS, EV_MAX = 128, 200


def eval_until_done(rew_buf, keys, w):
  """Policy evaluation: jax.vmap over envs of a lax.while_loop that runs each CartPole
  episode until done (a batched predicate), writing each step's reward into the env's
  row of a donated (EV_ENVS, EV_MAX) buffer."""
  def one(row, key):
    k0, key = jax.random.split(key)
    obs, st = _CP.reset(k0, _CP_PARAMS)

    def cond(c):
      t, done, *_ = c
      return jnp.logical_and(~done, t < EV_MAX)

    def body(c):
      t, done, obs, st, key, row = c
      key, ks = jax.random.split(key)
      a = (obs @ w > 0).astype(jnp.int32)
      obs, st, r, term, trunc, _ = _CP.step(ks, st, a, _CP_PARAMS)
      row = row.at[t].set(r)
      return t + 1, jnp.logical_or(term, trunc), obs, st, key, row

    t, _, _, _, _, row = lax.while_loop(cond, body, (0, False, obs, st, key, row))
    return row, t

  rows, lengths = jax.vmap(one)(rew_buf, keys)
  return rows, lengths


@jax.jit
def _ev2_args():
  return (jnp.zeros((EV_ENVS, EV_MAX), jnp.float32) - 1.0,
          jax.random.split(jax.random.key(0), EV_ENVS),
          jnp.array([0.0, 0.3, 1.0, 1.0]))


def _ev2_next(args, out):
  return out[0], jax.vmap(lambda k: jax.random.fold_in(k, 1))(args[1]), args[2] * 0.9


_MS_OPT = optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2)


def _ms_args():
  params, static = eqx.partition(_mlp_small(), eqx.is_array)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(1), (64, 128)))()
  return params, static, jax.jit(_MS_OPT.init)(params), x


@eqx.filter_jit
def _mlp_small():
  return eqx.nn.MLP(128, 128, 512, 2, key=jax.random.key(0))


def multisteps_step(params, static, opt_state, x):
  """optax.MultiSteps (gradient accumulation over 2 micro-steps) on an eqx.nn.MLP;
  params and opt_state (with the accumulators) donated."""
  def loss(p):
    return jnp.mean((jax.vmap(eqx.combine(p, static))(x) - jnp.sin(x)) ** 2)
  l, g = jax.value_and_grad(loss)(params)
  updates, opt_state = _MS_OPT.update(g, opt_state, params)
  return eqx.apply_updates(params, updates), opt_state, l


def _ms_next(args, out):
  return out[0], args[1], out[1], args[3]


def priority_decay_unique(prio, idx, td):
  """Priority replay bookkeeping: decay all sampled priorities by a read-modify-write
  scatter with unique indices, then write new |td| for them."""
  old = prio[idx]
  prio = prio.at[idx].set(jnp.maximum(old * 0.9, jnp.abs(td)), unique_indices=True)
  return prio, old.sum()


@jax.jit
def _pd_args():
  prio = jax.random.uniform(jax.random.key(0), (1 << 20,))      # 4 MiB
  idx = jax.random.permutation(jax.random.key(1), 1 << 20)[:4096]
  return prio, idx, jax.random.normal(jax.random.key(2), (4096,))


def _pd_next(args, out):
  return out[0], (args[1] * 3 + 1) % (1 << 20), args[2]


# Equinox "scan over layers": stacked layers via eqx.filter_vmap, applied with lax.scan,
# gradient through the scan, layers donated.
N_LAYERS, LW = 8, 256


@eqx.filter_jit
def _stack():
  make = lambda k: eqx.nn.MLP(LW, LW, LW, 1, key=k)
  return eqx.filter_vmap(make)(jax.random.split(jax.random.key(0), N_LAYERS))


def scan_layers_step(params, static, opt_state, x):
  def forward(p, x):
    dyn, st = eqx.partition(eqx.combine(p, static), eqx.is_array)

    def f(x, layer_dyn):
      layer = eqx.combine(layer_dyn, st)
      return x + eqx.filter_checkpoint(jax.vmap(layer))(x), None
    out, _ = lax.scan(f, x, dyn)
    return out

  def loss(p):
    return jnp.mean((forward(p, x) - x[:, ::-1]) ** 2)
  l, g = jax.value_and_grad(loss)(params)
  updates, opt_state = _CNN_OPT.update(g, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, l


def _sl_args():
  params, static = eqx.partition(_stack(), eqx.is_array)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(1), (32, LW)))()
  return params, static, jax.jit(_CNN_OPT.init)(params), x


PROGRAMS += [
    RealProgram("gymnax_switch_in_scan_log", "gymnax",
                "lax.scan over 64 steps with lax.switch(task_id) over 3 branches each "
                "updating the 4 MiB log buffer (set / b[t-1]-based / max) and counters; "
                "buffer and counters donated", multitask_switch_scan, _sw_args, (0, 1),
                _sw_next),
    RealProgram("flashbax_cond_add_in_scan", "flashbax",
                "CartPole scan collector with lax.cond(any(done), skip, buffer.add) inside "
                "the scan; flashbax state and runner donated", cond_add_in_scan, _cas_args,
                (0, 1), _cas_next),
    RealProgram("gymnax_vmap_while_eval", "gymnax",
                "vmap over 128 envs of lax.while_loop(until done) writing rewards into the "
                "env's row of a donated buffer (batched predicate)", eval_until_done,
                _ev2_args, (0,), _ev2_next),
    RealProgram("eqx_optax_multisteps", "equinox",
                "optax.MultiSteps(adam, every 2) on an eqx.nn.MLP; params and opt_state "
                "donated", multisteps_step, _ms_args, (0, 2), _ms_next, static_argnums=(1,)),
    RealProgram("flashbax_style_priority_unique_scatter", "flashbax",
                "1M priorities: read sampled, .at[idx].set(max(0.9 old, |td|), "
                "unique_indices=True); priorities donated", priority_decay_unique,
                _pd_args, (0,), _pd_next),
    RealProgram("eqx_scan_over_layers", "equinox",
                "8 stacked eqx MLP layers (filter_vmap), lax.scan over layers with "
                "eqx.filter_checkpoint, adamw; params, opt_state donated",
                scan_layers_step, _sl_args, (0, 2), _ms_next, static_argnums=(1,)),
]


# =========================================================================== batch 7: aliasing outputs,
# pass-through, weak-type recompiles, complex ODE, error_if, debug callbacks


def flat_add_return_experience(state, transitions, key):
  """Add, then return the new state and (for logging) its experience dict: the same
  arrays appear twice in the outputs."""
  state = _FLAT.add(state, transitions)
  return state, state.experience["reward"], state.experience


def _flat8_args():
  s, b, k = _flat_args()
  return s, b, k


def return_old_and_new(buf, x):
  """Keep the previous snapshot (returned) and the updated buffer."""
  new = buf.at[0].set(x).at[-1].add(x)
  return new, buf


@jax.jit
def _ron_args():
  return jax.random.normal(jax.random.key(0), (512, 1024)), jnp.ones((1024,))


def _ron_next(args, out):
  return out[0], args[1] + 1.0


def _ptraj_weak_args():
  """As flashbax_prio_trajectory, without casting the weakly typed
  max_recorded_priority: step 1 and step 2 compile different signatures."""
  make = _traj_make_args(_PTRAJ)
  def f():
    s, b, k = make()
    s = s.replace(sum_tree_state=s.sum_tree_state.replace(
        max_recorded_priority=jnp.asarray(1.0)))  # weak f32
    return s, b, k
  return f


def schrodinger_step(psi, v, dt):
  """Split-step-like time evolution with diffrax on a complex wavefunction (complex64):
  i dpsi/dt = -0.5 lap psi + V psi, Tsit5 with fixed steps; psi donated. Also returns
  the overlap <psi0|psi1>."""
  def field(t, y, args):
    lap = jnp.roll(y, 1) + jnp.roll(y, -1) - 2 * y
    return -1j * (-0.5 * lap + args * y)

  sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), t0=0.0, t1=dt,
                            dt0=dt / 8, y0=psi, args=v, saveat=diffrax.SaveAt(t1=True))
  psi1 = sol.ys[0]
  psi1 = psi1 / jnp.linalg.norm(psi1)
  return psi1, jnp.vdot(psi, psi1)


@jax.jit
def _sch_args():
  x = jnp.linspace(-10, 10, 1 << 16)
  psi = (jnp.exp(-x ** 2) * jnp.exp(1j * 2 * x)).astype(jnp.complex64)
  psi = psi / jnp.linalg.norm(psi)
  return psi, (0.5 * x ** 2 * 0.01).astype(jnp.float32), jnp.float32(0.01)


def _sch_next(args, out):
  return out[0], args[1], args[2]


def error_if_then_update(buf, x, t):
  """Equinox runtime check on the donated buffer (eqx.error_if) before writing into it."""
  buf = eqx.error_if(buf, jnp.any(jnp.isnan(buf)), "NaN in replay buffer")
  old = buf[t]
  buf = buf.at[t].set(x)
  buf = eqx.error_if(buf, ~jnp.all(jnp.isfinite(x)), "non-finite write")
  return buf, old.sum(), t + 1


@jax.jit
def _ei_args():
  return jax.random.normal(jax.random.key(0), (1024, 512)), jnp.ones((512,)), jnp.array(3)


def _ei_next(args, out):
  return out[0], args[1] * 2.0, out[2]


_LOGGED = []


def debug_print_then_update(params, static, opt_state, x, y):
  """Adam step that logs with jax.debug.callback the norm of the old weights (a host
  callback reading the donated buffer) before they are updated."""
  model = eqx.combine(params, static)
  jax.debug.callback(lambda n: _LOGGED.append(float(n)),
                     jnp.linalg.norm(params.layers[0].weight))
  loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean(
      (jax.vmap(m)(x) - y) ** 2))(model)
  updates, opt_state = _CNN_OPT.update(grads, opt_state, params)
  params = eqx.apply_updates(params, updates)
  jax.debug.callback(lambda w: _LOGGED.append(float(w[0, 0])), params.layers[0].weight)
  return params, opt_state, loss


def _dp_args():
  params, static = eqx.partition(_mlp_small(), eqx.is_array)
  x = jax.jit(lambda: jax.random.normal(jax.random.key(1), (64, 128)))()
  return params, static, jax.jit(_CNN_OPT.init)(params), x, jnp.sin(x)


def _dp_next(args, out):
  return out[0], args[1], out[1], args[3], args[4]


PROGRAMS += [
    RealProgram("flashbax_add_return_experience", "flashbax",
                "flat buffer add, returning the state and its experience (and reward) "
                "again: the same arrays output twice; state donated",
                flat_add_return_experience, _flat8_args, (0,), _her_next),
    RealProgram("eqx_return_old_and_new", "equinox",
                "snapshot pattern: return the updated buffer and the old one; buffer "
                "donated", return_old_and_new, _ron_args, (0,), _ron_next),
    RealProgram("flashbax_prio_trajectory_weak", "flashbax",
                "as flashbax_prio_trajectory but with the weakly typed "
                "max_recorded_priority (steps 1 and 2 compile different signatures)",
                ptraj_sample_update_add, _ptraj_weak_args(), (0,), _traj_next),
    RealProgram("diffrax_complex_schrodinger", "diffrax",
                "complex64 wavefunction (65536 points, 512 KiB) advanced by diffeqsolve "
                "Tsit5; vdot with the old psi returned; psi donated", schrodinger_step,
                _sch_args, (0,), _sch_next),
    RealProgram("eqx_error_if_buffer", "equinox",
                "eqx.error_if on the donated 2 MiB buffer, read row t, write row t, "
                "error_if again; buffer and t donated", error_if_then_update, _ei_args,
                (0, 2), _ei_next),
    RealProgram("eqx_debug_callback_adamw", "equinox",
                "adamw step on an eqx.nn.MLP with jax.debug.callback logging the old "
                "weight norm and a new weight; params, opt_state donated",
                debug_print_then_update, _dp_args, (0, 2), _dp_next, static_argnums=(1,)),
]


# =========================================================================== batch 8: whole training
# iterations (PureJaxRL PPO update, DQN loop with flashbax), all state donated

PPO_ENVS, PPO_STEPS, PPO_EPOCHS, PPO_MB = 64, 64, 2, 4
_PPO_OPT = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(3e-4, eps=1e-5))


class ActorCritic(eqx.Module):
  actor: eqx.nn.MLP
  critic: eqx.nn.MLP

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.actor = eqx.nn.MLP(4, 2, 64, 2, activation=jnp.tanh, key=k1)
    self.critic = eqx.nn.MLP(4, "scalar", 64, 2, activation=jnp.tanh, key=k2)

  def __call__(self, x):
    return self.actor(x), self.critic(x)


@eqx.filter_jit
def _ac():
  return ActorCritic(jax.random.key(0))


def ppo_update(params, static, opt_state, traj, runner):
  """One PureJaxRL PPO iteration on CartPole with an Equinox actor-critic: scan rollout
  into the donated trajectory buffer, GAE (reverse scan), then PPO_EPOCHS epochs of
  PPO_MB shuffled minibatch adam steps (scan over epochs of scan over minibatches)."""
  net = lambda p: jax.vmap(eqx.combine(p, static))

  def env_step(carry, t):
    traj, (obs, st, key) = carry
    key, ka, ks = jax.random.split(key, 3)
    logits, value = net(params)(obs)
    action = jax.random.categorical(ka, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
    nobs, st, r, term, trunc, _ = jax.vmap(_CP.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, PPO_ENVS), st, action, _CP_PARAMS)
    traj = {"obs": traj["obs"].at[t].set(obs), "action": traj["action"].at[t].set(action),
            "logp": traj["logp"].at[t].set(logp), "value": traj["value"].at[t].set(value),
            "reward": traj["reward"].at[t].set(r),
            "done": traj["done"].at[t].set(jnp.logical_or(term, trunc).astype(jnp.float32))}
    return (traj, (nobs, st, key)), None

  (traj, runner), _ = lax.scan(env_step, (traj, runner), jnp.arange(PPO_STEPS))
  _, last_val = net(params)(runner[0])

  def gae(c, tr):
    g, nv = c
    d = tr["reward"] + GAMMA * nv * (1 - tr["done"]) - tr["value"]
    g = d + GAMMA * LAMBDA * (1 - tr["done"]) * g
    return (g, tr["value"]), g

  _, adv = lax.scan(gae, (jnp.zeros_like(last_val), last_val),
                    {k: traj[k] for k in ("reward", "done", "value")}, reverse=True)
  targets = adv + traj["value"]

  def loss_fn(p, mb):
    logits, value = net(p)(mb["obs"])
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), mb["action"][:, None], 1)[:, 0]
    ratio = jnp.exp(logp - mb["logp"])
    a = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
    pg = -jnp.mean(jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a))
    vl = 0.5 * jnp.mean((value - mb["target"]) ** 2)
    ent = -jnp.mean(jnp.sum(jax.nn.softmax(logits) * jax.nn.log_softmax(logits), -1))
    return pg + 0.5 * vl - 0.01 * ent

  data = {"obs": traj["obs"], "action": traj["action"], "logp": traj["logp"], "adv": adv,
          "target": targets}
  data = jax.tree.map(lambda x: x.reshape((PPO_ENVS * PPO_STEPS,) + x.shape[2:]), data)

  def epoch(carry, _):
    p, o, key = carry
    key, kp = jax.random.split(key)
    perm = jax.random.permutation(kp, PPO_ENVS * PPO_STEPS)
    mbs = jax.tree.map(lambda x: x[perm].reshape((PPO_MB, -1) + x.shape[1:]), data)

    def mb_step(c, mb):
      p, o = c
      l, g = jax.value_and_grad(loss_fn)(p, mb)
      u, o = _PPO_OPT.update(g, o, p)
      return (optax.apply_updates(p, u), o), l

    (p, o), ls = lax.scan(mb_step, (p, o), mbs)
    return (p, o, key), ls.mean()

  obs, st, key = runner
  key, ke = jax.random.split(key)
  (params, opt_state, _), losses = lax.scan(epoch, (params, opt_state, ke), None,
                                            length=PPO_EPOCHS)
  return params, opt_state, traj, (obs, st, key), losses


def _ppo_args():
  params, static = eqx.partition(_ac(), eqx.is_array)

  @jax.jit
  def rest(params):
    obs, st = jax.vmap(_CP.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), PPO_ENVS), _CP_PARAMS)
    z = lambda *s: jnp.zeros((PPO_STEPS, PPO_ENVS) + s, jnp.float32)
    traj = {"obs": z(4), "action": jnp.zeros((PPO_STEPS, PPO_ENVS), jnp.int32),
            "logp": z(), "value": z(), "reward": z(), "done": z()}
    return _PPO_OPT.init(params), traj, (obs, st, jax.random.key(1))
  o, traj, runner = rest(params)
  return params, static, o, traj, runner


def _ppo_next(args, out):
  params, opt_state, traj, runner, _ = out
  return params, args[1], opt_state, traj, runner


# ---------------------------------------------------------------- DQN loop


DQ_ENVS, DQ_STEPS = 8, 16
_DQ_BUF = fbx.make_flat_buffer(max_length=16384, min_length=32, sample_batch_size=64,
                               add_batch_size=DQ_ENVS)


@eqx.filter_jit
def _dq_net():
  return eqx.nn.MLP(4, 2, 128, 2, key=jax.random.key(0))


def dqn_loop(params, target, static, opt_state, buf, runner, step):
  """DQN_STEPS iterations of: epsilon-greedy act in 8 CartPoles, add to the flashbax
  buffer, if (can_sample and step % 2 == 0) a TD-learning adam step (lax.cond), and a
  periodic hard target update. Everything that changes is donated."""
  def it(carry, _):
    params, target, opt_state, buf, (obs, st, key), step = carry
    key, ka, ke, ks, kb = jax.random.split(key, 5)
    q = jax.vmap(eqx.combine(params, static))(obs)
    greedy = jnp.argmax(q, -1)
    rand = jax.random.randint(ka, (DQ_ENVS,), 0, 2)
    action = jnp.where(jax.random.uniform(ke, (DQ_ENVS,)) < 0.1, rand, greedy)
    nobs, st, r, term, trunc, _ = jax.vmap(_CP.step, in_axes=(0, 0, 0, None))(
        jax.random.split(ks, DQ_ENVS), st, action, _CP_PARAMS)
    buf = _DQ_BUF.add(buf, {"obs": obs, "action": action, "reward": r, "done": term})

    def learn(c):
      params, opt_state = c
      b = _DQ_BUF.sample(buf, kb).experience
      f, s = b.first, b.second

      def loss(p):
        qa = jnp.take_along_axis(jax.vmap(eqx.combine(p, static))(f["obs"]),
                                 f["action"][:, None], 1)[:, 0]
        qn = jax.vmap(eqx.combine(target, static))(s["obs"]).max(-1)
        return jnp.mean(optax.huber_loss(qa, f["reward"] + 0.99 * (1 - f["done"]) * qn))
      g = jax.grad(loss)(params)
      u, opt_state = _Q_OPT.update(g, opt_state, params)
      return optax.apply_updates(params, u), opt_state

    params, opt_state = lax.cond(
        jnp.logical_and(_DQ_BUF.can_sample(buf), step % 2 == 0), learn, lambda c: c,
        (params, opt_state))
    target = optax.periodic_update(params, target, step, 8)
    return (params, target, opt_state, buf, (nobs, st, key), step + 1), r.sum()

  (params, target, opt_state, buf, runner, step), rs = lax.scan(
      it, (params, target, opt_state, buf, runner, step), None, length=DQ_STEPS)
  return params, target, opt_state, buf, runner, step, rs


def _dq_args():
  params, static = eqx.partition(_dq_net(), eqx.is_array)

  @jax.jit
  def rest(params):
    obs, st = jax.vmap(_CP.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), DQ_ENVS), _CP_PARAMS)
    ex = {"obs": obs[0], "action": jnp.int32(0), "reward": jnp.float32(0),
          "done": jnp.bool_(False)}
    return (jax.tree.map(lambda a: a.copy(), params), _Q_OPT.init(params),
            _DQ_BUF.init(ex), (obs, st, jax.random.key(1)))
  target, o, buf, runner = rest(params)
  return params, target, static, o, jax.tree.map(_strong, buf), runner, jnp.array(0, jnp.int32)


def _dq_next(args, out):
  params, target, opt_state, buf, runner, step, _ = out
  return params, target, args[2], opt_state, buf, runner, step


PROGRAMS += [
    RealProgram("gymnax_purejaxrl_ppo_update", "gymnax",
                "full PureJaxRL PPO iteration: CartPole scan rollout into a donated "
                "trajectory, GAE, 2 epochs x 4 shuffled minibatch adam steps on an Equinox "
                "actor-critic; params, opt_state, traj, runner donated", ppo_update,
                _ppo_args, (0, 2, 3, 4), _ppo_next, static_argnums=(1,)),
    RealProgram("flashbax_dqn_loop", "flashbax",
                "16 DQN iterations in a lax.scan: act, flashbax add, lax.cond(can_sample & "
                "even step, TD adam step), optax.periodic_update target; all state donated",
                dqn_loop, _dq_args, (0, 1, 3, 4, 5, 6), _dq_next, static_argnums=(2,)),
]


# =========================================================================== batch 9: SDEs, progress
# meter, SubSaveAt, an Equinox KV-cache decode loop


def sde_batch(y0, key):
  """vmap over 1024 paths of an Ornstein-Uhlenbeck SDE (MultiTerm(ODETerm, ControlTerm),
  VirtualBrownianTree, Euler), final states as next y0; y0 donated."""
  def one(y, k):
    drift = lambda t, y, args: -0.5 * y
    diffusion = lambda t, y, args: lineax.DiagonalLinearOperator(0.3 * jnp.ones_like(y))
    bm = diffrax.VirtualBrownianTree(0.0, 1.0, tol=1e-2, shape=y.shape, key=k)
    terms = diffrax.MultiTerm(diffrax.ODETerm(drift),
                              diffrax.ControlTerm(diffusion, bm))
    sol = diffrax.diffeqsolve(terms, diffrax.Euler(), 0.0, 1.0, dt0=0.05, y0=y,
                              saveat=diffrax.SaveAt(t1=True))
    return sol.ys[0]
  ks = jax.random.split(key, y0.shape[0])
  return jax.vmap(one)(y0, ks), jax.random.fold_in(key, 1)


@jax.jit
def _sde_args():
  return jax.random.normal(jax.random.key(0), (1024, 32)), jax.random.key(1)


def _sde_next(args, out):
  return out[0], out[1]


def subsaveat_solve(y0, w):
  """diffeqsolve with SaveAt(subs=[SubSaveAt(ts=..., fn=norm), SubSaveAt(t1=True)]),
  Dopri5 + PID; the final state is the next y0 (donated)."""
  def field(t, y, args):
    return jnp.tanh(y @ args) - 0.2 * y
  ts = jnp.linspace(0.0, 1.0, 33)
  saveat = diffrax.SaveAt(subs=[diffrax.SubSaveAt(ts=ts, fn=lambda t, y, a: jnp.linalg.norm(
      y, axis=-1)), diffrax.SubSaveAt(t1=True)])
  sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Dopri5(), 0.0, 1.0, None, y0,
                            args=w, saveat=saveat, max_steps=64,
                            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6))
  norms, yf = sol.ys
  return yf[0], norms


@jax.jit
def _ss_args():
  return (jax.random.normal(jax.random.key(0), (512, 128)),
          jax.random.normal(jax.random.key(1), (128, 128)) / 12.0)


def _ss_next(args, out):
  return out[0], args[1]


def progress_solve(y0, w):
  """diffeqsolve with diffrax.TextProgressMeter (host callbacks in the loop); y0 donated."""
  def field(t, y, args):
    return jnp.tanh(y @ args) - 0.2 * y
  sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, 1.0, 0.1, y0,
                            args=w, saveat=diffrax.SaveAt(t1=True),
                            progress_meter=diffrax.TextProgressMeter(minimum_increase=0.5))
  return sol.ys[0], sol.ys[0].sum()


# ---------------------------------------------------------------- Equinox KV-cache decoding

CTX, DM, NH = 256, 256, 4


class CachedAttention(eqx.Module):
  qkv: eqx.nn.Linear
  out: eqx.nn.Linear
  k_cache: eqx.nn.StateIndex
  v_cache: eqx.nn.StateIndex

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.qkv = eqx.nn.Linear(DM, 3 * DM, key=k1)
    self.out = eqx.nn.Linear(DM, DM, key=k2)
    z = jnp.zeros((CTX, NH, DM // NH), jnp.float32)
    self.k_cache = eqx.nn.StateIndex(z)
    self.v_cache = eqx.nn.StateIndex(z)

  def __call__(self, x, pos, state):
    q, k, v = jnp.split(self.qkv(x), 3)
    q, k, v = (a.reshape(NH, DM // NH) for a in (q, k, v))
    kc = state.get(self.k_cache).at[pos].set(k)
    vc = state.get(self.v_cache).at[pos].set(v)
    state = state.set(self.k_cache, kc).set(self.v_cache, vc)
    s = jnp.einsum("hd,thd->ht", q, kc) / jnp.sqrt(DM / NH)
    s = jnp.where(jnp.arange(CTX)[None] <= pos, s, -jnp.inf)
    o = jnp.einsum("ht,thd->hd", jax.nn.softmax(s, -1), vc).reshape(DM)
    return self.out(o), state


class TinyDecoder(eqx.Module):
  emb: eqx.nn.Embedding
  layers: tuple
  norm: eqx.nn.RMSNorm
  head: eqx.nn.Linear

  def __init__(self, key):
    ks = jax.random.split(key, 4)
    self.emb = eqx.nn.Embedding(512, DM, key=ks[0])
    self.layers = (CachedAttention(ks[1]), CachedAttention(ks[2]))
    self.norm = eqx.nn.RMSNorm(DM)
    self.head = eqx.nn.Linear(DM, 512, key=ks[3])

  def __call__(self, tok, pos, state):
    x = self.emb(tok)
    for layer in self.layers:
      h, state = layer(self.norm(x), pos, state)
      x = x + h
    return self.head(self.norm(x)), state


@eqx.filter_jit
def _dec():
  return eqx.nn.make_with_state(TinyDecoder)(jax.random.key(0))


def _dec_args():
  model, state = _dec()
  params, static = eqx.partition(model, eqx.is_array)
  return params, static, state, jnp.array(1, jnp.int32), jnp.array(0, jnp.int32)


def decode_chunk(params, static, state, tok, pos):
  """Greedy-decode 16 tokens in a lax.fori_loop with the eqx.nn.State (two layers' KV
  caches, 2 x 2 x 256 KiB) carried; state donated."""
  model = eqx.combine(params, static)

  def body(i, c):
    tok, pos, state, toks = c
    logits, state = model(tok, pos, state)
    tok = jnp.argmax(logits).astype(jnp.int32)
    return tok, pos + 1, state, toks.at[i].set(tok)

  tok, pos, state, toks = lax.fori_loop(0, 16, body,
                                        (tok, pos, state, jnp.zeros((16,), jnp.int32)))
  return state, tok, pos, toks


def _dec_next(args, out):
  state, tok, pos, _ = out
  return args[0], args[1], state, tok, pos


PROGRAMS += [
    RealProgram("diffrax_sde_vbt_vmap", "diffrax",
                "vmap over 1024 OU SDE paths: MultiTerm(ODETerm, ControlTerm), "
                "VirtualBrownianTree, Euler; y0 and key donated", sde_batch, _sde_args,
                (0, 1), _sde_next),
    RealProgram("diffrax_subsaveat", "diffrax",
                "SaveAt(subs=[SubSaveAt(ts, fn=norm), SubSaveAt(t1)]), Dopri5 + PID on a "
                "512x128 state; y0 donated", subsaveat_solve, _ss_args, (0,), _ss_next),
    RealProgram("diffrax_text_progress_meter", "diffrax",
                "diffeqsolve Tsit5 with TextProgressMeter (host callbacks in the loop); "
                "y0 donated", progress_solve, _ss_args, (0,), _ss_next),
    RealProgram("eqx_kv_cache_decode", "equinox",
                "two-layer decoder with KV caches in eqx.nn.State (StateIndex), RMSNorm; "
                "16 greedy tokens in lax.fori_loop; state donated", decode_chunk,
                _dec_args, (2,), _dec_next, static_argnums=(1,)),
]


# =========================================================================== batch 10: vmapped
# adaptive loops (batched predicates) with donated state


def vmap_pid_saveat_disp(y0, w, ts):
  """vmap over 2048 initial conditions of diffeqsolve(Dopri5, PIDController, SaveAt(ts))
  with per-element stiffness (so each element takes a different number of steps: a
  batched predicate); returns y1, the saved trajectory and y1 - y0. y0 donated."""
  def one(y, s):
    def field(t, y, args):
      return -s * y + jnp.tanh(y @ args)
    sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Dopri5(), ts[0], ts[-1],
                              None, y, args=w, saveat=diffrax.SaveAt(ts=ts),
                              stepsize_controller=diffrax.PIDController(rtol=1e-4,
                                                                        atol=1e-6),
                              max_steps=256)
    return sol.ys
  stiff = 1.0 + 20.0 * jnp.abs(y0[:, 0])
  ys = jax.vmap(one)(y0, stiff)
  y1 = ys[:, -1]
  return y1, ys, y1 - y0


@jax.jit
def _vp_args():
  return (jax.random.normal(jax.random.key(0), (2048, 16)),
          jax.random.normal(jax.random.key(1), (16, 16)) / 4.0,
          jnp.linspace(0.0, 0.5, 9))


def _vp_next(args, out):
  return out[0], args[1], args[2] + 0.5


def vmap_eqx_while_rows(buf, y0, w, lens):
  """jax.vmap over rows of a donated buffer of eqx.internal.while_loop(kind=
  'checkpointed', buffers=...) that runs a per-row number of steps (batched predicate)
  and writes each step's state into the row."""
  def one(row, y, n):
    def cond(c):
      i, _, _ = c
      return i < n

    def body(c):
      i, y, row = c
      y = jnp.tanh(w @ y)
      return i + 1, y, row.at[i].set(y)

    _, y, row = eqx.internal.while_loop(cond, body, (jnp.array(0), y, row), max_steps=64,
                                        buffers=lambda c: c[2], kind="checkpointed")
    return row, y
  rows, ys = jax.vmap(one)(buf, y0, lens)
  return rows, ys


@jax.jit
def _vr_args():
  buf = jnp.zeros((128, 64, 64), jnp.float32)      # 2 MiB
  y0 = jax.random.normal(jax.random.key(0), (128, 64))
  w = jax.random.normal(jax.random.key(1), (64, 64)) / 8.0
  lens = jax.random.randint(jax.random.key(2), (128,), 1, 65)
  return buf, y0, w, lens


def _vr_next(args, out):
  return out[0], out[1], args[2], 65 - args[3]


PROGRAMS += [
    RealProgram("diffrax_vmap_pid_batched_pred", "diffrax",
                "vmap over 2048 of diffeqsolve(Dopri5, PID, SaveAt(ts)) with per-element "
                "stiffness (batched loop predicate); returns y1, ys, y1 - y0; y0 donated",
                vmap_pid_saveat_disp, _vp_args, (0,), _vp_next),
    RealProgram("eqx_vmap_while_checkpointed_rows", "equinox",
                "vmap over 128 rows of eqx.internal.while_loop(kind='checkpointed', "
                "buffers=...) with per-row lengths (batched predicate) writing the row; "
                "buffer and y0 donated", vmap_eqx_while_rows, _vr_args, (0, 1), _vr_next),
]


# =========================================================================== batch 11: MinAtar envs
# with internal while loops, prioritised item buffer

def _minatar_program(name, n_envs=64, n_steps=16):
  env, params = gymnax.make(name)

  def rollout(obs_buf, rew_buf, runner):
    def body(carry, t):
      obs_buf, rew_buf, (obs, st, key) = carry
      key, ka, ks = jax.random.split(key, 3)
      action = jax.random.randint(ka, (n_envs,), 0, env.num_actions)
      nobs, st, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
          jax.random.split(ks, n_envs), st, action, params)
      obs_buf = obs_buf.at[t].set(obs)
      rew_buf = rew_buf.at[t].add(r)       # accumulate returns over iterations
      return (obs_buf, rew_buf, (nobs, st, key)), None

    (obs_buf, rew_buf, runner), _ = lax.scan(body, (obs_buf, rew_buf, runner),
                                             jnp.arange(n_steps))
    return obs_buf, rew_buf, runner

  @jax.jit
  def args():
    obs, st = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), n_envs), params)
    return (jnp.zeros((n_steps,) + obs.shape, obs.dtype),
            jnp.zeros((n_steps, n_envs), jnp.float32), (obs, st, jax.random.key(1)))

  return rollout, args


_AST_FN, _AST_ARGS = _minatar_program("Asterix-MinAtar")
_SEA_FN, _SEA_ARGS = _minatar_program("Seaquest-MinAtar")

_PITEM = fbx.make_prioritised_item_buffer(max_length=8192, min_length=16,
                                          sample_batch_size=128, add_batches=True,
                                          priority_exponent=0.0)


def _pitem_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0], _item_batch(jax.random.key(0)))
    s = _PITEM.init(ex)
    return _PITEM.add(s, _item_batch(jax.random.key(7)))
  return jax.tree.map(_strong, warm()), _item_batch_jit(jax.random.key(1)), jax.random.key(2)


def pitem_step(state, batch, key):
  """Prioritised item buffer with priority_exponent=0 (uniform), sample, set priorities
  from a ridge fit's residuals, then add; state donated."""
  b = _PITEM.sample(state, key)
  s = b.experience
  w = jnp.linalg.solve(s["obs"].T @ s["obs"] + jnp.eye(64), s["obs"].T @ s["target"])
  resid = jnp.abs(s["obs"] @ w - s["target"]) + 1e-3
  state = _PITEM.set_priorities(state, b.indices, resid)
  state = _PITEM.add(state, batch)
  return state, w, b.probabilities


PROGRAMS += [
    RealProgram("gymnax_asterix_minatar", "gymnax",
                "Asterix-MinAtar (env step has a lax.while_loop, vmapped: batched "
                "predicate), scan rollout writing obs and accumulating rewards into donated "
                "buffers; buffers and runner donated", _AST_FN, _AST_ARGS, (0, 1, 2),
                lambda a, o: o),
    RealProgram("gymnax_seaquest_minatar", "gymnax",
                "Seaquest-MinAtar scan rollout writing obs and accumulating rewards; "
                "buffers and runner donated", _SEA_FN, _SEA_ARGS, (0, 1, 2), lambda a, o: o),
    RealProgram("flashbax_prioritised_item_exp0", "flashbax",
                "fbx.make_prioritised_item_buffer(priority_exponent=0.0): sample, "
                "set_priorities(residuals), add; state donated", pitem_step, _pitem_args,
                (0,), _item_next),
]


# =========================================================================== batch 12: ping-pong
# buffers (two time levels), swapped roles


def wave_leapfrog(u, u_prev, c2):
  """Wave equation, leapfrog (two time levels): u_next = 2u - u_prev + c^2 lap(u);
  returns (u_next, u): the new pair. u and u_prev donated (the classic ping-pong)."""
  lap = (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1)
         - 4 * u)
  u_next = 2 * u - u_prev + c2 * lap
  return u_next, u


@jax.jit
def _wave_args():
  x = jnp.linspace(-1, 1, 512)
  u = jnp.exp(-50 * (x[:, None] ** 2 + x[None] ** 2))       # 1 MiB
  return u, u * 0.99, jnp.float32(0.2)


def _wave_next(args, out):
  return out[0], out[1], args[2]


def wave_leapfrog_scan(u, u_prev, c2):
  """8 leapfrog steps in a lax.scan carrying (u, u_prev)."""
  def step(c, _):
    u, up = c
    return wave_leapfrog(u, up, c2), None
  (u, u_prev), _ = lax.scan(step, (u, u_prev), None, length=8)
  return u, u_prev


def double_q_swap(online, target, static, x):
  """Double Q-learning with role swapping (as in van Hasselt's double Q-learning):
  after an SGD step on `online`, the networks swap roles: returns (target, new_online)."""
  def loss(p):
    q = jax.vmap(eqx.combine(p, static))(x)
    qt = jax.vmap(eqx.combine(target, static))(x)
    return jnp.mean((q - lax.stop_gradient(qt.max(-1, keepdims=True) * 0.9)) ** 2)
  l, g = jax.value_and_grad(loss)(online)
  online = jax.tree.map(lambda p, gg: p - 1e-2 * gg, online, g)
  return target, online, l


def _dq_swap_args():
  params, static = eqx.partition(_qnet(), eqx.is_array)
  target = jax.jit(lambda p: jax.tree.map(lambda a: a * 0.5, p))(params)
  x = _q_data()["obs"]
  return params, target, static, x


def _dq_swap_next(args, out):
  return out[0], out[1], args[2], args[3]


PROGRAMS += [
    RealProgram("diffrax_style_wave_leapfrog", "diffrax",
                "2D wave equation leapfrog with two time levels (512x512 f32 each), "
                "returns (u_next, u); u and u_prev donated", wave_leapfrog, _wave_args,
                (0, 1), _wave_next),
    RealProgram("diffrax_style_wave_leapfrog_scan", "diffrax",
                "8 leapfrog steps in lax.scan carrying (u, u_prev); both donated",
                wave_leapfrog_scan, _wave_args, (0, 1), _wave_next),
    RealProgram("eqx_double_q_swap", "equinox",
                "double Q-learning: SGD on online eqx MLP, then roles swapped: returns "
                "(target, new_online); both donated", double_q_swap, _dq_swap_args, (0, 1),
                _dq_swap_next, static_argnums=(2,)),
]


# =========================================================================== batch 13: Atari-sized
# uint8 frames in a flashbax trajectory buffer (7 MiB)

_ATARI = fbx.make_trajectory_buffer(add_batch_size=4, sample_batch_size=32,
                                    sample_sequence_length=2, period=1,
                                    min_length_time_axis=2, max_length_time_axis=256)


def _atari_batch(key):
  f = jax.random.randint(key, (4, 1, 84, 84, 4), 0, 256, jnp.int32).astype(jnp.uint8)
  return {"frames": f, "action": jnp.zeros((4, 1), jnp.int32),
          "reward": jnp.ones((4, 1), jnp.float32)}


_atari_batch_jit = jax.jit(_atari_batch)


def _atari_args():
  @jax.jit
  def warm():
    ex = jax.tree.map(lambda a: a[0, 0], _atari_batch(jax.random.key(0)))
    s = _ATARI.init(ex)
    return lax.fori_loop(0, 8, lambda i, s: _ATARI.add(s, _atari_batch(
        jax.random.fold_in(jax.random.key(3), i))), s)
  return jax.tree.map(_strong, warm()), _atari_batch_jit(jax.random.key(1)), jax.random.key(2)


def _atari_next(args, out):
  key, k = jax.random.split(args[2])
  return out[0], _atari_batch_jit(k), key


def atari_sample_add(state, batch, key):
  """DQN-Atari style: sample 32 (s, s') pairs of uint8 84x84x4 frames, normalise to float
  for the learner, then add 4 new frames; buffer state (7 MiB) donated."""
  s = _ATARI.sample(state, key).experience
  x = s["frames"].astype(jnp.float32) / 255.0
  state = _ATARI.add(state, batch)
  return state, x.mean((2, 3, 4)), s["reward"].sum()


PROGRAMS += [
    RealProgram("flashbax_atari_uint8_sample_add", "flashbax",
                "fbx.make_trajectory_buffer of uint8 84x84x4 frames (4 x 256, 7 MiB): "
                "sample 32 pairs, then add 4; state donated", atari_sample_add,
                _atari_args, (0,), _atari_next),
]


# =========================================================================== batch 14: other adjoints


def _node_step_with(adjoint):
  def step(params, static, opt_state, ti, yi):
    def grad_loss(model, ti, yi):
      def solve(y0):
        sol = diffrax.diffeqsolve(diffrax.ODETerm(model.func), diffrax.Tsit5(), ti[0], ti[-1],
                                  ti[1] - ti[0], y0, saveat=diffrax.SaveAt(ts=ti),
                                  max_steps=64, adjoint=adjoint)
        return sol.ys
      return jnp.mean((jax.vmap(solve)(yi[:, 0]) - yi) ** 2)

    model = eqx.combine(params, static)
    loss, grads = eqx.filter_value_and_grad(grad_loss)(model, ti, yi)
    updates, opt_state = _NODE_OPT.update(grads, opt_state)
    return eqx.apply_updates(params, updates), opt_state, loss
  return step


def steady_state_fit(theta, target):
  """Diffrax docs 'steady-state' example: solve to steady state with
  SteadyStateEvent + ImplicitAdjoint, fit theta by SGD; theta donated."""
  def loss(th):
    term = diffrax.ODETerm(lambda t, y, a: -a[0] * (y - a[1]))
    sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, jnp.inf, 0.1,
                              jnp.zeros_like(target), args=(th, target), max_steps=256,
                              stepsize_controller=diffrax.PIDController(rtol=1e-4,
                                                                        atol=1e-6),
                              event=diffrax.Event(diffrax.steady_state_event()),
                              adjoint=diffrax.ImplicitAdjoint())
    return jnp.mean((sol.ys[0] - 0.5 * target) ** 2)
  l, g = jax.value_and_grad(loss)(theta)
  return theta - 0.1 * g, l


@jax.jit
def _ss2_args():
  return jnp.ones((4096,), jnp.float32), jnp.linspace(0.0, 1.0, 4096)


PROGRAMS += [
    RealProgram("diffrax_neural_ode_backsolve", "diffrax",
                "neural ODE training step (eqx MLP field, Tsit5, constant dt) with "
                "diffrax.BacksolveAdjoint; params and opt_state donated",
                _node_step_with(diffrax.BacksolveAdjoint()), _node_args, (0, 2), _cnn_next,
                static_argnums=(1,)),
    RealProgram("diffrax_steady_state_implicit", "diffrax",
                "steady state via Event(steady_state_event()) + ImplicitAdjoint, SGD on a "
                "4096 rate vector; theta donated", steady_state_fit, _ss2_args, (0,),
                lambda a, o: (o[0], a[1])),
]
