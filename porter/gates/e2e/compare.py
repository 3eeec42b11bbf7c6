"""What one prefill yields, and how two prefills are compared: per stage, per token.

A *stage* is a point in the forward where the engine exposes the residual
stream of every prompt token: the embeddings, then the stream after each layer.
Errors from a wrong op appear at the stage of the layer that runs it and carry
forward, so the first stage whose error leaves the known-good envelope names
the layer; within that stage the tokens whose error leaves it name the token
(a sliding-window fault, say, only shows past the window).

A *probe* is one vector the engine exposes besides the stages, where an op's
output would otherwise reach the comparison only through a normalisation that
hides it: ds4's output head collapses the four hyper-connection streams into
one row and RMS-normalises it before the vocabulary projection, so a head that
drops a stream changes that row by a scale the norm removes and the logits by
little.  Probes are compared after the stages, before the logits.

The metric is NMSE (sum of squared error over sum of squared reference, as
ggml's test-backend-ops uses): it is scale-free, so one rule serves the
embeddings and a deep layer whose stream has grown.

Beside it, in the units the field reads a backend's accuracy in (llama.cpp's
`--kl-divergence`): the mean KL divergence of the candidate's next-token
distribution from the reference's, and how often both pick the same top token,
over every logits row both produced (logit_agreement).  They are reported with
the verdict; the verdict is the calibrated NMSE rule's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from porter.errors import PorterError

# A reference slice with no energy (an all-zero row) cannot scale an error:
# its NMSE is the candidate's squared error over this floor.
_ENERGY_FLOOR = 1e-30


class ReferenceFailure(PorterError):
    """The reference backend could not produce outputs: a harness problem, not the candidate's fault."""


@dataclass
class PrefillOutputs:
    """One engine run: stage states [n_stage][n_tok][width], logits rows, greedy tokens."""

    states: np.ndarray
    stage_names: list[str]
    logits: np.ndarray  # [n_rows][n_vocab]: row 0 from the prefill, then one per decode step
    tokens: list[int] = field(default_factory=list)  # greedy tokens (t0 from the prefill logits)
    wall_s: float | None = None
    probes: dict[str, np.ndarray] = field(default_factory=dict)  # name -> one vector, in forward order

    def __post_init__(self) -> None:
        self.states = np.asarray(self.states, dtype=np.float32)
        self.logits = np.atleast_2d(np.asarray(self.logits, dtype=np.float32))
        if self.states.ndim != 3:
            raise ValueError(f"states must be [stage][token][width], got shape {self.states.shape}")
        if len(self.stage_names) != self.states.shape[0]:
            raise ValueError(f"{len(self.stage_names)} stage names for {self.states.shape[0]} stages")
        self.probes = {k: np.asarray(v, dtype=np.float32).ravel() for k, v in self.probes.items()}


