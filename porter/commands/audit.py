"""`porter audit UNIT`: everything a reviewer needs to judge one unit, side by side.

- the Metal side: the unit's source slice from porter.target.scan when it is
  installed, else the unit's host function in the target's metal_host file,
  found by parsing it (tree-sitter Objective-C), never with a regex;
- the CUDA side as it is now (path, sha256, text);
- the state `porter status` derives for it, and the diff of the commit of its
  latest built/verified step;
- every attempt, in ledger order: provider, model, candidate hash, each gate's
  verdict and evidence, failures with the first lines of their diagnostics
  (runs/diagnostics/<sha>.txt, checked against its name), steps, exhaustion.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape

from porter.records import gitops
from porter.errors import PorterError
from porter.digest import sha256_bytes
from porter.target.scan.slice import unit_slice
from porter.records.history import History, UnitHistory
from porter.records.ledger import load_key
from porter.commands.status import _resolve_target_name, derive
from porter.target import Target, load_target

DIAG_LINES = 12
DIAG_CHARS = 4000


# ---- Metal side ------------------------------------------------------------------


def kernel_slice(target: Target, unit: str) -> dict:
    """The Metal kernels the unit's host function dispatches, from porter.target.scan."""
    base = {"source": "porter.target.scan.slice.unit_slice", "text": None, "note": None}
    try:
        text = unit_slice(target, unit)
    except Exception as exc:  # a scanner problem must not hide the rest of the audit
        return dict(base, note=f"kernel slice unavailable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
    return dict(base, text=text)


def host_function(target: Target, unit: str) -> dict:
    """The unit's host wrapper in metal_host, located by parsing (tree-sitter objc)."""
    path = target.metal_host
    base = {"path": str(path), "lines": None, "text": None}
    try:
        src = path.read_bytes()
    except OSError:
        return dict(base, note=f"{path} not found (no Metal host source in this checkout)")
    from porter.target.cparse import parser

    tree = parser("objc").parse(src)
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "function_definition":
            decl = node.child_by_field_name("declarator")
            while decl is not None and decl.type in ("pointer_declarator", "reference_declarator"):
                decl = decl.child_by_field_name("declarator")
            if decl is not None and decl.type == "function_declarator":
                name = decl.child_by_field_name("declarator")
                if name is not None and name.text.decode("utf-8", "replace") == unit:
                    return dict(
                        base,
                        lines=[node.start_point[0] + 1, node.end_point[0] + 1],
                        text=node.text.decode("utf-8", "replace"),
                        note=None,
                    )
            continue
        stack.extend(reversed(node.named_children))
    return dict(base, note=f"{path.name} defines no function {unit}")


def metal_side(target: Target, unit: str) -> dict:
    """The host wrapper (parsed from metal_host) and the kernels it dispatches (porter.target.scan)."""
    return {"host": host_function(target, unit), "kernels": kernel_slice(target, unit)}


# ---- git -------------------------------------------------------------------------


def commit_diff(workspace: Path, sha: str, rel: str) -> dict:
    root = gitops.toplevel(workspace)
    if root is None:
        return {"sha": sha, "message": None, "files": [], "diff": None, "note": "not a git repository"}

    def show(*args: str) -> str:
        return gitops.read(root, *args).decode(errors="replace").removesuffix("\n")

    try:
        message = show("log", "-1", "--format=%B", sha)
        files = [f for f in show("show", "--name-only", "--format=", sha).splitlines() if f]
        diff = show("show", "--format=", "--patch", sha, "--", rel)
        return {"sha": sha, "message": message, "files": files, "diff": diff, "note": None}
    except PorterError as exc:
        return {"sha": sha, "message": None, "files": [], "diff": None, "note": str(exc)[:200]}


# ---- ledger ------------------------------------------------------------------------


def _diagnostics(workspace: Path, sha: str | None) -> dict | None:
    if not sha:
        return None
    path = Path(workspace) / "runs" / "diagnostics" / f"{sha}.txt"
    out = {"sha256": sha, "file": f"runs/diagnostics/{sha}.txt", "kept": False, "intact": None, "excerpt": None}
    if not isinstance(sha, str) or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
        out["file"] = None
        return out
    try:
        data = path.read_bytes()
    except OSError:
        return out
    out["kept"] = True
    out["intact"] = sha256_bytes(data) == sha
    out["excerpt"] = data.decode("utf-8", "replace")[:DIAG_CHARS]
    return out


def attempts_of(workspace: Path, uh: UnitHistory) -> tuple[list[dict], list[dict]]:
    """Group the unit's records into attempts: each "attempt" record opens one; later
    gate/failure/step records with the same attempt number join it. Returns (attempts, other records)."""
    groups: list[dict] = []
    other: list[dict] = []
    current: dict | None = None
    for r in uh.records:
        lineno, rec, kind = r.line, r.raw, r.kind
        if kind == "attempt":
            current = {
                "attempt": rec.get("attempt"),
                "line": lineno,
                "time": rec.get("time"),
                "run": rec.get("run"),
                "provider": rec.get("provider"),
                "model": rec.get("model"),
                "prompt_sha256": rec.get("prompt_sha256"),
                "response_sha256": rec.get("response_sha256"),
                "candidate_sha256": rec.get("candidate_sha256"),
                "usage": rec.get("usage"),
                "gates": [],
                "failures": [],
                "steps": [],
            }
            groups.append(current)
            continue
        if kind in ("gate", "failure", "step") and current is not None and rec.get("attempt") == current["attempt"]:
            if kind == "gate":
                current["gates"].append(
                    {k: rec.get(k) for k in ("gate", "ok", "skipped", "summary", "evidence")} | {"line": lineno}
                )
            elif kind == "failure":
                current["failures"].append(
                    {"gate": rec.get("gate"), "summary": rec.get("summary"), "line": lineno,
                     "diagnostics": _diagnostics(workspace, rec.get("diagnostics"))}
                )
            else:
                current["steps"].append(
                    {k: rec.get(k) for k in ("state", "candidate_sha256", "evidence", "hash")} | {"line": lineno}
                )
            continue
        other.append({"line": lineno, **{k: v for k, v in rec.items() if k not in ("prev", "hash", "hmac")}})
    return groups, other


# ---- the audit -----------------------------------------------------------------------


def audit(workspace: Path, target_name: str | None, unit: str, source=None, key=None, use_key=True,
          report=None) -> dict:
    """`report`: a StatusReport already derived for this workspace (porter report audits every unit
    and derives once)."""
    workspace = Path(workspace).resolve()
    target = load_target(workspace, _resolve_target_name(workspace, target_name), source)
    target.api_function(unit)  # unknown unit -> PorterError naming `porter units`
    if use_key and key is None:
        key = load_key(workspace)
    if report is None:
        report = derive(workspace, target=target, key=key)
    st = report.unit(unit)
    attempts, other = attempts_of(workspace, History.read(workspace, target.name, key).unit(unit))

    path = target.unit_path(unit)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = None
    rel = path.relative_to(workspace).as_posix() if path.is_relative_to(workspace) else str(path)
    fn = target.api_function(unit)
    return {
        "target": target.name,
        "unit": unit,
        "signature": fn.c_signature(),
        "state": st.state,
        "reason": st.reason,
        "attempts_count": st.attempts,
        "metal": metal_side(target, unit),
        "cuda": {"path": rel, "sha256": st.candidate_sha256, "text": text},
        "commit": commit_diff(workspace, st.commit, rel) if st.commit else None,
        "evidence": st.evidence,
        "attempts": attempts,
        "other_records": other,
        "ledger": {"ok": report.ledger["ok"], "problems": report.ledger["problems"], "key": report.ledger["key"]},
    }


def render(data: dict, console=None) -> None:
    from rich.syntax import Syntax

    from porter.term import console as make_console

    # the terminal's width, COLUMNS in a pipe, 200 in a log (porter.term)
    console = console or make_console()

    def say(text: str, style: str | None = None) -> None:  # ledger text is data, never rich markup
        console.print(text, style=style, markup=False, highlight=False)

    def rule(title: str) -> None:
        console.rule(escape(title))

    rule(f"audit {data['target']}/{data['unit']}")
    say(f"signature: {data['signature']}")
    say(f"state: {data['state']} — {data['reason']}", "bold red" if data["state"] == "tampered" else None)
    if not data["ledger"]["ok"]:
        say(f"ledger TAMPERED: {data['ledger']['problems'][0]}", "bold red")

    host = data["metal"]["host"]
    rule(f"Metal host function ({host['path']}" + (f":{host['lines'][0]}-{host['lines'][1]})" if host["lines"] else ")"))
    if host["text"]:
        console.print(Syntax(host["text"], "objective-c", word_wrap=True))
    if host.get("note"):
        say(f"note: {host['note']}")
    kernels = data["metal"]["kernels"]
    rule("Metal kernels it dispatches (porter.target.scan)")
    if kernels["text"]:
        console.print(Syntax(kernels["text"], "c++", word_wrap=True))
    if kernels.get("note"):
        say(f"note: {kernels['note']}")

    cuda = data["cuda"]
    rule(f"CUDA now ({cuda['path']}, sha256 {(cuda['sha256'] or '-')[:12]})")
    if cuda["text"] is not None:
        console.print(Syntax(cuda["text"], "cuda", word_wrap=True))
    else:
        say("(no unit file)")

    commit = data["commit"]
    if commit:
        rule(f"commit {commit['sha'][:10]} (latest {data['state'] if data['state'] in ('built', 'verified') else ''} step)")
        if commit["message"]:
            say(commit["message"].rstrip())
        if commit["files"]:
            say("files: " + ", ".join(commit["files"]))
        if commit["diff"]:
            console.print(Syntax(commit["diff"], "diff", word_wrap=True))
        if commit["note"]:
            say(f"note: {commit['note']}")
    else:
        rule("commit")
        say("no built/verified step commit for this unit")

    rule(f"attempts ({len(data['attempts'])})")
    for a in data["attempts"]:
        say(
            f"attempt {a['attempt']} (ledger line {a['line']}, {a['time']}, run {a['run']}, "
            f"{a['provider']}/{a['model']}, candidate {(a['candidate_sha256'] or '-')[:12]})",
            "bold",
        )
        for g in a["gates"]:
            verdict = "skipped" if g.get("skipped") else ("ok" if g.get("ok") else "FAILED")
            say(f"  {g['gate']}: {verdict} — {g['summary']} (evidence {(g['evidence'] or '-')[:12]})")
        for f in a["failures"]:
            say(f"  failure at {f['gate']}: {f['summary']}")
            d = f["diagnostics"]
            if d and d["kept"]:
                lines = (d["excerpt"] or "").splitlines()
                say(f"    diagnostics {d['file']}" + ("" if d["intact"] else " (EDITED: does not match its hash)") + ":",
                    None if d["intact"] else "bold red")
                for line in lines[:DIAG_LINES]:
                    say(f"    | {line}")
                if len(lines) > DIAG_LINES:
                    say(f"    | ... ({len(lines) - DIAG_LINES} more lines)")
            elif d:
                say(f"    diagnostics {str(d['sha256'])[:12]}: not kept here (runs/ stays on the machine that ran it)")
        for s in a["steps"]:
            say(f"  step: {s['state']} (candidate {(s['candidate_sha256'] or '-')[:12]}, "
                f"{len(s['evidence'] or [])} evidence)")
    for r in data["other_records"]:
        say(f"{r.get('kind')} (ledger line {r['line']}): "
            + ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("kind", "line", "target", "unit")))


def add_arguments(parser) -> None:
    parser.add_argument("unit", help="API function name, e.g. mini_gpu_swiglu_tensor")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    workspace = Path(getattr(args, "workspace", None) or Path.cwd())
    unit = getattr(args, "unit", None)
    if not unit:
        raise PorterError("audit needs a unit name (see `porter units`)")
    data = audit(workspace, getattr(args, "target", None), unit, getattr(args, "source", None))
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        render(data)
    return 3 if data["state"] == "tampered" or not data["ledger"]["ok"] else 0
