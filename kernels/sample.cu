// sample.cu -- on-device token choice, so only the token id crosses to the host.
//
// rx_argmax(x, n, out, state, scratch): index of the largest of x[0..n) (first one on ties, NaN
//   ignored, as numpy.argmax on finite logits); written to out[0] and, when state is non-null, to
//   state[0] (the next captured decode step embeds that token) with state[1] += 1 (its position).
// Launch: grid ceil(n / 2048) blocks of 256 threads (8 elements each). Each block reduces its
//   slice and folds (value, index) into scratch[0] with one 64-bit atomicMax on an order-preserving
//   key (value bits high, ~index low, so ties keep the lowest index); the last block to finish
//   (scratch[1] counts them) writes the result and zeroes scratch for the next launch.
// rx_repeat_penalty(x, ring, n_ring, n, penalty): the sampler's repeat penalty (llama.cpp's), in
//   place on one row x[0..n): every distinct id in [0, n) among the ring's slots (ring[0] is the push
//   cursor, ring[1 .. 1 + n_ring) the last n_ring tokens of the history, -1 = empty) gets
//   x[id] = x[id] > 0 ? x[id] / penalty : x[id] * penalty. NumPy reference: Sampler._penalize
//   (reflex/sampling.py), which the host path runs on the same history window.
//   Launch: 1 block of 256 threads, n_ring <= 256: thread i takes slot i and leaves it to the
//   earlier slot holding the same id, so each id is scaled once and no two threads touch one x[id].
// rx_ring_push(ring, n_ring, tok): ring[1 + ring[0] % n_ring] = tok[0]; ring[0] += 1 -- the token
//   argmax just chose joins the window the next step's penalty reads (inside a captured graph too).
//   Launch: 1 thread.
#include "common.cuh"

RX_EXTERN void __launch_bounds__(256) rx_repeat_penalty(float* x, const int* ring, int n_ring, int n,
                                                        float penalty) {
    int i = threadIdx.x;
    if (i >= n_ring) return;
    int id = ring[1 + i];
    if (id < 0 || id >= n) return;
    for (int j = 0; j < i; j++)
        if (ring[1 + j] == id) return;
    float v = x[id];
    x[id] = v > 0.f ? v / penalty : v * penalty;
}

RX_EXTERN void rx_ring_push(int* ring, int n_ring, const int* tok) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int c = ring[0];
    ring[1 + c % n_ring] = tok[0];
    ring[0] = c + 1;
}

__device__ __forceinline__ unsigned long long rx_argmax_key(float v, int i) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // float order == unsigned order
    return ((unsigned long long)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)i);
}

RX_EXTERN void __launch_bounds__(256) rx_argmax(const float* x, int n, int* out, int* state,
                                                unsigned long long* scratch) {
    __shared__ unsigned long long sk[8];
    unsigned long long best = 0;  // below every real key
    int base = blockIdx.x * 2048;
    for (int i = base + threadIdx.x; i < min(n, base + 2048); i += 256) {
        float v = x[i];
        if (v == v) {  // not NaN
            unsigned long long k = rx_argmax_key(v, i);
            best = k > best ? k : best;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long ok = __shfl_xor_sync(0xffffffffu, best, o);
        best = ok > best ? ok : best;
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) sk[w] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < 8; k++) best = sk[k] > best ? sk[k] : best;
        atomicMax(&scratch[0], best);
        __threadfence();
        unsigned int done = atomicAdd(reinterpret_cast<unsigned int*>(&scratch[1]), 1u);
        if (done == gridDim.x - 1) {
            unsigned long long k = atomicExch(&scratch[0], 0ull);
            scratch[1] = 0ull;
            int idx = k ? (int)(0xFFFFFFFFu - (uint32_t)(k & 0xFFFFFFFFull)) : 0;
            out[0] = idx;
            if (state) { state[0] = idx; state[1] += 1; }
        }
    }
}
