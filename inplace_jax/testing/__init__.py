"""Testing utilities for inplace_jax and for code that uses it.

* `inplace_jax.testing.realworld`: reference programs written with the libraries JAX
  users use (Flax, Optax, Equinox, Diffrax, Flashbax, Gymnax); needs the `test` extra.
* `inplace_jax.testing.fuzz`: the differential fuzzer (generator, oracle built on the
  comparison harness, shrinker, worker pool); the long run is
  `python -m inplace_jax.testing.fuzz --count 10000 --seed S --workers 2`.
"""
