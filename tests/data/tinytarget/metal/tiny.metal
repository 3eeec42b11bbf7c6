#include <metal_stdlib>
using namespace metal;

typedef struct { uint64_t n; float s; } tiny_args_scale;
typedef struct { uint64_t n; } tiny_args_add;

// dst[i] = x[i] * s.   grid: (ceil(n / 256), 1, 1)   threadgroup: (256, 1, 1)
kernel void kernel_scale_f32(
        constant tiny_args_scale & args [[buffer(0)]],
        device const float * x   [[buffer(1)]],
        device       float * dst [[buffer(2)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig < args.n) {
        dst[tpig] = x[tpig] * args.s;
    }
}

// dst[i] = a[i] + b[i]; dst may be a.   grid: (ceil(n / 256), 1, 1)   threadgroup: (256, 1, 1)
kernel void kernel_add_f32(
        constant tiny_args_add & args [[buffer(0)]],
        device const float * a   [[buffer(1)]],
        device const float * b   [[buffer(2)]],
        device       float * dst [[buffer(3)]],
        uint tpig [[thread_position_in_grid]]) {
    if (tpig < args.n) {
        dst[tpig] = a[tpig] + b[tpig];
    }
}
