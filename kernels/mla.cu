// mla.cu -- Multi-head latent attention ops (deepseek2): whatever MLA needs beyond the generic ops.
// NumPy reference: reflex/backends/numpy_mla.py (mla_attention). rope_freqs needs no kernel of its
// own: cuda_mla.py runs rope.cu's rx_rope with the caller's (YaRN) inverse frequencies.
//
// rx_mla_attention(q_lat (T, n_head, R), q_pe (T, n_head, P), c (n_ctx, R) f16, pe (n_ctx, P) f16,
//   out (T, n_head, R), mask (T, S) u8 or null, n_head, R, P, n_past, scale):
//   score[s] = scale * (q_lat[t, h] . c[s] + q_pe[t, h] . pe[s]) over slots s < S = n_past + T,
//   visible = mask[t, s] when a mask is given, else s <= n_past + t (causal on slots);
//   out[t, h] = sum_s softmax(score)[s] * c[s]  (values are the latent itself).
//   Launch: grid (T * n_head), blockDim RX_MLA_THREADS (128); block (t, h) walks the keys in chunks
//   of 128 (one key per thread for the score), with an online softmax (running max m, sum l, the
//   accumulator rescaled by exp(m_old - m_new)); thread i owns output dims i, i + 128, ... (R <=
//   128 * RX_MLA_ACC). Dynamic shared memory: (R + P + 2 * 128 + 2) floats.
#pragma once
#include "common.cuh"

#define RX_MLA_THREADS 128
#define RX_MLA_ACC 8

RX_EXTERN void rx_mla_attention(const float* q_lat, const float* q_pe, const __half* c, const __half* pe,
                                float* out, const uint8_t* mask, int n_head, int R, int P, int n_past,
                                float scale) {
    extern __shared__ float sh[];
    float* sq = sh;                         // (R + P) the query: latent part, then rope part
    float* sp = sq + R + P;                 // (128) scores, then probabilities, of the chunk
    float* st = sp + RX_MLA_THREADS;        // (2) chunk max, chunk sum
    int th = blockIdx.x;                    // t * n_head + h
    int t = th / n_head;
    int T = gridDim.x / n_head;
    int S = n_past + T;
    int tid = threadIdx.x;
    for (int i = tid; i < R; i += blockDim.x) sq[i] = q_lat[(long)th * R + i];
    for (int i = tid; i < P; i += blockDim.x) sq[R + i] = q_pe[(long)th * P + i];
    float acc[RX_MLA_ACC];
#pragma unroll
    for (int j = 0; j < RX_MLA_ACC; ++j) acc[j] = 0.f;
    float m = -INFINITY, l = 0.f;           // identical in every thread (computed from shared values)
    __syncthreads();
    for (int base = 0; base < S; base += RX_MLA_THREADS) {
        int s = base + tid;
        float sc = -INFINITY;
        bool vis = s < S && (mask ? mask[(long)t * S + s] != 0 : s <= n_past + t);
        if (vis) {
            float d = 0.f;
            const __half* cs = c + (long)s * R;
            const __half* ps = pe + (long)s * P;
            for (int i = 0; i < R; ++i) d += sq[i] * __half2float(cs[i]);
            for (int i = 0; i < P; ++i) d += sq[R + i] * __half2float(ps[i]);
            sc = d * scale;
        }
        sp[tid] = sc;
        __syncthreads();
        if (tid == 0) {
            float cm = -INFINITY;
            for (int k = 0; k < RX_MLA_THREADS; ++k) cm = fmaxf(cm, sp[k]);
            st[0] = cm;
        }
        __syncthreads();
        float m_new = fmaxf(m, st[0]);
        if (m_new == -INFINITY) {           // nothing visible yet: every thread skips alike
            __syncthreads();
            continue;
        }
        float corr = __expf(m - m_new);     // m = -inf -> 0
        sp[tid] = sc == -INFINITY ? 0.f : __expf(sc - m_new);
        __syncthreads();
        if (tid == 0) {
            float cs = 0.f;
            for (int k = 0; k < RX_MLA_THREADS; ++k) cs += sp[k];
            st[1] = cs;
        }
        __syncthreads();
        l = l * corr + st[1];
        int n_k = min(RX_MLA_THREADS, S - base);
#pragma unroll
        for (int j = 0; j < RX_MLA_ACC; ++j) {
            int r = tid + j * RX_MLA_THREADS;
            if (r < R) {
                float a = acc[j] * corr;
                for (int k = 0; k < n_k; ++k) a += sp[k] * __half2float(c[(long)(base + k) * R + r]);
                acc[j] = a;
            }
        }
        m = m_new;
        __syncthreads();                    // sp is rewritten by the next chunk
    }
    float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int j = 0; j < RX_MLA_ACC; ++j) {
        int r = tid + j * RX_MLA_THREADS;
        if (r < R) out[(long)th * R + r] = acc[j] * inv;
    }
}
