"""The prompt of one `porter optimize` attempt: the porting prompt of the unit (its Metal source, host
dispatch, signature, layouts), then what it is now and what must not change.

The committed code and its speed come from the unit's last verified step (the file at HEAD and its
parity/perf evidence, porter.gates.perf.speed); its profile (porter.optimize.profile: Nsight
Compute on the timed case, per kernel) where one could be taken, else one line saying why not; the
refused optimisation attempts since that step are listed by their gates' one-line summaries, so the
model does not offer the same thing twice.
"""

from __future__ import annotations

from porter.prompt import build_prompt

RULES = """\
What must not change (each is checked, and a refusal costs the attempt):
- the function's exact C signature and its return codes;
- its results, within the parity spec's tolerances, on fresh inputs and seeds you will not see;
- no state kept between calls (no cache of inputs, outputs or pointers), no replay of earlier results;
- no lowered precision (no half/bf16/TF32 arithmetic where the committed code computes in fp32);
- the work done on every call, on the unit's stream.
A faster answer is kept only if old and new, timed in alternating rounds in fresh processes, differ by
more than the committed code's own round-to-round spread at p < 1e-4; then the whole engine runs again."""


def speed_facts(speed: dict | None) -> str:
    """One line of the committed code's measured speed, from porter.gates.perf.speed's dict."""
    if not speed:
        return "Its speed was not measured (no timed parity case)."
    parts = [f"{speed['time_ms']:.4g} ms median on {speed.get('case')!r}"]
    if speed.get("x_known_good"):
        parts.append(f"{speed['x_known_good']:.2f}x the known-good implementation's time")
    if speed.get("pct_roofline") is not None:
        parts.append(f"{speed['pct_roofline']:.0f}% of the roofline")
    parts.append(f"regime {speed.get('regime') or 'unrecorded'}")
    return "Measured: " + ", ".join(parts) + "."


def profile_facts(profile) -> str:
    """The profile's table, or "profile: unavailable (why)"; never a figure nothing measured."""
    if profile is None:
        return "profile: unavailable (no profile was taken)"
    return profile.render()


def optimize_section(unit: str, committed: str, speed: dict | None, refused: list, profile=None) -> str:
    lines = [
        "## Task: make the committed implementation faster",
        "",
        f"`{unit}` is already ported and verified. Answer with a faster complete translation unit for it, "
        "in the same form as a porting answer (one ```cuda block).",
        "",
        speed_facts(speed),
        "",
        profile_facts(profile),
        "",
        "The committed code:",
        "",
        "```cuda",
        committed.rstrip(),
        "```",
        "",
        RULES,
    ]
    if refused:
        lines += ["", "Earlier optimisation attempts that were refused (do not offer them again):"]
        lines += [f"- attempt {f.attempt}: {f.gate}: {f.summary}" for f in refused]
    return "\n".join(lines) + "\n"


def optimize_request(target, unit: str, attempt: int, failures: list, *, committed: str, speed: dict | None,
                     profile=None):
    """build_prompt's request for `unit` with the optimisation section after it; the same arguments as
    build_prompt plus what the section needs, so porter.run.attempt.Run.attempt takes it as `request`.
    `profile`: a porter.optimize.profile.Profile (None: none was taken)."""
    req = build_prompt(target, unit, attempt, [])
    req.prompt = req.prompt.rstrip() + "\n\n" + optimize_section(unit, committed, speed, list(failures or []),
                                                                  profile)
    req.meta = dict(req.meta, builder="porter.prompt.optimize", chars=len(req.prompt),
                    refused_optimizations=len(failures or []),
                    profile="unavailable" if profile is None or profile.unavailable else "ncu")
    return req
