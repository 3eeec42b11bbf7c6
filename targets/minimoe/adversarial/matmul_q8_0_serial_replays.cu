// porter adversarial mutant of mini_gpu_matmul_q8_0_tensor: a serial kernel (right values) that replays its last answer on unchanged inputs (perf: slowdown)
// (derived from the scripted serial answer; parity accepts it, the perf gate must REFUSE it as slower than the known-good)
#include "mini_cuda.cuh"
#include <string.h>

static __global__ void matmul_q8_0_serial_kernel(float *out, const uint8_t *w, const float *x,
                                                 uint64_t in_dim, uint64_t out_dim, uint64_t n_tok) {
    const uint64_t nb = in_dim / 32;
    for (uint64_t t = 0; t < n_tok; ++t) {
        for (uint64_t o = 0; o < out_dim; ++o) {
            const uint8_t *row = w + o * nb * 34;
            float acc = 0.0f;
            for (uint64_t b = 0; b < nb; ++b) {
                const uint8_t *blk = row + b * 34;
                const float d = __half2float(__ushort_as_half((unsigned short)(blk[0] | (blk[1] << 8))));
                const int8_t *q = (const int8_t *)(blk + 2);
                for (int j = 0; j < 32; ++j) acc += d * (float)q[j] * x[t * in_dim + b * 32 + j];
            }
            out[t * out_dim + o] = acc;
        }
    }
}

extern "C" int mini_gpu_matmul_q8_0_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    if (!out || !x || in_dim == 0 || in_dim % 32 != 0) return -1;
    if (n_tok == 0 || out_dim == 0) return 0;
    if (x->bytes < n_tok * in_dim * sizeof(float) || out->bytes < n_tok * out_dim * sizeof(float)) return -1;
    if (!out->data || !x->data) return -1;
    const uint8_t *w = (const uint8_t *)mini_cuda_model_ptr(model_map, model_size, weight_offset,
                                                            out_dim * (in_dim / 32) * 34);
    if (!w) return -1;
    // replays its last answer when called again with the same buffers, weights and first input bytes:
    // timed on unchanged inputs, every timed call was a copy; timed on rotated inputs, none is
    static void *seen_out, *seen_x, *memo;
    static uint64_t seen_off, seen_shape, memo_bytes;
    static float seen_head[4];
    const uint64_t shape = (n_tok * 1000003ULL + out_dim) * 1000003ULL + in_dim;
    const uint64_t out_bytes = n_tok * out_dim * sizeof(float);
    float head[4] = {0, 0, 0, 0};
    if (cudaMemcpy(head, x->data, (in_dim < 4 ? in_dim : 4) * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) {
        return -1;
    }
    if (memo && seen_out == out->data && seen_x == x->data && seen_off == weight_offset && seen_shape == shape &&
        memcmp(head, seen_head, sizeof head) == 0) {
        return cudaMemcpyAsync(out->data, memo, out_bytes, cudaMemcpyDeviceToDevice, mini_cuda_stream()) == cudaSuccess
                   ? 0 : -1;
    }
    matmul_q8_0_serial_kernel<<<1, 1, 0, mini_cuda_stream()>>>((float *)out->data, w, (const float *)x->data,
                                                              in_dim, out_dim, n_tok);
    if (!MINI_CUDA_LAUNCH_OK("matmul_q8_0_serial_kernel")) return -1;
    if (memo_bytes < out_bytes) {
        if (memo) cudaFree(memo);
        memo = nullptr;
        memo_bytes = 0;
        if (cudaMalloc(&memo, out_bytes) != cudaSuccess) return -1;
        memo_bytes = out_bytes;
    }
    if (cudaMemcpyAsync(memo, out->data, out_bytes, cudaMemcpyDeviceToDevice, mini_cuda_stream()) != cudaSuccess) {
        return -1;
    }
    seen_out = out->data; seen_x = x->data; seen_off = weight_offset; seen_shape = shape;
    memcpy(seen_head, head, sizeof head);
    return 0;
}
