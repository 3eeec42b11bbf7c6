// mini_metal.m — minimoe's Metal backend (the source that porter ports).
//
// Every function of mini_gpu.h is implemented here by encoding compute
// pipelines from one MTLLibrary built at init from metal/*.metal.  Pipelines
// are looked up by kernel name and cached.  Work is encoded into one open
// command buffer and committed by mini_gpu_synchronize() or by anything that
// must see finished results on the host (tensor reads and writes, the id
// checks of the embedding and the routed experts).
//
// Tensors are shared-storage MTLBuffers (a view shares its base's buffer at an
// offset).  Weights are never copied: the engine's memory-mapped GGUF is
// wrapped once in a no-copy MTLBuffer and bound at each weight's byte offset.
//
// This file is built only on macOS (clang -fobjc-arc -framework Metal
// -framework Foundation); porter reads it, it never compiles it.

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mini_gpu.h"

// ---- Shapes shared with the kernels (metal/common.metal and friends) --------

#define N_SIMDWIDTH      32
#define QK8_0            32
#define QK_K             256
#define MINI_MV_NSG      4
#define MINI_MV_CHUNK    2048
#define MINI_ATTN_NSG    4
#define MINI_ATTN_DPL    4
#define MINI_ROUTER_EPL  4
#define MINI_ROUTER_TOPK 8

#define Q8_0_BYTES    34
#define Q4_K_BYTES    144
#define Q2_K_BYTES    84
#define IQ2_XXS_BYTES 66

// Host mirrors of the kernels' argument structs (same field order and types).
typedef struct { uint32_t n_embd; uint32_t n_tokens; } mini_args_get_rows;
typedef struct { uint64_t in_dim; uint64_t out_dim; uint64_t n_tok; uint64_t row_bytes; } mini_args_mul_mv;
typedef struct { uint32_t n; uint32_t n_rows; float eps; } mini_args_rms_norm;
typedef struct {
    uint32_t n_tokens; uint32_t n_head; uint32_t head_dim; uint32_t n_rot; uint32_t pos0; float freq_base;
} mini_args_rope_tail;
typedef struct {
    uint32_t n_tokens; uint32_t pos0; uint32_t n_head; uint32_t head_dim; uint32_t window; float scale;
} mini_args_attn_window;
typedef struct { uint32_t n_expert; uint32_t n_tokens; uint32_t top_k; } mini_args_router;
typedef struct {
    uint64_t in_dim; uint64_t out_dim; uint64_t row_bytes; uint64_t expert_bytes;
    uint32_t n_expert; uint32_t n_slots; uint32_t x_div;
} mini_args_mul_mv_id;
typedef struct { uint32_t n_embd; uint32_t n_tokens; uint32_t top_k; } mini_args_moe_sum;
typedef struct { uint64_t n; } mini_args_elementwise;
typedef struct { uint64_t n; } mini_args_checksum;

// The kernel sources, concatenated in this order into one library.
static const char *k_metal_sources[] = {
    "metal/common.metal",
    "metal/dense.metal",
    "metal/rows.metal",
    "metal/attention.metal",
    "metal/moe.metal",
};

// The two RMS norm flavours are instantiations of one template kernel.
enum { MINI_NORM_PLAIN = 0, MINI_NORM_WEIGHT = 1 };
static const char *k_norm_kernels[] = { "kernel_rms_norm_plain_f32", "kernel_rms_norm_weight_f32" };

// ---- Tensors ------------------------------------------------------------------

@interface MiniMetalTensor : NSObject
@property(nonatomic, strong) id<MTLBuffer> buffer;
@property(nonatomic, assign) uint64_t offset;
@property(nonatomic, assign) uint64_t bytes;
@property(nonatomic, assign) BOOL owner;
@end

@implementation MiniMetalTensor
@end

static MiniMetalTensor *T(const mini_gpu_tensor *tensor) {
    return (__bridge MiniMetalTensor *)(const void *)tensor;
}

static uint8_t *mini_tensor_contents(const mini_gpu_tensor *tensor) {
    MiniMetalTensor *obj = T(tensor);
    return (uint8_t *)[obj.buffer contents] + obj.offset;
}

// The tensor holds at least count elements of elem_bytes.
static bool mini_holds(const mini_gpu_tensor *tensor, uint64_t count, uint64_t elem_bytes) {
    if (!tensor) return false;
    if (elem_bytes != 0 && count > UINT64_MAX / elem_bytes) return false;
    return T(tensor).bytes >= count * elem_bytes;
}

