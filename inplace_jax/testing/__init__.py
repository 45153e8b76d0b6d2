"""Testing utilities for inplace_jax and for code that uses it.

* `inplace_jax.testing.realworld`: reference programs written with the libraries JAX
  users use (Flax, Optax, Equinox, Diffrax, Flashbax, Gymnax); needs the `test` extra.
"""
