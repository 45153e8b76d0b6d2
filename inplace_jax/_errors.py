"""The warnings and errors inplace_jax raises."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import jax

_HERE = os.path.dirname(os.path.abspath(__file__))
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))


class InplaceCopyWarning(UserWarning):
  """A copy of a buffer the user asked to update in place remains."""


class InplaceDonationWarning(UserWarning):
  """A donated argument's buffer is not reused by any output (donation wasted)."""


class InplaceNestingWarning(UserWarning):
  """An inplace_jax function runs inside a compilation that erases its barriers."""


class ConflictError(AssertionError):
  """Under `on_copy="raise"`: the function needs a copy no ordering can remove."""

  def __init__(self, message: str, conflicts: Sequence[Any]):
    super().__init__(message)
    self.conflicts = tuple(conflicts)


def user_stacklevel() -> int:
  """The `stacklevel` that points a warning at the first frame outside inplace_jax
  and JAX (the user's call)."""
  frame: Any = sys._getframe(1)
  level = 1
  while frame is not None:
    path = os.path.abspath(frame.f_code.co_filename)
    if not (path.startswith(_HERE) or path.startswith(_JAX_DIR)):
      return level
    frame = frame.f_back
    level += 1
  return 1
