// embed.cu -- ops for encoder / classifier-head models (bert's RANK head): tanh.
// NumPy reference: reflex/backends/numpy_embed.py.
//
// rx_tanh(x, y, n): y[i] = tanh(x[i]), float32, contiguous.
//   Launch: 1-D grid-stride loop, 256 threads per block (CudaBackend._grid1(n) blocks).
#pragma once
#include "common.cuh"

RX_EXTERN void rx_tanh(const float* x, float* y, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        y[i] = tanhf(x[i]);
}