@dataclass
class Comparison:
    """A candidate's error against the reference, per stage and token."""

    stage_names: list[str]
    stage_nmse: np.ndarray  # [n_stage][n_tok]; inf where the candidate is not finite
    logits_nmse: float  # the prefill's logits row
    tokens_ref: list[int]
    tokens_cand: list[int]
    problem: str | None = None  # a shape mismatch: nothing to compare
    probe_nmse: dict[str, float] = field(default_factory=dict)  # inf where missing or not finite
    agreement: dict = field(default_factory=dict)  # logit_agreement's figures ({} before they were kept)

    @property
    def first_token_mismatch(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.tokens_ref, self.tokens_cand)):
            if a != b:
                return i
        if len(self.tokens_ref) != len(self.tokens_cand):
            return min(len(self.tokens_ref), len(self.tokens_cand))
        return None

    def to_json(self) -> dict:
        return {"stages": self.stage_names, "stage_nmse": [[_num(v) for v in row] for row in self.stage_nmse],
                "logits_nmse": _num(self.logits_nmse), "tokens_ref": self.tokens_ref,
                "tokens_cand": self.tokens_cand, "problem": self.problem,
                "probe_nmse": {k: _num(v) for k, v in self.probe_nmse.items()},
                "agreement": {k: (_num(v) if isinstance(v, float) else v) for k, v in self.agreement.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "Comparison":
        return cls(list(d["stages"]), np.array([[_unnum(v) for v in row] for row in d["stage_nmse"]], dtype=np.float64),
                   _unnum(d["logits_nmse"]), list(d["tokens_ref"]), list(d["tokens_cand"]), d.get("problem"),
                   {k: _unnum(v) for k, v in (d.get("probe_nmse") or {}).items()},
                   {k: (_unnum(v) if v == "inf" else v) for k, v in (d.get("agreement") or {}).items()})


def _num(v: float):
    v = float(v)
    return v if np.isfinite(v) else "inf"


def _unnum(v) -> float:
    return float("inf") if v == "inf" else float(v)


def nmse_rows(cand: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """NMSE over the last axis; inf where the candidate row has a non-finite value."""
    c = cand.astype(np.float64)
    r = ref.astype(np.float64)
    err = np.sum((c - r) ** 2, axis=-1)
    energy = np.maximum(np.sum(r**2, axis=-1), _ENERGY_FLOOR)
    out = err / energy
    out[~np.all(np.isfinite(c), axis=-1)] = np.inf
    return out


def logit_agreement(ref: np.ndarray, cand: np.ndarray) -> dict:
    """Over the rows both have: {positions, mean_kld, p99_kld, max_kld, same_top}: KL(P_ref || P_cand) of the
    softmax of each row (nats), and the share of rows whose argmax agree.  A row of the candidate that is not
    finite counts as an infinite divergence and a different top token."""
    n = min(len(ref), len(cand))
    if n == 0 or ref.shape[-1] != cand.shape[-1]:
        return {"positions": 0}
    return agreement_summary(*kld_rows(ref[:n], cand[:n]))


def kld_rows(ref: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of two equal-shaped [rows][vocab] blocks: (KL(P_ref || P_cand) in nats, same argmax).  Rows are
    independent, so a caller may feed a long run block by block (porter.gates.e2e.accuracy) and summarise the
    concatenation: the same figures as one call on the whole."""
    r, c = np.atleast_2d(ref).astype(np.float64), np.atleast_2d(cand).astype(np.float64)
    finite = np.all(np.isfinite(c), axis=-1)
    c = np.where(np.isfinite(c), c, 0.0)
    lr = r - r.max(axis=-1, keepdims=True)
    lr -= np.log(np.exp(lr).sum(axis=-1, keepdims=True))
    lc = c - c.max(axis=-1, keepdims=True)
    lc -= np.log(np.exp(lc).sum(axis=-1, keepdims=True))
    kld = np.maximum(np.sum(np.exp(lr) * (lr - lc), axis=-1), 0.0)
    kld[~finite] = np.inf
    same = (np.argmax(r, axis=-1) == np.argmax(c, axis=-1)) & finite
    return kld, same


def agreement_summary(kld: np.ndarray, same: np.ndarray) -> dict:
    """kld_rows' per-row figures as logit_agreement's {positions, mean_kld, p99_kld, max_kld, same_top}."""
    if len(kld) == 0:
        return {"positions": 0}
    return {"positions": int(len(kld)), "mean_kld": float(np.mean(kld)),
            "p99_kld": float(np.quantile(kld, 0.99, method="higher")), "max_kld": float(np.max(kld)),
            "same_top": float(np.mean(same)), "non_finite_rows": int(np.sum(~np.isfinite(kld)))}


def agreement_line(a: dict) -> str:
    """'mean KLD 2.1e-05, same top token 99.7% over 395 positions', or '' with none."""
    if not a or not a.get("positions"):
        return ""
    return (f"mean KLD {a['mean_kld']:.2g}, same top token {100 * a['same_top']:.1f}% over {a['positions']} "
            f"position(s)")


def compare(ref: PrefillOutputs, cand: PrefillOutputs) -> Comparison:
    if ref.states.shape != cand.states.shape or ref.stage_names != cand.stage_names:
        return Comparison(ref.stage_names, np.full((len(ref.stage_names), max(1, ref.states.shape[1])), np.inf),
                          float("inf"), list(ref.tokens), list(cand.tokens),
                          problem=f"candidate states {cand.states.shape} {cand.stage_names[:3]}... "
                                  f"do not match the reference's {ref.states.shape}")
    if ref.logits.shape[1] != cand.logits.shape[1] or cand.logits.shape[0] < 1:
        return Comparison(ref.stage_names, nmse_rows(cand.states, ref.states), float("inf"), list(ref.tokens),
                          list(cand.tokens), problem=f"candidate logits {cand.logits.shape} vs {ref.logits.shape}")
    logits = float(nmse_rows(cand.logits[:1], ref.logits[:1])[0])
    probes = {}
    for name, r in ref.probes.items():
        c = cand.probes.get(name)
        probes[name] = float(nmse_rows(c[None, :], r[None, :])[0]) if c is not None and c.shape == r.shape \
            else float("inf")
    return Comparison(ref.stage_names, nmse_rows(cand.states, ref.states), logits, list(ref.tokens), list(cand.tokens),
                      probe_nmse=probes, agreement=logit_agreement(ref.logits, cand.logits))


def worst(comparisons: list["Comparison"]) -> "Comparison":
    """Several prefills of one backend against the reference, judged by the worst: per stage and token the
    largest error, and the first run whose greedy tokens differ (a race passes some runs, not all)."""
    first = comparisons[0]
    if len(comparisons) == 1:
        return first
    broken = next((c for c in comparisons if c.problem), None)
    if broken is not None:
        return broken
    stage = np.max(np.stack([np.nan_to_num(c.stage_nmse, nan=np.inf) for c in comparisons]), axis=0)
    tokens = next((c.tokens_cand for c in comparisons if c.first_token_mismatch is not None), first.tokens_cand)
    probes = {k: max(c.probe_nmse.get(k, float("inf")) for c in comparisons) for k in first.probe_nmse}
    worst_agreement = max((c.agreement for c in comparisons if c.agreement.get("positions")),
                          key=lambda a: a["mean_kld"], default={})
    return Comparison(first.stage_names, stage, max(c.logits_nmse for c in comparisons), first.tokens_ref, tokens,
                      probe_nmse=probes, agreement=worst_agreement)
