// elementwise.cu -- activations and broadcasting arithmetic on float32.
//
// rx_binary(a, b, y, n, nb, op, sb): y[i] = a[i] op b'[i]; b' = b[i % nb] (nb == n: same shape;
//   nb = last dim: a bias or a norm-like vector; b null: the scalar sb). op 0 add, 1 mul.
// rx_unary(x, y, n, op): 0 silu x/(1+e^-x), 1 gelu_tanh, 2 gelu (erf).
// rx_glu(g, u, y, n, op): y = act(g) * u -- SwiGLU (op 0) / GeGLU-tanh (op 1) in one pass.
// Launch: 1-D grid-stride, 256 threads.
#include "common.cuh"

__device__ __forceinline__ float rx_act(float x, int op) {
    if (op == 0) return x / (1.f + expf(-x));
    if (op == 1) return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return (float)(0.5 * (double)x * (1.0 + erf((double)x * 0.7071067811865476)));
}

RX_EXTERN void rx_binary(const float* a, const float* b, float* y, long n, long nb, int op, float sb) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float bv = b ? b[nb == n ? i : i % nb] : sb;
        y[i] = op == 0 ? a[i] + bv : a[i] * bv;
    }
}

RX_EXTERN void rx_unary(const float* x, float* y, long n, int op) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = rx_act(x[i], op);
}

RX_EXTERN void rx_glu(const float* g, const float* u, float* y, long n, int op) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = rx_act(g[i], op) * u[i];
}
