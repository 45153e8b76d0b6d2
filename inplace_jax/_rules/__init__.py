"""Per-primitive rules, by family.

* `_registry.py`: the registry (`PrimitiveRule`: analysis rule, rewrite rule,
  sub-jaxpr bindings, in-place carries), `Context`, and the defaults.
* `updates.py`: `dynamic_update_slice` and the scatters (splitting read-modify-writes).
* `calls.py`: nested jit, remat, custom_jvp/vjp calls, shard_map, barriers.
* `loops.py`: `while` and `scan` (unrolled scans, scanned buffers carried).
* `conditionals.py`: `cond` and `switch` (lowering to zero-or-one-trip loops).

Importing this package registers every family's rules.
"""

from . import calls as calls
from . import conditionals as conditionals
from . import loops as loops
from . import updates as updates
from ._registry import (
    MIN_BUFFER_BYTES as MIN_BUFFER_BYTES, Context as Context,
    PrimitiveRule as PrimitiveRule, RULES as RULES, as_jaxpr as as_jaxpr,
    bindings as bindings, call_body as call_body, call_param as call_param,
    can_root as can_root, carries as carries, eqn_info as eqn_info, is_big as is_big,
    nbytes as nbytes, normalised_float as normalised_float,
    outputs_free_of as outputs_free_of, register as register, rule_for as rule_for,
    same_type as same_type, type_str as type_str)
