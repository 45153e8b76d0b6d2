"""The HLO text parser on handwritten text in XLA's format (no compiles here).

Fixtures in `tests/fixtures/`: `gpu_copy_start.hlo` (an async copy pair as GPU emits
it, a copy in a while body with `known_trip_count`, operands printed with shapes) and
`two_modules.hlo` (two modules; `true_computation=`/`false_computation=` branches,
`source_file` metadata with escaped UTF-8, packed s4, tiled bf16, `/*index=5*/`).
"""

import json
import pathlib

import pytest

from inplace_jax import _hlo
from inplace_jax._check import (CopiesFoundError, CopiesUnverifiedError,
                                assert_report_no_copies, report_from_text)

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def _fixture(name: str) -> str:
  return (FIXTURES / name).read_text()


def _by_name(inspection):
  return {c.name: c for c in inspection.copies}


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("text, dtype, dims, nbytes", [
    ("f32[10000,10000]{1,0}", "float32", (10000, 10000), 400_000_000),
    ("f32[]", "float32", (), 4),
    ("pred[7]{0}", "bool", (7,), 7),
    ("bf16[8,128]{1,0:T(8,128)(2,1)}", "bfloat16", (8, 128), 2048),
    ("s8[3]", "int8", (3,), 3),
    ("u64[2]{0}", "uint64", (2,), 16),
    ("f16[4]", "float16", (4,), 8),
    ("f64[0,5]{1,0}", "float64", (0, 5), 0),
    ("c64[3]", "complex64", (3,), 24),
    ("c128[3]", "complex128", (3,), 48),
    ("f8e4m3fn[16]", "float8_e4m3fn", (16,), 16),
    ("f8e5m2[16]{0}", "float8_e5m2", (16,), 16),
    ("s4[64]{0:E(4)}", "int4", (64,), 32),
    ("s4[64]", "int4", (64,), 64),
    ("f32[16]{0:S(1)}", "float32", (16,), 64),
    ("u32[]{:S(2)}", "uint32", (), 4),
    ("f32[<=8,4]{1,0}", "float32", (8, 4), 128),
])
def test_array_shapes(text, dtype, dims, nbytes):
  shape = _hlo.parse_shape(text)
  assert isinstance(shape, _hlo.ArrayShape)
  assert (shape.dtype, shape.dims, shape.nbytes) == (dtype, dims, nbytes)


def test_tuple_shape():
  shape = _hlo.parse_shape("(f32[2]{0}, (s32[], u32[]), /*x*/pred[])".replace("/*x*/", ""))
  assert isinstance(shape, _hlo.TupleShape)
  assert [type(e).__name__ for e in shape.elements] == ["ArrayShape", "TupleShape",
                                                        "ArrayShape"]


@pytest.mark.parametrize("text", ["q32[4]", "f32[?]", "f32[4", "(f32[2]", "f32", ""])
def test_bad_shapes_raise(text):
  with pytest.raises(_hlo.HloParseError):
    _hlo.parse_shape(text)


def test_unescape_octal_utf8_and_quotes():
  assert _hlo.unescape(r"/home/j\303\274rgen") == "/home/jürgen"
  assert _hlo.unescape(r"st[\'cache\'] \"q\"") == "st['cache'] \"q\""


def test_instruction_with_index_comments():
  ins = _hlo.parse_instruction(
      "ROOT %t = (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[]) "
      "tuple(%a, %b, %c, %d, %e, /*index=5*/%f)")
  assert ins.is_root and ins.opcode == "tuple"
  assert ins.operands == ("a", "b", "c", "d", "e", "f")


# --------------------------------------------------------------------------- fixtures


