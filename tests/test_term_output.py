"""status and plan fit the terminal they print to (COLUMNS), with headed columns; --wide never wraps."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from porter.cli import main
from ws_builder import TARGET, make_workspace

LONG = "stub body: it only returns -1 " + "and the compiler said a great deal more about it " * 3


@pytest.fixture(autouse=True)
def _no_key(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTER_LEDGER_KEY", raising=False)
    monkeypatch.delenv("PORTER_LEDGER_KEY_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    ws = make_workspace(tmp_path_factory.mktemp("term") / "ws")
    ws.fail("mini_gpu_routed_gate_up_iq2_xxs_tensor", 1, gate="static", summary=LONG)
    ws.port("mini_gpu_add_tensor", 1, state="built")
    return ws


def out(capsys, monkeypatch, columns: int | None, *argv) -> list[str]:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    main(list(argv))
    return capsys.readouterr().out.splitlines()


def words(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_status_fits_the_width_and_keeps_every_reason(ws, capsys, monkeypatch, columns):
    lines = out(capsys, monkeypatch, columns, "-C", str(ws.root), "status")
    assert max(cell_len(line.rstrip()) for line in lines) <= columns
    header = next(line for line in lines if "state" in line and "tier" in line)
    assert "unit" in header and "att" in header and "reason" in header
    text = words(lines)
    assert LONG.split("it only")[0].strip() in text and "great deal more about it" in text  # wrapped, not cut
    assert "mini_gpu_routed_gate_up_iq2_xxs_tensor" in text  # unit names are never broken


def test_status_wide_is_one_line_per_unit(ws, capsys, monkeypatch):
    lines = out(capsys, monkeypatch, 80, "-C", str(ws.root), "status", "--wide")
    row = [line for line in lines if "mini_gpu_routed_gate_up_iq2_xxs_tensor" in line]
    assert len(row) == 1 and " ".join(LONG.split()) in " ".join(row[0].split())
    assert any("commit" in line and "reason" in line for line in lines)


def test_status_in_a_log_without_columns_keeps_one_unit_per_line(ws, capsys, monkeypatch):
    lines = out(capsys, monkeypatch, None, "-C", str(ws.root), "status")
    assert any("mini_gpu_add_tensor" in line and "build evidence" in line for line in lines)


@pytest.mark.parametrize("columns", [80, 200])
def test_plan_fits_the_width_with_headed_columns(ws, capsys, monkeypatch, columns):
    lines = out(capsys, monkeypatch, columns, "-C", str(ws.root), "plan", "--target", TARGET)
    assert max(cell_len(line.rstrip()) for line in lines) <= columns
    header = next(line for line in lines if "tier" in line and "depth" in line)
    assert "#" in header and "unit" in header and "quant types" in header
    text = words(lines)
    assert "kernel_mul_mv_id_iq2_xxs_f32" in text
    assert "unreachable: no engine function calls it" in text


def test_plan_wide_shows_every_reason_on_its_row(ws, capsys, monkeypatch):
    lines = out(capsys, monkeypatch, 80, "-C", str(ws.root), "plan", "--target", TARGET, "--wide")
    row = next(line for line in lines if "mini_gpu_add_tensor" in line)
    assert "reached from prefill at depth" in row and "kernel_add_f32" in row