static bool mini_range_ok(uint64_t offset, uint64_t bytes, uint64_t size) {
    return offset <= size && bytes <= size - offset;
}

// ---- Device state ---------------------------------------------------------------

static id<MTLDevice>                g_device;
static id<MTLCommandQueue>          g_queue;
static id<MTLLibrary>               g_library;
static id<MTLCommandBuffer>         g_cb;          // open command buffer, nil when idle
static id<MTLComputeCommandEncoder> g_enc;         // open compute encoder of g_cb
static NSMutableDictionary<NSString *, id<MTLComputePipelineState>> *g_pipelines;
static NSMutableDictionary<NSString *, id<MTLBuffer>>               *g_model_buffers;
static NSMutableArray<id<MTLBuffer>>                                *g_transient;   // scratch alive until the next flush

static id<MTLComputeCommandEncoder> mini_encoder(void) {
    if (!g_cb) g_cb = [g_queue commandBuffer];
    if (!g_enc) g_enc = [g_cb computeCommandEncoder];
    return g_enc;
}

static void mini_end_encoder(void) {
    if (g_enc) {
        [g_enc endEncoding];
        g_enc = nil;
    }
}

// Commits everything encoded so far and waits for it.
static int mini_flush(void) {
    mini_end_encoder();
    if (!g_cb) return 0;
    id<MTLCommandBuffer> cb = g_cb;
    g_cb = nil;
    [cb commit];
    [cb waitUntilCompleted];
    [g_transient removeAllObjects];
    if (cb.status == MTLCommandBufferStatusError) {
        fprintf(stderr, "minimoe-metal: command buffer failed: %s\n",
                [[cb.error localizedDescription] UTF8String]);
        return 1;
    }
    return 0;
}

static NSString *mini_metal_library_source(void) {
    NSMutableString *source = [NSMutableString string];
    const char *dir = getenv("MINI_METAL_DIR");   // folder holding metal/, default: the working directory
    for (size_t i = 0; i < sizeof k_metal_sources / sizeof k_metal_sources[0]; i++) {
        NSString *path = [NSString stringWithFormat:@"%s%s%s", dir ? dir : "", dir ? "/" : "", k_metal_sources[i]];
        NSError *error = nil;
        NSString *text = [NSString stringWithContentsOfFile:path encoding:NSUTF8StringEncoding error:&error];
        if (!text) {
            fprintf(stderr, "minimoe-metal: cannot read %s: %s\n", [path UTF8String],
                    [[error localizedDescription] UTF8String]);
            return nil;
        }
        [source appendFormat:@"// ---- %s ----\n%@\n", k_metal_sources[i], text];
    }
    return source;
}

// A compute pipeline for a kernel, by name, specialised by function constants
// when given; cached under key.
static id<MTLComputePipelineState> mini_pipeline_with_constants(
        const char                 *name,
        MTLFunctionConstantValues  *constants,
        NSString                   *key) {
    id<MTLComputePipelineState> cached = g_pipelines[key];
    if (cached) return cached;

    NSError *error = nil;
    NSString *fn_name = [NSString stringWithUTF8String:name];
    id<MTLFunction> fn = constants
        ? [g_library newFunctionWithName:fn_name constantValues:constants error:&error]
        : [g_library newFunctionWithName:fn_name];
    if (!fn) {
        fprintf(stderr, "minimoe-metal: kernel %s not found%s%s\n", name,
                error ? ": " : "", error ? [[error localizedDescription] UTF8String] : "");
        return nil;
    }
    id<MTLComputePipelineState> pipeline = [g_device newComputePipelineStateWithFunction:fn error:&error];
    if (!pipeline) {
        fprintf(stderr, "minimoe-metal: pipeline %s failed: %s\n", name,
                [[error localizedDescription] UTF8String]);
        return nil;
    }
    g_pipelines[key] = pipeline;
    return pipeline;
}

static id<MTLComputePipelineState> mini_pipeline(const char *name) {
    return mini_pipeline_with_constants(name, nil, [NSString stringWithUTF8String:name]);
}

