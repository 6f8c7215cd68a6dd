// moe.cu -- sparse mixture-of-experts FFN: combining host-routed expert products (rx_moe_combine) and the
// device-routed decode path (rx_moe_route, rx_moe_glu_<type>, rx_moe_down_<type>; see below).
//
// expert_matmul runs each selected expert once over the rows routed to it, writing the results
// one expert after another into Y (n_slots, n_out): slot rows sorted by expert. A slot is one
// (token t, choice k) pair, numbered s = t * K + k; pos[s] is its row in Y.
//
// rx_moe_combine(Y, pos, wts, out, T, K, n_out):
//   out[t, c] = sum_k wts[t*K + k] * Y[pos[t*K + k], c]       (the routing-weighted sum, k in order)
// NumPy reference: out = (wts.reshape(T, K, 1) * Y[pos].reshape(T, K, n_out)).sum(1) -- what
// reflex/backends/numpy_backend.py expert_matmul computes (float32; summation order may differ).
// Launch: grid (ceil(n_out / 256), T), 256 threads; each thread one (t, c), coalesced over c.
// (Unweighted per-slot outputs are a plain row gather: rx_get_rows_f32 with pos.)
#include "common.cuh"

RX_EXTERN void rx_moe_combine(const float* Y, const int* pos, const float* wts, float* out, int T, int K,
                              int n_out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int t = blockIdx.y;
    if (c >= n_out || t >= T) return;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
        int s = t * K + k;
        acc += wts[s] * Y[(long)pos[s] * n_out + c];
    }
    out[(long)t * n_out + c] = acc;
}

// ---- device-routed MoE FFN: no host round-trip, so a decode step can be captured into a CUDA graph ----
//
// rx_moe_route(logits, ids, wts, n_expert, K, norm): for token t = blockIdx.x,
//   p = softmax(logits[t]) in float32 (max-subtracted, p = e / sum e as NumPy divides), then K rounds of
//   block argmax over p: ids[t, k] = the k-th largest, ties to the lower expert id; wts[t, k] = p[ids[t, k]],
//   divided by their sum when norm != 0.
//   NumPy reference: reflex/backends/numpy_moe.py route_ref (argsort(-p, kind="stable")[:, :K]).
//   Launch: grid (T), RX_MOE_THREADS threads; n_expert <= RX_MOE_MAX_EXPERT (p lives in shared memory;
//   the host checks). Each round is one block reduction of (p, id) pairs, so K rounds cost K reductions
//   (K = 8 for Qwen3-30B-A3B) -- far cheaper than sorting 128 values.
// rx_moe_glu_<type>(wg, wu, x, ids, h, n_ff, n_in, K, n_expert, expert_bytes, op):
//   h[t, k, r] = act(Wg[e] x[t])[r] * (Wu[e] x[t])[r], e = ids[t, k], act = silu (op 0) / gelu_tanh (op 1);
//   with wu null, h[t, k, r] = (Wg[e] x[t])[r] (the plain product: gate and up of different types
//   run as two such launches plus rx_glu). Wg / Wu are (n_expert, n_ff, n_in) in their GGUF block
//   format, expert e the byte range [e * expert_bytes, (e + 1) * expert_bytes), each expert n_ff rows
//   of n_in / QK blocks (quant.cuh). The expert id is read on the device, so only the selected
//   experts' bytes are read and the launch does not depend on host data.
//   Launch: grid (ceil(n_ff / 4), K, T), 128 threads = 4 warps, one warp per row r (matvec.cu's warp dot
//   dot_rows, gate and up rows in one call so they share the x loads).
// rx_moe_down_<type>(wd, h, ids, wts, y, n_embd, n_ff, K, n_expert, expert_bytes):
//   y[t, c] = sum_k wts[t, k] * (Wd[ids[t, k]] h[t, k])[c], k in order; Wd is (n_expert, n_embd, n_ff).
//   Launch: grid (ceil(n_embd / 4), T), 128 threads, one warp per output row c summing its K dots, so
//   the K expert outputs never go to memory and need no combine launch.
// NumPy reference of the pair: NumpyMoEOps.moe_ffn = expert_matmul(gate), expert_matmul(up), swiglu,
//   expert_matmul(down, weights). n_in, n_ff % 8 == 0 (dot_rows' float4 loads of x; host checks).
//   An expert id outside [0, n_expert) writes NaN (a routing bug shows instead of reading past the weight).
#define RX_MOE_THREADS 256
#define RX_MOE_MAX_EXPERT 1024

// (v, i) beats (w, j) when larger, or equal with the lower id: NumPy's stable argsort of -p
__device__ __forceinline__ bool rx_moe_better(float v, int i, float w, int j) {
    return v > w || (v == w && i < j);
}

