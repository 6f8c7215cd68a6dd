// matvec.cu -- decode-time matrix-vector products straight from the GGUF block format.
//
// rx_matvec_<type>(w, x, y, n_out, n_in): y[t, r] = sum_k W[r, k] * x[t, k] for the t = blockIdx.y
//   row of x (T small: decode is T = 1). W is (n_out, n_in) stored as n_out rows of n_in/QK blocks
//   (quant.cuh); it is never dequantized to memory. Launch: grid (ceil(n_out / 4), T), 128 threads
//   = 4 warps, one warp per output row; lane l takes the 8-element chunks l, l+32, ... of the row
//   (consecutive lanes read consecutive bytes), dequantizes them in registers and the warp sums.
//   Requires n_in % 8 == 0 (every GGUF block size is a multiple of 8 except the float types, and
//   their rows are checked on the host).
// rx_matvec3_<type>(w0, w1, w2, x, y0, y1, y2, n0, n1, n2, n_in): up to three weights of one type
//   sharing x (Q, K, V; gate and up) in one launch: output rows [0, n0) of w0, then n1 of w1, then
//   n2 of w2 (n2 = 0 for a pair). grid (ceil((n0 + n1 + n2) / 4), T).
// rx_matvec_glu_<type>(wg, wu, x, y, n_out, n_in, op): y = act(Wg x) * (Wu x), act = silu (op 0) or
//   gelu_tanh (op 1): gate, up and the SwiGLU/GeGLU in one launch; each warp does both rows r.
// rx_matvec3n_<type>(w0, w1, w2, a, b, nw, eps, s, y0, y1, y2, n0, n1, n2, n_in) and
// rx_matvec_glun_<type>(wg, wu, a, b, nw, eps, s, y, n_out, n_in, op): rx_matvec3 / rx_matvec_glu of
//   x = rms_norm(a + b) * nw (b, nw may be null) -- the residual add and the pre-norm folded into
//   the product that reads them, so they cost no launch of their own. Every block rebuilds its row
//   t of x in dynamic shared memory (n_in floats: shmem = 4 n_in bytes, host caps n_in at 8192; a few KB
//   of L2 reads per block against the ~3 us launch they replace); blocks with blockIdx.x == 0
//   also write s = a + b (the new residual stream) when s is given. Same grids as the plain forms.
#include "quant.cuh"

// dot8<T>(blk, j, x): sum over the 8 elements j..j+7 (j % 8 == 0) of one block times x[0..8).
// The generic form dequantizes element by element; the specialisations below decode each block's
// scales once per 8 elements and factor them out of the sum (d * sum(q x) + m * sum(x)).
template <int T>
struct Dot8 {
    __device__ static float f(const uint8_t* blk, int j, const float* x) {
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) a += Q<T>::dq(blk, j + i) * x[i];
        return a;
    }
};
template <> struct Dot8<8> {  // Q8_0
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const int8_t* q = reinterpret_cast<const int8_t*>(b + 2 + j);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) s += (float)q[i] * x[i];
        return rx_f16(b) * s;
    }
};
template <> struct Dot8<2> {  // Q4_0
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const uint8_t* q = b + 2 + (j & 15);
        int sh = j >= 16 ? 4 : 0;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) s += (float)(((q[i] >> sh) & 15) - 8) * x[i];
        return rx_f16(b) * s;
    }
};
template <> struct Dot8<3> {  // Q4_1
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const uint8_t* q = b + 4 + (j & 15);
        int sh = j >= 16 ? 4 : 0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s += (float)((q[i] >> sh) & 15) * x[i];
            sx += x[i];
        }
        return rx_f16(b) * s + rx_f16(b + 2) * sx;
    }
};
template <int OFF_QH, int OFF_QS, bool MIN>
__device__ __forceinline__ float dot8_q5(const uint8_t* b, int j, const float* x) {
    uint32_t qh = (uint32_t)b[OFF_QH] | ((uint32_t)b[OFF_QH + 1] << 8) | ((uint32_t)b[OFF_QH + 2] << 16) |
                  ((uint32_t)b[OFF_QH + 3] << 24);
    const uint8_t* q = b + OFF_QS + (j & 15);
    int sh = j >= 16 ? 4 : 0;
    float s = 0.f, sx = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> sh) & 15) | (((qh >> (j + i)) & 1) << 4);
        s += (float)(MIN ? v : v - 16) * x[i];
        sx += x[i];
    }
    return MIN ? rx_f16(b) * s + rx_f16(b + 2) * sx : rx_f16(b) * s;
}
template <> struct Dot8<6> {  // Q5_0
    __device__ static float f(const uint8_t* b, int j, const float* x) { return dot8_q5<2, 6, false>(b, j, x); }
};
template <> struct Dot8<7> {  // Q5_1
    __device__ static float f(const uint8_t* b, int j, const float* x) { return dot8_q5<4, 8, true>(b, j, x); }
};
template <> struct Dot8<12> {  // Q4_K: 8 elements share one 32-element sub-block
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int c = j >> 6, n = (j >> 5) & 1, l0 = j & 31, sb = j >> 5;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        const uint8_t* q = b + 16 + 32 * c + l0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s += (float)((q[i] >> (4 * n)) & 15) * x[i];
            sx += x[i];
        }
        return rx_f16(b) * (float)sc * s - rx_f16(b + 2) * (float)m * sx;
    }
};
template <> struct Dot8<13> {  // Q5_K
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int c = j >> 6, n = (j >> 5) & 1, l0 = j & 31, sb = j >> 5;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        const uint8_t* q = b + 48 + 32 * c + l0;
        const uint8_t* qh = b + 16 + l0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int v = ((q[i] >> (4 * n)) & 15) | (((qh[i] >> sb) & 1) << 4);
            s += (float)v * x[i];
            sx += x[i];
        }
        return rx_f16(b) * (float)sc * s - rx_f16(b + 2) * (float)m * sx;
    }
};
template <> struct Dot8<14> {  // Q6_K: 8 elements share one 16-element scale
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int h = j >> 7, k = (j >> 5) & 3, l0 = j & 31;
        const uint8_t* ql = b + 64 * h + 32 * (k & 1) + l0;
        const uint8_t* qh = b + 128 + 32 * h + l0;
        int s4 = 4 * (k >> 1), s2 = 2 * k;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int v = (((ql[i] >> s4) & 15) | (((qh[i] >> s2) & 3) << 4)) - 32;
            s += (float)v * x[i];
        }
        return rx_f16(b + 208) * (float)(int8_t)b[192 + (j >> 4)] * s;
    }
};

