"""porter/diagnostics.py: the one trim of tool output, and the rule that only the unit's own lines are quoted."""

from porter.diagnostics import own_by_name, trim_diagnostics

SECRET = "SECRET_LINE_ONE"
# nvcc 13.0's own output for a unit that includes another file (captured, paths as nvcc printed them)
NVCC = f"""u.cu(2): error: identifier "undefined_q" is undefined
  int g() {{ return undefined_q; }}
                   ^

/tmp/dg/secret.txt(1): error: identifier "{SECRET}" is undefined
  {SECRET} abc
  ^

/tmp/dg/secret.txt(2): error: expected a ";"
  second SECRET2
  ^

3 errors detected in the compilation of "u.cu".
"""
GAS = f"""/tmp/dg/secret.txt: Assembler messages:
/tmp/dg/secret.txt:1: Error: no such instruction: `{SECRET.lower()} abc'
/tmp/dg/secret.txt:2: Error: no such instruction: `second SECRET2'
"""
GCC = f"""In file included from /usr/include/x.h:3,
                 from u.cu:7:
/tmp/dg/secret.txt:1:1: error: '{SECRET}' does not name a type
    1 | {SECRET} abc
      | ^~~~~~~~~~~~~~~
"""
INSTANTIATION = f"""/usr/local/cuda/include/cub/x.cuh(10): error: no instance of "{SECRET}" matches
            argument types are: ({SECRET})
          detected during instantiation of "void k<T>(T *) [with T={SECRET}]" at line 45 of u.cu
"""


def own(f: str) -> bool:
    return f == "u.cu"


def test_a_message_located_in_another_file_loses_its_text():
    out = trim_diagnostics(NVCC, own=own)
    assert SECRET not in out and "SECRET2" not in out and "abc" not in out
    assert 'u.cu(2): error: identifier "undefined_q" is undefined' in out and "return undefined_q" in out
    assert "secret.txt(1): error in a file outside the unit" in out


def test_without_the_unit_rule_the_same_text_leaks():
    """The trim alone (no `own`) keeps what nvcc echoed: the rule is what removes it."""
    assert SECRET in trim_diagnostics(NVCC, compiler=True)


def test_assembler_and_gcc_messages_about_another_file_are_withheld():
    for text in (GAS, GCC):
        out = trim_diagnostics(text, own=own)
        assert SECRET not in out and SECRET.lower() not in out, out
    out = trim_diagnostics(GCC, own=own)
    assert "included from u.cu:7" in out and "x.h:3" not in out


def test_an_instantiation_keeps_only_the_units_line():
    out = trim_diagnostics(INSTANTIATION, own=own)
    assert SECRET not in out and "line 45 of u.cu" in out


def test_a_file_named_like_the_unit_elsewhere_is_another_file():
    """The candidate is compiled by bare name: /x/u.cu is another file, and after paths are cut to
    names in a prompt it would read as the unit's own."""
    text = f"/tmp/x/u.cu(1): error: identifier \"{SECRET}\" is undefined\n  {SECRET}\n  ^\n"
    assert SECRET not in trim_diagnostics(text, own=own)


def test_in_a_prompt_the_units_files_are_matched_by_name():
    mine = own_by_name(["unit.cu", "conv.cuh", "api.h"])
    assert mine("unit.cu") and mine("conv.cuh") and not mine("signing_key")
    text = f"signing_key(1): error: identifier \"{SECRET}\" is undefined\n  {SECRET}\n"
    assert SECRET not in trim_diagnostics(text, own=mine)
