// ssm.cu -- Mamba-2 selective-state-space ops (granitehybrid): ssm_conv (the causal depthwise conv1d
// shared with qwen35's Gated DeltaNet) and the Mamba-2 selective scan.
// NumPy reference: reflex/backends/numpy_ssm.py (same shapes, same arithmetic order per element).
//
// rx_ssm_conv(x (T, C), state (K-1, C) in/out, w (C, K), b (C,) or null, y (T, C), T, C, K):
//   y[t, c] = b[c] + sum_j w[c, j] * xx[t + j, c], xx = [state; x]; then state = last K-1 rows of xx.
//   Launch: one thread per channel c, 1-D grid of ceil(C / 256) blocks x 256 threads. Each thread owns
//   its column of `state`, so the in-place update needs no synchronisation (rows are rewritten in
//   ascending order, always from a row index > the one written).
// rx_ssm_scan(xbc (T, ld), dt (T, n_head), state (n_head, head_dim, d_state) in/out, A, D, dt_bias
//   (n_head,), y (T, n_head * head_dim), T, n_head, head_dim, d_state, n_group, ld):
//   xbc packs x (n_head * head_dim) | B (n_group * d_state) | C (n_group * d_state) per row, row stride ld;
//   head h uses group g = h / (n_head / n_group). Per token: d = softplus(dt + dt_bias),
//   s = s * exp(d * A) + d * x * B, y = s . C + D * x.
//   Launch: one block per head (grid n_head), one thread per head_dim element p (blockDim = head_dim);
//   thread (h, p) owns state row (h, p, :) and walks the tokens in order (sequential scan).
#pragma once
#include "common.cuh"

RX_EXTERN void rx_ssm_conv(const float* x, float* state, const float* w, const float* b, float* y,
                           int T, int C, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = 0; t < T; ++t) {
        float acc = 0.f;
        for (int j = 0; j < K; ++j) {
            int i = t + j;
            float v = i < K - 1 ? state[(long)i * C + c] : x[(long)(i - (K - 1)) * C + c];
            acc += w[(long)c * K + j] * v;
        }
        y[(long)t * C + c] = b ? acc + b[c] : acc;
    }
    for (int r = 0; r < K - 1; ++r) {
        int i = T + r;
        state[(long)r * C + c] = i < K - 1 ? state[(long)i * C + c] : x[(long)(i - (K - 1)) * C + c];
    }
}

RX_EXTERN void rx_ssm_scan(const float* xbc, const float* dt, float* state, const float* A, const float* D,
                           const float* dt_bias, float* y, int T, int n_head, int head_dim, int d_state,
                           int n_group, int ld) {
    int h = blockIdx.x, p = threadIdx.x;
    if (h >= n_head || p >= head_dim) return;
    int g = h / (n_head / n_group);
    int d_inner = n_head * head_dim;
    float* s = state + ((long)h * head_dim + p) * d_state;
    float a = A[h], dd = D ? D[h] : 0.f, bias = dt_bias ? dt_bias[h] : 0.f;
    for (int t = 0; t < T; ++t) {
        const float* row = xbc + (long)t * ld;
        float d = dt[(long)t * n_head + h] + bias;
        d = d > 20.f ? d : log1pf(expf(d));      // softplus (threshold 20 as torch)
        float dA = expf(d * a);
        float xv = row[h * head_dim + p];
        const float* B = row + d_inner + g * d_state;
        const float* C = row + d_inner + n_group * d_state + g * d_state;
        float acc = 0.f;
        for (int n = 0; n < d_state; ++n) {
            float sv = s[n] * dA + d * xv * B[n];
            s[n] = sv;
            acc += sv * C[n];
        }
        y[(long)t * d_inner + h * head_dim + p] = acc + dd * xv;
    }
}
