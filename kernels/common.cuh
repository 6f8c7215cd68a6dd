// common.cuh -- helpers shared by every Reflex kernel file.
//
// Conventions: activations are float32, row-major, last axis contiguous (NumPy order);
// KV caches are __half (n_ctx, n_head_kv, head_dim). Kernels are extern "C" so the runtime finds
// them by name in the fatbin (cuModuleGetFunction); every kernel name starts with "rx_".
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#define RX_EXTERN extern "C" __global__

__device__ __forceinline__ float rx_f16(const uint8_t* p) {
    // unaligned-safe fp16 load (block fields sit at any byte offset)
    uint16_t u = (uint16_t)p[0] | ((uint16_t)p[1] << 8);
    return __half2float(__ushort_as_half(u));
}

__device__ __forceinline__ float rx_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float rx_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); `sh` holds >= 32 floats.
__device__ __forceinline__ float rx_block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? sh[threadIdx.x] : 0.f;
    if (w == 0) v = rx_warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float rx_block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = rx_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? sh[threadIdx.x] : -INFINITY;
    if (w == 0) v = rx_warp_max(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

// A scalar that is either an immediate or, when `p` is non-null, read from device memory (the
// decode step's state, so a captured CUDA graph replays with the current position).
__device__ __forceinline__ int rx_dyn(int imm, const int* p) { return p ? *p : imm; }
