"""Inputs of the three ds4 HC expand specs (a helper, not a spec).

ds4's HC "post" step: out_hc[t][dst][d] = block[t][d] * post[t][dst]
+ sum_src comb[t][dst + src*n_hc] * residual_hc[t][src][d]; block is the
sublayer output (plus the routed output in the add variant).  post gates lie in
(0, 2), the combine matrix is a Sinkhorn output (entries ~0.25, not symmetric,
so reading it transposed is off); each token has its own post/comb, each stream
its own scale."""
import numpy as np

from reference import ds4_hc_ops as ref


def tensors(hc, rng, n_tokens, n_embd, n_hc):
    block = hc.scaled_rows(rng, n_tokens, n_embd)
    add = hc.scaled_rows(rng, n_tokens, n_embd)
    res = hc.scaled_rows(rng, n_tokens * n_hc, n_embd).reshape(n_tokens, n_hc, n_embd)
    if n_hc == hc.N_HC:
        scale, base = hc.hc_params(rng)
        split = ref.hc_split_sinkhorn_rows(hc.hc_mix(rng, n_tokens), scale, base, n_hc, hc.SINKHORN_ITERS,
                                           hc.HC_EPS).astype(np.float32)
    else:
        split = np.concatenate([rng.uniform(0.05, 1.0, (n_tokens, n_hc)), rng.uniform(0.1, 1.9, (n_tokens, n_hc)),
                                rng.uniform(0.0, 2.0 / n_hc, (n_tokens, n_hc * n_hc))], axis=1).astype(np.float32)
    return block, add, res, split


def dims(hc, n_tokens, n_embd=None, n_hc=None):
    return {"n_tokens": n_tokens, "n_embd": n_embd or hc.N_EMBD, "n_hc": n_hc or hc.N_HC}


def moved(s, inputs_per_token):
    d = s.dims
    # residual read + out written (n_hc rows each), the block rows, post (n_hc) and comb (n_hc^2)
    return 4 * d["n_tokens"] * (d["n_embd"] * (2 * d["n_hc"] + inputs_per_token) + d["n_hc"] + d["n_hc"] ** 2)
