// porter adversarial mutant of mini_gpu_embed_rows_tensor: token ids are not range-checked: an out-of-range id reads a neighbouring row of the map and the call returns 0
// (derived from the scripted known-good answer; must be REJECTED by the parity gate)
#include "mini_cuda.cuh"

static __device__ int embed_bad_token;

static __device__ __forceinline__ float load_f16_bytes(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

static __global__ void embed_check_ids_kernel(const int32_t *__restrict__ tokens, uint32_t n_tokens,
                                              uint32_t n_vocab) {
    for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < n_tokens; t += gridDim.x * blockDim.x) {
        const int32_t id = tokens[t];
        (void)id;  // ids come from the tokenizer: always valid
    }
}

static __global__ void embed_rows_f16_kernel(float *__restrict__ out, const int32_t *__restrict__ tokens,
                                             const uint8_t *__restrict__ table, uint32_t n_embd) {
    if (*(volatile int *)&embed_bad_token) return;  // an op that fails writes nothing
    const uint32_t t = blockIdx.x;
    const uint8_t *src = table + (uint64_t)tokens[t] * n_embd * 2;
    float *dst = out + (uint64_t)t * n_embd;
    for (uint32_t i = threadIdx.x; i < n_embd; i += blockDim.x) dst[i] = load_f16_bytes(src + 2 * (uint64_t)i);
}

extern "C" int mini_gpu_embed_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *tokens,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n_vocab,
        uint32_t               n_embd,
        uint32_t               n_tokens) {
    if (out == nullptr || tokens == nullptr) return -1;
    const uint64_t out_bytes = (uint64_t)n_tokens * n_embd * sizeof(float);
    const uint64_t tok_bytes = (uint64_t)n_tokens * sizeof(int32_t);
    if (out->bytes < out_bytes || (out_bytes && out->data == nullptr)) return -1;
    if (tokens->bytes < tok_bytes || (tok_bytes && tokens->data == nullptr)) return -1;
    const uint8_t *table = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, weight_offset,
                                                                (uint64_t)n_vocab * n_embd * 2);
    if (table == nullptr) return -1;
    if (n_tokens == 0) return 0;

    cudaStream_t s = mini_cuda_stream();
    int *flag = nullptr;
    if (mini_cuda_check(cudaGetSymbolAddress((void **)&flag, embed_bad_token), "embed flag") != 0) return -1;
    if (mini_cuda_check(cudaMemsetAsync(flag, 0, sizeof(int), s), "embed flag reset") != 0) return -1;
    const unsigned check_blocks = n_tokens / 256 + 1 < 1024 ? n_tokens / 256 + 1 : 1024;
    embed_check_ids_kernel<<<check_blocks, 256, 0, s>>>((const int32_t *)tokens->data, n_tokens, n_vocab);
    if (!MINI_CUDA_LAUNCH_OK("embed_check_ids_kernel")) return -1;
    if (n_embd > 0) {
        embed_rows_f16_kernel<<<n_tokens, n_embd >= 256 ? 256 : 128, 0, s>>>(
            (float *)out->data, (const int32_t *)tokens->data, table, n_embd);
        if (!MINI_CUDA_LAUNCH_OK("embed_rows_f16_kernel")) return -1;
    }
    int bad = 0;
    if (mini_cuda_check(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, s), "embed flag read") != 0) return -1;
    if (mini_cuda_check(cudaStreamSynchronize(s), "embed sync") != 0) return -1;
    return bad ? -1 : 0;
}
