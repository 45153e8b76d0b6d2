"""inplace_jax: in-place updates in JAX that are guaranteed, verified and explained.

Entry points:

* `jit`: a drop-in for `jax.jit` that sequences reads before updates, compiles so XLA
  honours that order, and verifies the result.
* `check`, `check_compiled`, `assert_no_copies`: compile and inspect the HLO for copies.
* `sequence`, `sequence_jaxpr`: the transform alone (function -> function, jaxpr -> jaxpr).
* `after`, `swap`, `update`: helper ops that state an in-place intent explicitly.
"""

from ._check import CopiesFoundError as CopiesFoundError
from ._check import CopiesUnverifiedError as CopiesUnverifiedError
from ._check import assert_no_copies as assert_no_copies
from ._check import check as check
from ._check import check_compiled as check_compiled
from ._errors import ConflictError as ConflictError
from ._errors import InplaceCopyWarning as InplaceCopyWarning
from ._errors import InplaceDonationWarning as InplaceDonationWarning
from ._errors import InplaceNestingWarning as InplaceNestingWarning
from ._jit import InplaceJitted as InplaceJitted
from ._jit import compiler_options as compiler_options
from ._jit import jit as jit
from ._ops import after as after
from ._ops import swap as swap
from ._ops import update as update
from ._plan import Conflict as Conflict
from ._plan import Plan as Plan
from ._report import CopyInfo as CopyInfo
from ._report import CopyReport as CopyReport
from ._report import DonationInfo as DonationInfo
from ._report import Finding as Finding
from ._report import SourceLocation as SourceLocation
from ._transform import sequence as sequence
from ._transform import sequence_jaxpr as sequence_jaxpr

__version__ = "0.1.0"