// The attention kernel is specialised on whether the sink logit joins the
// softmax (FC_attn_has_sinks, function constant 0).
static id<MTLComputePipelineState> mini_attn_pipeline(bool has_sinks) {
    MTLFunctionConstantValues *constants = [[MTLFunctionConstantValues alloc] init];
    [constants setConstantValue:&has_sinks type:MTLDataTypeBool atIndex:0];
    NSString *key = [NSString stringWithFormat:@"kernel_attn_window_f32|sinks=%d", has_sinks ? 1 : 0];
    return mini_pipeline_with_constants("kernel_attn_window_f32", constants, key);
}

// The whole model map as one no-copy buffer (the engine's map is an mmap, so
// page aligned); weights are bound at their byte offset into it.
static id<MTLBuffer> mini_model_buffer(const void *model_map, uint64_t model_size,
                                       uint64_t offset, uint64_t bytes) {
    if (!model_map || !mini_range_ok(offset, bytes, model_size)) return nil;
    NSString *key = [NSString stringWithFormat:@"%p:%llu", model_map, (unsigned long long)model_size];
    id<MTLBuffer> buffer = g_model_buffers[key];
    if (buffer) return buffer;

    const uint64_t page = (uint64_t)getpagesize();
    if ((uintptr_t)model_map % page != 0) {
        fprintf(stderr, "minimoe-metal: model map is not page aligned\n");
        return nil;
    }
    const uint64_t length = (model_size + page - 1) / page * page;
    buffer = [g_device newBufferWithBytesNoCopy:(void *)model_map
                                         length:(NSUInteger)length
                                        options:MTLResourceStorageModeShared
                                    deallocator:nil];
    if (!buffer) return nil;
    g_model_buffers[key] = buffer;
    return buffer;
}

// ---- Runtime and tensor lifetime ----------------------------------------------

int mini_gpu_init(void) {
    @autoreleasepool {
        if (g_device) return 0;
        g_device = MTLCreateSystemDefaultDevice();
        if (!g_device) {
            fprintf(stderr, "minimoe-metal: no Metal device\n");
            return 1;
        }
        g_queue = [g_device newCommandQueue];
        g_pipelines = [NSMutableDictionary dictionary];
        g_model_buffers = [NSMutableDictionary dictionary];
        g_transient = [NSMutableArray array];

        NSString *source = mini_metal_library_source();
        if (!g_queue || !source) {
            g_device = nil;
            return 1;
        }
        NSError *error = nil;
        MTLCompileOptions *options = [MTLCompileOptions new];
        g_library = [g_device newLibraryWithSource:source options:options error:&error];
        if (!g_library) {
            fprintf(stderr, "minimoe-metal: shader compilation failed: %s\n",
                    [[error localizedDescription] UTF8String]);
            g_queue = nil;
            g_device = nil;
            return 1;
        }
        return 0;
    }
}

void mini_gpu_cleanup(void) {
    if (!g_device) return;
    mini_flush();
    g_pipelines = nil;
    g_model_buffers = nil;
    g_transient = nil;
    g_library = nil;
    g_queue = nil;
    g_device = nil;
}

mini_gpu_tensor *mini_gpu_tensor_alloc(uint64_t bytes) {
    if (!g_device && mini_gpu_init() != 0) return NULL;
    id<MTLBuffer> buffer = [g_device newBufferWithLength:(NSUInteger)(bytes ? bytes : 16)
                                                 options:MTLResourceStorageModeShared];
    if (!buffer) return NULL;
    memset([buffer contents], 0, buffer.length);
    MiniMetalTensor *tensor = [MiniMetalTensor new];
    tensor.buffer = buffer;
    tensor.offset = 0;
    tensor.bytes = bytes;
    tensor.owner = YES;
    return (mini_gpu_tensor *)(__bridge_retained void *)tensor;
}

mini_gpu_tensor *mini_gpu_tensor_view(const mini_gpu_tensor *base, uint64_t offset, uint64_t bytes) {
    if (!base) return NULL;
    MiniMetalTensor *b = T(base);
    if (!mini_range_ok(offset, bytes, b.bytes)) return NULL;
    MiniMetalTensor *view = [MiniMetalTensor new];
    view.buffer = b.buffer;
    view.offset = b.offset + offset;
    view.bytes = bytes;
    view.owner = NO;
    return (mini_gpu_tensor *)(__bridge_retained void *)view;
}

