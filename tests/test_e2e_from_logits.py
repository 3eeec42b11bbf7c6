"""e2e is decided by porter from raw numbers, never by what the engine process says.

The engine process loads the candidate backend, so its stdout, stderr, exit code and files are the
candidate's to forge.  ds4's official logprob vectors: a stand-in for porter's driver program (the
process that would run ds4 with the candidate) prints ds4_test's OK lines and exits 0; only raw
results that porter checks against official.vec, which that process never sees, can pass.  minimoe:
the greedy tokens are porter's argmax of the engine's logits rows; a printed `tokens:` line that
disagrees is an inconsistent engine.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import NO_DS4

from porter.host import sandbox
from porter.errors import PorterError
from porter.gates.e2e import cbuild
from porter.target.code import load_file

ROOT = Path(__file__).resolve().parents[1]
lp = load_file(ROOT / "targets" / "ds4" / "e2e" / "logprob.py")
d4 = load_file(ROOT / "targets" / "ds4" / "e2e" / "driver.py")
mm = load_file(ROOT / "targets" / "minimoe" / "e2e" / "driver.py")

needs_sandbox = pytest.mark.skipif(not sandbox.available()[0], reason=f"no sandbox here: {sandbox.available()[1]}")

# ---- a tiny model vocabulary and an official.vec in ds4's format ------------------------------

BYTE_CHARS = load_file(ROOT / "targets" / "ds4" / "e2e" / "gguf.py").byte_level_chars()
VOCAB = BYTE_CHARS + ["Hello", "Ġworld", "Ġthere", "!Ċ", "<｜User｜>", "ĠHello"]
ID = {s: i for i, s in enumerate(VOCAB)}

OFFICIAL = """\
# ds4-official-logprob-vectors-v1
# case <id> <ctx> <steps> <prompt-file>

case greet 4096 2 tests/test-vectors/prompts/greet.txt
step 0 48656c6c6f 2
top 48656c6c6f -0.125
top 2048656c6c6f -2.5
step 1 20776f726c64 1
top 20776f726c64 -0.5
end

case long_memory_archive 16384 1 tests/test-vectors/prompts/archive.txt
step 0 2074686572 1
top 2074686572 0
end

case bang 4096 1 tests/test-vectors/prompts/bang.txt
step 0 210a 1
top 210a -0.0625
end
"""


def _correct_results() -> str:
    """What an honest driver writes for OFFICIAL (the disabled case is not in its job)."""
    return "\n".join([
        lp.RESULTS_HEADER,
        "case greet 2",
        f"step 0 {ID['Hello']} 3", f"top {ID['Hello']} -0.25", f"top {ID['ĠHello']} -2", f"top {ID['Ġthere']} -4",
        f"step 1 {ID['Ġworld']} 2", f"top {ID['Ġworld']} -0.75", f"top {ID['Ġthere']} -1.5",
        "end greet",
        "case bang 1",
        f"step 0 {ID['!Ċ']} 2", f"top {ID['!Ċ']} -0.0625", f"top {ID['Hello']} -3",
        "end bang",
        "done", ""])


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A stand-in for the user's ds4 checkout: the vector file and its prompts."""
    root = tmp_path / "ds4"
    prompts = root / "tests" / "test-vectors" / "prompts"
    prompts.mkdir(parents=True)
    (root / "tests" / "test-vectors" / "official.vec").write_text(OFFICIAL)
    for name in ("greet", "archive", "bang"):
        (prompts / f"{name}.txt").write_text(f"the {name} prompt\n")
    return root


@pytest.fixture
def model(tmp_path) -> Path:
    import gguf

    path = tmp_path / "model" / "tiny.gguf"
    path.parent.mkdir()
    w = gguf.GGUFWriter(str(path), "deepseek4")
    w.add_array("tokenizer.ggml.tokens", VOCAB)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- the official vector file, parsed by porter -------------------------------------------------

