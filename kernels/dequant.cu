// dequant.cu -- block formats -> float32: whole tensors (prefill scratch, tests) and embedding rows.
//
// rx_dequant_<type>(src, dst, n_rows, n_cols): dst (n_rows, n_cols) f32 from a tensor stored as
//   n_rows rows of n_cols/QK blocks (layout in quant.cuh). Launch: 1-D grid-stride, 256 threads,
//   one output element per thread per step. Bit-exact with reflex.quants.dequantize.
// rx_get_rows_<type>(table, ids, dst, n_ids, n_cols): dst[t] = row ids[t] of the quantized table
//   (token embeddings stay in their GGUF format on the device). Launch: grid (ceil(n_cols/256),
//   n_ids), 256 threads. ids are int32 on the device (the token of a captured decode step is
//   written there by the previous step's argmax).
#include "quant.cuh"

template <int T>
__device__ void dequant_impl(const uint8_t* src, float* dst, long n_rows, long n_cols) {
    long n = n_rows * n_cols;
    long row_bytes = n_cols / Q<T>::QK * Q<T>::TS;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long r = i / n_cols, k = i - r * n_cols;
        dst[i] = rx_dq_row<T>(src + r * row_bytes, k);
    }
}

template <int T>
__device__ void get_rows_impl(const uint8_t* table, const int* ids, float* dst, int n_cols) {
    int t = blockIdx.y;
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_cols) return;
    long row_bytes = (long)n_cols / Q<T>::QK * Q<T>::TS;
    long id = ids[t];
    dst[(long)t * n_cols + k] = rx_dq_row<T>(table + id * row_bytes, k);
}

#define RX_DEQ(T, name)                                                                       \
    RX_EXTERN void rx_dequant_##name(const uint8_t* src, float* dst, long n_rows, long n_cols) { \
        dequant_impl<T>(src, dst, n_rows, n_cols);                                            \
    }                                                                                         \
    RX_EXTERN void rx_get_rows_##name(const uint8_t* table, const int* ids, float* dst, int n_cols) { \
        get_rows_impl<T>(table, ids, dst, n_cols);                                            \
    }
RX_FOR_EACH_TYPE(RX_DEQ)

// rx_dequant_h_<type>(src, dst, n_rows, n_cols): as rx_dequant_<type> but into an __half scratch,
//   the B operand of rx_hgemm_nt (prefill on tensor cores). Same launch. Only used for block
//   formats and F16, whose values are exact or near-exact in f16 (K-quant/legacy products of an
//   fp16 scale with a small integer; F32/BF16 weights keep the float32 GEMM: range).
template <int T>
__device__ void dequant_h_impl(const uint8_t* src, __half* dst, long n_rows, long n_cols) {
    long n = n_rows * n_cols;
    long row_bytes = n_cols / Q<T>::QK * Q<T>::TS;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long r = i / n_cols, k = i - r * n_cols;
        dst[i] = __float2half_rn(rx_dq_row<T>(src + r * row_bytes, k));
    }
}

#define RX_DEQH(T, name)                                                                       \
    RX_EXTERN void rx_dequant_h_##name(const uint8_t* src, __half* dst, long n_rows, long n_cols) { \
        dequant_h_impl<T>(src, dst, n_rows, n_cols);                                           \
    }
RX_FOR_EACH_TYPE(RX_DEQH)