RX_EXTERN void __launch_bounds__(RX_MOE_THREADS) rx_moe_route(const float* logits, int* ids, float* wts,
                                                              int n_expert, int K, int norm) {
    __shared__ float p[RX_MOE_MAX_EXPERT];
    __shared__ float red[32];
    __shared__ float rv[32];
    __shared__ int ri[32];
    int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float* l = logits + (long)t * n_expert;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) m = fmaxf(m, l[i]);
    m = rx_block_max(m, red);
    float s = 0.f;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
        float e = expf(l[i] - m);
        p[i] = e;
        s += e;
    }
    s = rx_block_sum(s, red);  // synchronizes, so every p[i] is visible below
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) p[i] = p[i] / s;
    __syncthreads();
    float wsum = 0.f;
    for (int k = 0; k < K; k++) {
        // each thread scans its experts in increasing id with a strict '>', keeping the lowest id of a tie
        float v = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < n_expert; i += blockDim.x)
            if (p[i] > v) { v = p[i]; bi = i; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (rx_moe_better(ov, oi, v, bi)) { v = ov; bi = oi; }
        }
        if (lane == 0) { rv[wid] = v; ri[wid] = bi; }
        __syncthreads();
        if (wid == 0) {
            v = lane < nw ? rv[lane] : -INFINITY;
            bi = lane < nw ? ri[lane] : 0x7fffffff;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, v, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (rx_moe_better(ov, oi, v, bi)) { v = ov; bi = oi; }
            }
            if (lane == 0) {
                if (bi >= n_expert) bi = 0;  // only with NaN logits; keeps the id a valid expert
                ids[(long)t * K + k] = bi;
                wts[(long)t * K + k] = v;
                wsum += v;
                p[bi] = -INFINITY;  // taken: never chosen again (every real p is >= 0)
            }
        }
        __syncthreads();
    }
    if (norm && threadIdx.x == 0)
        for (int k = 0; k < K; k++) wts[(long)t * K + k] = wts[(long)t * K + k] / wsum;
}

template <int T>
__device__ void moe_glu_impl(const uint8_t* wg, const uint8_t* wu, const float* x, const int* ids, float* h,
                             int n_ff, int n_in, int K, int n_expert, long expert_bytes, int op) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_ff) return;
    int k = blockIdx.y, t = blockIdx.z;
    long slot = (long)t * K + k;
    int e = ids[slot];
    float* out = h + slot * n_ff + r;
    if (e < 0 || e >= n_expert) {
        if ((threadIdx.x & 31) == 0) *out = __int_as_float(0x7fc00000);
        return;
    }
    long row = (long)e * expert_bytes + (long)r * ((long)n_in / Q<T>::QK * Q<T>::TS);
    const float* xt = x + (long)t * n_in;
    float gu[2];
    if (wu) {  // gate and up rows together: they share every x load
        dot_rows<T, 2>(wg + row, wu + row, xt, n_in, true, RxNoPre{}, gu);
        gu[0] = rx_glu_act(gu[0], op) * gu[1];
    } else {
        dot_rows<T, 1>(wg + row, wg + row, xt, n_in, true, RxNoPre{}, gu);
    }
    if ((threadIdx.x & 31) == 0) *out = gu[0];
}

template <int T>
__device__ void moe_down_impl(const uint8_t* wd, const float* h, const int* ids, const float* wts, float* y,
                              int n_embd, int n_ff, int K, int n_expert, long expert_bytes) {
    int c = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (c >= n_embd) return;
    int t = blockIdx.y;
    long row_bytes = (long)n_ff / Q<T>::QK * Q<T>::TS;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
        long slot = (long)t * K + k;
        int e = ids[slot];
        if (e < 0 || e >= n_expert) { acc = __int_as_float(0x7fc00000); break; }
        const uint8_t* row = wd + (long)e * expert_bytes + (long)c * row_bytes;
        float d[2];
        dot_rows<T, 1>(row, row, h + slot * n_ff, n_ff, true, RxNoPre{}, d);
        acc += wts[slot] * d[0];
    }
    if ((threadIdx.x & 31) == 0) y[(long)t * n_embd + c] = acc;
}

#define RX_MOE(T, name)                                                                              \
    RX_EXTERN void __launch_bounds__(128) rx_moe_glu_##name(                                         \
        const uint8_t* wg, const uint8_t* wu, const float* x, const int* ids, float* h, int n_ff,    \
        int n_in, int K, int n_expert, long expert_bytes, int op) {                                  \
        moe_glu_impl<T>(wg, wu, x, ids, h, n_ff, n_in, K, n_expert, expert_bytes, op);               \
    }                                                                                                \
    RX_EXTERN void __launch_bounds__(128) rx_moe_down_##name(                                        \
        const uint8_t* wd, const float* h, const int* ids, const float* wts, float* y, int n_embd,   \
        int n_ff, int K, int n_expert, long expert_bytes) {                                          \
        moe_down_impl<T>(wd, h, ids, wts, y, n_embd, n_ff, K, n_expert, expert_bytes);               \
    }
RX_FOR_EACH_TYPE(RX_MOE)