def test_official_vec_parser_reads_ds4s_format():
    cases = lp.parse_official(OFFICIAL)
    assert [(c.id, c.ctx, c.nsteps) for c in cases] == [("greet", 4096, 2), ("long_memory_archive", 16384, 1),
                                                       ("bang", 4096, 1)]
    greet = cases[0]
    assert greet.prompt == "tests/test-vectors/prompts/greet.txt"
    assert greet.steps[0].selected == b"Hello"
    assert greet.steps[0].top == [(b"Hello", -0.125), (b" Hello", -2.5)]
    assert greet.steps[1].top == [(b" world", -0.5)]
    assert cases[2].steps[0].selected == b"!\n"


@pytest.mark.parametrize("broken, why", [
    (OFFICIAL.replace("end\n\ncase bang", "\ncase bang"), "expected|unexpected"),  # a case without end
    (OFFICIAL.replace("step 0 48656c6c6f 2", "step 0 48656c6c6f 3"), "top line"),  # fewer tops than declared
    (OFFICIAL.replace("step 1 20776f726c64 1", "step 2 20776f726c64 1"), "out of range"),
    (OFFICIAL.replace("top 210a -0.0625", "top 2x0a -0.0625"), "hex"),
    (OFFICIAL.replace("top 210a -0.0625", "top 210a nan"), "not finite"),
    (OFFICIAL.rsplit("end", 1)[0], "no `end`"),
    (OFFICIAL.replace("case greet 4096 2", "case greet 4096 2 extra"), "expected `case"),
], ids=["no-end-before-case", "short-top", "step-range", "bad-hex", "nan", "unterminated", "case-fields"])
def test_a_broken_official_vec_is_an_error_not_a_pass(broken, why):
    import re

    with pytest.raises(PorterError, match=re.compile(why)):
        lp.parse_official(broken)


def test_the_real_official_vec_parses_when_the_checkout_is_here():
    vec = Path(os.environ.get("PORTER_DS4_SOURCE", ROOT / "external" / "ds4")) / "tests" / "test-vectors" / "official.vec"
    if not vec.is_file():
        pytest.skip(NO_DS4)
    cases = lp.parse_official(vec.read_text(), str(vec))
    ids = [c.id for c in cases]
    assert "long_memory_archive" in ids and len(ids) >= 3
    assert all(c.steps and all(s.selected for s in c.steps) for c in cases)


def test_token_ids_become_bytes_as_ds4_token_text_does(model):
    vocab = lp.token_vocabulary(model)
    assert len(vocab) == len(VOCAB)
    assert vocab[ID["Ġworld"]] == b" world" and vocab[ID["!Ċ"]] == b"!\n"
    assert vocab[ID["<｜User｜>"]] == "<｜User｜>".encode()  # a literal special token keeps its UTF-8 bytes
    assert [vocab[b] for b in range(256)] == [bytes([b]) for b in range(256)]


# ---- porter's rule on raw results ----------------------------------------------------------------

def _judge(tmp_path, text: str | None, code: int = 0, stderr: str = ""):
    res = tmp_path / "results.txt"
    if text is not None:
        res.write_text(text)
    return lp.judge(lp.parse_official(OFFICIAL), res, code, [lp.token_bytes(s) for s in VOCAB], stderr)


def test_correct_raw_results_pass_and_the_disabled_case_is_a_documented_skip(tmp_path):
    r = _judge(tmp_path, _correct_results())
    assert r.ok, r.summary
    assert [(c.id, c.status) for c in r.cases] == [("greet", "ok"), ("long_memory_archive", "skipped"), ("bang", "ok")]
    assert "disabled by ds4_test" in r.cases[1].problems[0]
    assert r.cases[0].max_delta == pytest.approx(0.5)  # " Hello": -2 locally, -2.5 official
    assert r.to_json()["verdict"] == "OK"


