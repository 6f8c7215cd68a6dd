// rope.cu -- rotary position embedding, modes NORM (adjacent pairs) and NEOX (halves).
//
// rx_rope(x, y, x2, y2, n_head2, pos, inv_freq, n_head, head_dim, n_rot, mode, pos_dyn):
//   for token t, head h, pair i < n_rot/2: theta = pos[t] * inv_freq[i], inv_freq[i] =
//   base^(-2i / n_rot) in double (from the host, as the NumPy reference); theta is reduced to
//   [-pi, pi] in double, then sin/cos in float (exact to float rounding at any position), NORM rotates (x[2i], x[2i+1]), NEOX rotates (x[i], x[i + n_rot/2]); dims
//   >= n_rot are copied. pos is int32 on the device; when pos_dyn is non-null, token t sits at
//   position *pos_dyn + t (a captured decode step reads its position from the step state).
//   A second tensor x2 (T, n_head2, head_dim) at the same positions -- K beside Q -- may ride
//   along in the same launch (x2 null, n_head2 0 otherwise).
// Launch: grid (T * (n_head + n_head2)), threads = head_dim / 2 rounded up to a multiple of 32.
//
// rx_norm_rope_kv(x, y, w, x2, y2, w2, n_head2, pos, inv_freq, n_head, head_dim, n_rot, mode, pos_dyn,
//                 norm, eps, eps2, kc, v, vc, kv_start, kv_dyn): the decode tail of qwen3/gemma3/llama
//   attention in one launch (per-head launches are latency, not bandwidth, at T <= 8):
//   per head row (same layout and grid as rx_rope), optionally RMSNorm over head_dim first
//   (norm bit 0: x, bit 1: x2; y = x / sqrt(mean(x^2) + eps) * w, w may be null), then the same
//   RoPE as rx_rope. When kc is given, the first tensor's result also goes to the f16 cache kc at
//   row kv_start + t (kv_start = *kv_dyn when given), and v (same shape as the first tensor) to vc
//   -- K's norm + rope + cache write and V's cache write, beside Q's norm + rope.
//   head_dim <= 512 (the row is staged in shared memory between norm and rotation).
#include "common.cuh"

RX_EXTERN void rx_rope(const float* x, float* y, const float* x2, float* y2, int n_head2, const int* pos,
                       const double* inv_freq, int n_head, int head_dim, int n_rot, int mode, const int* pos_dyn) {
    int T = gridDim.x / (n_head + n_head2);
    int th = blockIdx.x;
    int t, nh;
    if (th >= T * n_head) {  // the second tensor
        th -= T * n_head;
        x = x2;
        y = y2;
        nh = n_head2;
    } else {
        nh = n_head;
    }
    t = th / nh;
    const float* xr = x + (long)th * head_dim;
    float* yr = y + (long)th * head_dim;
    int p = pos_dyn ? (*pos_dyn + t) : pos[t];
    int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double a = (double)p * inv_freq[i];
        a -= 6.283185307179586 * rint(a * 0.15915494309189535);
        float s, c;
        sincosf((float)a, &s, &c);
        int i0 = mode == 0 ? 2 * i : i;
        int i1 = mode == 0 ? 2 * i + 1 : i + half;
        float x0 = xr[i0], x1 = xr[i1];
        yr[i0] = x0 * c - x1 * s;
        yr[i1] = x0 * s + x1 * c;
    }
    for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) yr[i] = xr[i];
}

#define RX_NRK_MAXD 512

RX_EXTERN void rx_norm_rope_kv(const float* x, float* y, const float* w, const float* x2, float* y2,
                               const float* w2, int n_head2, const int* pos, const double* inv_freq, int n_head,
                               int head_dim, int n_rot, int mode, const int* pos_dyn, int norm, float eps,
                               float eps2, __half* kc, const float* v, __half* vc, int kv_start,
                               const int* kv_dyn) {
    __shared__ float row[RX_NRK_MAXD];
    __shared__ float sh[32];
    int T = gridDim.x / (n_head + n_head2);
    int th = blockIdx.x, nh = n_head;
    bool first = th < T * n_head;
    if (!first) {  // the second tensor: no cache write
        th -= T * n_head;
        x = x2;
        y = y2;
        w = w2;
        eps = eps2;
        nh = n_head2;
        norm >>= 1;
        kc = nullptr;
    }
    int t = th / nh;
    const float* xr = x + (long)th * head_dim;
    float* yr = y + (long)th * head_dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float a = xr[i];
        row[i] = a;
        ss += a * a;
    }
    if (norm & 1) {
        ss = rx_block_sum(ss, sh);  // syncs, so row[] is complete
        float inv = 1.0f / sqrtf(ss / head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
            float a = row[i] * inv;
            row[i] = w ? a * w[i] : a;
        }
    }
    __syncthreads();
    // cache row (kv_start + t) of a (T, nh, head_dim) tensor: offset kv_start * nh * head_dim + th * head_dim
    long c0 = kc ? (long)rx_dyn(kv_start, kv_dyn) * nh * head_dim + (long)th * head_dim : 0;
    int p = pos_dyn ? (*pos_dyn + t) : pos[t];
    int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double a = (double)p * inv_freq[i];
        a -= 6.283185307179586 * rint(a * 0.15915494309189535);
        float s, c;
        sincosf((float)a, &s, &c);
        int i0 = mode == 0 ? 2 * i : i;
        int i1 = mode == 0 ? 2 * i + 1 : i + half;
        float x0 = row[i0], x1 = row[i1];
        float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        yr[i0] = r0;
        yr[i1] = r1;
        if (kc) {
            kc[c0 + i0] = __float2half_rn(r0);
            kc[c0 + i1] = __float2half_rn(r1);
        }
    }
    for (int i = n_rot + threadIdx.x; i < head_dim; i += blockDim.x) {
        yr[i] = row[i];
        if (kc) kc[c0 + i] = __float2half_rn(row[i]);
    }
    if (kc && vc) {
        const float* vr = v + (long)th * head_dim;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) vc[c0 + i] = __float2half_rn(vr[i]);
    }
}