def test_copy_start_pair_and_loop_copy():
  r = _hlo.inspect_hlo(_fixture("gpu_copy_start.hlo"))
  assert r.verified, r.problems
  assert [m.name for m in r.modules] == ["jit_step"]
  copies = _by_name(r)
  assert set(copies) == {"copy-start", "copy.2"}  # copy-done is not a second copy

  pair = copies["copy-start"]
  assert (pair.kind, pair.done_name) == ("copy-start", "copy-done")
  assert (pair.shape, pair.dtype, pair.nbytes) == ((1024, 1024), "float32", 4 << 20)
  assert (pair.role, pair.trip_count) == ("entry", None)
  assert (pair.source, pair.parameter, pair.operand) == ("parameter", "x", "x.1")
  # The consumer of the copy-done is the scatter-add fusion, frame 2.
  assert str(pair.location) == "/home/user/model.py:13 (step)"
  assert pair.op_name == "jit(step)/scatter-add"

  body = copies["copy.2"]
  assert (body.kind, body.done_name) == ("copy", None)
  assert (body.role, body.trip_count, body.computation) == ("while_body", 8, "body")
  # A loop carry is last iteration's value, not the argument.
  assert (body.source, body.parameter) == ("instruction", None)
  assert str(body.location) == "/home/user/model.py:17 (step.<locals>.body)"


def test_module_header_and_roles():
  (module,), problems = _hlo.parse_hlo(_fixture("gpu_copy_start.hlo"))
  assert not problems
  assert module.aliases == (_hlo.Alias((0,), 0, (), "may-alias"),)
  assert module.roles == {
      "fused_slice": "fusion", "fused_update": "fusion", "body": "while_body",
      "cond": "while_condition", "fused_update.1": "fusion", "main.10": "entry"}
  assert module.entry is not None and module.entry.name == "main.10"
  assert module.entry_result_is_tuple()
  assert sorted(module.entry_parameters()) == [0, 1]


def test_several_modules():
  r = _hlo.inspect_hlo(_fixture("two_modules.hlo"))
  assert r.verified, r.problems
  assert [m.name for m in r.modules] == ["jit_branchy", "jit_dtypes"]
  copies = _by_name(r)
  branch = copies["copy.10"]
  assert (branch.module, branch.role, branch.computation) == ("jit_branchy", "branch",
                                                              "on_true")
  # Traced out of the branch through the conditional's operand to the argument.
  assert (branch.source, branch.parameter) == ("parameter", "state['cache']")
  # No stack frame tables: falls back to source_file/source_line, escapes undone.
  assert str(branch.location) == "/home/jürgen/m.py:7"
  assert r.modules[0].aliases == (_hlo.Alias((), 0, (), "may-alias"),)
  assert not r.modules[0].entry_result_is_tuple()

  sizes = {c.name: (c.dtype, c.nbytes) for c in r.copies if c.module == "jit_dtypes"}
  assert sizes == {
      "copy.20": ("bfloat16", 2048), "copy.21": ("int4", 32), "copy.22": ("bool", 3),
      "copy.23": ("complex128", 32), "copy.24": ("float32", 4),
      "copy.25": ("float32", 64)}
  assert copies["copy.25"].source == "instruction"


def test_report_from_text_formats_and_serialises():
  report = report_from_text(_fixture("gpu_copy_start.hlo"), backend="gpu")
  assert report.verified and report.total_copy_bytes == 2 * (4 << 20)
  text = str(report)
  assert "/home/user/model.py:13 (step)" in text and "while_body x8" in text
  json.dumps(report.to_dict())
  assert [c.name for c in report.copies_over(4 << 20)] == ["copy.2", "copy-start"]
  assert report.copies_over((4 << 20) + 1) == ()
  with pytest.raises(CopiesFoundError) as e:
    assert_report_no_copies(report, min_bytes=1024)
  assert "copy-start" in str(e.value) and "copy.2" in str(e.value)
  assert not isinstance(e.value, CopiesUnverifiedError)


# --------------------------------------------------------------------------- refusal

_MINIMAL = """HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %copy = f32[4]{0} copy(%x)
}
"""


def test_minimal_text_is_verified():
  r = _hlo.inspect_hlo(_MINIMAL)
  assert r.verified and [c.name for c in r.copies] == ["copy"]


