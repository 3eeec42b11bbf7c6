// tiny_metal.m: tinytarget's Metal backend (what porter ports; porter reads it, never compiles it).
// Tensors are shared-storage MTLBuffers; pipelines are made by kernel name from metal/tiny.metal.

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include "tiny_gpu.h"

typedef struct { uint64_t n; float s; } tiny_args_scale;
typedef struct { uint64_t n; } tiny_args_add;

@interface TinyMetalTensor : NSObject
@property(nonatomic, strong) id<MTLBuffer> buffer;
@property(nonatomic, assign) uint64_t offset;
@property(nonatomic, assign) uint64_t bytes;
@end

@implementation TinyMetalTensor
@end

static TinyMetalTensor *T(const tiny_gpu_tensor *tensor) {
    return (__bridge TinyMetalTensor *)(const void *)tensor;
}

static id<MTLDevice>         g_device;
static id<MTLLibrary>        g_library;
static id<MTLCommandQueue>   g_queue;

static id<MTLComputePipelineState> tiny_pipeline(const char *name) {
    id<MTLFunction> fn = [g_library newFunctionWithName:[NSString stringWithUTF8String:name]];
    if (!fn) return nil;
    NSError *err = nil;
    return [g_device newComputePipelineStateWithFunction:fn error:&err];
}

static bool tiny_holds(const tiny_gpu_tensor *t, uint64_t n) {
    return t && T(t).bytes >= n * sizeof(float);
}

int tiny_gpu_scale_tensor(
        tiny_gpu_tensor       *out,
        const tiny_gpu_tensor *x,
        float                  s,
        uint64_t               n) {
    if (!tiny_holds(out, n) || !tiny_holds(x, n)) return 1;
    if (n == 0) return 0;
    id<MTLComputePipelineState> pipeline = tiny_pipeline("kernel_scale_f32");
    if (!pipeline) return 1;
    tiny_args_scale args = { n, s };
    id<MTLCommandBuffer> cb = [g_queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(x).buffer offset:(NSUInteger)T(x).offset atIndex:1];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:2];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((n + 255) / 256), 1, 1)
        threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    [enc endEncoding];
    [cb commit];
    return 0;
}

int tiny_gpu_add_tensor(
        tiny_gpu_tensor       *out,
        const tiny_gpu_tensor *a,
        const tiny_gpu_tensor *b,
        uint64_t               n) {
    if (!tiny_holds(out, n) || !tiny_holds(a, n) || !tiny_holds(b, n)) return 1;
    if (n == 0) return 0;
    id<MTLComputePipelineState> pipeline = tiny_pipeline("kernel_add_f32");
    if (!pipeline) return 1;
    tiny_args_add args = { n };
    id<MTLCommandBuffer> cb = [g_queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
    [enc setComputePipelineState:pipeline];
    [enc setBytes:&args length:sizeof args atIndex:0];
    [enc setBuffer:T(a).buffer offset:(NSUInteger)T(a).offset atIndex:1];
    [enc setBuffer:T(b).buffer offset:(NSUInteger)T(b).offset atIndex:2];
    [enc setBuffer:T(out).buffer offset:(NSUInteger)T(out).offset atIndex:3];
    [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)((n + 255) / 256), 1, 1)
        threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
    [enc endEncoding];
    [cb commit];
    return 0;
}