template <int T>
__device__ __forceinline__ float dot_row(const uint8_t* row, const float* x, int n_in) {
    int lane = threadIdx.x & 31;
    float acc = 0.f;
    int n_chunks = n_in >> 3;
    for (int c = lane; c < n_chunks; c += 32) {
        int k0 = c << 3;
        const float4* xv = reinterpret_cast<const float4*>(x + k0);
        float4 a = xv[0], b = xv[1];
        const uint8_t* blk = row + (k0 / Q<T>::QK) * Q<T>::TS;
        int j = k0 % Q<T>::QK;
        if (Q<T>::QK == 1) {
            // float types: 8 consecutive "blocks"
            acc += Q<T>::dq(blk, 0) * a.x + Q<T>::dq(blk + Q<T>::TS, 0) * a.y +
                   Q<T>::dq(blk + 2 * Q<T>::TS, 0) * a.z + Q<T>::dq(blk + 3 * Q<T>::TS, 0) * a.w +
                   Q<T>::dq(blk + 4 * Q<T>::TS, 0) * b.x + Q<T>::dq(blk + 5 * Q<T>::TS, 0) * b.y +
                   Q<T>::dq(blk + 6 * Q<T>::TS, 0) * b.z + Q<T>::dq(blk + 7 * Q<T>::TS, 0) * b.w;
        } else {
            float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            acc += Dot8<T>::f(blk, j, xs);
        }
    }
    return rx_warp_sum(acc);
}

template <int T>
__device__ void matvec_impl(const uint8_t* w, const float* x, float* y, int n_out, int n_in) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_out) return;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    int t = blockIdx.y;
    float s = dot_row<T>(w + r * row_bytes, x + (long)t * n_in, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = s;
}

template <int T>
__device__ void matvec3_impl(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* x,
                             float* y0, float* y1, float* y2, int n0, int n1, int n2, int n_in) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    const uint8_t* w;
    float* y;
    int n_out;
    if (r < n0) { w = w0; y = y0; n_out = n0; }
    else if (r < n0 + n1) { r -= n0; w = w1; y = y1; n_out = n1; }
    else if (r < n0 + n1 + n2) { r -= n0 + n1; w = w2; y = y2; n_out = n2; }
    else return;
    int t = blockIdx.y;
    float s = dot_row<T>(w + r * row_bytes, x + (long)t * n_in, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = s;
}