@pytest.mark.parametrize("name, text", [
    ("empty", ""),
    ("blank", "\n\n  \n"),
    ("prose", "Compilation finished without copies.\n"),
    ("header only", "HloModule m, is_scheduled=true\n"),
    ("no entry", _MINIMAL.replace("ENTRY ", "")),
    ("unclosed", _MINIMAL.rstrip().rstrip("}")),
    ("copy line not parsed", _MINIMAL.replace("ROOT %copy = f32[4]{0} copy(%x)",
                                              "ROOT %copy = f32[4]{0} copy %x")),
    ("unknown dtype", _MINIMAL.replace("ROOT %copy = f32[4]{0}", "ROOT %copy = q9[4]{0}")),
    ("undefined operand", _MINIMAL.replace("copy(%x)", "copy(%y)")),
    ("missing computation", _MINIMAL.replace(
        "ROOT %copy = f32[4]{0} copy(%x)",
        "ROOT %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%gone")),
    ("stray line", _MINIMAL + "\nthis is not HLO\n"),
    ("text before header", "garbage\n" + _MINIMAL),
    ("copy-start without done", _MINIMAL.replace(
        "ROOT %copy = f32[4]{0} copy(%x)",
        "ROOT %cs = (f32[4]{0}, f32[4]{0}, u32[]) copy-start(%x)")),
    ("binary", "\x00\x01HloModule\xff{{{"),
])
def test_refuses_text_it_does_not_understand(name, text):
  r = _hlo.inspect_hlo(text)
  assert not r.verified and r.problems, name
  report = report_from_text(text)
  assert not report.verified
  assert "UNVERIFIED" in str(report) and "No copies." not in str(report)
  with pytest.raises(CopiesUnverifiedError):
    assert_report_no_copies(report, min_bytes=0)


def test_non_text_is_refused():
  assert not _hlo.inspect_hlo(None).verified  # type: ignore[arg-type]


@pytest.mark.parametrize("fixture", ["gpu_copy_start.hlo", "two_modules.hlo"])
def test_every_truncation_is_refused(fixture):
  text = _fixture(fixture)
  full = text.rstrip()
  # Every cut inside the last module leaves it incomplete: never verified. (A cut
  # between two modules leaves a complete first module; that one is not detectable.)
  last_module = full.rfind("HloModule")
  cuts = sorted(set(range(last_module + 1, len(full), 7)) | {
      i for i, ch in enumerate(full) if ch == "\n" and i > last_module})
  assert len(cuts) > 50
  for k in cuts:
    r = _hlo.inspect_hlo(full[:k])
    assert not r.verified, f"text cut at {k} passed as verified"
  assert _hlo.inspect_hlo(full).verified


def test_a_dropped_line_is_refused_or_changes_nothing():
  text = _fixture("gpu_copy_start.hlo")
  lines = text.splitlines()
  full = {c.name for c in _hlo.inspect_hlo(text).copies}
  for i, line in enumerate(lines):
    if "copy" not in line or line.strip().startswith("HloModule"):
      continue
    r = _hlo.inspect_hlo("\n".join(lines[:i] + lines[i + 1:]))
    # Dropping a copy's definition must be noticed through its users.
    assert not r.verified, f"dropping line {i + 1} went unnoticed"
  assert full == {"copy-start", "copy.2"}


def test_metadata_and_backend_config_forms():
  md = _hlo.parse_metadata(
      '{op_name="jit(f)/add" profile_type={1,2} stack_frame_id=3 preserve_layout=true}')
  assert md == {"op_name": "jit(f)/add", "profile_type": "{1,2}", "stack_frame_id": "3",
                "preserve_layout": "true"}
  with pytest.raises(_hlo.HloParseError):
    _hlo.parse_metadata('{op_name="a" ???}')
  json_form = _hlo.parse_instruction(
      '%w = (s32[]) while(%t), condition=%c, body=%b, '
      'backend_config={"known_trip_count":{"n":"5"},"known_init_step":{"init":"0"}}')
  quoted_form = _hlo.parse_instruction(
      r'%w = (s32[]) while(%t), condition=%c, body=%b, '
      r'backend_config="{\"known_trip_count\":{\"n\":\"7\"}}"')
  assert _hlo.known_trip_count(json_form) == 5
  assert _hlo.known_trip_count(quoted_form) == 7


