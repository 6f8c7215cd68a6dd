// attention.cu -- KV-cache writes and grouped-query attention over an f16 KV cache.
//
// rx_kv_write(cache, x, cache2, x2, n, row, start, start_dyn): cache[start*row + i] = half(x[i])
//   for the n floats of x (T, n_head_kv, head_dim) -- cache rows are contiguous, so it is one flat
//   copy at an offset; the same for (cache2, x2) when given (K and V in one launch). start is
//   *start_dyn when given (captured decode step). 1-D grid-stride, 256 threads.
//
// rx_attention(q, k, v, o, part, mask, T, n_head, n_head_kv, d, n_past, n_past_dyn, scale,
//              window, causal, chunk, S_mask):
//   query t (cache slot n_past + t), head h reads kv head h / (n_head / n_head_kv); visible keys j:
//   mask given -> mask[t * S_mask + j] != 0; else causal (j <= n_past + t) or all (j < S), and
//   with window > 0 also n_past + t - j < window. Online softmax (running max m, sum l, acc[d]).
//   Launch: grid (T * n_head, n_split), 128 threads; split s covers keys [s*chunk, (s+1)*chunk)
//   (split over the KV length so long contexts fill the GPU at T = 1). Per tile of 128 keys each
//   thread scores one key against q (shared), the block reduces max/sum, then the V sum: for
//   d < 128 the threads form G = 128 / d groups of d, group g taking keys g, g+G, ... (four loads
//   in flight per thread), summed across groups at the end; for d >= 128 thread t owns dims
//   t, t+128, ... (coalesced V reads).
//   n_split == 1: o (T, n_head, d) is written directly. Otherwise every split writes
//   part[(th * n_split + s) * (d + 2)] = (m, l, acc[0..d)) and rx_attn_combine merges them.
// rx_attn_combine(part, o, n_split, d): grid T * n_head, 128 threads.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_MAXD 512

RX_EXTERN void rx_kv_write(__half* cache, const float* x, __half* cache2, const float* x2, long n, int row,
                           int start, const int* start_dyn) {
    long s = (long)rx_dyn(start, start_dyn) * row;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        cache[s + i] = __float2half_rn(x[i]);
        if (cache2) cache2[s + i] = __float2half_rn(x2[i]);
    }
}

