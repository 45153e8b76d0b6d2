"""Issue 6: donated buffers sharded over 8 CPU devices, and shard_map bodies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import inplace_jax
from conftest import ON_CPU, compare

pytestmark = pytest.mark.skipif(jax.device_count() < 8,
                                reason="needs 8 devices (jax_num_cpu_devices)")


def _mesh(kind=AxisType.Auto):
  return jax.make_mesh((8,), ("d",), axis_types=(kind,))


def _sharded(spec, mesh=None):
  mesh = mesh or _mesh()
  x = jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32) / 3.0
  return jax.device_put(x, NamedSharding(mesh, spec))


def test_named_sharding_20440():
  def f(x):
    y = x[0, 0]
    return x.at[0, 0].add(1.0), y
  r = compare(f, _sharded(P("d", None)))
  assert (r.ref_big_copies(1024) or not ON_CPU) and not r.big_copies(1024), r.report
  assert r.report.partitions == 8
  assert r.comparison.candidate.final[0].sharding.spec == P("d", None)


def test_named_sharding_row_swap_across_shards():
  def f(x):
    a, b = x[3], x[60]
    return x.at[3].set(b).at[60].set(a)
  r = compare(f, _sharded(P("d", None)))
  assert r.report.verified


def test_shard_map_body_is_sequenced():
  mesh = _mesh()

  def local(xb):
    y = xb[0]
    return xb.at[0].set(xb[1]).at[1].set(y)

  def f(x):
    return jax.shard_map(local, mesh=mesh, in_specs=P("d", None),
                         out_specs=P("d", None))(x)
  r = compare(f, _sharded(P("d", None), mesh))
  assert (r.ref_big_copies(1024) or not ON_CPU) and not r.big_copies(1024), r.report
  assert "opaque" not in str(r.report)


def test_explicit_sharding_mesh():
  mesh = _mesh(AxisType.Explicit)

  def f(x):
    y = x[:, 0]
    return x.at[:, 0].set(x[:, 1]).at[:, 1].set(y)
  with jax.set_mesh(mesh):
    compare(f, _sharded(P("d", None), mesh))
