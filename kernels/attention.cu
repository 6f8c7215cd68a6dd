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
// rx_attention_dec_<v>: the decode step (T = 1, no mask), GQA-grouped and warp-per-key; see its
//   section below. The backend uses it for every T = 1 attention without a mask.
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

// ---- decode (T = 1): rx_attention_dec_<v> --------------------------------------------------------
// rx_attention_dec_<v>(q, k, v, o, part, cnt, n_head, n_head_kv, d, gb, n_past, n_past_dyn, scale,
//                      window, min_chunk):
//   the one query of a decode step (slot n_past = *n_past_dyn when given) against the f16 cache:
//   visible keys j in [j_beg, n_past] with j_beg = max(0, n_past - window + 1) when window > 0, else
//   0 (T = 1 needs no mask and causal / non-causal coincide). q (1, n_head, d) and o (1, n_head, d)
//   float32; k, v (n_ctx, n_head_kv, d) halves, row stride n_head_kv * d.
//   Launch: grid (n_head_kv * n_grp, Y), 256 threads = 8 warps. Block x serves kv head x / n_grp and
//   query heads [h0, h0 + ng) of its group of G = n_head / n_head_kv (gb heads per block, the last
//   group may be smaller; gb <= GMAX of the variant), so every K/V row is read once for all the
//   query heads that share it (GQA) instead of once per query head.
//   Splits: the visible keys are cut at run time (n_past may come from device memory in a captured
//   graph) into ns = min(Y, ceil(n_vis / min_chunk)) splits of `chunk` keys (a multiple of 32);
//   blocks with blockIdx.y >= ns exit at once. So a graph captured with Y from n_ctx replays
//   correctly at any position, and short contexts do not pay for empty splits beyond one launch.
//   Splitting is kept for long contexts only (min_chunk keys per split at least): on the H200 a
//   cross-block merge costs ~2 us (fence, atomic, one L2 round trip), a 64-key step of the 8 warps
//   ~0.9 us, so 8 warps per block rather than 4 and splits of >= 64 keys.
//   Inside a block warp w takes keys j0 + w*U .. + U - 1, then + 8U ...: the U key and value rows
//   are loaded together, and the next U rows are loaded before this step's arithmetic (software
//   pipeline: 4 * U loads in flight per lane), lanes split head_dim so each row is one
//   coalesced warp read: lane owns halves (i*32 + lane)*VEC .. + VEC - 1 for i < NV
//   (d = 64: 4 B per lane, d = 128: 8 B, d = 256: 16 B, d = 512: 2 x 16 B; the generic variants
//   take any even d with 4 B per lane and bounds checks). Scores: warp-shuffle sums; online
//   softmax per warp (m, l, acc in registers, base 2: q is pre-scaled by scale * log2(e)), warps
//   merged through shared memory at the end.
//   ns == 1: o written directly. ns > 1: each split writes part[(h * Y + s) * (d + 2)] = (m, l,
//   acc[0..d)) and bumps cnt[blockIdx.x]; the block that brings it to ns merges the ns partials
//   into o (one pass over the splits, online rescaling) and puts the counter back to 0. That saves
//   the rx_attn_combine launch (a dependent launch costs more than the merge, which reads a few
//   KB from L2); splits that saw no key cannot occur (every active split holds >= 1 visible key,
//   inactive ones never touch part or cnt). The reset by the last block
//   keeps the counter valid for the next layer and for every replay of a captured graph (launches
//   of one stream never overlap). cnt holds >= gridDim.x zeroed unsigned ints owned by the backend.
#define DEC_WARPS 8

template <int VEC> struct RxHalfVec;
template <> struct RxHalfVec<2> { typedef unsigned int T; };
template <> struct RxHalfVec<4> { typedef uint2 T; };
template <> struct RxHalfVec<8> { typedef uint4 T; };

