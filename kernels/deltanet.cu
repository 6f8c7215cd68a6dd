// deltanet.cu -- Gated DeltaNet ops (qwen35 linear-attention layers): the gated delta rule recurrence and its helpers.
// NumPy reference: reflex/backends/numpy_deltanet.py (same shapes; the conv before the rule is ssm.cu's rx_ssm_conv).
//
// rx_sigmoid_mul(x (n,), g (n,), y (n,), n): y = x * sigmoid(g) (qwen35's attention output gate).
//   Launch: 1-D grid-stride loop, 256 threads per block.
// rx_gated_delta_rule(qkv (T, 2*n_k*d_k + n_v*d_v), alpha (T, n_v), beta (T, n_v), ssm_a (n_v,),
//   dt_bias (n_v,), state (n_v, d_k, d_v) in/out, out (T, n_v, d_v), T, n_k, n_v, d_k, d_v, eps):
//   value head h reads key head h % n_k (tiled order). Per token: q, k L2-normalized
//   (x / sqrt(sum x^2 + eps)), q / sqrt(d_k); g = ssm_a * softplus(alpha + dt_bias), b = sigmoid(beta);
//   S = exp(g) S; S += k (b (v - k^T S))^T; out = q^T S.
//   Launch: one block per value head (grid n_v), one thread per value column j (blockDim = d_v <= 1024);
//   thread j owns state column S[:, j] and walks the tokens in order (sequential, as step decode).
//   The head's q and k (d_k <= RX_DN_MAX_DK) are staged in shared memory each token; thread 0 takes
//   their norms (a plain loop: obviously right, d_k is 128 in the real models).
#pragma once
#include "common.cuh"

#define RX_DN_MAX_DK 256

RX_EXTERN void rx_sigmoid_mul(const float* x, const float* g, float* y, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = x[i] / (1.f + expf(-g[i]));
}

RX_EXTERN void rx_gated_delta_rule(const float* qkv, const float* alpha, const float* beta, const float* ssm_a,
                                   const float* dt_bias, float* state, float* out, int T, int n_k, int n_v,
                                   int d_k, int d_v, float eps) {
    __shared__ float sq[RX_DN_MAX_DK], sk[RX_DN_MAX_DK];
    __shared__ float qscale, kscale;
    int h = blockIdx.x, j = threadIdx.x;
    int hk = h % n_k;
    long ld = 2L * n_k * d_k + (long)n_v * d_v;
    float* S = state + (long)h * d_k * d_v;      // (d_k, d_v) of head h; column j is this thread's
    for (int t = 0; t < T; ++t) {
        const float* row = qkv + (long)t * ld;
        for (int i = j; i < d_k; i += blockDim.x) {
            sq[i] = row[hk * d_k + i];
            sk[i] = row[(long)n_k * d_k + hk * d_k + i];
        }
        __syncthreads();
        if (j == 0) {
            float ssq = 0.f, ssk = 0.f;
            for (int i = 0; i < d_k; ++i) { ssq += sq[i] * sq[i]; ssk += sk[i] * sk[i]; }
            qscale = rsqrtf(ssq + eps) * rsqrtf((float)d_k);
            kscale = rsqrtf(ssk + eps);
        }
        __syncthreads();
        float x = alpha[(long)t * n_v + h] + dt_bias[h];
        float sp = x > 20.f ? x : log1pf(expf(x));   // softplus (threshold 20 as torch)
        float decay = expf(ssm_a[h] * sp);
        float b = 1.f / (1.f + expf(-beta[(long)t * n_v + h]));
        float v = row[2L * n_k * d_k + (long)h * d_v + j];
        float kv = 0.f;
        for (int i = 0; i < d_k; ++i) kv += S[(long)i * d_v + j] * decay * (sk[i] * kscale);
        float delta = b * (v - kv);
        float o = 0.f;
        for (int i = 0; i < d_k; ++i) {
            float s = S[(long)i * d_v + j] * decay + (sk[i] * kscale) * delta;
            S[(long)i * d_v + j] = s;
            o += s * (sq[i] * qscale);
        }
        out[((long)t * n_v + h) * d_v + j] = o;
        __syncthreads();  // sq / sk are rewritten by the next token
    }
}
