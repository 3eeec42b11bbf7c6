// ds4 CUDA conventions: included by every ported unit (the build gate also
// force-includes it, so a unit whose extern "C" signature differs from
// ds4_gpu.h fails to compile as a conflicting declaration).
//
// Target-owned, written for porter from ds4_gpu.h and from how ds4.c drives
// the API; never ported, never generated (except the IQ2 grid, printed by
// gen_iq2_grid.py from porter's reference/quant.py).  It holds:
//   - the tensor struct (its layout is fixed: the parity child builds tensors
//     around its own guarded device buffers with the same three fields);
//   - the backend's process-wide state, shared by all units (model map and
//     its registered/cached ranges, the Q8 expanded-weight caches, scratch,
//     staging buffers, the cuBLAS handle, the quality flag).  The variables are
//     defined once, in ds4_cuda_glue.cu: a unit that kept its own copy would
//     see a different model map than the unit before it;
//   - the glue's helpers: error checks, scratch, model range lookup;
//   - device helpers a unit may use: quant block layouts, warp reductions, Q8
//     activation quantization, the IQ2_XXS grid and sign rule.
//
// Units launch on the legacy default stream (as ds4's engine expects: every op
// is ordered after the previous one, and ds4_gpu_synchronize drains them all).
// Every helper below that can fail returns 1 on success and 0 on failure, as
// the API does (ds4_gpu.h: non-zero on success).
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cublas_v2.h>
#include <cub/block/block_radix_sort.cuh>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <unordered_map>
#include <vector>

// ds4_gpu.h has no extern "C" guard of its own: the API is C (ds4.c calls
// it), so its declarations get C linkage here, and a unit whose definition
// drifts from them is a compile error instead of a second overload.
extern "C" {
#include "ds4_gpu.h"
}

struct ds4_gpu_tensor {
    void    *ptr;    // device pointer (already offset for views)
    uint64_t bytes;  // usable bytes from ptr
    int      owner;  // 1: ptr was allocated by this tensor; 0: a view / foreign buffer
};

// ---------------------------------------------------------------------------
// Shared backend state (defined in ds4_cuda_glue.cu)
// ---------------------------------------------------------------------------

// A cached or mapped range of the model map, found again by its map offset.
// Field order matters: units build these with brace initialisers.
struct ds4_cuda_model_range {
    const void *host_base;              // the model map the range belongs to
    uint64_t    offset;                 // byte offset in the map
    uint64_t    bytes;
    char       *device_ptr;             // where a kernel reads map[offset]
    void       *registered_base;        // page-aligned host start, when host-registered
    char       *registered_device_base; // its device alias
    uint64_t    registered_bytes;
    int         host_registered;        // 1: pages registered (zero-copy); 0: device copy
    int         arena_allocated;        // 1: device_ptr lives in an arena (freed with it)
};

// A large device allocation that many small weight copies are carved from.
struct ds4_cuda_model_arena {
    char    *device_ptr;
    uint64_t bytes;
    uint64_t used;
};

// Q8_0 weights expanded once to F16 / F32 for the cuBLAS paths.
struct ds4_cuda_q8_f16_range {
    const void *host_base;
    uint64_t    offset;
    uint64_t    weight_bytes;
    uint64_t    in_dim;
    uint64_t    out_dim;
    __half     *device_ptr;
};

struct ds4_cuda_q8_f32_range {
    const void *host_base;
    uint64_t    offset;
    uint64_t    weight_bytes;
    uint64_t    in_dim;
    uint64_t    out_dim;
    float      *device_ptr;
};

#define DS4_CUDA_STAGE_SLOTS 4