template <int VEC, int NV, bool EXACT>
__device__ __forceinline__ void rx_att_dec(const float* __restrict__ q, const __half* __restrict__ k,
                                           const __half* __restrict__ v, float* __restrict__ o,
                                           float* __restrict__ part, unsigned* __restrict__ cnt, int n_head,
                                           int n_head_kv, int d, int gb, int n_past_imm, const int* n_past_dyn,
                                           float scale, int window, int min_chunk) {
    typedef typename RxHalfVec<VEC>::T HV;
    constexpr int DPL = VEC * NV;                            // dims per lane
    constexpr int GMAX = DPL <= 2 ? 8 : 16 / DPL;            // query heads per block (q + acc registers)
    constexpr int U = DPL <= 4 ? 8 : (DPL <= 8 ? 4 : 2);     // keys per warp step (K/V registers)
    constexpr int DP = 32 * DPL;                             // >= d: per-head stride of s_acc
    __shared__ float s_m[DEC_WARPS][GMAX], s_l[DEC_WARPS][GMAX];
    __shared__ float s_acc[DEC_WARPS][GMAX * DP];
    __shared__ int s_last;
    // the host sizes gb and the block from the same tables; never drop heads or warps silently
    if (gb > GMAX || gb < 1 || blockDim.x != DEC_WARPS * 32) __trap();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int G = n_head / n_head_kv;
    const int n_grp = (G + gb - 1) / gb;
    const int kvh = blockIdx.x / n_grp, grp = blockIdx.x % n_grp;
    const int h0 = kvh * G + grp * gb;
    const int ng = min(gb, G - grp * gb);
    // q first: its loads need not wait for n_past (a device read when captured)
    const float qscale = scale * 1.4426950408889634f;  // exp(x) = exp2(x * log2 e)
    float qr[GMAX][DPL], acc[GMAX][DPL], m[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int off = (i * 32 + lane) * VEC;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                acc[g][i * VEC + e] = 0.f;
                qr[g][i * VEC + e] = (g < ng && (EXACT || off < d)) ? q[(long)(h0 + g) * d + off + e] * qscale : 0.f;
            }
        }
    }
    const int n_past = rx_dyn(n_past_imm, n_past_dyn);
    const int j_end = n_past + 1;
    const int j_beg = window > 0 ? max(0, n_past - window + 1) : 0;
    const int n_vis = j_end - j_beg;  // >= 1: the query's own key
    const int Y = gridDim.y;
    int ns = min(Y, (n_vis + min_chunk - 1) / min_chunk);
    const int chunk = ((n_vis + ns - 1) / ns + 31) & ~31;
    ns = (n_vis + chunk - 1) / chunk;  // rounding chunk up can only lower ns
    const int split = blockIdx.y;
    if (split >= ns) return;  // whole block: before any barrier; never counted in cnt
    const int j_lo = j_beg + split * chunk, j_hi = min(j_end, j_lo + chunk);

    const long kv_row = (long)n_head_kv * d;
    const __half* kb = k + (long)kvh * d;
    const __half* vb = v + (long)kvh * d;
    // U rows of K and V for keys j0 .. j0 + U - 1 (rows past j_hi load the last visible row and get
    // weight 0 below, so no load is ever out of bounds)
    auto load = [&](int j0, HV (&kr)[U][NV], HV (&vr)[U][NV]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long row = (long)min(j0 + u, j_hi - 1) * kv_row;
#pragma unroll
            for (int i = 0; i < NV; i++) {
                const int off = (i * 32 + lane) * VEC;
                if (EXACT || off < d) {
                    kr[u][i] = *reinterpret_cast<const HV*>(kb + row + off);
                    vr[u][i] = *reinterpret_cast<const HV*>(vb + row + off);
                } else {
                    kr[u][i] = HV();
                    vr[u][i] = HV();
                }
            }
        }
    };
    // software pipeline: the next U rows are in flight while this step computes (one warp step is
    // otherwise a full memory round trip of idle time; measured ~1.5 us per step on the H200)
    HV kr[U][NV], vr[U][NV];
    int j0 = j_lo + w * U;
    if (j0 < j_hi) load(j0, kr, vr);
    for (; j0 < j_hi; j0 += DEC_WARPS * U) {
        HV kn[U][NV], vn[U][NV];
        const int jn = j0 + DEC_WARPS * U;
        if (jn < j_hi) load(jn, kn, vn);
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (g >= ng) break;
            float s[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float a = 0.f;
#pragma unroll
                for (int i = 0; i < NV; i++) {
                    const __half2* hp = reinterpret_cast<const __half2*>(&kr[u][i]);
#pragma unroll
                    for (int e = 0; e < VEC / 2; e++) {
                        float2 kk = __half22float2(hp[e]);
                        a += qr[g][i * VEC + 2 * e] * kk.x + qr[g][i * VEC + 2 * e + 1] * kk.y;
                    }
                }
                s[u] = a;
            }
#pragma unroll
            for (int sh = 16; sh > 0; sh >>= 1) {
#pragma unroll
                for (int u = 0; u < U; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], sh);
            }
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (j0 + u >= j_hi) s[u] = -INFINITY;
                mx = fmaxf(mx, s[u]);
            }
            const float m_new = fmaxf(m[g], mx);  // finite: key j0 < j_hi is visible
            const float corr = exp2f(m[g] - m_new);  // 0 on the first step (m = -inf)
            float ps = 0.f;
#pragma unroll
            for (int u = 0; u < U; u++) {
                s[u] = exp2f(s[u] - m_new);  // -inf -> 0
                ps += s[u];
            }
            l[g] = l[g] * corr + ps;
            m[g] = m_new;
