// matmul.cu -- prefill matrix-matrix product on float32 tiles.
//
// rx_sgemm_nt(x, w, y, M, N, K): y (M, N) = x (M, K) @ w (N, K)^T, all float32 row-major. W is a
//   dequantized weight (rx_dequant_* into a reused scratch buffer: the resident copy stays
//   quantized). Launch: grid (ceil(N/64), ceil(M/64)), 256 threads; each block computes a 64x64
//   tile of y, each thread a 4x4 sub-tile, stepping K by 16 through shared memory
//   (As/Bs stored k-major so the inner loop reads float4 rows). Any M, N, K (bounds-checked).
#include "common.cuh"

#define BM 64
#define BN 64
#define BK 16

RX_EXTERN void __launch_bounds__(256) rx_sgemm_nt(const float* __restrict__ x, const float* __restrict__ w,
                                                  float* __restrict__ y, int M, int N, int K) {
    __shared__ __align__(16) float As[BK][BM];
    __shared__ __align__(16) float Bs[BK][BN];
    int tid = threadIdx.x;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
    float acc[4][4] = {};
    // loader mapping: 256 threads x 4 elements = 64 rows x 16 k
    int lr = tid / 4, lk = (tid % 4) * 4;
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int k = k0 + lk + i;
            int ra = m0 + lr, rb = n0 + lr;
            As[lk + i][lr] = (ra < M && k < K) ? x[(long)ra * K + k] : 0.f;
            Bs[lk + i][lr] = (rb < N && k < K) ? w[(long)rb * K + k] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            float4 a = *reinterpret_cast<const float4*>(&As[kk][tm]);
            float4 b = *reinterpret_cast<const float4*>(&Bs[kk][tn]);
            float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = m0 + tm + i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int c = n0 + tn + j;
            if (c < N) y[(long)r * N + c] = acc[i][j];
        }
    }
}