// The model map as the engine registered it (ds4_gpu_set_model_map).
extern const void  *ds4_cuda_model_host_base;       // host address of the map
extern const char  *ds4_cuda_model_device_base;     // device alias of the whole map, or the host address (HMM)
extern uint64_t     ds4_cuda_model_registered_size;
extern int          ds4_cuda_model_registered;      // whole map host-registered
extern int          ds4_cuda_model_device_owned;    // whole map copied to device memory (freed on release)
extern int          ds4_cuda_model_range_mapping_supported; // 0 once range registration was refused
extern int          ds4_cuda_model_hmm_direct;      // device may read pageable host memory directly
// The model file, for reading ranges with pread instead of faulting the map.
extern int          ds4_cuda_model_fd;
extern const void  *ds4_cuda_model_fd_host_base;
extern int          ds4_cuda_model_direct_fd;       // O_DIRECT duplicate of model_fd, or -1
extern uint64_t     ds4_cuda_model_direct_align;
extern uint64_t     ds4_cuda_model_file_size;
extern int          ds4_cuda_model_cache_full;      // device cache budget reached
extern cudaStream_t ds4_cuda_model_prefetch_stream;
extern cudaStream_t ds4_cuda_model_upload_stream;
// cuBLAS and precision.
extern cublasHandle_t ds4_cuda_cublas;
extern int          ds4_cuda_cublas_ready;
extern int          ds4_cuda_quality_mode;          // ds4_gpu_set_quality: 1 = no TF32 / reduced-precision shortcuts
// Cached ranges of the map, and lookups by map offset.
extern std::vector<ds4_cuda_model_range>      ds4_cuda_model_ranges;
extern std::vector<ds4_cuda_model_arena>      ds4_cuda_model_arenas;
extern std::unordered_map<uint64_t, size_t>   ds4_cuda_model_range_by_offset;
extern std::vector<ds4_cuda_q8_f16_range>     ds4_cuda_q8_f16_ranges;
extern std::unordered_map<uint64_t, size_t>   ds4_cuda_q8_f16_by_offset;
extern std::vector<ds4_cuda_q8_f32_range>     ds4_cuda_q8_f32_ranges;
extern std::unordered_map<uint64_t, size_t>   ds4_cuda_q8_f32_by_offset;
extern uint64_t     ds4_cuda_model_range_bytes;
extern uint64_t     ds4_cuda_q8_f16_bytes;
extern uint64_t     ds4_cuda_q8_f32_bytes;
extern int          ds4_cuda_q8_f16_disabled_after_oom;
extern int          ds4_cuda_q8_f16_budget_notice_printed;
// Load-progress reporting.
extern uint64_t     ds4_cuda_model_load_progress_next;
extern double       ds4_cuda_model_load_progress_last;
extern int          ds4_cuda_model_load_progress_started;
extern int          ds4_cuda_model_load_progress_tty;
// One scratch buffer (grown, never shrunk; see ds4_cuda_tmp_alloc).
extern void        *ds4_cuda_tmp;
extern uint64_t     ds4_cuda_tmp_bytes;
// Pinned staging buffers for file -> device uploads, each with its event.
extern void        *ds4_cuda_model_stage_raw[DS4_CUDA_STAGE_SLOTS];
extern void        *ds4_cuda_model_stage[DS4_CUDA_STAGE_SLOTS];
extern cudaEvent_t  ds4_cuda_model_stage_event[DS4_CUDA_STAGE_SLOTS];
extern uint64_t     ds4_cuda_model_stage_bytes;

// ---------------------------------------------------------------------------
// Glue helpers (ds4_cuda_glue.cu)
// ---------------------------------------------------------------------------

// 1 when err is cudaSuccess; else prints `what` and the error, returns 0.
int ds4_cuda_ok(cudaError_t err, const char *what);
// 1 when st is CUBLAS_STATUS_SUCCESS; else prints and returns 0.
int ds4_cublas_ok(cublasStatus_t st, const char *what);
// The shared scratch buffer, at least `bytes` long (NULL for 0 bytes or on
// failure).  One buffer for the whole backend: a unit must not hold it across
// a call of another unit that may also use it.
void *ds4_cuda_tmp_alloc(uint64_t bytes, const char *what);
// Where a kernel reads map[offset] when the whole map is registered or
// copied; otherwise the host address itself.
const char *ds4_cuda_model_ptr(const void *model_map, uint64_t offset);
// Device address of map bytes [offset, offset+bytes): the whole-map alias when
// the map is registered, else a range registered (zero-copy) or copied to the
// device once and found again by its offset.  NULL when nothing works.
const char *ds4_cuda_model_range_ptr(const void *model_map, uint64_t offset, uint64_t bytes, const char *what);
// 1 when [offset, offset+bytes) is readable on the device without more work.
int ds4_cuda_model_range_is_cached(const void *model_map, uint64_t offset, uint64_t bytes);
// Registers the whole map for device access (what ds4_gpu_set_model_map does
// once per model); 1 on success.  Drops every cached range of an older map.
int ds4_cuda_register_model_map(const void *model_map, uint64_t model_size);
// Drops every cached/registered range, the Q8 caches, scratch and staging.
void ds4_cuda_release_models(void);