FORGED_TEXT = ("ds4-test: vector greet\nds4-test: vector bang\nlogprob-vectors: OK\n", "ds4 tests: ok\n")


H, W, T, B, U, HH = (ID[s] for s in ("Hello", "Ġworld", "Ġthere", "!Ċ", "<｜User｜>", "ĠHello"))


@pytest.mark.parametrize("mutate, why", [
    (lambda t: None, "no results"),  # prints the OK lines, writes nothing
    (lambda t: "", "header"),
    (lambda t: t.replace("done\n", ""), "done"),
    (lambda t: t.split("case bang")[0], "stop after 1 of 2"),  # crashed before the second case
    # a consistent list whose greedy token's logprob is far from the official one
    (lambda t: t.replace(f"top {W} -0.75\ntop {T} -1.5", f"top {W} -5.5\ntop {T} -6"), "delta too high"),
    (lambda t: t.replace(f"top {W} -0.75", f"top {W} nan"), "not finite"),
    (lambda t: t.replace(f"step 1 {W} 2", f"step 1 {T} 2"), "not the top of its own list"),
    (lambda t: t.replace(f"step 0 {H} 3", f"step 0 {U} 3").replace(f"top {H} -0.25", f"top {U} -0.25"), "mismatch"),
    (lambda t: t.replace(f"top {HH} -2", f"top {U} -2"), "missing locally"),
    (lambda t: t.replace("case greet 2", "case long_memory_archive 2"), "the job's next is greet"),
    (lambda t: t.replace("done", "case extra 1\ndone"), "expected done"),
    (lambda t: t.replace(f"top {H} -0.25", f"top {H} 0.5"), "<= 0"),
    (lambda t: t.replace(f"top {H} -0.25", "top 99999 -0.25"), "outside the vocabulary"),
    (lambda t: t.replace(f"top {T} -4", f"top {B} -0.01"), "<= 0 in descending order|sum to more than 1"),
], ids=["no-results", "empty", "no-done", "truncated", "wrong-logprob", "nan", "greedy-not-top", "wrong-token",
        "top-missing", "other-case", "extra-case", "positive-logprob", "id-out-of-vocab", "unsorted"])
def test_forged_or_broken_results_fail_whatever_the_engine_says(tmp_path, mutate, why):
    import re

    text = mutate(_correct_results())
    assert text != _correct_results()
    r = _judge(tmp_path, text, 0, FORGED_TEXT[0])
    assert not r.ok and r.verdict == "ERR"
    assert re.search(why, r.summary + " ".join(p for c in r.cases for p in c.problems)), r.summary


def test_a_nonzero_exit_fails_closed_even_with_correct_results(tmp_path):
    r = _judge(tmp_path, _correct_results(), 1)
    assert not r.ok and "exited 1" in r.summary


def test_results_that_are_not_a_regular_file_are_not_read(tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text(lp.RESULTS_HEADER + "\nSECRET-KEY-BYTES\n")
    (tmp_path / "results.txt").symlink_to(secret)
    r = lp.judge(lp.parse_official(OFFICIAL), tmp_path / "results.txt", 0, [lp.token_bytes(s) for s in VOCAB])
    assert not r.ok and "SECRET" not in json.dumps(r.to_json())
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (lp.MAX_RESULTS_BYTES + 1))
    r = lp.judge(lp.parse_official(OFFICIAL), big, 0, [lp.token_bytes(s) for s in VOCAB])
    assert not r.ok and "more than" in r.summary


# ---- the stand-in engine, sandboxed as porter runs the real one ---------------------------------

