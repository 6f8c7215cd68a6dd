// matmul.cu -- prefill matrix-matrix products: float32 tiles, and f16 tensor cores (wmma).
//
// rx_sgemm_nt(x, w, y, M, N, K): y (M, N) = x (M, K) @ w (N, K)^T, all float32 row-major. W is a
//   dequantized weight (rx_dequant_* into a reused scratch buffer: the resident copy stays
//   quantized). Launch: grid (ceil(N/64), ceil(M/64)), 256 threads; each block computes a 64x64
//   tile of y, each thread a 4x4 sub-tile, stepping K by 16 through shared memory
//   (As/Bs stored k-major so the inner loop reads float4 rows). Any M, N, K (bounds-checked).
//
// rx_x_to_half(x, xh, scale, M, K): xh (M, K) f16 = x / scale[m], scale[m] a power of two putting
//   the row's largest |x| in [2^13, 2^14) (f16 cannot overflow, and the division is exact, so
//   each element keeps f16's relative rounding 2^-11 and no more). Launch: grid (M), 256 threads.
// rx_hgemm_nt(xh, wh, scale, y, M, N, K): y (M, N) f32 = scale[m] * (xh (M, K) @ wh (N, K)^T),
//   f16 operands, f32 accumulation on tensor cores (wmma 16x16x16, sm_70+). wh is a weight
//   dequantized into a reused f16 scratch (rx_dequant_h_*). Needs K % 8 == 0 (16-byte row
//   loads); any M, N (rows beyond are zero-filled, stores bounds-checked). Launch: grid
//   (ceil(N/64), ceil(M/64)), 128 threads = 4 warps in 2x2, each warp a 32x32 tile (2x2
//   fragments); K steps by 32 through double-buffered shared tiles (next tile in registers while
//   the current one multiplies); the epilogue stages the f32 tile in shared memory to apply
//   scale and bounds.
#include "common.cuh"
#include <mma.h>

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

RX_EXTERN void __launch_bounds__(256) rx_x_to_half(const float* __restrict__ x, __half* __restrict__ xh,
                                                   float* __restrict__ scale, int M, int K) {
    __shared__ float sh[32];
    const float* r = x + (long)blockIdx.x * K;
    float m = 0.f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(r[k]));
    m = rx_block_max(m, sh);
    // 2^(e - 14) with 2^(e-1) <= m < 2^e: the row max lands in [2^13, 2^14)
    float s = (m > 0.f && isfinite(m)) ? ldexpf(1.f, ilogbf(m) + 1 - 14) : 1.f;
    float inv = 1.f / s;  // exact: s is a power of two
    __half* o = xh + (long)blockIdx.x * K;
    for (int k = threadIdx.x; k < K; k += blockDim.x) o[k] = __float2half_rn(r[k] * inv);
    if (threadIdx.x == 0) scale[blockIdx.x] = s;
}

#define HBM 64
#define HBN 64
#define HBK 32
#define HLD (HBK + 8)   // padded row (halves): breaks shared-memory bank conflicts, keeps 16-byte rows
#define CLD (HBN + 4)

RX_EXTERN void __launch_bounds__(128) rx_hgemm_nt(const __half* __restrict__ xh, const __half* __restrict__ wh,
                                                  const float* __restrict__ scale, float* __restrict__ y,
                                                  int M, int N, int K) {
    using namespace nvcuda;
    // two stages of A (64 x HLD) and B (64 x HLD) halves; the epilogue reuses the space as f32 C
    constexpr int STAGE = (HBM + HBN) * HLD;
    constexpr int AB_BYTES = 2 * STAGE * 2, C_BYTES = HBM * CLD * 4;
    __shared__ __align__(32) unsigned char smem[AB_BYTES > C_BYTES ? AB_BYTES : C_BYTES];
    __half* sAB = reinterpret_cast<__half*>(smem);
    int tid = threadIdx.x, warp = tid >> 5;
    int m0 = blockIdx.y * HBM, n0 = blockIdx.x * HBN;
    int wr = (warp >> 1) * 32, wc = (warp & 1) * 32;
    // loader: a 64 x 32 tile is 256 chunks of 8 halves; thread t loads chunks t and t + 128
    // (row c / 4, halves (c % 4) * 8) of both A and B
    uint4 ra[2], rb[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int c = tid + i * 128, row = c >> 2, kc = k0 + (c & 3) * 8;
            int am = m0 + row, bn = n0 + row;
            ra[i] = (am < M && kc < K) ? *reinterpret_cast<const uint4*>(xh + (long)am * K + kc) : make_uint4(0, 0, 0, 0);
            rb[i] = (bn < N && kc < K) ? *reinterpret_cast<const uint4*>(wh + (long)bn * K + kc) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store = [&](int st) {
        __half* A = sAB + st * STAGE;
        __half* B = A + HBM * HLD;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int c = tid + i * 128, row = c >> 2, kk = (c & 3) * 8;
            *reinterpret_cast<uint4*>(A + row * HLD + kk) = ra[i];
            *reinterpret_cast<uint4*>(B + row * HLD + kk) = rb[i];
        }
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
    int nk = (K + HBK - 1) / HBK;
    load(0);
    store(0);
    __syncthreads();
    for (int t = 0; t < nk; t++) {
        int st = t & 1;
        if (t + 1 < nk) load((t + 1) * HBK);  // global loads in flight during the mma below
        const __half* A = sAB + st * STAGE;
        const __half* B = A + HBM * HLD;
#pragma unroll
        for (int kk = 0; kk < HBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            // B = W^T: element (k, n) sits at B[n * HLD + k], i.e. column-major K x N
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], A + (wr + i * 16) * HLD + kk, HLD);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], B + (wc + j * 16) * HLD + kk, HLD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        if (t + 1 < nk) store(st ^ 1);  // the other stage: last read an iteration ago (synced below)
        __syncthreads();
    }
    float* C = reinterpret_cast<float*>(smem);  // all warps are past their last mma (synced above)
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(C + (wr + i * 16) * CLD + wc + j * 16, acc[i][j], CLD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < HBM * HBN; e += 128) {
        int r = e / HBN, c = e % HBN, m = m0 + r, n = n0 + c;
        if (m < M && n < N) y[(long)m * N + n] = C[r * CLD + c] * scale[m];
    }
}
