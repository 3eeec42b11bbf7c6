/* faults.c — broken backends for calibrating minimoe's e2e rule.
 *
 * Each fault is compiled alone (-DFAULT_<NAME>) and linked into the engine
 * with -Wl,--wrap=<symbol>: the engine's calls to that API function reach
 * __wrap_<symbol> here, which calls the real backend (CPU or CUDA, whichever
 * the engine is linked with) with one argument wrong.  So one fault file
 * breaks any backend the same way, without touching its sources.  Unit faults
 * make one op compute the wrong thing; integration faults break the contract
 * between the engine and the backend (model-map base, KV-cache placement),
 * which unit parity cannot see because its harness builds its own maps and
 * tensors.  variants.toml names each fault, its symbols and why it is wrong.
 */
#include "mini_gpu.h"

#if defined(FAULT_ROPE_POS_SHIFT)
int __real_mini_gpu_rope_tail_tensor(mini_gpu_tensor *, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, float);
int __wrap_mini_gpu_rope_tail_tensor(mini_gpu_tensor *x, uint32_t n_tokens, uint32_t n_head, uint32_t head_dim,
                                     uint32_t n_rot, uint32_t pos0, float freq_base) {
    /* Queries only (the n_head > 1 call; keys share one head): shifting both
     * would leave every q.k angle difference, and so the output, unchanged. */
    return __real_mini_gpu_rope_tail_tensor(x, n_tokens, n_head, head_dim, n_rot, pos0 + (n_head > 1), freq_base);
}
#endif

#if defined(FAULT_ATTENTION_WINDOW_SHORT)
int __real_mini_gpu_attention_window_tensor(mini_gpu_tensor *, const mini_gpu_tensor *, const mini_gpu_tensor *,
        const mini_gpu_tensor *, const void *, uint64_t, uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, float);
int __wrap_mini_gpu_attention_window_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *q, const mini_gpu_tensor *k,
        const mini_gpu_tensor *v, const void *map, uint64_t size, uint64_t sinks, uint32_t n_tokens, uint32_t pos0,
        uint32_t n_head, uint32_t head_dim, uint32_t window, float scale) {
    return __real_mini_gpu_attention_window_tensor(out, q, k, v, map, size, sinks, n_tokens, pos0, n_head, head_dim,
                                                   window - 1, scale);
}
#endif

#if defined(FAULT_NORM_WEIGHT_SHIFT)
int __real_mini_gpu_rms_norm_weight_rows_tensor(mini_gpu_tensor *, const mini_gpu_tensor *, const void *, uint64_t,
                                                uint64_t, uint32_t, uint32_t, float);
int __wrap_mini_gpu_rms_norm_weight_rows_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *x, const void *map,
                                                uint64_t size, uint64_t off, uint32_t n, uint32_t n_rows, float eps) {
    return __real_mini_gpu_rms_norm_weight_rows_tensor(out, x, map, size, off + 4, n, n_rows, eps);
}
#endif

#if defined(FAULT_ROUTER_STRIDE)
int __real_mini_gpu_router_topk_tensor(mini_gpu_tensor *, mini_gpu_tensor *, const mini_gpu_tensor *, uint32_t,
                                       uint32_t, uint32_t);
int __wrap_mini_gpu_router_topk_tensor(mini_gpu_tensor *ids, mini_gpu_tensor *w, const mini_gpu_tensor *logits,
                                       uint32_t n_expert, uint32_t n_tokens, uint32_t top_k) {
    return __real_mini_gpu_router_topk_tensor(ids, w, logits, n_expert - 1, n_tokens, top_k);
}
#endif

#if defined(FAULT_SWIGLU_TAIL)
int __real_mini_gpu_swiglu_tensor(mini_gpu_tensor *, const mini_gpu_tensor *, const mini_gpu_tensor *, uint64_t);
int __wrap_mini_gpu_swiglu_tensor(mini_gpu_tensor *out, const mini_gpu_tensor *gate, const mini_gpu_tensor *up,
                                  uint64_t n) {
    return __real_mini_gpu_swiglu_tensor(out, gate, up, n - 1);
}
#endif

#if defined(FAULT_DOWN_BLOCK_SHIFT)
int __real_mini_gpu_routed_down_q2_k_tensor(mini_gpu_tensor *, const void *, uint64_t, uint64_t, uint32_t, uint32_t,
        uint32_t, const mini_gpu_tensor *, const mini_gpu_tensor *, const mini_gpu_tensor *, uint32_t, uint32_t);
int __wrap_mini_gpu_routed_down_q2_k_tensor(mini_gpu_tensor *out, const void *map, uint64_t size, uint64_t off,
        uint32_t n_ff, uint32_t n_embd, uint32_t n_expert, const mini_gpu_tensor *mid, const mini_gpu_tensor *ids,
        const mini_gpu_tensor *w, uint32_t n_tokens, uint32_t top_k) {
    /* one Q2_K block (84 bytes) late: every row reads its neighbour's tail */
    return __real_mini_gpu_routed_down_q2_k_tensor(out, map, size, off + 84, n_ff, n_embd, n_expert, mid, ids, w,
                                                   n_tokens, top_k);
}
#endif

#if defined(FAULT_MODEL_MAP_BASE)
/* Integration: the offsets of the Q8_0 projections reach the backend one
 * block (34 bytes) early, as if the engine and the backend disagreed about
 * the base the offsets are relative to.  Every read stays inside the map and
 * every block is a valid one, so no op refuses: the weights are just wrong.
 * Unit parity cannot see it: its harness passes offsets it computed itself. */
int __real_mini_gpu_matmul_q8_0_tensor(mini_gpu_tensor *, const void *, uint64_t, uint64_t, uint64_t, uint64_t,
                                       const mini_gpu_tensor *, uint64_t);
int __wrap_mini_gpu_matmul_q8_0_tensor(mini_gpu_tensor *out, const void *map, uint64_t size, uint64_t off,
                                       uint64_t in_dim, uint64_t out_dim, const mini_gpu_tensor *x, uint64_t n_tok) {
    return __real_mini_gpu_matmul_q8_0_tensor(out, map, size, off - 34, in_dim, out_dim, x, n_tok);
}
#endif

#if defined(FAULT_KV_ROW_LATE)
/* Integration: the KV cache rows land one row late (row p written at p+1),
 * a placement error between the engine's cache layout and the backend's copy.
 * Only copies into a tensor with room after them are moved: the KV caches
 * (n_ctx rows), not the prefill snapshots (exactly the copied size). */
int __real_mini_gpu_tensor_copy(mini_gpu_tensor *, uint64_t, const mini_gpu_tensor *, uint64_t, uint64_t);
int __wrap_mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset, const mini_gpu_tensor *src,
                                uint64_t src_offset, uint64_t bytes) {
    const uint64_t row = 64u * sizeof(float); /* minimoe's head_dim */
    if (mini_gpu_tensor_bytes(dst) >= dst_offset + bytes + row) dst_offset += row;
    return __real_mini_gpu_tensor_copy(dst, dst_offset, src, src_offset, bytes);
}
#endif
