"""The warnings and errors inplace_jax raises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