extern "C" {
// Parity-harness hooks (targets/ds4/parity/harness.toml):
//   porter_ds4_init           the cuBLAS handle (what ds4_gpu_init provides to units), without
//                             depending on the ported ds4_gpu_init.
//   porter_ds4_forget_models  before every call: the child hands each call a fresh host map that
//                             may land at an old map's address, so every cached view is dropped.
//   porter_ds4_model_ptr      then registers that map, as ds4_gpu_set_model_map does; returns
//                             NULL: units read the registered host pages (zero-copy), there is no
//                             separate device copy to compare.
int porter_ds4_init(void);
void porter_ds4_forget_models(void);
const void *porter_ds4_model_ptr(const void *model_map, uint64_t model_size, uint64_t offset, uint64_t bytes);
}

// ---------------------------------------------------------------------------
// Device helpers (static: each translation unit gets its own copy)
// ---------------------------------------------------------------------------

#define DS4_QK_K 256   // values per K-quant super-block
#define DS4_QK8_0 32   // values per Q8_0 block

// GGML block layouts of the model's quant types (sizes checked below).  Scales
// are IEEE half bits; convert with ds4_f16_bits().
struct ds4_block_q8_0 {      // 34 bytes: d * qs[i]
    uint16_t d;
    int8_t   qs[DS4_QK8_0];
};
struct ds4_block_q2_K {      // 84 bytes: 16 sub-blocks of 16, 4-bit scale|min each
    uint8_t  scales[DS4_QK_K / 16];
    uint8_t  qs[DS4_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
struct ds4_block_q4_K {      // 144 bytes: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes
    uint16_t d;
    uint16_t dmin;
    uint8_t  scales[12];
    uint8_t  qs[DS4_QK_K / 2];
};
struct ds4_block_iq2_xxs {   // 66 bytes: 8 groups of 32; per group 4 grid bytes + 4x7 sign bits + 4-bit scale
    uint16_t d;
    uint16_t qs[DS4_QK_K / 8];
};
struct ds4_block_q8_K {      // activations for K-quant dots: float scale, 256 int8, 16 partial sums
    float    d;
    int8_t   qs[DS4_QK_K];
    int16_t  bsums[DS4_QK_K / 16];
};
static_assert(sizeof(ds4_block_q8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(ds4_block_q2_K) == 84, "Q2_K block is 84 bytes");
static_assert(sizeof(ds4_block_q4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(ds4_block_iq2_xxs) == 66, "IQ2_XXS block is 66 bytes");

static __device__ __forceinline__ float ds4_f16_bits(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
}

// Butterfly reductions: every lane of the warp gets the result.
static __device__ __forceinline__ float ds4_warp_sum_f32(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
static __device__ __forceinline__ float ds4_warp_max_f32(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}
static __device__ __forceinline__ int ds4_warp_sum_i32(int v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Q8_0 activation quantization, one warp per block of 32 values: lane i holds
// x[i] (0 beyond n); d = max|x| / 127, q = round(x / d).  Every lane gets d;
// lane i returns its q.
static __device__ __forceinline__ int8_t ds4_quantize_q8_0_lane(float x, float *d_out) {
    const float amax = ds4_warp_max_f32(fabsf(x));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = __float2int_rn(x * id);
    q = q > 127 ? 127 : (q < -128 ? -128 : q);
    *d_out = d;
    return (int8_t)q;
}

// Q8_K activation quantization of one 256-value block by one warp: lane l
// quantizes x[8l .. 8l+7].  The scale follows GGML: the value of largest
// magnitude maps to -127 (d = max / -127); bsums[j] sums qs[16j .. 16j+15].
static __device__ inline void ds4_quantize_q8_K_warp(const float *x, ds4_block_q8_K *out) {
    const int lane = threadIdx.x & 31;
    float v[8];
    float best = 0.0f, best_abs = 0.0f;
    for (int i = 0; i < 8; i++) {
        v[i] = x[lane * 8 + i];
        if (fabsf(v[i]) > best_abs) { best_abs = fabsf(v[i]); best = v[i]; }
    }
    for (int m = 16; m > 0; m >>= 1) {  // carry the signed value of the largest magnitude
        const float ob = __shfl_xor_sync(0xffffffffu, best, m);
        const float oa = __shfl_xor_sync(0xffffffffu, best_abs, m);
        if (oa > best_abs) { best_abs = oa; best = ob; }
    }
    if (best_abs == 0.0f) {
        for (int i = 0; i < 8; i++) out->qs[lane * 8 + i] = 0;
        if (lane < DS4_QK_K / 16) out->bsums[lane] = 0;
        if (lane == 0) out->d = 0.0f;
        return;
    }
    const float iscale = -127.0f / best;
    int sum = 0;
    for (int i = 0; i < 8; i++) {
        int q = __float2int_rn(iscale * v[i]);
        q = q > 127 ? 127 : (q < -128 ? -128 : q);
        out->qs[lane * 8 + i] = (int8_t)q;
        sum += q;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // lanes 2j, 2j+1 cover values 16j .. 16j+15
    if ((lane & 1) == 0) out->bsums[lane >> 1] = (int16_t)sum;
    if (lane == 0) out->d = 1.0f / iscale;
}

// IQ2_XXS signs: 7 stored bits; the eighth makes the count of negatives even.
static __device__ __forceinline__ uint32_t ds4_iq2_sign_bits(uint32_t sign7) {
    return sign7 | ((uint32_t)(__popc(sign7) & 1) << 7);
}

// IQ2_XXS grid (GGML iq2xxs_grid): byte j of entry g is the magnitude of value j.
static __constant__ uint64_t ds4_iq2xxs_grid[256] = {
    0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
    0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x08080808082b0808ull,
    0x08080808082b082bull, 0x08080808082b2b08ull, 0x08080808082b2b2bull, 0x0808080819080819ull,
    0x0808080819081908ull, 0x0808080819190808ull, 0x0808080819192b08ull, 0x08080808192b0819ull,
    0x08080808192b1908ull, 0x080808082b080808ull, 0x080808082b08082bull, 0x080808082b082b2bull,
    0x080808082b2b082bull, 0x0808081908080819ull, 0x0808081908081908ull, 0x0808081908190808ull,
    0x0808081908191919ull, 0x0808081919080808ull, 0x080808192b081908ull, 0x080808192b192b08ull,
    0x0808082b08080808ull, 0x0808082b0808082bull, 0x0808082b082b082bull, 0x0808082b2b08082bull,
    0x0808190808080819ull, 0x0808190808081908ull, 0x0808190808190808ull, 0x08081908082b0819ull,
    0x08081908082b1908ull, 0x0808190819080808ull, 0x080819081908082bull, 0x0808190819082b08ull,
    0x08081908192b0808ull, 0x080819082b080819ull, 0x080819082b081908ull, 0x080819082b190808ull,
    0x080819082b2b1908ull, 0x0808191908080808ull, 0x080819190808082bull, 0x0808191908082b08ull,
    0x08081919082b0808ull, 0x080819191908192bull, 0x08081919192b2b19ull, 0x080819192b080808ull,
    0x080819192b190819ull, 0x0808192b08082b19ull, 0x0808192b08190808ull, 0x0808192b19080808ull,
    0x0808192b2b081908ull, 0x0808192b2b2b1908ull, 0x08082b0808080808ull, 0x08082b0808081919ull,
    0x08082b0808082b08ull, 0x08082b0808191908ull, 0x08082b08082b2b08ull, 0x08082b0819080819ull,
    0x08082b0819081908ull, 0x08082b0819190808ull, 0x08082b081919082bull, 0x08082b082b082b08ull,
    0x08082b1908081908ull, 0x08082b1919080808ull, 0x08082b2b0808082bull, 0x08082b2b08191908ull,
    0x0819080808080819ull, 0x0819080808081908ull, 0x0819080808190808ull, 0x08190808082b0819ull,
    0x0819080819080808ull, 0x08190808192b0808ull, 0x081908082b081908ull, 0x081908082b190808ull,
    0x081908082b191919ull, 0x0819081908080808ull, 0x0819081908082b08ull, 0x08190819082b0808ull,
    0x0819081919190808ull, 0x0819081919192b2bull, 0x081908192b080808ull, 0x0819082b082b1908ull,
    0x0819082b19081919ull, 0x0819190808080808ull, 0x0819190808082b08ull, 0x08191908082b0808ull,
    0x08191908082b1919ull, 0x0819190819082b19ull, 0x081919082b080808ull, 0x0819191908192b08ull,
    0x08191919192b082bull, 0x0819192b08080808ull, 0x0819192b0819192bull, 0x08192b0808080819ull,
    0x08192b0808081908ull, 0x08192b0808190808ull, 0x08192b0819080808ull, 0x08192b082b080819ull,
    0x08192b1908080808ull, 0x08192b1908081919ull, 0x08192b192b2b0808ull, 0x08192b2b19190819ull,
    0x082b080808080808ull, 0x082b08080808082bull, 0x082b080808082b2bull, 0x082b080819081908ull,
    0x082b0808192b0819ull, 0x082b08082b080808ull, 0x082b08082b08082bull, 0x082b0819082b2b19ull,
    0x082b081919082b08ull, 0x082b082b08080808ull, 0x082b082b0808082bull, 0x082b190808080819ull,
    0x082b190808081908ull, 0x082b190808190808ull, 0x082b190819080808ull, 0x082b19081919192bull,
    0x082b191908080808ull, 0x082b191919080819ull, 0x082b1919192b1908ull, 0x082b192b2b190808ull,
    0x082b2b0808082b08ull, 0x082b2b08082b0808ull, 0x082b2b082b191908ull, 0x082b2b2b19081908ull,
    0x1908080808080819ull, 0x1908080808081908ull, 0x1908080808190808ull, 0x1908080808192b08ull,
    0x19080808082b0819ull, 0x19080808082b1908ull, 0x1908080819080808ull, 0x1908080819082b08ull,
    0x190808081919192bull, 0x19080808192b0808ull, 0x190808082b080819ull, 0x190808082b081908ull,
    0x190808082b190808ull, 0x1908081908080808ull, 0x19080819082b0808ull, 0x19080819192b0819ull,
    0x190808192b080808ull, 0x190808192b081919ull, 0x1908082b08080819ull, 0x1908082b08190808ull,
    0x1908082b19082b08ull, 0x1908082b1919192bull, 0x1908082b192b2b08ull, 0x1908190808080808ull,
    0x1908190808082b08ull, 0x19081908082b0808ull, 0x190819082b080808ull, 0x190819082b192b19ull,
    0x190819190819082bull, 0x19081919082b1908ull, 0x1908192b08080808ull, 0x19082b0808080819ull,
    0x19082b0808081908ull, 0x19082b0808190808ull, 0x19082b0819080808ull, 0x19082b0819081919ull,
    0x19082b1908080808ull, 0x19082b1919192b08ull, 0x19082b19192b0819ull, 0x19082b192b08082bull,
    0x19082b2b19081919ull, 0x19082b2b2b190808ull, 0x1919080808080808ull, 0x1919080808082b08ull,
    0x1919080808190819ull, 0x1919080808192b19ull, 0x19190808082b0808ull, 0x191908082b080808ull,
    0x191908082b082b08ull, 0x1919081908081908ull, 0x191908191908082bull, 0x191908192b2b1908ull,
    0x1919082b2b190819ull, 0x191919082b190808ull, 0x191919082b19082bull, 0x1919191908082b2bull,
    0x1919192b08080819ull, 0x1919192b19191908ull, 0x19192b0808080808ull, 0x19192b0808190819ull,
    0x19192b0808192b19ull, 0x19192b08192b1908ull, 0x19192b1919080808ull, 0x19192b2b08082b08ull,
    0x192b080808081908ull, 0x192b080808190808ull, 0x192b080819080808ull, 0x192b0808192b2b08ull,
    0x192b081908080808ull, 0x192b081919191919ull, 0x192b082b08192b08ull, 0x192b082b192b0808ull,
    0x192b190808080808ull, 0x192b190808081919ull, 0x192b191908190808ull, 0x192b19190819082bull,
    0x192b19192b081908ull, 0x192b2b081908082bull, 0x2b08080808080808ull, 0x2b0808080808082bull,
    0x2b08080808082b2bull, 0x2b08080819080819ull, 0x2b0808082b08082bull, 0x2b08081908081908ull,
    0x2b08081908192b08ull, 0x2b08081919080808ull, 0x2b08082b08190819ull, 0x2b08190808080819ull,
    0x2b08190808081908ull, 0x2b08190808190808ull, 0x2b08190808191919ull, 0x2b08190819080808ull,
    0x2b081908192b0808ull, 0x2b08191908080808ull, 0x2b0819191908192bull, 0x2b0819192b191908ull,
    0x2b08192b08082b19ull, 0x2b08192b19080808ull, 0x2b08192b192b0808ull, 0x2b082b080808082bull,
    0x2b082b1908081908ull, 0x2b082b2b08190819ull, 0x2b19080808081908ull, 0x2b19080808190808ull,
    0x2b190808082b1908ull, 0x2b19080819080808ull, 0x2b1908082b2b0819ull, 0x2b1908190819192bull,
    0x2b1908192b080808ull, 0x2b19082b19081919ull, 0x2b19190808080808ull, 0x2b191908082b082bull,
    0x2b19190819081908ull, 0x2b19191919190819ull, 0x2b192b082b080819ull, 0x2b192b19082b0808ull,
    0x2b2b08080808082bull, 0x2b2b080819190808ull, 0x2b2b08082b081919ull, 0x2b2b081908082b19ull,
    0x2b2b082b08080808ull, 0x2b2b190808192b08ull, 0x2b2b2b0819190808ull, 0x2b2b2b1908081908ull,
};
