"""The one TOML reader: every way a declared file can be bad is one line naming the file, in the caller's
error type (a provider's manifest raises ProviderError, a target file PorterError), never a traceback."""

from __future__ import annotations

import pytest

from porter.errors import PorterError
from porter.providers.base import ProviderError
from porter.tomlfile import parse_toml, read_toml


def test_a_good_file_reads_as_its_table(tmp_path):
    p = tmp_path / "a.toml"
    p.write_text('[[rule]]\nfile = "x"\n')
    assert read_toml(p) == {"rule": [{"file": "x"}]}


def test_a_missing_file_is_an_error_unless_the_caller_says_what_it_reads_as(tmp_path):
    p = tmp_path / "absent.toml"
    assert read_toml(p, missing=None) is None and read_toml(p, missing={}) == {}
    with pytest.raises(ProviderError) as exc:
        read_toml(p, error=ProviderError, why_needed="no scripted answers for target t")
    assert str(exc.value) == f"{p} does not exist: no scripted answers for target t"


@pytest.mark.parametrize("raw, says", [(b"[[rule]\n", "not valid TOML"), (b"a = 1\nb = \"\xff\xfe\"\n", "not UTF-8")])
def test_bad_syntax_or_bytes_are_one_line_naming_the_file(tmp_path, raw, says):
    p = tmp_path / "bad.toml"
    p.write_bytes(raw)
    with pytest.raises(PorterError) as exc:
        read_toml(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}: ") and says in msg and "\n" not in msg
    with pytest.raises(PorterError, match="not valid TOML"):
        parse_toml("x = ", "somewhere.toml")


def test_a_malformed_parity_harness_file_is_one_line_not_a_traceback(tmp_path):
    from types import SimpleNamespace

    from porter.gates.parity.gate import harness_names

    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / "harness.toml").write_text("[harness\n")
    with pytest.raises(PorterError, match=r"harness.toml: not valid TOML"):
        harness_names(SimpleNamespace(dir=tmp_path, symbol_prefix="mini_gpu_"))
    (tmp_path / "parity" / "harness.toml").unlink()
    assert harness_names(SimpleNamespace(dir=tmp_path, symbol_prefix="mini_gpu_"))["stream"] == "mini_cuda_stream"