__device__ __forceinline__ float rx_glu_act(float g, int op) {
    if (op == 0) return g / (1.f + expf(-g));
    return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

template <int T>
__device__ void matvec_glu_impl(const uint8_t* wg, const uint8_t* wu, const float* x, float* y, int n_out,
                                int n_in, int op) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_out) return;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    int t = blockIdx.y;
    const float* xt = x + (long)t * n_in;
    float g = dot_row<T>(wg + r * row_bytes, xt, n_in);
    float u = dot_row<T>(wu + r * row_bytes, xt, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = rx_glu_act(g, op) * u;
}

extern __shared__ float4 rx_mvn_smem[];

// xs[0..n_in) = rms_norm(a[t] + b[t]) * nw for t = blockIdx.y (the rx_add_rms_norm arithmetic);
// every thread of the block must call it (it synchronizes)
__device__ __forceinline__ void rx_norm_row(const float* a, const float* b, const float* nw, float eps,
                                            float* s, int n_in, float* xs) {
    __shared__ float red[32];
    long o = (long)blockIdx.y * n_in;
    bool ws = s && blockIdx.x == 0;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
        float v = b ? a[o + i] + b[o + i] : a[o + i];
        xs[i] = v;
        if (ws) s[o + i] = v;
        ss += v * v;
    }
    ss = rx_block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / n_in + eps);
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
        float v = xs[i] * inv;
        xs[i] = nw ? v * nw[i] : v;
    }
    __syncthreads();
}

template <int T>
__device__ void matvec3n_impl(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* a,
                              const float* b, const float* nw, float eps, float* s, float* y0, float* y1,
                              float* y2, int n0, int n1, int n2, int n_in) {
    float* xs = reinterpret_cast<float*>(rx_mvn_smem);
    rx_norm_row(a, b, nw, eps, s, n_in, xs);
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    const uint8_t* w;
    float* y;
    int n_out;
    if (r < n0) { w = w0; y = y0; n_out = n0; }
    else if (r < n0 + n1) { r -= n0; w = w1; y = y1; n_out = n1; }
    else if (r < n0 + n1 + n2) { r -= n0 + n1; w = w2; y = y2; n_out = n2; }
    else return;
    float acc = dot_row<T>(w + r * row_bytes, xs, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)blockIdx.y * n_out + r] = acc;
}

template <int T>
__device__ void matvec_glun_impl(const uint8_t* wg, const uint8_t* wu, const float* a, const float* b,
                                 const float* nw, float eps, float* s, float* y, int n_out, int n_in, int op) {
    float* xs = reinterpret_cast<float*>(rx_mvn_smem);
    rx_norm_row(a, b, nw, eps, s, n_in, xs);
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_out) return;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    float g = dot_row<T>(wg + r * row_bytes, xs, n_in);
    float u = dot_row<T>(wu + r * row_bytes, xs, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)blockIdx.y * n_out + r] = rx_glu_act(g, op) * u;
}

#define RX_MV(T, name)                                                                          \
    RX_EXTERN void __launch_bounds__(128) rx_matvec_##name(const uint8_t* w, const float* x,   \
                                                          float* y, int n_out, int n_in) {     \
        matvec_impl<T>(w, x, y, n_out, n_in);                                                   \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128) rx_matvec3_##name(                                    \
        const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* x, float* y0,    \
        float* y1, float* y2, int n0, int n1, int n2, int n_in) {                               \
        matvec3_impl<T>(w0, w1, w2, x, y0, y1, y2, n0, n1, n2, n_in);                           \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128) rx_matvec_glu_##name(const uint8_t* wg, const uint8_t* wu, \
                                                              const float* x, float* y, int n_out, \
                                                              int n_in, int op) {               \
        matvec_glu_impl<T>(wg, wu, x, y, n_out, n_in, op);                                      \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128) rx_matvec3n_##name(                                   \
        const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* a, const float* b, \
        const float* nw, float eps, float* s, float* y0, float* y1, float* y2, int n0, int n1,  \
        int n2, int n_in) {                                                                     \
        matvec3n_impl<T>(w0, w1, w2, a, b, nw, eps, s, y0, y1, y2, n0, n1, n2, n_in);           \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128) rx_matvec_glun_##name(                                \
        const uint8_t* wg, const uint8_t* wu, const float* a, const float* b, const float* nw,  \
        float eps, float* s, float* y, int n_out, int n_in, int op) {                           \
        matvec_glun_impl<T>(wg, wu, a, b, nw, eps, s, y, n_out, n_in, op);                      \
    }
RX_FOR_EACH_TYPE(RX_MV)
