"""`porter run` shows a progress bar on a terminal and only its plain lines in pipes and logs."""

from __future__ import annotations

import io

from rich.console import Console

from porter.run.progress import Reporter


def drive(console: Console, tmp_path, quiet: bool = False) -> tuple[str, str]:
    rep = Reporter(tmp_path / "run.log", quiet=quiet)
    rep.console = console
    bar = rep.progress(2, "porting")
    for unit in ("mini_gpu_init", "mini_gpu_add_tensor"):
        rep.line(f"[x] {unit}")
        bar.working_on(unit)
        bar.advance()
    rep.close()
    return console.file.getvalue(), (tmp_path / "run.log").read_text()


def test_a_terminal_gets_a_bar(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=True, width=100), tmp_path)
    assert "porting: mini_gpu_add_tensor" in shown and "2/2" in shown
    assert "━" in shown  # the bar itself
    assert "porting" not in log and log.count("[x]") == 2  # the log keeps plain lines only


def test_a_pipe_gets_plain_lines(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=False, width=100), tmp_path)
    assert shown.splitlines() == ["[x] mini_gpu_init", "[x] mini_gpu_add_tensor"]


def test_quiet_shows_nothing(tmp_path):
    shown, log = drive(Console(file=io.StringIO(), force_terminal=True, width=100), tmp_path, quiet=True)
    assert shown == "" and log.count("[x]") == 2


# ---- every long job: porter.term.Steps ----------------------------------------------------------

import shutil  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from porter.term import Steps  # noqa: E402


class Recorder:
    """A progress factory that remembers what each job announced and how far it got."""

    def __init__(self):
        self.jobs: list[list] = []  # [what, total, advanced, stopped]

    def __call__(self, what, total):
        job = [what, total, 0, False]
        self.jobs.append(job)
        class _S(Steps):
            def advance(self, n=1):
                job[2] += n

            def stop(self):
                job[3] = True

        return _S(what, total)


def test_two_jobs_share_the_terminals_one_live_display():
    """A first build's bar under `porter run`'s: rich allows one live display per console."""
    con = Console(file=io.StringIO(), force_terminal=True, width=100)
    run = Steps("porting", 2, console=con)
    build = Steps("first build: 3 objects", 3, console=con)  # a second rich Progress would raise LiveError
    assert build._live is run._live  # one display, two rows
    assert [t.description for t in run._live.tasks] == ["porting", "first build: 3 objects"]
    for _ in range(3):
        build.advance()
    build.stop()
    assert [t.description for t in run._live.tasks] == ["porting"]  # its row goes when it ends
    run.advance()
    run.stop()
    assert "porting" in con.file.getvalue()


def test_a_log_gets_a_line_a_tenth_and_one_at_the_end():
    lines: list[str] = []
    with Steps("building", 100, plain=lines.append) as steps:
        threads = [threading.Thread(target=lambda: [steps.advance() for _ in range(25)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert lines[0] == "building: 0/100" and lines[-1].startswith("building: 100/100 in ")
    assert 3 <= len(lines) <= 12, lines


def test_a_terminal_gets_no_plain_lines_and_nothing_is_inert():
    lines: list[str] = []
    con = Console(file=io.StringIO(), force_terminal=True, width=100)
    with Steps("building", 5, console=con, plain=lines.append) as steps:
        for _ in range(5):
            steps.advance()
    assert lines == [] and "building" in con.file.getvalue()
    with Steps("nothing", 5) as quiet:  # no console, no lines: costs nothing, says nothing
        quiet.advance()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: the build gate needs it")
def test_the_first_build_shows_its_objects_and_a_cached_build_does_not(tmp_path):
    from porter.gates import build
    from porter.gates.driver import Candidate, GateContext
    from porter.target import load_target
    from porter.workspace import init_workspace

    ws = init_workspace(tmp_path / "ws", [str(Path(__file__).parent / "data" / "tinytarget")])
    target = load_target(ws, "tinytarget")
    unit = target.units[0]
    source = target.unit_path(unit).read_text()  # the placeholder: compiles, and the others with it
    first = Recorder()
    build.run(Candidate.of(unit, source), GateContext(target, build_cache=tmp_path / "cache", progress=first))
    others = len(target.units) - 1 + len(target.glue_sources)
    assert [(j[0].split(":")[0], j[1], j[2], j[3]) for j in first.jobs] == [("first build", others, others, True)]
    again = Recorder()
    build.run(Candidate.of(unit, source), GateContext(target, build_cache=tmp_path / "cache", progress=again))
    assert again.jobs == []  # everything cached: no bar for nothing


def test_calibrate_shows_the_library_builds_and_the_specs(tmp_path, monkeypatch):
    import porter.calibration.calibrator as cal
    from porter.calibration.libraries import _parallel
    from porter.gates.result import GateResult
    from porter.target import load_target

    target = load_target(Path(__file__).resolve().parents[1], "minimoe")
    units = ["mini_gpu_add_tensor", "mini_gpu_swiglu_tensor"]
    monkeypatch.setattr(cal, "load_mutants", lambda t: [])
    monkeypatch.setattr(cal, "parity_on_library", lambda target, unit, lib, opts, **kw: GateResult(
        "parity", True, "parity ok", evidence={"unit": unit, "gate": "parity", "ok": True}))

    class Libs:
        describe = "fake"

        def has(self, unit):
            return True

        def prepare(self, mutants, progress=None):
            _parallel(lambda m: m, ["a", "b", "c"], progress, "building 3 libraries")

        def known_good(self):
            return tmp_path / "good.so"

    (tmp_path / "good.so").write_bytes(b"x")
    rec = Recorder()
    cal.calibrate(target, Libs(), cal.CalibrateOptions(tmp_path, units=units, ledger=False, progress=rec),
                  out=lambda *a: None)
    assert [tuple(j) for j in rec.jobs] == [("building 3 libraries", 3, 3, True), ("calibrating 2 specs", 2, 2, True)]