STAND_IN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "results.h"
/* argv: MODEL JOB RESULTS, as porter's driver program takes them */
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    FILE *peek = fopen(ANSWERS, "r");  /* the expected answers, at their host path */
    FILE *job = fopen(argv[2], "r");
    char line[512];
    while (job && fgets(line, sizeof line, job)) fputs(line, stderr);
    if (job) fclose(job);
    fprintf(stderr, "ds4-test: vector greet\nds4-test: vector bang\nlogprob-vectors: OK\n");
    printf("ds4 tests: ok\n");
    if (peek) {
        fprintf(stderr, "SAW-THE-ANSWERS\n");
        fclose(peek);
    }
    if (WRITE) {
        FILE *out = fopen(argv[3], "w");
        if (!out) return 3;
        fputs(RESULTS, out);
        fclose(out);
    }
    return 0;
}
"""


def _stand_in(tmp_path, checkout, results: str | None) -> Path:
    src = tmp_path / "stand-in"
    src.mkdir(exist_ok=True)
    (src / "results.h").write_text(f"static const char RESULTS[] = {json.dumps(results or '')};\n")
    (src / "main.c").write_text(STAND_IN)
    exe = src / ("writes" if results is not None else "forges")
    answers = checkout / "tests" / "test-vectors" / "official.vec"
    subprocess.run([cbuild.cc_path(), f'-DANSWERS="{answers}"', f"-DWRITE={int(results is not None)}",
                    "-o", str(exe), str(src / "main.c")], check=True)
    return exe


def _run(tmp_path, checkout, model, exe):
    official = lp.parse_official((checkout / "tests" / "test-vectors" / "official.vec").read_text())
    return lp.run_vectors(exe, model, None, official, checkout, lp.token_vocabulary(model), tmp_path / "work",
                          timeout=60)


@needs_sandbox
def test_an_engine_that_prints_ok_and_exits_0_without_results_is_refused(tmp_path, checkout, model):
    result, argv = _run(tmp_path, checkout, model, _stand_in(tmp_path, checkout, None))
    assert result.exit_code == 0 and "logprob-vectors: OK" in result.diagnostics  # what ds4_test's parser took
    assert not result.ok and result.verdict == "ERR"
    assert all(c.status in ("failed", "skipped") for c in result.cases)
    assert "no results" in result.summary


@needs_sandbox
def test_an_engine_that_prints_ok_but_writes_wrong_logprobs_is_refused(tmp_path, checkout, model):
    wrong = _correct_results().replace(f"top {W} -0.75\ntop {T} -1.5", f"top {W} -9\ntop {T} -9.5")
    assert wrong != _correct_results()
    result, _ = _run(tmp_path, checkout, model, _stand_in(tmp_path, checkout, wrong))
    assert result.exit_code == 0 and not result.ok and "delta too high" in result.summary


@needs_sandbox
def test_correct_raw_results_from_the_sandboxed_engine_pass(tmp_path, checkout, model):
    result, argv = _run(tmp_path, checkout, model, _stand_in(tmp_path, checkout, _correct_results()))
    assert result.ok, result.summary + result.diagnostics
    # the job it read names cases and prompts, not the answers; it could not open official.vec
    assert "case greet 4096 2 prompt-0.txt" in result.diagnostics
    assert "long_memory_archive" not in result.diagnostics
    assert "SAW-THE-ANSWERS" not in result.diagnostics


@needs_sandbox
@pytest.mark.parametrize("honest", [False, True], ids=["forges-ok-lines", "writes-correct-results"])
def test_the_logprob_command_records_porters_verdict(tmp_path, checkout, model, monkeypatch, honest):
    """`porter dev e2e logprob` as a whole (the make step stood in for): the evidence it stores says
    what porter decided from the raw results, under the kind status and report read."""
    from types import SimpleNamespace

    ws = tmp_path / "ws"
    (ws / "targets" / "ds4" / "cuda").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    target = SimpleNamespace(name="ds4", checkout=checkout, workspace=ws, arch=SimpleNamespace(archs=["sm_90"]),
                             ported_dir=ws / "targets" / "ds4" / "ported", cuda_dir=ws / "targets" / "ds4" / "cuda")
    build = tmp_path / "scratch" / "ds4-full"
    stand_in = _stand_in(tmp_path, checkout, _correct_results() if honest else None)

    def fake_copy(target, dest, n_layer, cuda_rules=()):
        Path(dest).mkdir(parents=True, exist_ok=True)
        (Path(dest) / d4.LOGPROB_EXE).write_bytes(stand_in.read_bytes())
        (Path(dest) / d4.LOGPROB_EXE).chmod(0o755)
        return Path(dest)

    real_run = subprocess.run

    def no_make(cmd, *a, **k):
        if cmd[0] == "make":
            assert d4.LOGPROB_EXE in cmd
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return real_run(cmd, *a, **k)

    monkeypatch.setattr(d4, "scratch_copy", fake_copy)
    monkeypatch.setattr(subprocess, "run", no_make)
    lib = tmp_path / "libds4_cuda.so"
    lib.write_bytes(b"not loaded by the stand-in")
    res = lp.run_logprob_vectors(target, ws, lib, model, tmp_path / "scratch", store=False)
    ev = res.evidence
    assert ev["kind"] == "ds4-logprob-vectors" and ev["gate"] == "e2e" and ev["unit"] == "e2e:prefill"
    assert res.ok is honest and ev["ok"] is honest and not res.skipped
    assert ev["result"]["verdict"] == ("OK" if honest else "ERR") and ev["result"]["exit_code"] == 0
    assert ev["result"]["decided_by"].startswith("porter")
    assert build.is_dir()


def test_the_engine_is_shown_no_answers(tmp_path, checkout, model, monkeypatch):
    """The bind list of the engine's run: the program, the model, the job folder; never official.vec, the
    checkout or its official JSON; and nothing in the job folder holds an official token or logprob."""
    seen = {}

    def fake_run_engine(cmd, *, reads, writes, env=None, timeout, cwd=None):
        seen.update(cmd=cmd, reads=[Path(p) for p in reads], writes=[Path(p) for p in writes], cwd=cwd)
        Path(cmd[3]).write_text(_correct_results())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(cbuild, "run_engine", fake_run_engine)
    exe = tmp_path / "bin" / "ds4_e2e_logprob"
    exe.parent.mkdir()
    exe.write_text("")
    result, argv = _run(tmp_path, checkout, model, exe)
    assert result.ok, result.summary
    vec = (checkout / "tests" / "test-vectors" / "official.vec").resolve()
    for p in seen["reads"] + seen["writes"]:
        p = p.resolve()
        assert p != vec and p not in vec.parents, p  # neither the file nor a folder holding it
        assert checkout.resolve() not in [p, *p.parents], p  # nothing of the checkout
    job_dir = seen["cwd"]
    text = b"".join(f.read_bytes() for f in Path(job_dir).iterdir())
    for answer in (b"48656c6c6f", b"Hello", b"-0.125", b"-2.5", b"210a", b"archive"):
        assert answer not in text, answer
    assert all(str(vec) not in a for a in seen["cmd"])


# ---- the engine's text can neither pass nor crash the gate ---------------------------------------

@needs_sandbox
def test_an_engine_that_prints_bytes_that_are_not_utf8_is_data_not_a_crash(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = cbuild.run_engine(["/bin/sh", "-c", r"printf 'tokens: \377\376 1\n'; printf '\377' >&2"], reads=[],
                             writes=[out], timeout=30)
    assert proc.returncode == 0 and "tokens:" in proc.stdout


def test_ds4_reduced_run_with_exit_0_and_no_outputs_fails(tmp_path, monkeypatch):
    """ds4's reduced e2e: an engine that exits 0 and prints what a good run prints, but writes no state
    records, fails the candidate (a PorterError) rather than crash the gate or pass."""
    def fake_run_engine(cmd, *, reads, writes, env=None, timeout, cwd=None):
        return subprocess.CompletedProcess(cmd, 0, "prefill done\ntokens: 1\n", "ok\n")

    monkeypatch.setattr(cbuild, "run_engine", fake_run_engine)
    red = d4.Ds4Reduced.__new__(d4.Ds4Reduced)
    red.scratch, red.n_layer, red.n_prompt = tmp_path, 2, 8
    red.model, red.positions, red.prompt_file = tmp_path / "m.gguf", [0, 1], tmp_path / "prompt.txt"
    v = d4.Ds4Variant("candidate", "candidate", library=None)
    with pytest.raises(PorterError, match="no states.bin"):
        red.run(tmp_path / "build", v)


def test_engine_outputs_that_are_links_or_too_big_are_refused(tmp_path):
    host = tmp_path / "host-file"
    host.write_bytes(b"\0" * 64)
    link = tmp_path / "states.bin"
    link.symlink_to(host)
    with pytest.raises(PorterError, match="not a file porter reads"):
        cbuild.read_engine_output(link, 1 << 20)
    with pytest.raises(PorterError, match="more than"):
        cbuild.read_engine_output(host, 16)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PorterError, match="not a regular file"):
        cbuild.read_engine_output(tmp_path / "fifo", 16)


# ---- minimoe: the greedy tokens come from the logits rows ----------------------------------------

SHAPE = mm.ModelShape(n_vocab=6, n_embd=2, n_layer=1)


def _minimoe_files(tmp_path, rows) -> tuple[Path, Path]:
    lg, st = tmp_path / "logits.f32", tmp_path / "states.f32"
    np.asarray(rows, dtype=np.float32).tofile(lg)
    np.zeros(2 * 3 * 2, dtype=np.float32).tofile(st)  # 2 stages x 3 prompt tokens x 2
    return lg, st


def _parse(tmp_path, stdout, rows):
    lg, st = _minimoe_files(tmp_path, rows)
    return mm.parse_run(stdout, lg, st, ["embeddings", "layer 0"], 3, SHAPE, len(rows) - 1)


ROWS = [[0, 1, 5, 2, 0, 0], [9, 1, 0, 0, 0, 9]]  # argmax 2, then 0 (a tie: the lower id, as engine.c)


def test_minimoe_tokens_are_the_argmax_of_the_logits_rows(tmp_path):
    assert _parse(tmp_path, "tokens: 2 0\n", ROWS).tokens == [2, 0]
    assert _parse(tmp_path, "digest: 1234\n", ROWS).tokens == [2, 0]  # no tokens line is no failure


def test_minimoe_forged_tokens_line_is_an_inconsistent_engine(tmp_path):
    with pytest.raises(PorterError, match="inconsistent engine"):
        _parse(tmp_path, "tokens: 2 5\n", ROWS)
    with pytest.raises(PorterError, match="inconsistent engine"):
        _parse(tmp_path, "tokens: 2\n", ROWS)


def test_minimoe_a_non_finite_row_has_no_greedy_token(tmp_path):
    rows = [ROWS[0], [np.nan, 1, 0, 0, 0, 0]]
    out = _parse(tmp_path, "", rows)
    assert out.tokens == [2, -1]


def test_minimoe_short_or_linked_outputs_fail(tmp_path):
    lg, st = _minimoe_files(tmp_path, ROWS[:1])
    with pytest.raises(PorterError, match="expected"):
        mm.parse_run("tokens: 2 0\n", lg, st, ["embeddings", "layer 0"], 3, SHAPE, 1)
    (tmp_path / "elsewhere").mkdir()
    lg2 = tmp_path / "elsewhere" / "logits.f32"
    lg2.symlink_to(lg)
    with pytest.raises(PorterError):
        mm.parse_run("", lg2, st, ["embeddings", "layer 0"], 3, SHAPE, 0)


# ---- porter's driver program on ds4 itself (opt-in: minutes of CPU) -----------------------------

@needs_sandbox
@pytest.mark.skipif(not os.environ.get("PORTER_E2E_DS4_SMOKE"),
                    reason="set PORTER_E2E_DS4_SMOKE=1: builds ds4's CPU path with porter's driver program (~1.5 min) "
                           "and runs two greedy steps on a zero-weight 5-layer GGUF")
def test_the_driver_program_answers_a_job_through_ds4s_api(tmp_path):
    """ds4_e2e_logprob.c against the user's ds4: it reads porter's job, runs ds4's public API on the CPU
    path in the sandbox, and writes results porter's parser and consistency checks accept."""
    from porter.target import load_target

    src = Path(os.environ.get("PORTER_DS4_SOURCE", ROOT / "external" / "ds4"))
    if not (src / "ds4.c").is_file():
        pytest.skip(NO_DS4)
    target = load_target(ROOT, "ds4", src)
    model = load_file(ROOT / "targets" / "ds4" / "e2e" / "gguf.py").write_gguf(tmp_path / "zero.gguf", 5,
                                                                              zero_weights=True)
    build = d4.scratch_copy(target, tmp_path / "build", 5)
    proc = subprocess.run(["make", "-C", str(build), "-f", "Makefile", "-f", d4.MAKE_FRAGMENT, "-j2",
                           f"{d4.LOGPROB_EXE}_cpu", "CPU_CORE_OBJS=ds4_cpu.o ds4_e2e_accessor_cpu.o"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    prompts = tmp_path / "vectors"
    prompts.mkdir()
    (prompts / "p.txt").write_text("Say hello.")
    case = lp.OfficialCase("zero_weights", 1024, 2, "p.txt", [lp.OfficialStep(b"?", [])] * 2)
    vocab = lp.token_vocabulary(model)
    result, argv = lp.run_vectors(build / f"{d4.LOGPROB_EXE}_cpu", model, None, [case], prompts, vocab,
                                  tmp_path / "work", timeout=600, extra_args=["--cpu"])
    assert result.exit_code == 0, result.diagnostics
    got, why = lp.parse_results((tmp_path / "work" / "out" / "results.txt").read_bytes(), [("zero_weights", 2)])
    assert why is None and len(got["zero_weights"]) == 2, why
    for step in got["zero_weights"]:
        assert lp.check_step(step, len(vocab)) is None, step
        assert len(step.top) == lp.TOP_K


def test_the_field_units_beside_the_nmse_rule():
    """Mean KL divergence and the same-top-token rate, as llama.cpp's --kl-divergence reports them, over
    every logits row both runs produced; a non-finite candidate row is an infinite divergence."""
    import numpy as np

    from porter.gates.e2e.compare import agreement_line, logit_agreement

    rng = np.random.default_rng(7)
    ref = rng.normal(0, 3, (50, 257)).astype(np.float32)
    same = logit_agreement(ref, ref.copy())
    assert same["positions"] == 50 and same["mean_kld"] < 1e-9 and same["same_top"] == 1.0
    noisy = ref + rng.normal(0, 0.05, ref.shape).astype(np.float32)
    a = logit_agreement(ref, noisy)
    assert 0 < a["mean_kld"] < 0.01 and a["p99_kld"] <= a["max_kld"]
    swapped = ref.copy()
    top = np.argmax(ref, axis=1)
    swapped[np.arange(10), top[:10]] = ref.min() - 1  # the top token of 10 rows pushed to the bottom
    b = logit_agreement(ref, swapped)
    assert b["same_top"] == 0.8 and b["mean_kld"] > a["mean_kld"]
    broken = ref.copy()
    broken[3, 5] = np.nan
    c = logit_agreement(ref, broken)
    assert c["max_kld"] == float("inf") and c["same_top"] == 49 / 50
    assert logit_agreement(ref, ref[:, :10]) == {"positions": 0} and agreement_line({}) == ""
    assert agreement_line(same).startswith("mean KLD") and "100.0% over 50 position(s)" in agreement_line(same)
