"""`python -m inplace_jax check`: in process (`_cli.main(argv)`) and as a subprocess.

Copy counts asserted here were observed with jax/jaxlib 0.10.2 on CPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from inplace_jax import _cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "xla_20440.py")

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

FUNCS = textwrap.dedent('''
    import jax.numpy as jnp

    def step(x):
      y = x[0, 0]
      x = x.at[0, 0].add(1.0)
      return x, y

    def old_and_new(x):
      return x, x.at[0].set(1.0)

    def write(x):
      return x.at[0].set(1.0)

    def cache_step(state, pos, scale):
      k = state["k"].at[pos].set(state["k"][0] * scale)
      return {"k": k, "v": state["v"]}, state["k"].sum()

    def make_args():
      return ({"k": jnp.ones((64, 8)), "v": jnp.zeros((64, 8))}, jnp.int32(3))

    def not_a_tuple():
      return jnp.ones(3)

    def boom(x):
      raise ValueError("this function fails\\nwith two lines")

    CONSTANT = 3
''')


@pytest.fixture(scope="module")
def funcs(tmp_path_factory):
  path = tmp_path_factory.mktemp("cli") / "funcs.py"
  path.write_text(FUNCS)
  return str(path)


def run(capsys, *argv):
  code = _cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


# --------------------------------------------------------------------------- results


def test_json_on_the_20440_example(capsys):
  code, out, err = run(capsys, "check", f"{EXAMPLE}:step", "--arg", "f32[256,256]",
                       "--donate", "0", "--json", "--repeat", "3")
  assert code == 0, err
  result = json.loads(out)          # stdout holds the JSON object and nothing else
  jj, ij = result["jax_jit"], result["inplace_jax_jit"]
  assert jj["copies"] == 2 and jj["copy_bytes"] == 2 * 256 * 256 * 4
  assert ij["copies"] == 0 and ij["copy_bytes"] == 0
  for v in (jj, ij):
    assert len(v["times_s"]) == 3 and v["median_time_s"] > 0 and v["verified"]
  assert result["time_ratio"] == pytest.approx(jj["median_time_s"] / ij["median_time_s"])
  assert result["outputs_equal"] is True
  assert result["strict_failures"] == []
  report = result["inplace_jax_report"]
  assert report["copies"] == [] and report["verified"] is True
  assert report["donations"][0]["aliased_output"] == [0]
  assert len(result["jax_jit_report"]["copies"]) == 2
  assert "compiling and running under jax.jit" in err
  assert "compiling and running under inplace_jax.jit" in err


def test_text_output_side_by_side(capsys):
  code, out, err = run(capsys, "check", f"{EXAMPLE}:step", "--arg", "f32[256,256]",
                       "--donate", "0", "--repeat", "2", "--strict")
  assert code == 0, err
  lines = out.splitlines()
  copies = next(line for line in lines if line.strip().startswith("copies "))
  assert copies.split()[1:] == ["2", "0"]
  assert any("median time per call" in line for line in lines)
  assert any("time ratio jax.jit / inplace_jax.jit" in line for line in lines)
  assert "outputs equal bit for bit: yes" in out
  assert "Copies under jax.jit:" in out
  assert "inplace_jax.jit report (what remains and why):" in out
  assert "No copies." in out
  assert "done in" in err


def test_strict_fails_on_an_unavoidable_copy(capsys, funcs):
  code, out, err = run(capsys, "check", f"{funcs}:old_and_new", "--arg", "f32[256,256]",
                       "--donate", "0", "--strict", "--repeat", "1", "-q")
  assert code == 1
  assert "old_version_escapes" in out           # the report says why
  assert err.strip().splitlines()[-1].endswith(
      "1 copy(ies) of at least 1024 bytes remain under inplace_jax.jit")
  # Without --strict the same run succeeds.
  code, _, _ = run(capsys, "check", f"{funcs}:old_and_new", "--arg", "f32[256,256]",
                   "--donate", "0", "--repeat", "1", "-q")
  assert code == 0


def test_strict_fails_on_a_non_donated_update(capsys, funcs):
  code, out, _ = run(capsys, "check", f"{funcs}:write", "--arg", "f32[256,256]",
                     "--strict", "--json", "--repeat", "1", "-q")
  assert code == 1
  result = json.loads(out)
  assert result["inplace_jax_jit"]["copies_over_min_bytes"] == 1
  # Raising --min-bytes above the buffer size lets it pass.
  code, _, _ = run(capsys, "check", f"{funcs}:write", "--arg", "f32[256,256]",
                   "--strict", "--min-bytes", str(256 * 256 * 4 + 1), "--repeat", "1",
                   "-q")
  assert code == 0


def test_pytree_specs_static_args_and_factory(capsys, funcs):
  spec = '{"k": "f32[64,8]", "v": "f32[64,8]=zeros"}'
  code, out, err = run(capsys, "check", f"{funcs}:cache_step", "--arg", spec,
                       "--arg", "i32[]=3", "--arg", "2.5", "--static", "2",
                       "--donate", "0", "--json", "--repeat", "2", "-q")
  assert code == 0, err
  result = json.loads(out)
  assert result["outputs_equal"] is True
  assert result["static_argnums"] == [2] and result["donate_argnums"] == [0]
  assert result["inplace_jax_jit"]["copies_over_min_bytes"] == 0
  donated = [d for d in result["inplace_jax_report"]["donations"] if d["donated"]]
  assert len(donated) == 2 and all(d["aliased_output"] is not None for d in donated)
  # The same arguments from a factory, plus a static --arg after them.
  code, out, err = run(capsys, "check", f"{funcs}:cache_step", "--args-factory",
                       f"{funcs}:make_args", "--arg", "2.5", "--static", "2",
                       "--donate", "0", "--json", "--repeat", "2", "-q")
  assert code == 0, err
  assert json.loads(out)["outputs_equal"] is True


def test_fresh_inputs_and_compile_only(capsys):
  code, out, err = run(capsys, "check", f"{EXAMPLE}:step", "--arg", "f32[128,128]",
                       "--donate", "0", "--json", "--repeat", "2", "--fresh-inputs", "-q")
  assert code == 0, err
  result = json.loads(out)
  assert result["inplace_jax_jit"]["timing"].startswith("donated inputs re-created")
  code, out, err = run(capsys, "check", f"{EXAMPLE}:step", "--arg", "f32[20000,20000]",
                       "--donate", "0", "--json", "--repeat", "0", "-q")
  assert code == 0, err                 # 1.6 GB: nothing was allocated
  result = json.loads(out)
  assert result["jax_jit"]["copies"] == 2 and result["inplace_jax_jit"]["copies"] == 0
  assert result["outputs_equal"] is None and result["time_ratio"] is None


# --------------------------------------------------------------------------- errors


def _bad_cases(funcs):
  here = f"{funcs}:step"
  return {
      "missing file": ["check", "/no/such/file.py:f", "--arg", "f32[4]"],
      "unknown function": ["check", f"{funcs}:nope", "--arg", "f32[4]"],
      "not a function": ["check", f"{funcs}:CONSTANT", "--arg", "f32[4]"],
      "no colon": ["check", funcs, "--arg", "f32[4]"],
      "malformed shape": ["check", here, "--arg", "f32[4,x]"],
      "unclosed shape": ["check", here, "--arg", "f32[4,4"],
      "unknown dtype": ["check", here, "--arg", "q7[4]"],
      "bad fill": ["check", here, "--arg", "f32[4]=lots"],
      "random ints": ["check", here, "--arg", "i32[4]=randn"],
      "bad pytree": ["check", here, "--arg", '{"k": f32[4]}'],
      "no arguments": ["check", here],
      "donate out of range": ["check", here, "--arg", "f32[4,4]", "--donate", "1"],
      "negative donate": ["check", here, "--arg", "f32[4,4]", "--donate", "-1"],
      "donate not a number": ["check", here, "--arg", "f32[4,4]", "--donate", "x"],
      "static out of range": ["check", here, "--arg", "f32[4,4]", "--static", "3"],
      "static array": ["check", here, "--arg", "f32[4,4]", "--static", "0"],
      "donate and static": ["check", here, "--arg", "3", "--donate", "0", "--static", "0"],
      "donated python value": ["check", here, "--arg", "3", "--donate", "0"],
      "unhashable static": ["check", here, "--arg", "[1, 2]", "--static", "0"],
      "negative min bytes": ["check", here, "--arg", "f32[4,4]", "--min-bytes", "-1"],
      "unknown flag": ["check", here, "--arg", "f32[4,4]", "--bogus"],
      "no command": [],
      "unknown command": ["audit", here],
      "factory not a tuple": ["check", here, "--args-factory", f"{funcs}:not_a_tuple"],
      "function raises": ["check", f"{funcs}:boom", "--arg", "f32[4]"],
      "wrong shape for the function": ["check", here, "--arg", "f32[4]"],
  }


def test_bad_arguments_give_one_line_and_exit_2(capsys, funcs):
  for name, argv in _bad_cases(funcs).items():
    code, out, err = run(capsys, *argv, "-q") if argv else run(capsys)
    lines = err.strip().splitlines()
    assert code == 2, (name, code, out, err)
    assert out == "", (name, out)
    assert len(lines) == 1, (name, err)
    assert lines[0].startswith("python -m inplace_jax: error: "), (name, err)
    assert "Traceback" not in err, name


def test_error_messages_say_what_is_wrong(capsys, funcs):
  cases = _bad_cases(funcs)
  expect = {
      "unknown function": "has no function 'nope' (it defines: ",
      "malformed shape": "malformed shape [4,x]",
      "unknown dtype": "unknown dtype 'q7'",
      "donate out of range": "--donate 1: out of range",
      "function raises": "ValueError: this function fails",
      "missing file": "no such file",
  }
  for name, text in expect.items():
    _, _, err = run(capsys, *cases[name], "-q")
    assert text in err, (name, err)


def test_help_exits_0(capsys):
  code, out, _ = run(capsys, "check", "--help")
  assert code == 0 and "--args-factory" in out


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, dtype, shape", [
    ("f32[1000,1000]", "float32", (1000, 1000)),
    ("bf16[8, 128]", "bfloat16", (8, 128)),
    ("f16[3]", "float16", (3,)),
    ("i32[]", "int32", ()),
    ("s8[2,0]", "int8", (2, 0)),
    ("u8[5]", "uint8", (5,)),
    ("bool[2]", "bool", (2,)),
    ("pred[2]", "bool", (2,)),
    ("c64[4]", "complex64", (4,)),
    ("float32[7]", "float32", (7,)),
])
def test_array_specs(text, dtype, shape):
  spec = _cli.parse_arg(text)
  assert str(spec.dtype) == dtype and spec.shape == shape


def test_fills_and_literals():
  assert _cli.parse_arg("f32[2]").fill == "randn"
  assert _cli.parse_arg("i32[2]").fill == "zeros"
  assert _cli.parse_arg("i32[]=5").fill == 5
  assert _cli.parse_arg("f32[2]=0.5").fill == 0.5
  assert _cli.parse_arg("f32[2]=arange").fill == "arange"
  assert _cli.parse_arg("3") == 3 and _cli.parse_arg('"relu"') == "relu"
  assert _cli.parse_arg("(2, 2)") == (2, 2) and _cli.parse_arg("None") is None
  tree = _cli.parse_arg('{"a": ["f32[2]", 3], "b": "i32[]"}')
  assert tree["a"][0].shape == (2,) and tree["a"][1] == 3 and tree["b"].shape == ()
  args = _cli.build_args([_cli.parse_arg("f32[2,3]=arange"), tree], seed=0)
  assert args[0].tolist() == [[0, 1, 2], [3, 4, 5]]
  assert args[1]["a"][0].shape == (2,) and args[1]["b"].dtype == jax.numpy.int32


def test_built_arrays_are_safe_to_donate():
  # A jitted maker, not `device_put(numpy)`: donation must reuse the buffer.
  (x,) = _cli.build_args([_cli.parse_arg("f32[64,64]")], seed=0)
  ptr = x.unsafe_buffer_pointer()
  y = jax.jit(lambda x: x.at[0].set(1.0), donate_argnums=0)(x)
  assert x.is_deleted() and y.unsafe_buffer_pointer() == ptr


# --------------------------------------------------------------------------- subprocess


def _subprocess(*argv):
  return subprocess.run([sys.executable, "-m", "inplace_jax", *argv], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_subprocess_readme_command_small():
  proc = _subprocess("check", "examples/xla_20440.py:step", "--arg", "f32[256,256]",
                     "--donate", "0", "--repeat", "3", "--strict")
  assert proc.returncode == 0, proc.stderr
  copies = next(line for line in proc.stdout.splitlines()
                if line.strip().startswith("copies "))
  assert copies.split()[1:] == ["2", "0"]
  assert "outputs equal bit for bit: yes" in proc.stdout
  assert "[inplace_jax] compiling and running under jax.jit ..." in proc.stderr


def test_subprocess_bad_argument():
  proc = _subprocess("check", "examples/xla_20440.py:step", "--arg", "f32[256,oops]")
  assert proc.returncode == 2
  assert proc.stdout == ""
  assert proc.stderr.strip().splitlines() == [
      "python -m inplace_jax: error: --arg 'f32[256,oops]': malformed shape "
      "[256,oops]: dimensions must be non-negative integers separated by commas"]