void mini_gpu_tensor_free(mini_gpu_tensor *tensor) {
    if (!tensor) return;
    // Pending work may still use the buffer; ARC keeps it alive while the
    // command buffer references it.
    MiniMetalTensor *obj = (__bridge_transfer MiniMetalTensor *)(void *)tensor;
    obj.buffer = nil;
}

uint64_t mini_gpu_tensor_bytes(const mini_gpu_tensor *tensor) {
    return tensor ? T(tensor).bytes : 0;
}

int mini_gpu_tensor_write(mini_gpu_tensor *tensor, uint64_t offset, const void *data, uint64_t bytes) {
    if (!tensor || (!data && bytes != 0)) return 1;
    if (!mini_range_ok(offset, bytes, T(tensor).bytes)) return 1;
    if (mini_flush()) return 1;          // earlier ops may still read or write the tensor
    if (bytes) memcpy(mini_tensor_contents(tensor) + offset, data, (size_t)bytes);
    return 0;
}

int mini_gpu_tensor_read(const mini_gpu_tensor *tensor, uint64_t offset, void *data, uint64_t bytes) {
    if (!tensor || (!data && bytes != 0)) return 1;
    if (!mini_range_ok(offset, bytes, T(tensor).bytes)) return 1;
    if (mini_flush()) return 1;
    if (bytes) memcpy(data, mini_tensor_contents(tensor) + offset, (size_t)bytes);
    return 0;
}

int mini_gpu_tensor_copy(mini_gpu_tensor *dst, uint64_t dst_offset,
                         const mini_gpu_tensor *src, uint64_t src_offset,
                         uint64_t bytes) {
    if (!dst || !src) return 1;
    MiniMetalTensor *d = T(dst);
    MiniMetalTensor *s = T(src);
    if (!mini_range_ok(dst_offset, bytes, d.bytes) || !mini_range_ok(src_offset, bytes, s.bytes)) return 1;
    if (bytes == 0) return 0;

    const uint64_t so = s.offset + src_offset, doff = d.offset + dst_offset;
    if (d.buffer == s.buffer && so < doff + bytes && doff < so + bytes) {
        // A blit between overlapping ranges of one buffer is undefined: move on the host.
        if (mini_flush()) return 1;
        uint8_t *base = (uint8_t *)[d.buffer contents];
        memmove(base + doff, base + so, (size_t)bytes);
        return 0;
    }
    mini_end_encoder();
    if (!g_cb) g_cb = [g_queue commandBuffer];
    id<MTLBlitCommandEncoder> blit = [g_cb blitCommandEncoder];
    [blit copyFromBuffer:s.buffer
            sourceOffset:(NSUInteger)so
                toBuffer:d.buffer
       destinationOffset:(NSUInteger)doff
                    size:(NSUInteger)bytes];
    [blit endEncoding];
    return 0;
}

int mini_gpu_synchronize(void) {
    return mini_flush();
}

// ---- Embedding ------------------------------------------------------------------

int mini_gpu_embed_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *tokens,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n_vocab,
        uint32_t               n_embd,
        uint32_t               n_tokens) {
    if (!mini_holds(out, (uint64_t)n_tokens * n_embd, sizeof(float)) || !mini_holds(tokens, n_tokens, sizeof(int32_t))) return 1;
    id<MTLBuffer> wbuf = mini_model_buffer(model_map, model_size, weight_offset, (uint64_t)n_vocab * n_embd * 2);
    if (!wbuf) return 1;
    if (n_tokens == 0 || n_embd == 0) return 0;

    // Token ids may be the result of earlier work: finish it and check them,
    // an id outside the vocabulary is an error and not a clamp.
    if (mini_flush()) return 1;
    const int32_t *ids = (const int32_t *)mini_tensor_contents(tokens);
    for (uint32_t t = 0; t < n_tokens; t++) {
        if (ids[t] < 0 || (uint32_t)ids[t] >= n_vocab) return 1;
    }

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_get_rows_f16");
    if (!pipeline) return 1;
    mini_args_get_rows args = { n_embd, n_tokens };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:wbuf offset:(NSUInteger)weight_offset atIndex:1];
    [enc setBuffer:T(tokens).buffer offset:(NSUInteger)T(tokens).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake(n_tokens, 1, 1)
        threadsPerThreadgroup:MTLSizeMake(MIN(n_embd, 256u), 1, 1)];
    return 0;
}

// ---- Norms -----------------------------------------------------------------------

