"""The runnable examples in public docstrings run and print what they say."""

from __future__ import annotations

import doctest
import warnings

import pytest

import inplace_jax
from inplace_jax import _jit, _transform


@pytest.mark.parametrize("module", [_jit, _transform])
def test_docstring_examples(module):
  with warnings.catch_warnings():
    warnings.simplefilter("error", inplace_jax.InplaceCopyWarning)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0