# --------------------------------------------------------------------------- lineage

# x (parameter 0) is donated. `%ax` is x's elementwise update (it may take x's
# buffer), `%dx` a product that reads x (a new buffer); the loop carries x in slot
# 0 and, in slot 1, a value computed from both slots.
_LINEAGE = """HloModule m, input_output_alias={ {0}: (0, {}, may-alias) }

%fused_dot (p.0: f32[8,8], p.1: f32[8,8]) -> f32[8,8] {
  %p.0 = f32[8,8]{1,0} parameter(0)
  %p.1 = f32[8,8]{1,0} parameter(1)
  ROOT %d = f32[8,8]{1,0} dot(%p.0, %p.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_axpy (q.0: f32[8,8], q.1: f32[8,8]) -> f32[8,8] {
  %q.0 = f32[8,8]{1,0} parameter(0)
  %q.1 = f32[8,8]{1,0} parameter(1)
  %c = f32[] constant(0.9)
  %b = f32[8,8]{1,0} broadcast(%c), dimensions={}
  %m = f32[8,8]{1,0} multiply(%q.0, %b)
  ROOT %a = f32[8,8]{1,0} add(%m, %q.1)
}

%body (t: (f32[8,8], f32[8,8])) -> (f32[8,8], f32[8,8]) {
  %t = (f32[8,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  %t.0 = f32[8,8]{1,0} get-tuple-element(%t), index=0
  %t.1 = f32[8,8]{1,0} get-tuple-element(%t), index=1
  %keep.0 = f32[8,8]{1,0} copy(%t.0)
  %keep.1 = f32[8,8]{1,0} copy(%t.1)
  %s = f32[8,8]{1,0} add(%t.1, %t.0)
  ROOT %r = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%keep.0, %s)
}

%cond (u: (f32[8,8], f32[8,8])) -> pred[] {
  %u = (f32[8,8]{1,0}, f32[8,8]{1,0}) parameter(0)
  ROOT %f = pred[] constant(false)
}

ENTRY %main (x: f32[8,8], g: f32[8,8]) -> (f32[8,8], f32[8,8], f32[8,8]) {
  %x = f32[8,8]{1,0} parameter(0)
  %g = f32[8,8]{1,0} parameter(1)
  %dx = f32[8,8]{1,0} fusion(%g, %x), kind=kOutput, calls=%fused_dot
  %copy.dx = f32[8,8]{1,0} copy(%dx)
  %ax = f32[8,8]{1,0} fusion(%x, %g), kind=kLoop, calls=%fused_axpy
  %copy.ax = f32[8,8]{1,0} copy(%ax)
  %init = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%ax, %dx)
  %w = (f32[8,8]{1,0}, f32[8,8]{1,0}) while(%init), condition=%cond, body=%body
  %w.0 = f32[8,8]{1,0} get-tuple-element(%w), index=0
  %w.1 = f32[8,8]{1,0} get-tuple-element(%w), index=1
  ROOT %out = (f32[8,8]{1,0}, f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%w.0, %w.1, %copy.dx)
}
"""


def test_lineage_follows_buffers_not_values_computed_from_them():
  # A copy of an elementwise update of x, or of the carry that holds x, copies x's
  # buffer; a copy of a product that reads x, or of another carry computed from
  # x's, copies a buffer of its own (`_buffers.py`).
  report = report_from_text(_LINEAGE)
  assert report.verified, report.problems
  kinds = {c.name: (c.category, c.buffer_parameter) for c in report.copies}
  assert kinds == {"copy.dx": ("temporary", None), "copy.ax": ("buffer", 0),
                   "keep.0": ("buffer", 0), "keep.1": ("temporary", None)}, kinds