#pragma unroll
            for (int i = 0; i < NV; i++) {
#pragma unroll
                for (int e = 0; e < VEC / 2; e++) {
                    float a0 = acc[g][i * VEC + 2 * e] * corr, a1 = acc[g][i * VEC + 2 * e + 1] * corr;
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        float2 vv = __half22float2(reinterpret_cast<const __half2*>(&vr[u][i])[e]);
                        a0 += s[u] * vv.x;
                        a1 += s[u] * vv.y;
                    }
                    acc[g][i * VEC + 2 * e] = a0;
                    acc[g][i * VEC + 2 * e + 1] = a1;
                }
            }
        }
        if (jn < j_hi) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int i = 0; i < NV; i++) { kr[u][i] = kn[u][i]; vr[u][i] = vn[u][i]; }
        }
    }

    // merge the warps (a warp that got no key has m = -inf, l = 0, acc = 0)
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (g >= ng) break;
        if (lane == 0) { s_m[w][g] = m[g]; s_l[w][g] = l[g]; }
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int off = (i * 32 + lane) * VEC;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (EXACT || off < d) s_acc[w][g * DP + off + e] = acc[g][i * VEC + e];
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < ng * d; x += blockDim.x) {
        const int g = x / d, i = x - g * d;
        float M = -INFINITY;
#pragma unroll
        for (int ww = 0; ww < DEC_WARPS; ww++) M = fmaxf(M, s_m[ww][g]);
        float L = 0.f, A = 0.f;
#pragma unroll
        for (int ww = 0; ww < DEC_WARPS; ww++) {
            const float mw = s_m[ww][g];
            const float f = mw == -INFINITY ? 0.f : exp2f(mw - M);
            L += s_l[ww][g] * f;
            A += s_acc[ww][g * DP + i] * f;
        }
        if (ns == 1) {
            o[(long)(h0 + g) * d + i] = A / L;  // L >= 1: the maximum's own term
        } else {
            float* pr = part + ((long)(h0 + g) * Y + split) * (d + 2);
            pr[2 + i] = A;
            if (i == 0) { pr[0] = M; pr[1] = L; }
        }
    }
    if (ns == 1) return;

    // the last split of this block's heads to finish merges all ns (threadFenceReduction pattern)
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&cnt[blockIdx.x], 1u) == (unsigned)(ns - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    // one pass over the splits, rescaling as the maximum grows: m, l and acc of a split are read
    // together, so the merge costs one L2 round trip, not two. __ldcg: the partials of other
    // blocks were written through L2; never read them from L1
    for (int x = threadIdx.x; x < ng * d; x += blockDim.x) {
        const int g = x / d, i = x - g * d;
        const float* pr = part + (long)(h0 + g) * Y * (d + 2);
        float M = -INFINITY, L = 0.f, A = 0.f;
#pragma unroll 4
        for (int sp = 0; sp < ns; sp++) {
            const float ms = __ldcg(pr + (long)sp * (d + 2)), ls = __ldcg(pr + (long)sp * (d + 2) + 1);
            const float as = __ldcg(pr + (long)sp * (d + 2) + 2 + i);
            const float M2 = fmaxf(M, ms);  // every active split saw >= 1 key: ms is finite
            const float f = exp2f(M - M2), e = exp2f(ms - M2);  // f = 0 on the first split
            L = L * f + ls * e;
            A = A * f + as * e;
            M = M2;
        }
        o[(long)(h0 + g) * d + i] = A / L;
    }
    if (threadIdx.x == 0) cnt[blockIdx.x] = 0u;
}

#define RX_ATT_DEC(name, VEC, NV, EXACT)                                                                     \
    RX_EXTERN void __launch_bounds__(DEC_WARPS * 32) name(                                                    \
        const float* q, const __half* k, const __half* v, float* o, float* part, unsigned* cnt, int n_head, \
        int n_head_kv, int d, int gb, int n_past, const int* n_past_dyn, float scale, int window,            \
        int min_chunk) {                                                                                     \
        rx_att_dec<VEC, NV, EXACT>(q, k, v, o, part, cnt, n_head, n_head_kv, d, gb, n_past, n_past_dyn,    \
                                   scale, window, min_chunk);                                                \
    }
// one kernel per head_dim so each keeps only the registers its d needs (the host picks by d and
// sizes gb <= GMAX: d64 8, d128 4, d256 2, d512 1, g256 2, g512 1; more would spill on sm_90)
RX_ATT_DEC(rx_attention_dec_d64, 2, 1, true)
RX_ATT_DEC(rx_attention_dec_d128, 4, 1, true)
RX_ATT_DEC(rx_attention_dec_d256, 8, 1, true)
RX_ATT_DEC(rx_attention_dec_d512, 8, 2, true)
RX_ATT_DEC(rx_attention_dec_g256, 2, 4, false)  // any even d <= 256
RX_ATT_DEC(rx_attention_dec_g512, 2, 8, false)  // any even d <= 512
