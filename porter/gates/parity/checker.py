"""The parity checker: owns a plan's memory and records what the candidate left in it.

    python checker.py MODE          (started beside the runner, see runner.py / pool.py)

It never loads candidate code: its sandbox shows it no candidate library and it
imports numpy, ctypes, cupy and its siblings only (device.py, compare.py,
shared_mem.py, link.py; loader.py only for the CUDA driver).  The runner
(child.py), which loads the candidate, can rewrite anything in its own address
space -- the outputs it would save, the guard and const checks, the timer --
so none of those are done there:

  - every buffer the unit is called on lives in an arena this process
    allocated (shared_mem.py) and exported to the runner as a descriptor;
  - this process writes the inputs and the sentinel-filled outputs before each
    call, with fresh random guard bytes around every buffer;
  - when the runner says a call returned (its stream synchronized), this
    process reads the outputs itself, then again once the runner says the
    device is idle (a difference: work still running on another stream), and
    checks guards and const inputs -- and, where an error case's descriptor
    claimed fewer bytes than its buffer or a NULL data pointer, that nothing
    past the claim was written;
  - timed calls: it writes each repetition's input set (the rotation is the
    plan's, read before the runner started) and flushes L2, decides in secret
    which repetitions' outputs it reads back, and times every repetition from
    outside the runner (the wall time from its "go" to the runner's report),
    a bound the runner's own event times must agree with (gate.py judges);
  - anything out of order is a violation that ends the run: the runner is the
    candidate's process, so its messages are claims, never facts.

Protocol: stdout carries {"ready"}, {"loaded"} and {"finished"} lines for the
parent; stdin one job line {"staged": PLAN_DIR, "out": OUT_DIR} -- read, with
the plan and every input array, before the runner is given the job, so the
runner (which can write the plan folder) cannot change what is checked.  The
runner's requests arrive on the socket named by $PORTER_CHECKER_FD (link.py).
Results: OUT_DIR/checker.json (facts per case and call) and OUT_DIR/outputs.npz.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (siblings, loaded by path on purpose)
import device as devmod  # noqa: E402
import link as linkmod  # noqa: E402
import shared_mem  # noqa: E402


class Violation(Exception):
    """The runner asked for something out of order or outside the plan."""


def _int(msg: dict, key: str) -> int:
    v = msg.get(key)
    if type(v) is not int:
        raise Violation(f"{msg.get('op')}: {key} is not an integer")
    return v


class Checker:
    def __init__(self, plan: dict, arrays: dict, dev, mode: str):
        self.plan, self.arrays, self.dev, self.mode = plan, arrays, dev, mode
        self.cases = {c["id"]: c for c in plan["cases"]}
        self.guard = int(plan.get("guard_bytes", devmod.GUARD_BYTES))
        self.reps = int(plan.get("timing_reps", 0))
        self.records: dict[str, dict] = {}
        self.outputs: dict[str, np.ndarray] = {}
        self.violation: str | None = None
        self.done = False
        self.arena = None
        self.case = None
        self.state: tuple = ("idle",)
        self.rand = random.SystemRandom()

    # -- buffers -----------------------------------------------------------
    def _open(self, cid) -> tuple[dict, list[int]]:
        if cid not in self.cases:
            raise Violation(f"case {cid!r} is not in the plan")
        if cid in self.records:
            raise Violation(f"case {cid!r} opened twice")
        if self.case is not None:
            self._close_case()
        case = self.cases[cid]
        sizes = {n: int(b["nbytes"]) for n, b in case["buffers"].items()}
        self.offsets, size = shared_mem.layout(sizes, self.guard)
        import loader  # the CUDA driver only: this process loads no candidate library

        self.arena = shared_mem.make_arena(self.mode, size, self.dev, loader)
        self.guards = {}
        for n, off in self.offsets.items():
            before, after = os.urandom(self.guard), os.urandom(self.guard)
            self.arena.write(off - self.guard, before)
            self.arena.write(off + sizes[n], after)
            self.guards[n] = (before, after)
        self.sizes, self.case = sizes, case
        self.records[cid] = {"id": cid, "passes": []}
        self.state = ("open",)
        return {"size": self.arena.size, "offsets": self.offsets, "kind": self.arena.kind}, [self.arena.fd]

    def _close_case(self) -> None:
        if self.arena is not None:
            self.dev.synchronize()
            self.arena.close()
        self.arena, self.case = None, None

    def _read(self, name: str) -> bytes:
        return self.arena.read(self.offsets[name], self.sizes[name])

    def _write_set(self, data_of: dict) -> dict[str, bytes]:
        """Inputs of one call (a pass or a timing set) and sentinel-filled outputs; returns what was written."""
        written = {}
        for name, b in self.case["buffers"].items():
            if b["role"] == "out":
                data = compare.sentinel_bytes(int(b["nbytes"]))
            else:
                data = np.ascontiguousarray(self.arrays[data_of["data"][name]]).view(np.uint8).tobytes()
            if len(data) != self.sizes[name]:
                raise Violation(f"input {name} has {len(data)} bytes, the buffer {self.sizes[name]}")
            self.arena.write(self.offsets[name], data)
            written[name] = data
        self.dev.synchronize()
        return written

    def _watched(self) -> list[str]:
        case = self.case
        return sorted(set(case["outputs"].values()) | {n for n, b in case["buffers"].items() if b["role"] != "in"})

    def _guard_damage(self) -> list[dict]:
        out = []
        for n, (before, after) in self.guards.items():
            off, size = self.offsets[n], self.sizes[n]
            got_b = self.arena.read(off - self.guard, self.guard)
            got_a = self.arena.read(off + size, self.guard)
            if got_b != before:
                d = np.flatnonzero(np.frombuffer(before, np.uint8) != np.frombuffer(got_b, np.uint8))
                out.append({"tensor": n, "side": "before", "n_bytes": int(d.size), "first": int(self.guard - 1 - d[-1])})
            if got_a != after:
                d = np.flatnonzero(np.frombuffer(after, np.uint8) != np.frombuffer(got_a, np.uint8))
                out.append({"tensor": n, "side": "after", "n_bytes": int(d.size), "first": int(d[0])})
        return out

    def _claim_damage(self) -> list[dict]:
        """Writes a unit could only make by ignoring what its descriptor said (an error case's lie, from
        the plan this process read before the runner started): past the bytes a descriptor claims, or
        anywhere in a buffer whose descriptor's data pointer was NULL.  Const inputs are whole-checked."""
        out = []
        for n, b in self.case["buffers"].items():
            if b["role"] == "in" or not (b.get("data_null") or b.get("claim_bytes") is not None):
                continue
            start = 0 if b.get("data_null") else int(b["claim_bytes"])
            n_diff, first = compare.byte_diff(self.initial[n][start:], self._read(n)[start:])
            if n_diff:
                out.append({"tensor": n, "side": "past-claim", "n_bytes": n_diff, "first": first, "claim": start,
                            "data_null": bool(b.get("data_null"))})
        return out

    # -- requests ----------------------------------------------------------
    def _expect(self, msg: dict, *states: str) -> None:
        if self.case is None or msg.get("case") != self.case["id"]:
            raise Violation(f"{msg.get('op')} for case {msg.get('case')!r}, the open case is "
                            f"{self.case['id'] if self.case else None!r}")
        if self.state[0] not in states:
            raise Violation(f"{msg.get('op')} while {self.state[0]}")

    def handle(self, msg: dict) -> tuple[dict, list[int]]:
        op = msg.get("op")
        if op == "hello":
            return {"facts": self.facts}, []
        if op == "case":
            return self._open(msg.get("case"))
        if op == "prepare":
            self._expect(msg, "open", "passed")
            p = _int(msg, "pass")
            passes = self.case["passes"]
            if p != len(self.records[self.case["id"]]["passes"]) or p >= len(passes):
                raise Violation(f"prepare of call {p}, expected call {len(self.records[self.case['id']]['passes'])}")
            self.initial = self._write_set(passes[p])
            self.state = ("prepared", p)
            return {}, []
        if op == "called":
            self._expect(msg, "prepared")
            if _int(msg, "pass") != self.state[1]:
                raise Violation("called for another call than the one prepared")
            self.immediate = {n: self._read(n) for n in self._watched()}
            self.state = ("called", self.state[1])
            return {}, []
        if op == "settled":
            self._expect(msg, "called")
            p = self.state[1]
            if _int(msg, "pass") != p:
                raise Violation("settled for another call than the one called")
            self._settle(p)
            self.state = ("passed", p)
            return {}, []
        if op == "put":
            return self._put(msg)
        if op == "timed":
            return self._timed(msg)
        if op == "timed_end":
            return self._timed_end(msg)
        if op == "timed_settled":
            return self._timed_settled(msg)
        if op == "done":
            self._close_case()
            self.done = True
            return {}, []
        raise Violation(f"unknown request {op!r}")

    def _settle(self, p: int) -> None:
        cid, case = self.case["id"], self.case
        settled = {n: self._read(n) for n in self.immediate}
        rec = {"pass": p, "settle_changed": [n for n in self.immediate if settled[n] != self.immediate[n]],
               "guard_damage": self._guard_damage() + self._claim_damage(), "const_changed": []}
        for name, b in case["buffers"].items():
            if b["role"] == "in":
                n_diff, first = compare.byte_diff(self.initial[name], self._read(name))
                if n_diff:
                    rec["const_changed"].append({"tensor": name, "n_bytes": n_diff, "first": first})
        for param, buf in case["outputs"].items():
            self.outputs[f"{cid}.{p}.{param}"] = np.frombuffer(self.immediate[buf], dtype=np.uint8).copy()
        self.records[cid]["passes"].append(rec)

    # -- timed calls -------------------------------------------------------
    def _timing(self) -> dict:
        case, rec = self.case, self.records[self.case["id"]]
        if "timing" not in rec:
            if not (case.get("timed") and self.reps > 0 and case.get("expect") == "ok"):
                raise Violation(f"case {case['id']} is not timed")
            if len(rec["passes"]) != len(case["passes"]):
                raise Violation("timing before every call of the case was checked")
            sets = case.get("timing_sets") or [case["passes"][-1]]
            order = case.get("timing_order") or [len(sets) - 1] * self.reps
            reps = len(order)
            rec["timing"] = {"reps": reps, "wall_ms": [], "reported_ms": [], "checked_reps": sorted(
                {reps - 1, self.rand.randrange(reps)}), "settle_changed_reps": [], "l2_flushed_by_checker":
                self.dev.kind == "cuda"}
            self._sets, self._order, self._put_set = sets, order, None
        return rec["timing"]

    def _put(self, msg: dict) -> tuple[dict, list[int]]:
        self._expect(msg, "passed", "timed_settled", "put")
        t = self._timing()
        k = _int(msg, "set")
        if not 0 <= k < len(self._sets):
            raise Violation(f"no input set {k}")
        self._write_set(self._sets[k])
        self.dev.flush_l2(0)  # the writes just made put the inputs in L2: the timed call must fetch them
        self.dev.synchronize()
        self._put_set = k
        self.state = ("put", len(t["wall_ms"]))
        return {}, []

    def _timed(self, msg: dict) -> tuple[dict, list[int]]:
        self._expect(msg, "put")
        t = self._timing()
        r = _int(msg, "rep")
        if r != len(t["wall_ms"]) or r >= t["reps"]:
            raise Violation(f"timed repetition {r}, expected {len(t['wall_ms'])}")
        if self._put_set != self._order[r]:
            raise Violation(f"repetition {r} must be timed on input set {self._order[r]}, "
                            f"the buffers hold set {self._put_set}")
        self.state = ("timing", r)
        self._t0 = time.perf_counter()  # taken before the reply: the runner cannot start earlier
        return {}, []

    def _timed_end(self, msg: dict) -> tuple[dict, list[int]]:
        self._expect(msg, "timing")
        t1 = time.perf_counter()
        t = self._timing()
        r = self.state[1]
        if _int(msg, "rep") != r:
            raise Violation("timed_end for another repetition")
        ms = msg.get("ms")
        t["wall_ms"].append((t1 - self._t0) * 1e3)
        t["reported_ms"].append(ms if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None)
        if r in t["checked_reps"]:
            self._early = {p: self._read(b) for p, b in self.case["outputs"].items()}
            for param, raw in self._early.items():
                self.outputs[f"{self.case['id']}.t{r}.{param}"] = np.frombuffer(raw, dtype=np.uint8).copy()
        self._put_set = None  # the next repetition gets its inputs written again
        self.state = ("timed", r)
        return {}, []

    def _timed_settled(self, msg: dict) -> tuple[dict, list[int]]:
        self._expect(msg, "timed")
        t = self._timing()
        r = self.state[1]
        if _int(msg, "rep") != r:
            raise Violation("timed_settled for another repetition")
        if r in t["checked_reps"]:
            if any(self._read(b) != self._early[p] for p, b in self.case["outputs"].items()):
                t["settle_changed_reps"].append(r)
        self.state = ("timed_settled", r)
        return {}, []

    # -- the run -----------------------------------------------------------
    def serve(self, link: linkmod.Link) -> None:
        while not self.done:
            try:
                msg, fds = link.recv()
            except linkmod.LinkClosed:
                return  # the runner is gone: what it did not get through is missing, not passed
            for fd in fds:
                os.close(fd)  # the runner has nothing to hand over
            try:
                reply, out_fds = self.handle(msg)
            except (Violation, KeyError, ValueError, TypeError) as exc:
                self.violation = f"{type(exc).__name__}: {exc}"[:300] if not isinstance(exc, Violation) else str(exc)
                try:
                    link.send({"ok": False, "error": self.violation})
                except linkmod.LinkClosed:
                    pass
                return
            try:
                link.send({"ok": True, **reply}, out_fds)
            except linkmod.LinkClosed:
                return

    def save(self, out: Path) -> None:
        expected = {cid: len(c["passes"]) for cid, c in self.cases.items()}
        complete = self.done and self.violation is None and all(
            cid in self.records and len(self.records[cid]["passes"]) == n for cid, n in expected.items())
        facts = {"cases": list(self.records.values()), "complete": complete, "violation": self.violation,
                 "device": self.facts}
        np.savez(out / "outputs.npz", **self.outputs)
        tmp = out / "checker.json.tmp"
        tmp.write_text(json.dumps(facts))
        os.replace(tmp, out / "checker.json")


def _say(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "cuda"
    link = linkmod.Link.from_env()
    if link is None:
        print("checker: no runner socket ($PORTER_CHECKER_FD)", file=sys.stderr)
        return 2
    try:
        dev = devmod.make_device(mode)
        facts = dev.facts()
    except Exception as exc:  # noqa: BLE001 - no device: the parent says so, no candidate is blamed
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
        return 3
    _say({"ready": True})
    line = sys.stdin.readline()
    if not line:
        return 0  # the pool closed without a job
    job = json.loads(line)
    plan_dir, out = Path(job["staged"]), Path(job["out"])
    plan = json.loads((plan_dir / "plan.json").read_text())
    arrays = {}
    if (plan_dir / "inputs.npz").exists():  # a plan with no case has none; a case naming a missing array is a violation
        with np.load(plan_dir / "inputs.npz") as z:
            arrays = {k: z[k] for k in z.files}  # all of it now: the plan folder is the runner's to write later
    checker = Checker(plan, arrays, dev, mode)
    checker.facts = facts
    _say({"loaded": True})
    try:
        checker.serve(link)
    finally:
        checker.save(out)
        _say({"finished": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
