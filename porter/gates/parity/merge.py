"""An op plan's facts for the judgement: the checker's, with the runner's claims beside them.

The checker (checker.py) never loaded candidate code: what it recorded -- which
calls happened, outputs, guards, const inputs, outputs changing after the
stream said done, the wall time of each timed call -- is taken as fact.  The
runner (child.py) loaded the candidate, which can rewrite anything in that
process: its return codes, CUDA errors, descriptor changes, stream probe, host
map check and event times are claims.  A claim can only ever add a refusal
(a process that reports its own failure is believed), or, for event times, is
used only where the checker's wall times bound it (gate._timed_failures).  A
claim that is missing or malformed where the checker saw the call is itself a
refusal ("runner" below): the candidate's process did not account for it.
"""

from __future__ import annotations

import math

# the most the exchange around a timed call may add to its event time (checker's "go" to the runner's
# report: two socket hops, the event record and synchronize, Python on both sides), per clock
GAP_LIMIT_MS = {"cuda": 0.5, "host": 5.0}
# and a share of the call itself: a long call sleeps in the driver's sync, and waking it on a host busy with
# builds cost 0.507 ms at 106 ms a call (two-H200 lease, 2026-11-29); work hidden in 1% of a call cannot
# move a perf verdict whose limits start at 1.25x
GAP_SHARE = 0.01


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _list_of_dicts(v) -> list:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _runner_pass(crec: dict | None, p: int) -> dict | None:
    for x in (crec or {}).get("passes") or []:
        if isinstance(x, dict) and x.get("pass") == p:
            return x
    return None


def merged(results: dict | None, checker: dict | None, mode: str) -> dict:
    """evaluate()'s `results`: one record per case the checker opened, one per call it saw through."""
    runner_cases = {c.get("id"): c for c in (results or {}).get("cases") or [] if isinstance(c, dict)}
    out = {"cases": [], "device": (checker or {}).get("device")}
    for crec in (checker or {}).get("cases") or []:
        rcase = runner_cases.get(crec["id"])
        case = {"id": crec["id"], "passes": []}
        for cp in crec.get("passes", []):
            p = cp["pass"]
            rp = _runner_pass(rcase, p)
            rec = {"pass": p, "guard_damage": cp["guard_damage"], "const_changed": list(cp["const_changed"]),
                   "settle_changed": cp["settle_changed"]}
            if rp is None or ("rc" in rp and rp["rc"] is not None and type(rp["rc"]) is not int):
                rec["runner"] = "the candidate's process gave no well-formed report of this call"
                rec["rc"] = None
            else:
                rec["rc"] = rp.get("rc")
                err = rp.get("launch_error")
                rec["launch_error"] = err if isinstance(err, str) else None
                rec["struct_changed"] = [s for s in _list_of_dicts(rp.get("struct_changed"))
                                         if isinstance(s.get("before"), list) and isinstance(s.get("after"), list)]
                rec["const_changed"] += [c for c in _list_of_dicts(rp.get("const_changed"))
                                         if isinstance(c.get("tensor"), str)]
                probe = rp.get("probe")
                if isinstance(probe, dict) and probe.get("status") in ("changed", "clean", "inconclusive"):
                    rec["probe"] = {"status": probe["status"],
                                    "changed": [str(x) for x in probe.get("changed") or [] if isinstance(x, str)]}
                rec["call_ms"] = rp.get("call_ms") if _num(rp.get("call_ms")) else None
            case["passes"].append(rec)
        if "timing" in crec:
            case["timing"] = _timing(crec["timing"], (rcase or {}).get("timing"), mode)
        out["cases"].append(case)
    return out


def _timing(chk: dict, claimed, mode: str) -> dict:
    """The raw timing evaluate's timing_stats reads: event times as the runner reported them to the checker
    rep by rep (bound to that rep's wall time), the checker's reads, the runner's tails and L2 claims."""
    claimed = claimed if isinstance(claimed, dict) else {}
    tails = claimed.get("tail_ms")
    return {"reps": chk["reps"], "times_ms": list(chk["reported_ms"]), "wall_ms": list(chk["wall_ms"]),
            "checked_reps": chk["checked_reps"], "settle_changed_reps": chk["settle_changed_reps"],
            "tail_ms": [x for x in tails if _num(x)] if isinstance(tails, list) else [],
            "l2_flushed": bool(chk.get("l2_flushed_by_checker")),
            "l2_persisting_reset": claimed.get("l2_persisting_reset") is True,
            "clock": "cuda-events" if mode == "cuda" else "host", "gap_limit_ms": GAP_LIMIT_MS.get(mode, 0.5)}


def gap_failures(times: list, walls: list, reps: int, limit_ms: float) -> list[str]:
    """Why a timed case's event times are not believed (empty: they are): each must be a number no
    longer than the wall time the checker measured around it, every repetition must have been made,
    and the median gap between the two must stay within what the exchange itself costs."""
    if len(walls) != reps or len(times) != reps:
        return [f"{len(walls)} of {reps} timed calls were made through the checker"]
    bad = [r for r, t in enumerate(times) if not _num(t) or t < 0]
    if bad:
        return [f"timed call {bad[0] + 1} of {reps}: its event time {times[bad[0]]!r} is not a duration"]
    over = [r for r in range(reps) if times[r] > walls[r] + 0.01]
    if over:
        r = over[0]
        return [f"timed call {r + 1} of {reps}: its events say {times[r]:.4g} ms, longer than the "
                f"{walls[r]:.4g} ms the checker measured around it"]
    gaps = sorted(w - t for w, t in zip(walls, times))
    gap = gaps[len(gaps) // 2]
    limit_ms += GAP_SHARE * sorted(times)[len(times) // 2]
    if gap > limit_ms:
        wall = sorted(walls)[len(walls) // 2]
        return [f"from outside the candidate's process each timed call took {wall:.4g} ms (median), {gap:.4g} ms "
                f"more than its events say, where the exchange costs at most {limit_ms:.4g} ms: its timing is "
                "not believed"]
    return []
