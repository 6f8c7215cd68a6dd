// norm.cu -- RMSNorm and LayerNorm over the last axis, optionally fused with a residual add.
//
// rx_rms_norm(x, w, y, n, eps): y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w  (w may be null).
// rx_add_rms_norm(x, r, s, w, y, n, eps): s = x + r (the new residual stream, written out),
//   y = rms_norm(s) * w -- one pass instead of an add kernel and a norm kernel.
// rx_layer_norm(x, w, b, y, n, eps): (x - mean) / sqrt(var + eps) * w + b (w, b may be null).
// Launch: one block of 256 threads per row (grid = number of rows); the row is read twice from
//   L1/L2 (sum, then scale), the reduction is a block sum in shared memory.
#include "common.cuh"

RX_EXTERN void rx_rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    __shared__ float sh[32];
    const float* xr = x + (long)blockIdx.x * n;
    float* yr = y + (long)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = rx_block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * inv;
        yr[i] = w ? v * w[i] : v;
    }
}

RX_EXTERN void rx_add_rms_norm(const float* x, const float* r, float* s, const float* w, float* y,
                               int n, float eps) {
    __shared__ float sh[32];
    long o = (long)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[o + i] + r[o + i];
        s[o + i] = v;
        ss += v * v;
    }
    ss = rx_block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = s[o + i] * inv;
        y[o + i] = w ? v * w[i] : v;
    }
}

RX_EXTERN void rx_layer_norm(const float* x, const float* w, const float* b, float* y, int n, float eps) {
    __shared__ float sh[32];
    const float* xr = x + (long)blockIdx.x * n;
    float* yr = y + (long)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    float mu = rx_block_sum(s, sh) / n;
    float v = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = xr[i] - mu;
        v += d * d;
    }
    float inv = 1.0f / sqrtf(rx_block_sum(v, sh) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float t = (xr[i] - mu) * inv;
        if (w) t *= w[i];
        if (b) t += b[i];
        yr[i] = t;
    }
}
