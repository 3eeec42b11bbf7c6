"""A pre-started parity worker: warms up, then runs exactly ONE plan and exits.

    python worker.py MODE        (started by pool.Standby inside the sandbox; MODE: cuda | host | call)

Starting the child costs most of a parity verdict (interpreter, numpy, cupy,
the CUDA context); this process pays that before any candidate exists, while
the previous one is still being built.  Once it has loaded a candidate's
library it serves no other: a constructor, a patched interpreter, a leaked
allocation or a poisoned CUDA context dies with it.

Protocol: one line {"ready": ...} on stdout when warm; then one job line on
stdin {"plan_dir": P, "staged": S, "library": L}.  The parent has moved the plan
folder P to S, a folder this sandbox can write; P is made a link to S here, so
every path the plan names is valid as written.  Before the candidate loads,
stdin is closed.  When the plan is done (results.json written) one line
{"done": rc} on the reply channel lets the parent kill the sandbox instead of
waiting out the CUDA teardown.  The candidate can write to that channel too:
the parent reads it only as "look at the files now" (an early line leaves
results incomplete, a refusal), and the verdict comes from the output bytes
the parent compares itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import child as childmod  # noqa: E402  (sibling module, loaded by path on purpose)
import device as devmod  # noqa: E402


def _redirect(plan_dir: Path) -> None:
    for fd, name in ((1, "child.stdout"), (2, "child.stderr")):
        f = os.open(plan_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "cuda"
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing but the hello on the reply channel
    try:
        dev = devmod.make_device(mode) if mode != "call" else None
        if dev is not None:
            dev.facts()
            getattr(dev, "prewarm", lambda: None)()
    except Exception as exc:  # noqa: BLE001
        reply.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]}) + "\n")
        return 3
    reply.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    line = sys.stdin.readline()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)
    if not line:
        return 0  # the pool closed without a job for this worker
    job = json.loads(line)
    plan_dir, staged = Path(job["plan_dir"]), Path(job["staged"])
    if plan_dir != staged:
        plan_dir.parent.mkdir(parents=True, exist_ok=True)  # in the sandbox's own root, not the user's disk
        plan_dir.symlink_to(staged)
    os.chdir(plan_dir)  # as the fresh child, which starts in its plan folder
    _redirect(plan_dir)
    rc = childmod.run_plan(plan_dir, dev=dev, library=job["library"])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        reply.write(json.dumps({"done": rc}) + "\n")
        reply.flush()
    except (OSError, ValueError):
        pass  # the candidate closed it: the parent waits for the exit status instead
    os._exit(rc)  # no interpreter teardown: the parent has what it needs


if __name__ == "__main__":
    sys.exit(main(sys.argv))
