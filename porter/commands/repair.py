"""`porter repair --reason TEXT`: accept a loss explicitly, recorded and signed, so runs can go on.

`porter run` refuses a tampered or rolled-back workspace. repair handles the
cases that can be accepted without rewriting signed history:

- a tampered tail: ledger lines from the first bad one on (unsigned, wrongly
  signed, off the chain) that are not committed at HEAD are moved, bytes
  unchanged, to ledger/quarantine-<time>.jsonl, and a signed "repair" record
  names that file, its size and sha256;
- a rollback: a signed "repair" record names the head the witness had saw and the
  steps that disappeared, and the witness is reset to the ledger as it is.

- a torn last line (a crash mid-append, or a forged line without its newline):
  moved aside, bytes unchanged, as the next `porter run` does.

The repair is committed (`Porter-Repair:` trailer). Anything else (an edited
committed line, a swapped evidence file, a rewritten trailer, a swapped key) is
not repaired: restore it from git, or from a clone, and status says which.
"""

from __future__ import annotations

from pathlib import Path

from porter.records import gitops
from porter.errors import PorterError
from porter.records.ledger import Ledger


def add_arguments(parser) -> None:
    parser.add_argument("--reason", required=True, metavar="TEXT", help="why the loss is accepted (recorded, signed)")


def _first(report) -> str:
    items = report.ledger["problems"] + report.problems + [f"{u.unit}: {u.reason}" for u in report.units
                                                           if u.state == "tampered"]
    return items[0] if items else "?"


def run(args) -> int:
    from porter.commands.status import derive

    ws = Path(args.workspace)
    ledger = Ledger.open(ws)  # signed workspace: this user's key, or a one-line error (wrong key)
    report = derive(ws, args.target, getattr(args, "source", None), key=ledger.key, use_static=False, rank=False)
    done = []
    if report.torn and ledger.repair_torn_tail():
        done.append(f"moved the torn ledger tail aside ({report.ledger['torn'][0]})")
        report = derive(ws, args.target, getattr(args, "source", None), key=ledger.key, use_static=False, rank=False)
    if not report.tampered and not done:
        print("porter: nothing to repair (status finds no tampering and no rollback)")
        return 0
    integ = ledger.verify()
    if integ.bad_lines:
        first = min(integ.bad_lines)
        committed = report.ledger.get("committed_records", 0)
        if first <= committed:
            raise PorterError(f"cannot repair: ledger line {first} ({integ.bad_lines[first]}) is committed at HEAD; "
                              "restore it with `git checkout HEAD -- ledger/ledger.jsonl`", exit_code=3)
        rec = ledger.quarantine_from(first, f"tampered tail moved aside: {args.reason}")
        done.append(f"moved ledger lines {first}- to {rec['quarantined_file']} ({integ.bad_lines[first]})")
        report = derive(ws, args.target, getattr(args, "source", None), key=ledger.key, use_static=False, rank=False)
    rolled = report.ledger.get("rolled_back") or []
    if rolled:
        ledger.append("repair", reason=f"rollback accepted: {args.reason}", accepted="rollback", lost=rolled)
        ledger.reset_witness()
        done.append(f"accepted the rollback ({rolled[0]}{' +%d more' % (len(rolled) - 1) if len(rolled) > 1 else ''})")
        report = derive(ws, args.target, getattr(args, "source", None), key=ledger.key, use_static=False, rank=False)
    if done:
        gitops.commit_paths(ws, ["ledger"], f"porter: repair ({args.reason})\n\nPorter-Repair: {args.reason}\n")
    for line in done:
        print(f"porter: repair: {line}")
    if report.tampered:
        raise PorterError(f"not repairable here: {_first(report)}; restore it from git (or a clone)", exit_code=3)
    print("porter: repaired; `porter status` is clean of tampering")
    return 0
