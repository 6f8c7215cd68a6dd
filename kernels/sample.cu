// sample.cu -- on-device token choice, so only the token id crosses to the host.
//
// rx_argmax(x, n, out, state): index of the largest of x[0..n) (first one on ties, NaN ignored,
//   as numpy.argmax on finite logits); written to out[0] and, when state is non-null, to
//   state[0] (the next captured decode step embeds that token) with state[1] += 1 (its position).
// Launch: one block of 1024 threads.
#include "common.cuh"

RX_EXTERN void __launch_bounds__(1024) rx_argmax(const float* x, int n, int* out, int* state) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    if (w == 0) {
        best = sv[lane]; bi = si[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) {
            if (bi == 0x7fffffff) bi = 0;
            out[0] = bi;
            if (state) { state[0] = bi; state[1] += 1; }
        }
    }
}