static int mini_metal_rms_norm(int kind, mini_gpu_tensor *out, const mini_gpu_tensor *x,
                               id<MTLBuffer> wbuf, uint64_t weight_offset,
                               uint32_t n, uint32_t n_rows, float eps) {
    const uint64_t count = (uint64_t)n * n_rows;
    if (n == 0 || !mini_holds(out, count, sizeof(float)) || !mini_holds(x, count, sizeof(float))) return 1;
    if (n_rows == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline(k_norm_kernels[kind]);
    if (!pipeline) return 1;
    NSUInteger nth = MIN((NSUInteger)1024, ((NSUInteger)n + N_SIMDWIDTH - 1) / N_SIMDWIDTH * N_SIMDWIDTH);
    nth = MIN(nth, pipeline.maxTotalThreadsPerThreadgroup);

    mini_args_rms_norm args = { n, n_rows, eps };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:1];
    if (kind == MINI_NORM_WEIGHT) {
        [enc setBuffer:wbuf offset:(NSUInteger)weight_offset atIndex:2];
    } else {
        [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:2];   // unused placeholder
    }
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc setThreadgroupMemoryLength:N_SIMDWIDTH * sizeof(float) atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(n_rows, 1, 1)
        threadsPerThreadgroup:MTLSizeMake(nth, 1, 1)];
    return 0;
}

int mini_gpu_rms_norm_plain_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    return mini_metal_rms_norm(MINI_NORM_PLAIN, out, x, nil, 0, n, n_rows, eps);
}

int mini_gpu_rms_norm_weight_rows_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *x,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint32_t               n,
        uint32_t               n_rows,
        float                  eps) {
    id<MTLBuffer> wbuf = mini_model_buffer(model_map, model_size, weight_offset, (uint64_t)n * sizeof(float));
    if (!wbuf) return 1;
    return mini_metal_rms_norm(MINI_NORM_WEIGHT, out, x, wbuf, weight_offset, n, n_rows, eps);
}

// ---- Dense projections ------------------------------------------------------------

// y = W x for W of one GGUF type; the kernel is kernel_mul_mv_<type>_f32.
static int mini_metal_mul_mv(
        const char            *type_name,
        uint64_t               block_vals,
        uint64_t               block_bytes,
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    if (in_dim == 0 || in_dim % block_vals != 0) return 1;
    if (!mini_holds(out, n_tok * out_dim, sizeof(float)) || !mini_holds(x, n_tok * in_dim, sizeof(float))) return 1;
    const uint64_t row_bytes = in_dim / block_vals * block_bytes;
    id<MTLBuffer> wbuf = mini_model_buffer(model_map, model_size, weight_offset, out_dim * row_bytes);
    if (!wbuf) return 1;
    if (n_tok == 0 || out_dim == 0) return 0;

    char name[64];
    snprintf(name, sizeof name, "kernel_mul_mv_%s_f32", type_name);
    id<MTLComputePipelineState> pipeline = mini_pipeline(name);
    if (!pipeline) return 1;

    mini_args_mul_mv args = { in_dim, out_dim, n_tok, row_bytes };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:wbuf offset:(NSUInteger)weight_offset atIndex:1];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    if (block_vals > 1) {
        // Quantized kernels stage the input row in threadgroup memory; F16 does not.
        [enc setThreadgroupMemoryLength:MINI_MV_CHUNK * sizeof(float) atIndex:0];
    }
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((out_dim + MINI_MV_NSG - 1) / MINI_MV_NSG), (NSUInteger)n_tok, 1)
        threadsPerThreadgroup:MTLSizeMake(MINI_MV_NSG * N_SIMDWIDTH, 1, 1)];
    return 0;
}

int mini_gpu_matmul_q8_0_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return mini_metal_mul_mv("q8_0", QK8_0, Q8_0_BYTES, out, model_map, model_size, weight_offset,
                             in_dim, out_dim, x, n_tok);
}

int mini_gpu_matmul_f16_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return mini_metal_mul_mv("f16", 1, 2, out, model_map, model_size, weight_offset,
                             in_dim, out_dim, x, n_tok);
}

int mini_gpu_matmul_q4_k_tensor(
        mini_gpu_tensor       *out,
        const void            *model_map,
        uint64_t               model_size,
        uint64_t               weight_offset,
        uint64_t               in_dim,
        uint64_t               out_dim,
        const mini_gpu_tensor *x,
        uint64_t               n_tok) {
    return mini_metal_mul_mv("q4_k", QK_K, Q4_K_BYTES, out, model_map, model_size, weight_offset,
                             in_dim, out_dim, x, n_tok);
}

