"""`porter prompt UNIT`: print the prompt porter would send for a unit (nothing is sent).

The attempt number and the earlier failures come from the workspace's ledger,
as the run loop would take them, unless --attempt / --no-failures say otherwise.
"""

from __future__ import annotations

import json
import sys

from porter.records.history import History
from porter.prompt import render_prompt
from porter.target import load_target


def add_arguments(p) -> None:
    p.add_argument("unit", metavar="UNIT", help="the API function to show the prompt for")
    p.add_argument("--attempt", type=int, metavar="N", help="attempt number to show (default: the next one per the ledger)")
    p.add_argument("--no-failures", action="store_true", help="leave out earlier failures from the ledger")
    p.add_argument("--max-chars", type=int, metavar="N",
                   help="prompt size budget in characters (default: [provider] prompt_chars or 60000)")
    p.add_argument("--system-only", action="store_true", help="print only the system prompt (the rules)")
    p.epilog = ("examples:\n  porter prompt mini_gpu_matmul_q8_0_tensor\n"
                "  porter prompt mini_gpu_swiglu_tensor --json | jq -r .prompt")


def run(args) -> int:
    target = load_target(args.workspace, args.target, getattr(args, "source", None))
    unit = args.unit
    target.api_function(unit)  # one-line error for an unknown unit
    uh = History.read(args.workspace, target.name).unit(unit)  # the same history `porter run` prompts from
    failures = [] if args.no_failures else uh.failures_since_step
    attempt = args.attempt or uh.next_attempt
    r = render_prompt(target, unit, attempt, failures, max_chars=args.max_chars)
    req = r.request
    if getattr(args, "json", False):
        json.dump({"target": req.target, "unit": req.unit, "attempt": req.attempt, "system": req.system,
                   "prompt": req.prompt, "max_tokens": req.max_tokens, "meta": req.meta}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if args.system_only:
        sys.stdout.write(req.system)
        return 0
    sys.stdout.write("=== system ===\n" + req.system + "\n=== prompt ===\n" + req.prompt)
    tail = f"--- {len(req.prompt):,} characters (budget {r.budget_chars:,})"
    if r.cut:
        tail += f"; cut: {len(r.cut)} part(s)"
    if r.missing:
        tail += f"; missing: {len(r.missing)}"
    print(tail, file=sys.stderr)
    return 0
