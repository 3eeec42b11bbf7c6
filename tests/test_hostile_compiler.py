"""Candidates that make the compiler read the signing key (tests/hostile/, one file per trick).

Each trick is shown three times: it works against a bare nvcc (the key's text
comes back in nvcc's output, or in the object for `.incbin`), so the defences
below are what stop it; extract and the static gate refuse it; and with that
filter switched off, the build gate's sandbox makes the include fail as "No
such file", with no byte of the key in the gate's summary, diagnostics or
evidence.  Last, a whole `porter run` over every trick (filter on, then off)
leaves no byte of the key in any prompt, ledger line, evidence file or runs/ log.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from porter.records import signing
from porter.gates.extract import ExtractionError, extract_unit_source
from porter.gates import build, static
from porter.gates.driver import Candidate, GateContext
from porter.providers.secrets import secret_forms
from porter.target import load_target

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("bwrap") is None,
                                reason="needs nvcc and bubblewrap")

HOSTILE = Path(__file__).parent / "hostile"
TRICKS = ["include_signing_key_echo.cu", "include_macro.cu", "include_dotdot_angle.cu", "include_line_splice.cu",
          "include_comment_between.cu", "include_next.cu", "import.cu", "incbin_asm.cu"]
UNIT = "mini_gpu_add_tensor"


@pytest.fixture
def key(monkeypatch, tmp_path) -> Path:
    """A real signing key under a $PORTER_HOME of its own (beside the workspace, never inside it)."""
    monkeypatch.setenv("PORTER_HOME", str(tmp_path / "home" / "porter"))
    signing.create_private()
    return signing.private_key_path()


@pytest.fixture
def target(tmp_path, key):
    from porter.workspace import init_workspace

    return load_target(init_workspace(tmp_path / "ws", ["minimoe"]), "minimoe")


def hostile(name: str, key: Path) -> str:
    return (HOSTILE / name).read_text().replace("@KEY_UP@", "../" * 16 + str(key).lstrip("/")).replace("@KEY@", str(key))


def key_texts(key: Path) -> list[str]:
    """What of the key may not appear: each line of the key file that carries key bytes, and every
    form of its seed that porter's prompt check knows (hex, base64 at any alignment, raw)."""
    lines = [ln for ln in key.read_text().splitlines()[2:] if len(ln) >= 16 and "PRIVATE KEY" not in ln]
    return lines + sorted(secret_forms()["the signing key"])


def leaked(text: str, key: Path) -> list[str]:
    return [t for t in key_texts(key) if t in text]


@pytest.mark.parametrize("trick", TRICKS)
def test_the_trick_reads_the_key_through_a_bare_nvcc(trick, target, key, tmp_path):
    """Without the sandbox nvcc reads the key: its lines come back in the output (or the object)."""
    src = tmp_path / f"{UNIT}.cu"
    src.write_text(hostile(trick, key))
    obj = tmp_path / "out.o"
    r = subprocess.run([build.nvcc_path(), "-c", *build.compile_flags(target), "-o", str(obj), src.name],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    seen = r.stdout + r.stderr + (obj.read_bytes().decode("latin-1") if obj.is_file() else "")
    assert leaked(seen, key), f"{trick} no longer reads the key through nvcc: the test shows nothing\n{seen[-2000:]}"


@pytest.mark.parametrize("trick", TRICKS)
def test_extract_and_the_static_gate_refuse_the_trick(trick, target, key):
    src = hostile(trick, key)
    with pytest.raises(ExtractionError) as exc:
        extract_unit_source(f"Here it is.\n```cuda\n{src}```\n", UNIT, target)
    assert "refused" in str(exc.value) and not leaked(str(exc.value), key)
    res = static.run(Candidate.of(UNIT, src), GateContext(target))
    assert not res.ok and "refused" in res.summary


@pytest.mark.parametrize("trick", TRICKS)
def test_past_the_filter_the_sandbox_hides_the_key(trick, target, key, build_cache):
    """The build gate run on the trick as if extract had missed it: the compile fails because the key's
    path does not exist in the compiler's sandbox, and nothing of the key is in what the gate reports."""
    res = build.run(Candidate.of(UNIT, hostile(trick, key)), GateContext(target, build_cache=build_cache))
    assert not res.ok
    reported = "\n".join([res.summary, res.diagnostics, json.dumps(res.evidence)])
    assert not leaked(reported, key)
    assert "No such file" in reported or "not found" in reported or "can't open" in reported, reported


def test_a_run_over_every_trick_leaves_no_byte_of_the_key_anywhere(target, key, monkeypatch):
    """`porter run` answered with every trick in turn, the filter on (refused at extract) and then off
    (the sandbox is the wall): each next prompt carries the last attempt's diagnostics; no prompt,
    ledger line, evidence file or runs/ log holds any of the key."""
    from porter.gates import extract
    from porter.cli import main

    ws = target.workspace
    scripted = target.scripted_dir
    entries = []
    for trick in TRICKS:
        (scripted / "hostile").mkdir(exist_ok=True)
        (scripted / "hostile" / f"{trick}.md").write_text(f"The port.\n\n```cuda\n{hostile(trick, key)}```\n")
        entries.append(f'[[answer]]\nunit = "{UNIT}"\nfile = "hostile/{trick}.md"\nexpect = "build"\nwhy = "{trick}"\n')
    (scripted / "manifest.toml").write_text("\n".join(entries * 2))
    n = str(len(TRICKS))
    assert main(["-C", str(ws), "run", "--provider", "scripted", "--unit", UNIT, "--max-attempts", n]) != 0
    monkeypatch.setattr(extract, "check_includes", lambda code, local: None)
    monkeypatch.setattr(static, "check_includes", lambda code, local: None)
    assert main(["-C", str(ws), "run", "--provider", "scripted", "--unit", UNIT, "--max-attempts", n]) != 0
    prompts = list((ws / "runs").rglob("*.prompt.md"))
    assert len(prompts) >= 2 * len(TRICKS) - 1, "the runs did not make the prompts this test reads"
    build_failures = [p for p in (ws / "ledger").rglob("*")
                      if p.is_file() and re.search(r'"gate":\s*"build"', p.read_text(errors="replace"))]
    assert build_failures, "no build gate ran on a trick: the sandbox was not exercised"
    for path in [p for p in ws.rglob("*") if p.is_file() and ".git" not in p.parts]:
        text = path.read_bytes().decode("latin-1")
        assert not leaked(text, key), f"{path.relative_to(ws)} holds the signing key"