// ---- Positional encoding -------------------------------------------------------

int mini_gpu_rope_tail_tensor(
        mini_gpu_tensor *x,
        uint32_t         n_tokens,
        uint32_t         n_head,
        uint32_t         head_dim,
        uint32_t         n_rot,
        uint32_t         pos0,
        float            freq_base) {
    if (n_rot % 2 != 0 || n_rot > head_dim) return 1;
    if (!mini_holds(x, (uint64_t)n_tokens * n_head * head_dim, sizeof(float))) return 1;
    if (n_tokens == 0 || n_head == 0 || n_rot == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_rope_tail_f32");
    if (!pipeline) return 1;
    mini_args_rope_tail args = { n_tokens, n_head, head_dim, n_rot, pos0, freq_base };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:1];
    [enc dispatchThreadgroups:MTLSizeMake(n_head, n_tokens, 1)
        threadsPerThreadgroup:MTLSizeMake(n_rot / 2, 1, 1)];
    return 0;
}

// ---- Attention -------------------------------------------------------------------

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
        float                  scale) {
    const uint64_t n_q = (uint64_t)n_tokens * n_head * head_dim;
    const uint64_t n_kv = ((uint64_t)pos0 + n_tokens) * head_dim;
    if (!mini_holds(out, n_q, sizeof(float)) || !mini_holds(q, n_q, sizeof(float))) return 1;
    if (!mini_holds(k_cache, n_kv, sizeof(float)) || !mini_holds(v_cache, n_kv, sizeof(float))) return 1;
    if (head_dim > N_SIMDWIDTH * MINI_ATTN_DPL) return 1;   // one lane holds at most MINI_ATTN_DPL dims
    id<MTLBuffer> sbuf = mini_model_buffer(model_map, model_size, sinks_offset, (uint64_t)n_head * sizeof(float));
    if (!sbuf) return 1;
    if (n_q == 0) return 0;

    // Every minimoe layer has learned sinks.
    id<MTLComputePipelineState> pipeline = mini_attn_pipeline(true);
    if (!pipeline) return 1;

    mini_args_attn_window args = { n_tokens, pos0, n_head, head_dim, window, scale };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(q).buffer offset:(NSUInteger)T(q).offset atIndex:1];
    [enc setBuffer:T(k_cache).buffer offset:(NSUInteger)T(k_cache).offset atIndex:2];
    [enc setBuffer:T(v_cache).buffer offset:(NSUInteger)T(v_cache).offset atIndex:3];
    [enc setBuffer:sbuf offset:(NSUInteger)sinks_offset atIndex:4];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:5];
    [enc setThreadgroupMemoryLength:MINI_ATTN_NSG * (2 + N_SIMDWIDTH * MINI_ATTN_DPL) * sizeof(float) atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(n_head, n_tokens, 1)
        threadsPerThreadgroup:MTLSizeMake(N_SIMDWIDTH * MINI_ATTN_NSG, 1, 1)];
    return 0;
}

// ---- Mixture of experts ---------------------------------------------------------

int mini_gpu_router_topk_tensor(
        mini_gpu_tensor       *expert_ids,
        mini_gpu_tensor       *expert_weights,
        const mini_gpu_tensor *logits,
        uint32_t               n_expert,
        uint32_t               n_tokens,
        uint32_t               top_k) {
    if (top_k == 0 || top_k > n_expert) return 1;
    if (n_expert > N_SIMDWIDTH * MINI_ROUTER_EPL || top_k > MINI_ROUTER_TOPK) return 1;
    if (!mini_holds(logits, (uint64_t)n_tokens * n_expert, sizeof(float))) return 1;
    if (!mini_holds(expert_ids, (uint64_t)n_tokens * top_k, sizeof(int32_t)) ||
        !mini_holds(expert_weights, (uint64_t)n_tokens * top_k, sizeof(float))) return 1;
    if (n_tokens == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_router_topk_f32");
    if (!pipeline) return 1;
    mini_args_router args = { n_expert, n_tokens, top_k };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(logits).buffer offset:(NSUInteger)T(logits).offset atIndex:1];
    [enc setBuffer:T(expert_ids).buffer offset:(NSUInteger)T(expert_ids).offset atIndex:2];
    [enc setBuffer:T(expert_weights).buffer offset:(NSUInteger)T(expert_weights).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake(n_tokens, 1, 1)
        threadsPerThreadgroup:MTLSizeMake(N_SIMDWIDTH, 1, 1)];
    return 0;
}

