"""Shrinking a failing program: deleting ops, emptying bodies, turning branches into
identities, lowering trip counts, dropping carries and outputs and simplifying
expressions, while the same failure kind remains (`oracle.kind_of`).

Residual-copy and unexplained-copy programs shrink too, so they can be triaged. For
an orderable program no buffer output is dropped (every donated buffer must be
returned); the other candidates keep the orderable rules (`generate.py`): deleting
an update or a block only makes old versions newer, and the oracle rechecks that
the outputs still pair with the donated buffers.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

from .oracle import Outcome, check_program, kind_of
from .program import Block, Program, Stmt


def _bodies(body, path=()):
  """Every (path, body list) in the tree; path indexes Block.bodies."""
  yield path, body
  for k, node in enumerate(body):
    if isinstance(node, Block):
      for j, sub in enumerate(node.bodies):
        if sub is not None:
          yield from _bodies(sub, path + (k, j))


def _get(body, path):
  for k in range(0, len(path), 2):
    body = body[path[k]].bodies[path[k + 1]]
  return body


def candidates(p: Program):
  """Smaller variants of `p`, most aggressive first."""
  for path, body in list(_bodies(p.body)):
    for k in range(len(body)):
      q = copy.deepcopy(p)
      del _get(q.body, path)[k]
      yield q
  for path, body in list(_bodies(p.body)):
    for k, node in enumerate(body):
      if not isinstance(node, Block):
        continue
      for j, sub in enumerate(node.bodies):
        if sub is None:
          continue
        if len(node.bodies) > 1:
          q = copy.deepcopy(p)
          _get(q.body, path)[k].bodies[j] = None
          yield q
      if node.kind == "switch" and len(node.bodies) > 2:
        for j in range(len(node.bodies)):
          q = copy.deepcopy(p)
          del _get(q.body, path)[k].bodies[j]
          yield q
      if node.kind in ("fori", "while") and node.params.get("trips") not in (0, 1):
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["trips"] = 1
        yield q
      if node.kind == "while" and node.params.get("cond_read"):
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["cond_read"] = None
        yield q
      if node.kind == "scan" and node.params["length"] > 1:
        q = copy.deepcopy(p)
        _get(q.body, path)[k].params["length"] = 1
        yield q
      if len(node.carried) > 1:
        for c in node.carried:
          q = copy.deepcopy(p)
          _get(q.body, path)[k].carried = tuple(x for x in node.carried if x != c)
          yield q
  if len(p.returns) > 1:
    buffers = {b.name for b in p.bufs}
    for k in range(len(p.returns)):
      if p.orderable and p.returns[k] in buffers:
        continue
      q = copy.deepcopy(p)
      del q.returns[k]
      yield q
  for path, body in list(_bodies(p.body)):
    for k, node in enumerate(body):
      texts = ([("code", node.code)] if isinstance(node, Stmt) else
               [(key, v) for key, v in node.params.items() if isinstance(v, str)])
      for key, text in texts:
        for simpler in _simpler(text):
          q = copy.deepcopy(p)
          target = _get(q.body, path)[k]
          if isinstance(target, Stmt):
            target.code = simpler
          else:
            target.params[key] = simpler
          yield q


_WRAPPED_INDEX = re.compile(r"( % \d+)?( [+-] \d+)?")
# Not a cast to int32: it makes a value an integer buffer's update takes; dropped,
# the update adds a float, which JAX does by converting the whole buffer (a copy
# that is no residual; seed 2040 #492 shrank to one).
_NOISE = re.compile(r"\.astype\(jnp\.(?!int32\))\w+\)| \* 0\.5 \+ 1| \* 2 \+ 1|"
                    r", unique_indices=True|, indices_are_sorted=True|, mode='clip'")


def _close(text: str, start: int) -> int:
  """The index just past the parenthesis closing the one before `start`."""
  depth = 1
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i + 1
  return len(text)


def _simpler(text: str):
  """Variants of one line with one sub-expression simplified: computed indices
  become constants, `jnp.maximum(e, 0)` becomes `e`, casts (but to int32) and
  decorations go."""
  for m in re.finditer(r"jnp\.arg(max|min)\(|jnp\.maximum\(", text):
    end = _close(text, m.end())
    if m.group(0).startswith("jnp.arg"):
      wrapped = _WRAPPED_INDEX.match(text, end)
      end = wrapped.end() if wrapped else end
      for rep in ("0", "jnp.int32(0)"):
        yield text[:m.start()] + rep + text[end:]
    elif text[end - 4:end] == ", 0)":
      yield text[:m.start()] + text[m.end():end - 4] + text[end:]
  for m in _NOISE.finditer(text):
    yield text[:m.start()] + text[m.end():]


def shrink(p: Program, outcome: Outcome | None = None,
           check: Callable[[Program], Outcome] = check_program,
           max_checks: int = 400, log: Callable[[str], None] | None = None
           ) -> tuple[Program, Outcome]:
  """Greedily removes parts of `p` while it keeps failing the same way (any status
  but "ok": hard failures, residual and unexplained copies)."""
  outcome = outcome or check(p)
  if outcome.ok:
    return p, outcome
  kind = kind_of(outcome)
  checks = 0
  progress = True
  while progress and checks < max_checks:
    progress = False
    for q in candidates(p):
      checks += 1
      r = check(q)
      if kind_of(r) == kind:
        p, outcome, progress = q, r, True
        if log:
          log(f"  shrunk to {p.count_ops()} ops")
        break
      if checks >= max_checks:
        break
  return p, outcome
