#ifndef MINI_GPU_H
#define MINI_GPU_H

/* minimoe backend API.
 *
 * A miniature of ds4_gpu.h: the engine (engine.c) drives a backend through
 * these functions only, and every backend (mini_cpu.c, mini_metal.m, the CUDA
 * port) implements all of them.  The API is tensor-resident: activations, the
 * KV cache and scratch stay backend-owned across prefill and decode; weights
 * are never copied into tensors by the engine but read from the memory-mapped
 * GGUF (model_map) at a byte offset, as ds4 does.
 *
 * Conventions shared by every op:
 *   - Return 0 on success, non-zero on failure (bad arguments, device error).
 *   - Activations are row-major float32; a "row" is one token.
 *   - Weight matrices are stored GGUF-style: out_dim rows of in_dim values,
 *     each row a run of quant blocks along in_dim.  y[t][o] = sum_i W[o][i]*x[t][i].
 *   - Integer tensors (tokens, expert ids) are int32.
 *   - Ops may be asynchronous; mini_gpu_synchronize() and the tensor read/write
 *     functions order against everything submitted before them.
 */

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mini_gpu_tensor mini_gpu_tensor;

/* ---- Runtime and tensor lifetime ------------------------------------- */

int  mini_gpu_init(void);
void mini_gpu_cleanup(void);

mini_gpu_tensor *mini_gpu_tensor_alloc(uint64_t bytes);
/* A view aliases [offset, offset+bytes) of base; freeing a view never frees base. */
mini_gpu_tensor *mini_gpu_tensor_view(const mini_gpu_tensor *base, uint64_t offset, uint64_t bytes);
void     mini_gpu_tensor_free(mini_gpu_tensor *tensor);
uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor);
int mini_gpu_tensor_write(mini_gpu_tensor *tensor, uint64_t offset, const void *data, uint64_t bytes);
int mini_gpu_tensor_read(const mini_gpu_tensor *tensor, uint64_t offset, void *data, uint64_t bytes);
int mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset,
                         const mini_gpu_tensor *src, uint64_t src_offset,
                         uint64_t bytes);
int mini_gpu_synchronize(void);

/* ---- Embedding --------------------------------------------------------- */

/* out[t][:] = F16 row tokens[t] of the token-embedding table (n_vocab rows of
 * n_embd halves at weight_offset), widened to float32.  A token id outside
 * [0, n_vocab) is an error (non-zero return), not a clamp. */
int mini_gpu_embed_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *tokens,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n_vocab,
        uint32_t               n_embd,
        uint32_t               n_tokens);

/* ---- Norms -------------------------------------------------------------- */

/* out[r][i] = x[r][i] / sqrt(mean_i(x[r][i]^2) + eps), for rows r < n_rows. */
int mini_gpu_rms_norm_plain_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps);

/* As the plain norm, then multiplied by an F32 weight vector of n values read
 * from the model map at weight_offset. */
int mini_gpu_rms_norm_weight_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps);

/* ---- Dense projections ------------------------------------------------- */

/* out[t][o] = sum_i W[o][i] * x[t][i], W in Q8_0 (blocks of 32: f16 scale d,
 * 32 int8 q; value = d*q).  in_dim is a multiple of 32. */
int mini_gpu_matmul_q8_0_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok);

/* Same contract with W stored as F16. */
int mini_gpu_matmul_f16_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok);

/* Abandoned variant kept from an earlier model revision: W in Q4_K.  The
 * engine never calls it; the fixture model has no Q4_K tensor. */
int mini_gpu_matmul_q4_k_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok);

/* ---- Positional encoding ---------------------------------------------- */

/* In place.  x holds n_tokens rows of n_head heads of head_dim floats.  Only
 * the last n_rot dims of each head rotate (ds4's "tail" RoPE); pairs are
 * adjacent (x[2j], x[2j+1]) inside the tail, token t sits at position pos0+t,
 * theta_j = (pos0+t) * freq_base^(-2j/n_rot).  n_rot is even and <= head_dim. */
int mini_gpu_rope_tail_tensor(
        mini_gpu_tensor *x,
        uint32_t         n_tokens,
        uint32_t         n_head,
        uint32_t         head_dim,
        uint32_t         n_rot,
        uint32_t         pos0,
        float            freq_base);