// Finishes pending work and checks every expert id of n_slots slots.
static int mini_metal_check_expert_ids(const mini_gpu_tensor *expert_ids, uint64_t n_slots, uint32_t n_expert) {
    if (!mini_holds(expert_ids, n_slots, sizeof(int32_t))) return 1;
    if (mini_flush()) return 1;
    const int32_t *ids = (const int32_t *)mini_tensor_contents(expert_ids);
    for (uint64_t i = 0; i < n_slots; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= n_expert) return 1;
    }
    return 0;
}

// Encodes one routed mat-vec: dst[s] = W_{ids[s]} x[s / x_div].
static void mini_metal_encode_mul_mv_id(
        id<MTLComputePipelineState> pipeline,
        const mini_args_mul_mv_id  *args,
        id<MTLBuffer>               wbuf,
        uint64_t                    weight_offset,
        const mini_gpu_tensor      *x,
        const mini_gpu_tensor      *expert_ids,
        id<MTLBuffer>               dst,
        uint64_t                    dst_offset) {
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:args length:sizeof *args atIndex:0];
    [enc setBuffer:wbuf offset:(NSUInteger)weight_offset atIndex:1];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:2];
    [enc setBuffer:T(expert_ids).buffer offset:(NSUInteger)T(expert_ids).offset atIndex:3];
    [enc setBuffer:dst offset:(NSUInteger)dst_offset atIndex:4];
    [enc setThreadgroupMemoryLength:MINI_MV_CHUNK * sizeof(float) atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((args->out_dim + MINI_MV_NSG - 1) / MINI_MV_NSG), args->n_slots, 1)
        threadsPerThreadgroup:MTLSizeMake(MINI_MV_NSG * N_SIMDWIDTH, 1, 1)];
}

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
        uint32_t               top_k) {
    if (n_embd == 0 || n_embd % QK_K != 0) return 1;
    const uint64_t n_slots = (uint64_t)n_tokens * top_k;
    const uint64_t row_bytes = (uint64_t)(n_embd / QK_K) * IQ2_XXS_BYTES;
    const uint64_t expert_bytes = (uint64_t)n_ff * row_bytes;
    if (!mini_holds(gate, n_slots * n_ff, sizeof(float)) || !mini_holds(up, n_slots * n_ff, sizeof(float))) return 1;
    if (!mini_holds(x, (uint64_t)n_tokens * n_embd, sizeof(float))) return 1;
    id<MTLBuffer> gbuf = mini_model_buffer(model_map, model_size, gate_offset, expert_bytes * n_expert);
    id<MTLBuffer> ubuf = mini_model_buffer(model_map, model_size, up_offset, expert_bytes * n_expert);
    if (!gbuf || !ubuf) return 1;
    if (mini_metal_check_expert_ids(expert_ids, n_slots, n_expert)) return 1;
    if (n_slots == 0 || n_ff == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_mul_mv_id_iq2_xxs_f32");
    if (!pipeline) return 1;
    // Gate and up read the token's input row: slot s uses row s / top_k.
    const mini_args_mul_mv_id args = { n_embd, n_ff, row_bytes, expert_bytes, n_expert, (uint32_t)n_slots, top_k };
    mini_metal_encode_mul_mv_id(pipeline, &args, gbuf, gate_offset, x, expert_ids, T(gate).buffer, T(gate).offset);
    mini_metal_encode_mul_mv_id(pipeline, &args, ubuf, up_offset, x, expert_ids, T(up).buffer, T(up).offset);
    return 0;
}

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
        uint32_t               top_k) {
    if (n_ff == 0 || n_ff % QK_K != 0) return 1;
    const uint64_t n_slots = (uint64_t)n_tokens * top_k;
    const uint64_t row_bytes = (uint64_t)(n_ff / QK_K) * Q2_K_BYTES;
    const uint64_t expert_bytes = (uint64_t)n_embd * row_bytes;
    if (!mini_holds(out, (uint64_t)n_tokens * n_embd, sizeof(float))) return 1;
    if (!mini_holds(mid, n_slots * n_ff, sizeof(float)) || !mini_holds(expert_weights, n_slots, sizeof(float))) return 1;
    id<MTLBuffer> wbuf = mini_model_buffer(model_map, model_size, down_offset, expert_bytes * n_expert);
    if (!wbuf) return 1;
    if (mini_metal_check_expert_ids(expert_ids, n_slots, n_expert)) return 1;
    if (n_tokens == 0 || n_embd == 0) return 0;

    // Per slot outputs go to scratch, then the weighted sum over each token's slots.
    id<MTLBuffer> scratch = [g_device newBufferWithLength:(NSUInteger)(n_slots * n_embd * sizeof(float))
                                                  options:MTLResourceStorageModePrivate];
    if (!scratch) return 1;
    [g_transient addObject:scratch];

    id<MTLComputePipelineState> down = mini_pipeline("kernel_mul_mv_id_q2_k_f32");
    id<MTLComputePipelineState> combine = mini_pipeline("kernel_moe_weighted_sum_f32");
    if (!down || !combine) return 1;

    // Down reads the slot's own mid row: x_div = 1.
    const mini_args_mul_mv_id args = { n_ff, n_embd, row_bytes, expert_bytes, n_expert, (uint32_t)n_slots, 1 };
    mini_metal_encode_mul_mv_id(down, &args, wbuf, down_offset, mid, expert_ids, scratch, 0);

    mini_args_moe_sum sum_args = { n_embd, n_tokens, top_k };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:combine];
    [enc setBytes:&sum_args length:sizeof sum_args atIndex:0];
    [enc setBuffer:scratch offset:0 atIndex:1];
    [enc setBuffer:T(expert_weights).buffer offset:(NSUInteger)T(expert_weights).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake((n_embd + 255) / 256, n_tokens, 1)
        threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    return 0;
}

