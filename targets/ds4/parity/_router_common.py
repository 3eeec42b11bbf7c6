"""Inputs of the two ds4 router specs (a helper, not a spec).

ds4's router takes 256 logits per token (the ffn_gate_inp projection), scores
experts by sqrt(softplus(logit)), and picks 6: in the first 3 layers from the
token's row of the [129280][6] tid2eid hash table, later by the top 6 of score +
bias (ffn_exp_probs_b).  Logits span about +-6 with a few beyond +-20 (softplus's
two cut-offs); the bias is large enough to change which experts win; hash rows
hold 6 distinct experts and include experts 0 and 255."""
import numpy as np

from porter.spec import Context
from reference import ds4_ops as ops

N_EXPERT, N_USED = ops.N_EXPERT, ops.N_EXPERT_USED
N_VOCAB = 129280

INPUTS = ("logits ~ N(0, 2^2) with 4 per token beyond softplus's cut-offs (about 24, 21.5, -23, -30); "
          "bias ~ N(0, 0.5^2); tie cases: logits and bias of a few values; edge: per token one logit "
          "near +150 and one near -110, past expf's float32 range")

# Logits past expf's range: log1pf(expf(150)) is inf in float32, so a softplus without the x > 20
# branch returns inf probabilities and NaN weights; upstream's softplus_dev (every router kernel)
# returns x above 20 and expf(x) below -20 (0 at -110), as ds4.c's softplus_stable does.  One huge
# logit per token: with two, such a kernel's selection would also tie them at inf.
HUGE_LOGITS = (150.0, -110.0)
EDGE_HUGE = "a logit near +150 and one near -110 per token (softplus without its cut-off overflows expf)"


def logits(rng, n_tokens, levels=0, huge=False):
    if levels:  # heavy ties: every logit one of a few values
        vals = np.sort(rng.standard_normal(levels) * 2.0).astype(np.float32)
        return vals[rng.integers(0, levels, (n_tokens, N_EXPERT))]
    z = (rng.standard_normal((n_tokens, N_EXPERT)) * 2.0).astype(np.float32)
    for t in range(n_tokens):  # softplus's branches: x > 20 returns x, x < -20 returns exp(x)
        idx = rng.choice(N_EXPERT, 4, replace=False)
        z[t, idx] = np.array([24.0, 21.5, -23.0, -30.0], np.float32) * rng.uniform(0.95, 1.05, 4).astype(np.float32)
        if huge:
            far = rng.choice(np.setdiff1d(np.arange(N_EXPERT), idx), 2, replace=False)
            z[t, far] = np.array(HUGE_LOGITS, np.float32) * rng.uniform(0.95, 1.05, 2).astype(np.float32)
    return z


def separate_near_ties(lg, b=None, rel=1e-5):
    """Nudge apart selection scores (probs + bias) that are close but not equal among each
    token's top 7: a right kernel's float32 softplus may differ from the reference's by
    an ulp and flip such a pair, which no tie rule decides.  Exact ties stay."""
    from reference import ds4_hc_ops as ref

    lg = lg.copy()
    for t in range(lg.shape[0]):
        for _ in range(8):
            keys = ref.router_selection_scores(ref.router_probs(lg[t]), b).astype(np.float64)
            top = np.argsort(-keys, kind="stable")[:N_USED + 1]
            gaps = keys[top[:-1]] - keys[top[1:]]
            close = np.flatnonzero((gaps > 0) & (gaps < rel * np.abs(keys[top[:-1]]).clip(1e-3)))
            if not close.size:
                break
            lg[t, top[close + 1]] -= np.float32(0.05)
    return lg


def bias(rng, levels=0):
    if levels:
        vals = (rng.standard_normal(levels) * 0.3).astype(np.float32)
        return vals[rng.integers(0, levels, N_EXPERT)]
    return (rng.standard_normal(N_EXPERT) * 0.5).astype(np.float32)


def hash_table(rng, rows):
    """[rows][6] int32, each row 6 distinct experts; the last row names experts 0 and 255."""
    start = rng.integers(0, N_EXPERT, (rows, 1))
    step = rng.integers(1, N_EXPERT // N_USED, (rows, 1))  # k * step < 256 for k < 6: distinct experts
    t = ((start + step * np.arange(N_USED)) % N_EXPERT).astype(np.int32)
    t[-1] = np.concatenate([[0], rng.choice(np.arange(1, N_EXPERT - 1), N_USED - 2, replace=False), [N_EXPERT - 1]])
    return t


def router_map(rng, hash_rows, bias_levels=0):
    """(map, bias offset, hash offset, bias, table): both tensors present in every case."""
    b = bias(rng, bias_levels)
    table = hash_table(rng, hash_rows)
    m, (b_off, h_off) = Context.synthetic_map([b, table], rng)
    return m, b_off, h_off, b, table