/* ---- Attention ----------------------------------------------------------- */

/* Causal sliding-window attention with one shared KV head (multi-query) and a
 * learned per-head sink logit.
 *   q:        n_tokens x n_head x head_dim   (queries at positions pos0+t)
 *   k_cache,
 *   v_cache:  rows of head_dim floats indexed by absolute position; rows
 *             [0, pos0+n_tokens) are valid.
 *   sinks:    n_head F32 values at sinks_offset in the model map.
 * For query position p the visible keys are max(0, p-window+1) .. p.
 *   s_j = scale * dot(q, k_j);  m = max(max_j s_j, sink_h)
 *   out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink_h - m))
 * The sink takes probability mass but contributes no value. */
int mini_gpu_attention_window_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *q,
        const mini_gpu_tensor *k_cache,
        const mini_gpu_tensor *v_cache,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               sinks_offset,
        uint32_t               n_tokens,
        uint32_t               pos0,
        uint32_t               n_head,
        uint32_t               head_dim,
        uint32_t               window,
        float                  scale);

/* ---- Mixture of experts ------------------------------------------------- */

/* Per token: p = softmax(logits[t][0..n_expert)); choose the top_k experts by
 * p, descending.  Tie rule: on equal p the lower expert index ranks first.
 * expert_ids[t][k] (int32) in that order; expert_weights[t][k] = p / sum of
 * the chosen p (the chosen weights of a token sum to 1). */
int mini_gpu_router_topk_tensor(
        mini_gpu_tensor       *expert_ids,
        mini_gpu_tensor       *expert_weights,
        const mini_gpu_tensor *logits,
        uint32_t               n_expert,
        uint32_t               n_tokens,
        uint32_t               top_k);

/* Routed gate and up projections.  The gate and up weights are 3-D GGUF
 * tensors [n_expert][n_ff][n_embd] in IQ2_XXS (blocks of 256, 66 bytes);
 * expert e's matrix starts e * n_ff * (n_embd/256) * 66 bytes after the
 * tensor's offset.  For each token t and slot k, with e = expert_ids[t][k]:
 *   gate[t][k][:] = Wgate_e x[t],   up[t][k][:] = Wup_e x[t]
 * n_embd is a multiple of 256.  An expert id outside [0, n_expert) is an error. */
int mini_gpu_routed_gate_up_iq2_xxs_tensor(
        mini_gpu_tensor       *gate,
        mini_gpu_tensor       *up,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               gate_offset,
        uint64_t               up_offset,
        uint32_t               n_embd,
        uint32_t               n_ff,
        uint32_t               n_expert,
        const mini_gpu_tensor *x,
        const mini_gpu_tensor *expert_ids,
        uint32_t               n_tokens,
        uint32_t               top_k);

/* Routed down projection and weighted sum over the chosen experts.  Down
 * weights are [n_expert][n_embd][n_ff] in Q2_K (blocks of 256, 84 bytes).
 *   out[t][:] = sum_k expert_weights[t][k] * Wdown_{expert_ids[t][k]} mid[t][k][:]
 * n_ff is a multiple of 256. */
int mini_gpu_routed_down_q2_k_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               down_offset,
        uint32_t               n_ff,
        uint32_t               n_embd,
        uint32_t               n_expert,
        const mini_gpu_tensor *mid,
        const mini_gpu_tensor *expert_ids,
        const mini_gpu_tensor *expert_weights,
        uint32_t               n_tokens,
        uint32_t               top_k);

/* ---- Elementwise -------------------------------------------------------- */

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). */
int mini_gpu_swiglu_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *gate,
        const mini_gpu_tensor *up,
        uint64_t               n);

/* out[i] = a[i] + b[i]; out may alias a (the residual stream is updated in place). */
int mini_gpu_add_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *a,
        const mini_gpu_tensor *b,
        uint64_t               n);

/* ---- Diagnostics (never on the engine's path) ---------------------------- */

/* checksum[0] = sum of x[0..n) as float32, checksum[1] = sum of squares.
 * Used by hand while debugging a backend. */
int mini_gpu_debug_checksum_tensor(
        mini_gpu_tensor       *checksum,
        const mini_gpu_tensor *x,
        uint64_t               n);

#ifdef __cplusplus
}
#endif

#endif /* MINI_GPU_H */