// ---- Elementwise ------------------------------------------------------------------

int mini_gpu_swiglu_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *gate,
        const mini_gpu_tensor *up,
        uint64_t               n) {
    if (!mini_holds(out, n, sizeof(float)) || !mini_holds(gate, n, sizeof(float)) || !mini_holds(up, n, sizeof(float))) return 1;
    if (n == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_swiglu_f32");
    if (!pipeline) return 1;
    mini_args_elementwise args = { n };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(gate).buffer offset:(NSUInteger)T(gate).offset atIndex:1];
    [enc setBuffer:T(up).buffer offset:(NSUInteger)T(up).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((n + 255) / 256), 1, 1)
        threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    return 0;
}

int mini_gpu_add_tensor(
        mini_gpu_tensor       *out,
        const mini_gpu_tensor *a,
        const mini_gpu_tensor *b,
        uint64_t               n) {
    if (!mini_holds(out, n, sizeof(float)) || !mini_holds(a, n, sizeof(float)) || !mini_holds(b, n, sizeof(float))) return 1;
    if (n == 0) return 0;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_add_f32");
    if (!pipeline) return 1;
    mini_args_elementwise args = { n };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(a).buffer offset:(NSUInteger)T(a).offset atIndex:1];
    [enc setBuffer:T(b).buffer offset:(NSUInteger)T(b).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((n + 255) / 256), 1, 1)
        threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    return 0;
}

// ---- Diagnostics ------------------------------------------------------------------

int mini_gpu_debug_checksum_tensor(
        mini_gpu_tensor       *checksum,
        const mini_gpu_tensor *x,
        uint64_t               n) {
    if (!mini_holds(checksum, 2, sizeof(float)) || !mini_holds(x, n, sizeof(float))) return 1;

    id<MTLComputePipelineState> pipeline = mini_pipeline("kernel_debug_checksum_f32");
    if (!pipeline) return 1;
    const NSUInteger nth = MIN((NSUInteger)1024, pipeline.maxTotalThreadsPerThreadgroup);
    mini_args_checksum args = { n };
    id<MTLComputeCommandEncoder> enc = mini_encoder();
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:1];
    [enc setBuffer:T(checksum).buffer offset:(NSUInteger)T(checksum).offset atIndex:2];
    [enc setThreadgroupMemoryLength:N_SIMDWIDTH * sizeof(float) atIndex:0];
    [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1)
        threadsPerThreadgroup:MTLSizeMake(nth, 1, 1)];
    return 0;
}
