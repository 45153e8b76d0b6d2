"""Reference programs written the way users of JAX libraries write them.

Each `RealProgram` is a step function following the docs/tutorial idiom of one library
(Flax, Optax, Equinox, Diffrax, Flashbax, Gymnax), with the state it updates (model or
optimizer state, KV cache, replay buffer, rollout buffer) donated, as a user would put it
under `jax.jit(fn, donate_argnums=...)`. They are used to compare `inplace_jax.jit` with
plain `jax.jit` on real code: copies left, values, compile time.

    >>> import jax
    >>> from inplace_jax.testing import realworld
    >>> for p in realworld.programs(["optax"]):
    ...   f = jax.jit(p.fn, donate_argnums=p.donate_argnums,
    ...               static_argnums=p.static_argnums)
    ...   args = p.make_args()
    ...   for _ in range(p.steps):
    ...     out = f(*args)
    ...     args = p.next_args(args, out)

Each library's module is imported lazily; libraries that are not installed (or fail to
import) are skipped by `programs()`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Sequence

LIBRARIES = ("flax", "optax", "equinox", "diffrax", "flashbax", "gymnax")

# Why a library's programs were skipped, by library (filled by `programs()`).
import_errors: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class RealProgram:
  """One reference program.

  Attributes:
    name: e.g. `"flax_nnx_decode"`.
    library: `"flax"`, `"optax"`, `"equinox"`, `"diffrax"`, `"flashbax"` or `"gymnax"`.
    description: one line: what it is and which library idiom it follows.
    fn: the step function (pure, not jitted), called as `fn(*args)`.
    make_args: fresh arguments for step 1 (a new set each call).
    donate_argnums: the arguments a user donates (the updated state).
    next_args: `(args of step k, outputs of step k) -> args of step k+1`.
    static_argnums: as for `jax.jit`.
    steps: length of the chain of steps a test runs.
  """
  name: str
  library: str
  description: str
  fn: Callable[..., Any]
  make_args: Callable[[], tuple]
  donate_argnums: tuple[int, ...]
  next_args: Callable[[tuple, Any], tuple]
  static_argnums: tuple[int, ...] = ()
  steps: int = 3


def _load(library: str) -> list[RealProgram]:
  if library not in LIBRARIES:
    raise ValueError(f"unknown library {library!r}; known: {LIBRARIES}")
  try:
    mod = importlib.import_module(f"{__name__}.{library}_programs")
    progs = mod.PROGRAMS
    if callable(progs):
      progs = progs()
    import_errors.pop(library, None)
    return list(progs)
  except Exception as e:  # noqa: BLE001 - a library that does not import is skipped
    import_errors[library] = f"{type(e).__name__}: {e}"
    return []


def programs(libraries: str | Sequence[str] | None = None) -> list[RealProgram]:
  """The programs of the given libraries (default: all) that can be imported."""
  if libraries is None:
    libraries = LIBRARIES
  elif isinstance(libraries, str):
    libraries = (libraries,)
  out: list[RealProgram] = []
  for lib in libraries:
    out.extend(_load(lib))
  return out


def get(name: str) -> RealProgram:
  """The program called `name` (looked up in its library's module first)."""
  lib = name.split("_", 1)[0]
  lib = {"eqx": "equinox"}.get(lib, lib)
  candidates = _load(lib) if lib in LIBRARIES else programs()
  for p in candidates:
    if p.name == name:
      return p
  for p in programs():
    if p.name == name:
      return p
  raise KeyError(f"no real-world program named {name!r}")


__all__ = ["LIBRARIES", "RealProgram", "get", "import_errors", "programs"]
