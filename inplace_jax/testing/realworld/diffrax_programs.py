"""Diffrax program: `diffrax.diffeqsolve` with `SaveAt(ts=...)` under `jax.vmap` over a
batch of initial conditions, as in the Diffrax docs ("batching" in the FAQ/tutorials)."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp

from . import RealProgram

BATCH, DIM = 4096, 16        # a 256 KiB f32 batch of initial conditions (donated)
N_SAVE = 11                  # saved states per solve: ys is BATCH x N_SAVE x DIM


def vector_field(t, y, args):
  w, b = args
  return jnp.tanh(w @ y + b) - 0.5 * y


_TERM = diffrax.ODETerm(vector_field)
_SOLVER = diffrax.Tsit5()


def solve_batch(y0, args, ts):
  """Integrates every initial condition of `y0` over `ts`; returns the final states
  (the next chunk's initial conditions) and the saved trajectories."""

  def solve_one(y0):
    sol = diffrax.diffeqsolve(_TERM, _SOLVER, t0=ts[0], t1=ts[-1], dt0=0.1, y0=y0,
                              args=args, saveat=diffrax.SaveAt(ts=ts), max_steps=16)
    return sol.ys

  ys = jax.vmap(solve_one)(y0)
  return ys[:, -1], ys


@jax.jit
def _args():
  # One normal draw cut into w, b and y0 (each jitted threefry draw costs XLA compile).
  z = jax.random.normal(jax.random.key(0), (DIM * DIM + DIM + BATCH * DIM,), jnp.float32)
  w = z[:DIM * DIM].reshape(DIM, DIM) / jnp.sqrt(float(DIM))
  b = 0.1 * z[DIM * DIM:DIM * DIM + DIM]
  y0 = z[DIM * DIM + DIM:].reshape(BATCH, DIM)
  ts = jnp.linspace(0.0, 1.0, N_SAVE, dtype=jnp.float32)
  return y0, (w, b), ts


def _next(args, out):
  _, params, ts = args
  y_final, _ = out
  return y_final, params, ts + (ts[-1] - ts[0])   # the next time chunk


PROGRAMS = [
    RealProgram(
        name="diffrax_vmap_saveat",
        library="diffrax",
        description="jax.vmap of diffrax.diffeqsolve (Tsit5, dt0=0.1, SaveAt(ts=11 "
                    "times)) over 4096 initial conditions; y0 batch donated",
        fn=solve_batch,
        make_args=_args,
        donate_argnums=(0,),
        next_args=_next,
    ),
]
