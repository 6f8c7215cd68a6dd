// moe.cu -- combining the expert products of a sparse MoE FFN (CudaBackend.expert_matmul).
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