RX_EXTERN void __launch_bounds__(ATT_THREADS) rx_attention(
    const float* q, const __half* k, const __half* v, float* o, float* part, const uint8_t* mask,
    int n_head, int n_head_kv, int d, int n_past_imm, const int* n_past_dyn, float scale, int window,
    int causal, int chunk, int S_mask) {
    __shared__ float qs[ATT_MAXD];
    __shared__ float ps[ATT_THREADS];
    __shared__ float red[32];
    int th = blockIdx.x, split = blockIdx.y, n_split = gridDim.y;
    int t = th / n_head, h = th % n_head;
    int kvh = h / (n_head / n_head_kv);
    int tid = threadIdx.x;
    int n_past = rx_dyn(n_past_imm, n_past_dyn);
    int qslot = n_past + t;
    int T_all = gridDim.x / n_head;
    int S = n_past + T_all;
    const float* qr = q + (long)th * d;
    for (int i = tid; i < d; i += ATT_THREADS) qs[i] = qr[i] * scale;
    __syncthreads();
    int j_lo = split * chunk, j_hi = min(S, j_lo + chunk);
    if (!mask) {
        if (causal) j_hi = min(j_hi, qslot + 1);
        if (window > 0) j_lo = max(j_lo, qslot - window + 1);
    }
    const int kv_row = n_head_kv * d;
    const int G = d < ATT_THREADS ? ATT_THREADS / d : 1;
    const int gi = d < ATT_THREADS ? tid / d : 0;
    const int di = d < ATT_THREADS ? tid % d : tid;
    const bool active = gi < G;
    float m = -INFINITY, l = 0.f;
    float acc[ATT_MAXD / ATT_THREADS];
#pragma unroll
    for (int u = 0; u < ATT_MAXD / ATT_THREADS; u++) acc[u] = 0.f;
    for (int j0 = j_lo; j0 < j_hi; j0 += ATT_THREADS) {
        int j = j0 + tid;
        float sc = -INFINITY;
        if (j < j_hi && (!mask || mask[(long)t * S_mask + j])) {
            float a = 0.f;
            if (d >= 128 && (d & 7) == 0) {
                // 16-byte loads: each thread walks its own key row, so fewer, wider loads matter
                // (Qwen3 d = 128 prefill: 683 -> 280 us per layer on the H200; d = 64 measured
                // slower in one run, so it keeps the 4-byte loads)
                const uint4* kr = reinterpret_cast<const uint4*>(k + (long)j * kv_row + (long)kvh * d);
#pragma unroll 4
                for (int i = 0; i < d / 8; i++) {
                    uint4 u = kr[i];
                    const __half2* hp = reinterpret_cast<const __half2*>(&u);
                    const float* qq = qs + 8 * i;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float2 kk = __half22float2(hp[e]);
                        a += qq[2 * e] * kk.x + qq[2 * e + 1] * kk.y;
                    }
                }
            } else {
                const __half2* kr = reinterpret_cast<const __half2*>(k + (long)j * kv_row + (long)kvh * d);
#pragma unroll 8
                for (int i = 0; i < d / 2; i++) {
                    float2 kk = __half22float2(kr[i]);
                    a += qs[2 * i] * kk.x + qs[2 * i + 1] * kk.y;
                }
            }
            sc = a;
        }
        float tmax = rx_block_max(sc, red);
        float m_new = fmaxf(m, tmax);
        float p = (m_new == -INFINITY) ? 0.f : __expf(sc - m_new);
        ps[tid] = p;
        float corr = (m == -INFINITY) ? 0.f : __expf(m - m_new);
        float tsum = rx_block_sum(p, red);  // also orders the ps[] writes before the reads below
        l = l * corr + tsum;
        m = m_new;
        int nj = min(ATT_THREADS, j_hi - j0);
#pragma unroll
        for (int u = 0; u < ATT_MAXD / ATT_THREADS; u++) {
            int i = di + u * ATT_THREADS;
            if (active && i < d) {
                const __half* vc = v + (long)j0 * kv_row + (long)kvh * d + i;
                float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
                int jj = gi;
                for (; jj + 3 * G < nj; jj += 4 * G) {
                    a0 += ps[jj] * __half2float(vc[(long)jj * kv_row]);
                    a1 += ps[jj + G] * __half2float(vc[(long)(jj + G) * kv_row]);
                    a2 += ps[jj + 2 * G] * __half2float(vc[(long)(jj + 2 * G) * kv_row]);
                    a3 += ps[jj + 3 * G] * __half2float(vc[(long)(jj + 3 * G) * kv_row]);
                }
                for (; jj < nj; jj += G) a0 += ps[jj] * __half2float(vc[(long)jj * kv_row]);
                acc[u] = acc[u] * corr + ((a0 + a1) + (a2 + a3));
            }
        }
        __syncthreads();
    }
    if (G > 1) {
        // sum the key groups: group 0 ends up with the whole V sum for its dim
        ps[tid] = active ? acc[0] : 0.f;
        __syncthreads();
        if (gi == 0) {
            float a = 0.f;
            for (int g = 0; g < G; g++) a += ps[g * d + di];
            acc[0] = a;
        }
        __syncthreads();
    }
    if (n_split == 1) {
        float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
        for (int u = 0; u < ATT_MAXD / ATT_THREADS; u++) {
            int i = di + u * ATT_THREADS;
            if (gi == 0 && i < d) o[(long)th * d + i] = acc[u] * inv;
        }
    } else {
        float* pr = part + ((long)th * n_split + split) * (d + 2);
        if (tid == 0) { pr[0] = m; pr[1] = l; }
#pragma unroll
        for (int u = 0; u < ATT_MAXD / ATT_THREADS; u++) {
            int i = di + u * ATT_THREADS;
            if (gi == 0 && i < d) pr[2 + i] = acc[u];
        }
    }
}

RX_EXTERN void rx_attn_combine(const float* part, float* o, int n_split, int d) {
    int th = blockIdx.x;
    const float* pr = part + (long)th * n_split * (d + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, pr[s * (d + 2)]);
    float L = 0.f;
    for (int s = 0; s < n_split; s++) {
        float ms = pr[s * (d + 2)];
        if (ms != -INFINITY) L += pr[s * (d + 2) + 1] * __expf(ms - M);
    }
    float inv = L > 0.f ? 1.f / L : 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < n_split; s++) {
            float ms = pr[s * (d + 2)];
            if (ms != -INFINITY) a += pr[s * (d + 2) + 2 + i] * __expf(ms - M);
        }
        o[(long)th * d + i] = a * inv;
    }
}
