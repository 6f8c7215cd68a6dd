// matvec.cu -- decode-time matrix-vector products straight from the GGUF block format.
//
// rx_matvec_<type>(w, x, y, n_out, n_in): y[t, r] = sum_k W[r, k] * x[t, k] for the t = blockIdx.y
//   row of x (T small: decode is T = 1). W is (n_out, n_in) stored as n_out rows of n_in/QK blocks
//   (quant.cuh); it is never dequantized to memory. Launch: grid (ceil(n_out / 4), T), 128 threads
//   = 4 warps, one warp per output row, dequantized in registers, the warp sums, lane 0 writes.
//   Requires n_in % 8 == 0 (every GGUF block size is a multiple of 8 except the float types, and
//   their rows are checked on the host).
// Lane layouts (MV<T> below; a warp step covers 32 / LPB whole blocks, LPB lanes per block):
//   Q4_K, Q5_K  8 lanes / 256-element super-block (4 a step). Lane i, c = i/2, l0 = 16 (i%2): the
//               16-byte header (d, dmin, 12 scale bytes) as one uint4, qs[32c + l0 ..+16) as one
//               uint4 (Q5_K also qh[l0 ..+16)): elements 64c + l0 + 0..15 (low nibbles, sub-block
//               2c) and 64c + 32 + l0 + 0..15 (high, 2c+1); decodes only those 2 (scale, min) pairs.
//               Rows must be 16-byte aligned (144 = 9 * 16, 176 = 11 * 16).
//   Q6_K        8 lanes / super-block. Lane i, h = i/4, l0 = 8 (i%4): 8 bytes each of
//               ql[64h + l0], ql[64h + 32 + l0], qh[32h + l0] -> elements 128h + 32k + l0 + 0..7,
//               k = 0..3, with the 4 scales sc[8h + 2k + l0/16]. 210-byte blocks are 2-byte aligned
//               only, so bytes come as aligned 32-bit words funnel-shifted into place.
//   Q8_0, Q4_0, Q4_1  4 lanes / 32-element block (8 a step), lane i a contiguous quarter: Q8_0
//               qs[8i ..+8) = elements 8i..8i+7; Q4_x qs[4i ..+4) = elements 4i + j and 16 + 4i + j.
//   x is read as float4 (from global memory, or shared memory in the *n forms); the per-block
//   scales are factored out of the sums (d sc sum(q x) - dmin m sum(x)); nibbles and bytes become
//   floats by a byte permute into 0x4B0000xx and one subtraction (no conversion instruction).
//   Rows off their layout's alignment, and the other types, take the generic path: lane l the
//   8-element chunks l, l + 32, ... (consecutive lanes read consecutive bytes) through Dot8<T>.
// rx_matvec3_<type>(w0, w1, w2, x, y0, y1, y2, n0, n1, n2, n_in): up to three weights of one type
//   sharing x (Q, K, V; gate and up) in one launch: output rows [0, n0) of w0, then n1 of w1, then
//   n2 of w2 (n2 = 0 for a pair). grid (ceil((n0 + n1 + n2) / 4), T).
// rx_matvec_glu_<type>(wg, wu, x, y, n_out, n_in, op): y = act(Wg x) * (Wu x), act = silu (op 0) or
//   gelu_tanh (op 1): gate, up and the SwiGLU/GeGLU in one launch; each warp does both rows r.
// rx_matvec3n_<type>(w0, w1, w2, a, b, nw, eps, s, y0, y1, y2, n0, n1, n2, n_in) and
// rx_matvec_glun_<type>(wg, wu, a, b, nw, eps, s, y, n_out, n_in, op): rx_matvec3 / rx_matvec_glu of
//   x = rms_norm(a + b) * nw (b, nw may be null) -- the residual add and the pre-norm folded into
//   the product that reads them, so they cost no launch of their own. Every block rebuilds its row
//   t of x in dynamic shared memory (n_in floats: shmem = 4 n_in bytes, host caps n_in at 8192; a few KB
//   of L2 reads per block against the ~3 us launch they replace) as (a + b) * nw in one pass, the
//   1 / rms factor applied to the finished dot products; the first step's weight loads are issued
//   before that pass so their latency overlaps it. Blocks with blockIdx.x == 0 also write
//   s = a + b (the new residual stream) when s is given. Same grids as the plain forms.
#include "quant.cuh"

// dot8<T>(blk, j, x): sum over the 8 elements j..j+7 (j % 8 == 0) of one block times x[0..8).
// The generic form dequantizes element by element; the specialisations below decode each block's
// scales once per 8 elements and factor them out of the sum (d * sum(q x) + m * sum(x)).
template <int T>
struct Dot8 {
    __device__ static float f(const uint8_t* blk, int j, const float* x) {
        float a = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) a += Q<T>::dq(blk, j + i) * x[i];
        return a;
    }
};
template <> struct Dot8<8> {  // Q8_0
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const int8_t* q = reinterpret_cast<const int8_t*>(b + 2 + j);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) s += (float)q[i] * x[i];
        return rx_f16(b) * s;
    }
};
template <> struct Dot8<2> {  // Q4_0
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const uint8_t* q = b + 2 + (j & 15);
        int sh = j >= 16 ? 4 : 0;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) s += (float)(((q[i] >> sh) & 15) - 8) * x[i];
        return rx_f16(b) * s;
    }
};
template <> struct Dot8<3> {  // Q4_1
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        const uint8_t* q = b + 4 + (j & 15);
        int sh = j >= 16 ? 4 : 0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s += (float)((q[i] >> sh) & 15) * x[i];
            sx += x[i];
        }
        return rx_f16(b) * s + rx_f16(b + 2) * sx;
    }
};
template <int OFF_QH, int OFF_QS, bool MIN>
__device__ __forceinline__ float dot8_q5(const uint8_t* b, int j, const float* x) {
    uint32_t qh = (uint32_t)b[OFF_QH] | ((uint32_t)b[OFF_QH + 1] << 8) | ((uint32_t)b[OFF_QH + 2] << 16) |
                  ((uint32_t)b[OFF_QH + 3] << 24);
    const uint8_t* q = b + OFF_QS + (j & 15);
    int sh = j >= 16 ? 4 : 0;
    float s = 0.f, sx = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int v = ((q[i] >> sh) & 15) | (((qh >> (j + i)) & 1) << 4);
        s += (float)(MIN ? v : v - 16) * x[i];
        sx += x[i];
    }
    return MIN ? rx_f16(b) * s + rx_f16(b + 2) * sx : rx_f16(b) * s;
}
template <> struct Dot8<6> {  // Q5_0
    __device__ static float f(const uint8_t* b, int j, const float* x) { return dot8_q5<2, 6, false>(b, j, x); }
};
template <> struct Dot8<7> {  // Q5_1
    __device__ static float f(const uint8_t* b, int j, const float* x) { return dot8_q5<4, 8, true>(b, j, x); }
};
template <> struct Dot8<12> {  // Q4_K: 8 elements share one 32-element sub-block
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int c = j >> 6, n = (j >> 5) & 1, l0 = j & 31, sb = j >> 5;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        const uint8_t* q = b + 16 + 32 * c + l0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            s += (float)((q[i] >> (4 * n)) & 15) * x[i];
            sx += x[i];
        }
        return rx_f16(b) * (float)sc * s - rx_f16(b + 2) * (float)m * sx;
    }
};
template <> struct Dot8<13> {  // Q5_K
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int c = j >> 6, n = (j >> 5) & 1, l0 = j & 31, sb = j >> 5;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        const uint8_t* q = b + 48 + 32 * c + l0;
        const uint8_t* qh = b + 16 + l0;
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int v = ((q[i] >> (4 * n)) & 15) | (((qh[i] >> sb) & 1) << 4);
            s += (float)v * x[i];
            sx += x[i];
        }
        return rx_f16(b) * (float)sc * s - rx_f16(b + 2) * (float)m * sx;
    }
};
template <> struct Dot8<14> {  // Q6_K: 8 elements share one 16-element scale
    __device__ static float f(const uint8_t* b, int j, const float* x) {
        int h = j >> 7, k = (j >> 5) & 3, l0 = j & 31;
        const uint8_t* ql = b + 64 * h + 32 * (k & 1) + l0;
        const uint8_t* qh = b + 128 + 32 * h + l0;
        int s4 = 4 * (k >> 1), s2 = 2 * k;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int v = (((ql[i] >> s4) & 15) | (((qh[i] >> s2) & 3) << 4)) - 32;
            s += (float)v * x[i];
        }
        return rx_f16(b + 208) * (float)(int8_t)b[192 + (j >> 4)] * s;
    }
};

// row . x over the warp, on every lane: the single-row entry (moe.cu uses it too); defined below
template <int T>
__device__ __forceinline__ float dot_row(const uint8_t* row, const float* x, int n_in);

// ---- the per-type fast lane layouts (MV<T>) ---------------------------------------------------
// One warp step covers G = 32 / LPB whole blocks: lanes [LPB g, LPB g + LPB) take block g of the
// step, each lane i of them a fixed share of its bytes, read with the widest aligned loads the block
// layout allows, and the scales of only the sub-blocks those bytes belong to, decoded once per
// block. Weight loads and the x loads of a step are independent, so every step puts all of them
// in flight together, and a single-row product unrolls MV<T>::UNROLL steps so that several steps'
// loads are outstanding at once (the kernels are latency bound: a Qwen3-0.6B layer's 8 MB of
// weights stream in under 2 us at 4.8 TB/s). MV<T>::ok = false keeps the generic 8-element path
// (dot_row_generic) for the float types, Q5_0, Q5_1, Q2_K and Q3_K.
template <int T>
struct MV {
    static constexpr bool ok = false;
};

__device__ __forceinline__ uint4 rx_ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t rx_ld4(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ uint32_t rx_ld2(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
}
// Bytes p[0..4N) for a p that is only 2-byte aligned (Q6_K's 210-byte and Q8_0/Q4_0's 34/18-byte
// blocks): the covering aligned 32-bit words, funnel-shifted into place. When p is misaligned the
// range starts 2 bytes into its first word and ends 2 bytes into a last one, read as a 16-bit load
// so no byte past p + 4N is touched (the last block of a buffer stays in bounds; p - 2 is the same
// block's earlier field or the previous block).
template <int N>
__device__ __forceinline__ void rx_ld_a2(const uint8_t* p, uint32_t (&w)[N]) {
    const uint8_t* a = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)3);
    uint32_t sh = ((uint32_t)reinterpret_cast<uintptr_t>(p) & 2u) * 8u;
    uint32_t r[N + 1];
#pragma unroll
    for (int k = 0; k < N; k++) r[k] = rx_ld4(a + 4 * k);
    r[N] = sh ? rx_ld2(a + 4 * N) : 0u;
#pragma unroll
    for (int k = 0; k < N; k++) w[k] = __funnelshift_r(r[k], r[k + 1], sh);
}
// Byte J of w as a float, exactly, minus `bias`: 0x4B000000 | b is the float 2^23 + b, so one byte
// permute and one add replace an integer-to-float conversion (16 a clock per SM on sm_90, against
// 64-128 for the permute and the add).
template <int J>
__device__ __forceinline__ float rx_bytef(uint32_t w, float bias) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7650 | J)) - (8388608.f + bias);
}
__device__ __forceinline__ float rx_h2f(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)u)); }
// s += sum_j (byte_j(w) - bias) * x[j]
__device__ __forceinline__ void rx_dot4(uint32_t w, float4 x, float bias, float& s) {
    s = fmaf(rx_bytef<0>(w, bias), x.x, s);
    s = fmaf(rx_bytef<1>(w, bias), x.y, s);
    s = fmaf(rx_bytef<2>(w, bias), x.z, s);
    s = fmaf(rx_bytef<3>(w, bias), x.w, s);
}
__device__ __forceinline__ float rx_sum4(float4 x) { return (x.x + x.y) + (x.z + x.w); }

// 6-bit (scale, min) of Q4_K / Q5_K sub-blocks 2c and 2c+1 from the 12-byte field s0 | s1 | s2
// (bytes 0-3, 4-7, 8-11), all four bytes of a word at once: sub-blocks 0-3 are the low 6 bits of
// bytes 0-3 (scales) and 4-7 (mins); 4-7 take their low 4 bits from bytes 8-11 and their top 2
// from the top 2 bits of bytes 0-3 / 4-7.
__device__ __forceinline__ void rx_k4_pair(uint32_t s0, uint32_t s1, uint32_t s2, int c, float (&sc)[2],
                                           float (&m)[2]) {
    uint32_t scw = c < 2 ? s0 & 0x3f3f3f3fu : (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
    uint32_t mw = c < 2 ? s1 & 0x3f3f3f3fu : ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
    int sh = 16 * (c & 1);
    sc[0] = (float)((scw >> sh) & 0xff);
    sc[1] = (float)((scw >> (sh + 8)) & 0xff);
    m[0] = (float)((mw >> sh) & 0xff);
    m[1] = (float)((mw >> (sh + 8)) & 0xff);
}

// Q4_K, 144 B: 8 lanes a super-block. Lane i (c = i/2, l0 = 16 (i%2)) loads the 16-byte header
// (d, dmin, 12 scale bytes; the 8 lanes of a block read one address) and qs[32c + l0 .. +16) as one
// uint4: low nibbles are elements 64c + l0 + 0..15 (sub-block 2c), high nibbles 64c + 32 + l0 +
// 0..15 (sub-block 2c + 1). Rows must be 16-byte aligned (144 = 9 * 16).
template <>
struct MV<12> {
    static constexpr bool ok = true;
    static constexpr int LPB = 8, ALIGN = 16, NX = 8, UNROLL = 2;
    struct W { uint4 h, q; };
    __device__ static W load(const uint8_t* b, int i) { return {rx_ld16(b), rx_ld16(b + 16 + 16 * i)}; }
    __device__ static void load_x(const float* x, int i, float4 (&v)[8]) {
        const float4* p = reinterpret_cast<const float4*>(x + 64 * (i >> 1) + 16 * (i & 1));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = p[k];
            v[4 + k] = p[8 + k];   // + 32 elements: the high nibbles
        }
    }
    __device__ static float dot(const W& w, int i, const float4 (&v)[8]) {
        float sc[2], m[2];
        rx_k4_pair(w.h.y, w.h.z, w.h.w, i >> 1, sc, m);
        const uint32_t q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
        float s0 = 0.f, s1 = 0.f, x0 = 0.f, x1 = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            rx_dot4(q[k] & 0x0f0f0f0fu, v[k], 0.f, s0);
            rx_dot4((q[k] >> 4) & 0x0f0f0f0fu, v[4 + k], 0.f, s1);
            x0 += rx_sum4(v[k]);
            x1 += rx_sum4(v[4 + k]);
        }
        return rx_h2f(w.h.x) * (sc[0] * s0 + sc[1] * s1) - rx_h2f(w.h.x >> 16) * (m[0] * x0 + m[1] * x1);
    }
};

// Q5_K, 176 B: Q4_K's lanes plus the fifth bits, qh[l0 .. l0 + 16) as one uint4 (bit 2c for the
// low nibbles, 2c + 1 for the high). Rows must be 16-byte aligned (176 = 11 * 16).
template <>
struct MV<13> {
    static constexpr bool ok = true;
    static constexpr int LPB = 8, ALIGN = 16, NX = 8, UNROLL = 2;
    struct W { uint4 h, qh, q; };
    __device__ static W load(const uint8_t* b, int i) {
        return {rx_ld16(b), rx_ld16(b + 16 + 16 * (i & 1)), rx_ld16(b + 48 + 16 * i)};
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[8]) { MV<12>::load_x(x, i, v); }
    __device__ static float dot(const W& w, int i, const float4 (&v)[8]) {
        int c = i >> 1;
        float sc[2], m[2];
        rx_k4_pair(w.h.y, w.h.z, w.h.w, c, sc, m);
        const uint32_t q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
        const uint32_t qh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
        float s0 = 0.f, s1 = 0.f, x0 = 0.f, x1 = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = (q[k] & 0x0f0f0f0fu) | (((qh[k] >> (2 * c)) & 0x01010101u) << 4);
            uint32_t hi = ((q[k] >> 4) & 0x0f0f0f0fu) | (((qh[k] >> (2 * c + 1)) & 0x01010101u) << 4);
            rx_dot4(lo, v[k], 0.f, s0);
            rx_dot4(hi, v[4 + k], 0.f, s1);
            x0 += rx_sum4(v[k]);
            x1 += rx_sum4(v[4 + k]);
        }
        return rx_h2f(w.h.x) * (sc[0] * s0 + sc[1] * s1) - rx_h2f(w.h.x >> 16) * (m[0] * x0 + m[1] * x1);
    }
};

// Q6_K, 210 B: 8 lanes a super-block. Lane i (h = i/4, l0 = 8 (i%4)) takes l = l0 .. l0 + 8 of
// half h for all four k: 8 bytes each of ql[64h + l0], ql[64h + 32 + l0], qh[32h + l0] and the 8
// scales of half h (it uses sc[8h + 2k + l0/16], k = 0..3). 210 B blocks are only 2-byte aligned
// at odd super-blocks, so the bytes come through rx_ld_a2 (aligned words + funnel shift).
template <>
struct MV<14> {
    static constexpr bool ok = true;
    static constexpr int LPB = 8, ALIGN = 2, NX = 8, UNROLL = 2;
    struct W { uint32_t a[2], b[2], h[2], s[2], d; };
    __device__ static W load(const uint8_t* blk, int i) {
        int h = i >> 2, l0 = 8 * (i & 3);
        W w;
        rx_ld_a2<2>(blk + 64 * h + l0, w.a);
        rx_ld_a2<2>(blk + 64 * h + 32 + l0, w.b);
        rx_ld_a2<2>(blk + 128 + 32 * h + l0, w.h);
        rx_ld_a2<2>(blk + 192 + 8 * h, w.s);
        w.d = rx_ld2(blk + 208);
        return w;
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[8]) {
        const float* p = x + 128 * (i >> 2) + 8 * (i & 3);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = *reinterpret_cast<const float4*>(p + 32 * k);
            v[2 * k + 1] = *reinterpret_cast<const float4*>(p + 32 * k + 4);
        }
    }
    __device__ static float dot(const W& w, int i, const float4 (&v)[8]) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int t = 0; t < 2; t++) {   // elements l0 + 4t + 0..3
            uint32_t a = w.a[t], b = w.b[t], h = w.h[t];
            // 6-bit q = lo | hi << 4 per byte; the k-th 2-bit field of qh moved to bits 4-5
            rx_dot4((a & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u), v[t], 32.f, s[0]);
            rx_dot4((b & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u), v[2 + t], 32.f, s[1]);
            rx_dot4(((a >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u), v[4 + t], 32.f, s[2]);
            rx_dot4(((b >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u), v[6 + t], 32.f, s[3]);
        }
        int sh = 8 * ((i & 3) >> 1);   // l0 / 16 picks the odd or even scale bytes
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t word = w.s[k >> 1];
            float sck = (float)(int8_t)(uint8_t)(word >> (16 * (k & 1) + sh));
            acc = fmaf(sck, s[k], acc);
        }
        return rx_h2f(w.d) * acc;
    }
};

// Q8_0 / Q4_0 / Q4_1 (32-element blocks): RX_Q32_LPB lanes a block (32 / RX_Q32_LPB blocks a warp
// step), lane i taking a contiguous 32 / LPB-element share. One lane a whole block (34 B strided
// lane to lane) made every load instruction touch ~34 sectors for 128 useful bytes and was slower
// than the old byte loads on the H200; 4 lanes a block keep each instruction's bytes within 8
// neighbouring blocks and x fully coalesced (4 beat 2 on most shapes, with 4 steps unrolled).
#ifndef RX_Q32_LPB
#define RX_Q32_LPB 4
#endif
#ifndef RX_Q32_UNROLL
#define RX_Q32_UNROLL 4
#endif
static_assert(RX_Q32_LPB == 2 || RX_Q32_LPB == 4, "Q8_0/Q4_x lane shares are 16 or 8 elements");
template <>
struct MV<8> {  // Q8_0, 34 B (2-byte aligned): lane i has qs[E i .. E i + E), int8 as (byte ^ 0x80) - 128
    static constexpr bool ok = true;
    static constexpr int LPB = RX_Q32_LPB, ALIGN = 2, E = 32 / LPB, NW = E / 4, NX = E / 4, UNROLL = RX_Q32_UNROLL;
    struct W { uint32_t q[NW], d; };
    __device__ static W load(const uint8_t* b, int i) {
        W w;
        rx_ld_a2<NW>(b + 2 + E * i, w.q);
        w.d = rx_ld2(b);
        return w;
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[NX]) {
        const float4* p = reinterpret_cast<const float4*>(x + E * i);
#pragma unroll
        for (int k = 0; k < NX; k++) v[k] = p[k];
    }
    __device__ static float dot(const W& w, int, const float4 (&v)[NX]) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < NW; k++) rx_dot4(w.q[k] ^ 0x80808080u, v[k], 128.f, s);
        return rx_h2f(w.d) * s;
    }
};
// Q4_0 / Q4_1 lane i: qs[H i .. H i + H), H = 16 / LPB: low nibbles are elements H i + j, high
// nibbles 16 + H i + j.
template <int OFF, bool A4>
struct MVq4 {
    static constexpr int LPB = RX_Q32_LPB, H = 16 / LPB, NW = H / 4, NX = H / 2;
    __device__ static void load_q(const uint8_t* b, int i, uint32_t (&q)[NW]) {
        if constexpr (A4) {
#pragma unroll
            for (int k = 0; k < NW; k++) q[k] = rx_ld4(b + OFF + H * i + 4 * k);
        } else {
            rx_ld_a2<NW>(b + OFF + H * i, q);
        }
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[NX]) {
        const float4* p = reinterpret_cast<const float4*>(x + H * i);
        const float4* p2 = reinterpret_cast<const float4*>(x + 16 + H * i);
#pragma unroll
        for (int k = 0; k < NW; k++) {
            v[k] = p[k];
            v[NW + k] = p2[k];
        }
    }
};
template <>
struct MV<2> {  // Q4_0, 18 B (2-byte aligned): d * (q - 8)
    static constexpr bool ok = true;
    using B = MVq4<2, false>;
    static constexpr int LPB = B::LPB, ALIGN = 2, NX = B::NX, UNROLL = RX_Q32_UNROLL;
    struct W { uint32_t q[B::NW], d; };
    __device__ static W load(const uint8_t* b, int i) {
        W w;
        B::load_q(b, i, w.q);
        w.d = rx_ld2(b);
        return w;
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[NX]) { B::load_x(x, i, v); }
    __device__ static float dot(const W& w, int, const float4 (&v)[NX]) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < B::NW; k++) {
            rx_dot4(w.q[k] & 0x0f0f0f0fu, v[k], 8.f, s);
            rx_dot4((w.q[k] >> 4) & 0x0f0f0f0fu, v[B::NW + k], 8.f, s);
        }
        return rx_h2f(w.d) * s;
    }
};
template <>
struct MV<3> {  // Q4_1, 20 B (4-byte aligned): d * sum(q x) + m * sum(x)
    static constexpr bool ok = true;
    using B = MVq4<4, true>;
    static constexpr int LPB = B::LPB, ALIGN = 4, NX = B::NX, UNROLL = RX_Q32_UNROLL;
    struct W { uint32_t q[B::NW], dm; };
    __device__ static W load(const uint8_t* b, int i) {
        W w;
        B::load_q(b, i, w.q);
        w.dm = rx_ld4(b);
        return w;
    }
    __device__ static void load_x(const float* x, int i, float4 (&v)[NX]) { B::load_x(x, i, v); }
    __device__ static float dot(const W& w, int, const float4 (&v)[NX]) {
        float s = 0.f, sx = 0.f;
#pragma unroll
        for (int k = 0; k < B::NW; k++) {
            rx_dot4(w.q[k] & 0x0f0f0f0fu, v[k], 0.f, s);
            rx_dot4((w.q[k] >> 4) & 0x0f0f0f0fu, v[B::NW + k], 0.f, s);
            sx += rx_sum4(v[k]) + rx_sum4(v[B::NW + k]);
        }
        return rx_h2f(w.dm) * s + rx_h2f(w.dm >> 16) * sx;
    }
};

// The generic path: lane l takes the 8-element chunks l, l + 32, ... (consecutive lanes read
// consecutive bytes) through Dot8 / Q<T>::dq. Returns this lane's partial sum.
template <int T>
__device__ __forceinline__ float dot_row_generic(const uint8_t* row, const float* x, int n_in) {
    int lane = threadIdx.x & 31;
    float acc = 0.f;
    int n_chunks = n_in >> 3;
    for (int c = lane; c < n_chunks; c += 32) {
        int k0 = c << 3;
        const float4* xv = reinterpret_cast<const float4*>(x + k0);
        float4 a = xv[0], b = xv[1];
        const uint8_t* blk = row + (k0 / Q<T>::QK) * Q<T>::TS;
        int j = k0 % Q<T>::QK;
        if (Q<T>::QK == 1) {
            // float types: 8 consecutive "blocks"
            acc += Q<T>::dq(blk, 0) * a.x + Q<T>::dq(blk + Q<T>::TS, 0) * a.y +
                   Q<T>::dq(blk + 2 * Q<T>::TS, 0) * a.z + Q<T>::dq(blk + 3 * Q<T>::TS, 0) * a.w +
                   Q<T>::dq(blk + 4 * Q<T>::TS, 0) * b.x + Q<T>::dq(blk + 5 * Q<T>::TS, 0) * b.y +
                   Q<T>::dq(blk + 6 * Q<T>::TS, 0) * b.z + Q<T>::dq(blk + 7 * Q<T>::TS, 0) * b.w;
        } else {
            float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            acc += Dot8<T>::f(blk, j, xs);
        }
    }
    return acc;
}

template <int T>
__device__ __forceinline__ bool rx_fast_ok(const uint8_t* row) {
    if constexpr (MV<T>::ok) return (reinterpret_cast<uintptr_t>(row) & (MV<T>::ALIGN - 1)) == 0;
    else return false;
}

// the pre() of the forms that have none
struct RxNoPre {
    __device__ void operator()() const {}
};

// sum_k r0[k] x[k] (and r1 . x for NR = 2: gate and up share every x load) over the warp, into
// out[0..NR) on every lane of a `live` warp. `pre()` runs once, at one program point, on every
// thread of the block (the *n forms build x there, with __syncthreads); with PF the fast path has
// requested its first step's weights before it, so their DRAM latency overlaps pre's work (without
// PF no step is peeled: the forms without a pre() keep UNROLL steps' loads together). The alignment test
// is warp-uniform (one row per warp); a row off its layout's alignment takes the generic path.
template <int T, int NR, bool PF = false, class Pre>
__device__ __forceinline__ void dot_rows(const uint8_t* r0, const uint8_t* r1, const float* x, int n_in, bool live,
                                         Pre pre, float (&out)[2]) {
    float acc[2] = {0.f, 0.f};
    bool generic = true;
    if constexpr (MV<T>::ok) {
        using M = MV<T>;
        constexpr int G = 32 / M::LPB;
        int lane = threadIdx.x & 31, g = lane / M::LPB, i = lane % M::LPB;
        int nb = n_in / Q<T>::QK;
        bool fast = rx_fast_ok<T>(r0) && (NR == 1 || rx_fast_ok<T>(r1));
        generic = !fast;
        int b = g;
        if constexpr (PF) {
            // prefetch (PF, the *n forms): the first step's weights requested before pre()
            typename M::W w0{}, w1{};
            bool first = live && fast && g < nb;
            if (first) {
                w0 = M::load(r0 + (long)g * Q<T>::TS, i);
                if (NR == 2) w1 = M::load(r1 + (long)g * Q<T>::TS, i);
            }
            pre();
            if (!live) return;
            if (first) {
                float4 v[M::NX];
                M::load_x(x + (long)g * Q<T>::QK, i, v);
                acc[0] += M::dot(w0, i, v);
                if (NR == 2) acc[1] += M::dot(w1, i, v);
            }
            b += G;
        } else {
            // no peeled step here: the unrolled loop below then issues UNROLL steps' loads together
            pre();
            if (!live) return;
        }
        if (fast) {
            // two rows: one step's registers are already ~2x a single row's, so no unrolling
#pragma unroll(NR == 1 ? M::UNROLL : 1)
            for (; b < nb; b += G) {
                long off = (long)b * Q<T>::TS;
                typename M::W u0 = M::load(r0 + off, i);
                typename M::W u1;
                if (NR == 2) u1 = M::load(r1 + off, i);
                float4 v[M::NX];
                M::load_x(x + (long)b * Q<T>::QK, i, v);
                acc[0] += M::dot(u0, i, v);
                if (NR == 2) acc[1] += M::dot(u1, i, v);
            }
        }
    } else {
        pre();
        if (!live) return;
    }
    if (generic) {
        acc[0] = dot_row_generic<T>(r0, x, n_in);
        if (NR == 2) acc[1] = dot_row_generic<T>(r1, x, n_in);
    }
    out[0] = rx_warp_sum(acc[0]);
    if (NR == 2) out[1] = rx_warp_sum(acc[1]);
}

template <int T>
__device__ __forceinline__ float dot_row(const uint8_t* row, const float* x, int n_in) {
    float s[2];
    dot_rows<T, 1, false>(row, row, x, n_in, true, RxNoPre{}, s);
    return s[0];
}

template <int T>
__device__ void matvec_impl(const uint8_t* w, const float* x, float* y, int n_out, int n_in) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_out) return;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    int t = blockIdx.y;
    float s = dot_row<T>(w + r * row_bytes, x + (long)t * n_in, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = s;
}

// row r of the 3-way forms: w, y, n_out of the weight it falls in; false past the last
__device__ __forceinline__ bool rx_row3(int& r, const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, float* y0,
                                        float* y1, float* y2, int n0, int n1, int n2, const uint8_t*& w, float*& y,
                                        int& n_out) {
    if (r < n0) { w = w0; y = y0; n_out = n0; }
    else if (r < n0 + n1) { r -= n0; w = w1; y = y1; n_out = n1; }
    else if (r < n0 + n1 + n2) { r -= n0 + n1; w = w2; y = y2; n_out = n2; }
    else { r = 0; w = w0; y = y0; n_out = n0; return false; }
    return true;
}

template <int T>
__device__ void matvec3_impl(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* x,
                             float* y0, float* y1, float* y2, int n0, int n1, int n2, int n_in) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    const uint8_t* w;
    float* y;
    int n_out;
    if (!rx_row3(r, w0, w1, w2, y0, y1, y2, n0, n1, n2, w, y, n_out)) return;
    int t = blockIdx.y;
    float s = dot_row<T>(w + r * row_bytes, x + (long)t * n_in, n_in);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = s;
}

__device__ __forceinline__ float rx_glu_act(float g, int op) {
    if (op == 0) return g / (1.f + expf(-g));
    return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

template <int T>
__device__ void matvec_glu_impl(const uint8_t* wg, const uint8_t* wu, const float* x, float* y, int n_out,
                                int n_in, int op) {
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (r >= n_out) return;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    int t = blockIdx.y;
    float gu[2];
    dot_rows<T, 2, false>(wg + r * row_bytes, wu + r * row_bytes, x + (long)t * n_in, n_in, true, RxNoPre{}, gu);
    if ((threadIdx.x & 31) == 0) y[(long)t * n_out + r] = rx_glu_act(gu[0], op) * gu[1];
}

extern __shared__ float4 rx_mvn_smem[];

// xs[0..n_in) = (a[t] + b[t]) * nw for t = blockIdx.y; returns inv = 1 / rms(a[t] + b[t]), so that
// row . (rms_norm(a + b) * nw) = inv * (row . xs): one pass, one round trip to global memory
// (a, b and nw loaded together) instead of a second pass that scales xs. Every thread of the block
// must call it (it synchronizes; the block sum's barriers also publish xs).
__device__ __forceinline__ float rx_norm_row(const float* a, const float* b, const float* nw, float eps,
                                             float* s, int n_in, float* xs) {
    __shared__ float red[32];
    long o = (long)blockIdx.y * n_in;
    bool ws = s && blockIdx.x == 0;
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
        float v = b ? a[o + i] + b[o + i] : a[o + i];
        xs[i] = nw ? v * nw[i] : v;
        if (ws) s[o + i] = v;
        ss += v * v;
    }
    ss = rx_block_sum(ss, red);
    return 1.0f / sqrtf(ss / n_in + eps);
}

template <int T>
__device__ void matvec3n_impl(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* a,
                              const float* b, const float* nw, float eps, float* s, float* y0, float* y1,
                              float* y2, int n0, int n1, int n2, int n_in) {
    float* xs = reinterpret_cast<float*>(rx_mvn_smem);
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    const uint8_t* w;
    float* y;
    int n_out;
    bool live = rx_row3(r, w0, w1, w2, y0, y1, y2, n0, n1, n2, w, y, n_out);
    float inv, acc[2];
    const uint8_t* row = w + r * row_bytes;
    dot_rows<T, 1, true>(row, row, xs, n_in, live, [&] { inv = rx_norm_row(a, b, nw, eps, s, n_in, xs); }, acc);
    if (live && (threadIdx.x & 31) == 0) y[(long)blockIdx.y * n_out + r] = inv * acc[0];
}

template <int T>
__device__ void matvec_glun_impl(const uint8_t* wg, const uint8_t* wu, const float* a, const float* b,
                                 const float* nw, float eps, float* s, float* y, int n_out, int n_in, int op) {
    float* xs = reinterpret_cast<float*>(rx_mvn_smem);
    int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    bool live = r < n_out;
    if (!live) r = 0;
    long row_bytes = (long)n_in / Q<T>::QK * Q<T>::TS;
    float inv, gu[2];
    dot_rows<T, 2, true>(wg + r * row_bytes, wu + r * row_bytes, xs, n_in, live,
                   [&] { inv = rx_norm_row(a, b, nw, eps, s, n_in, xs); }, gu);
    if (live && (threadIdx.x & 31) == 0) y[(long)blockIdx.y * n_out + r] = rx_glu_act(inv * gu[0], op) * (inv * gu[1]);
}

// Minimum resident blocks per SM for the fast-path kernels (register cap 65536 / (128 * MINB)):
// without it ptxas held some forms to 32 registers, serializing the unrolled steps' loads; 8
// (<= 64 registers) measured best on the H200 for the single-row forms, 6 (<= 80) keeps the
// two-row glu forms free of spills and a 3072-row gate/up still in one wave of 132 SMs. The
// generic-path types keep ptxas' own choice (0). benchmarks/bench_matvec.py measures them.
#ifndef RX_MV_MINB
#define RX_MV_MINB 8
#endif
#ifndef RX_MV_MINB_GLU
#define RX_MV_MINB_GLU 6
#endif
#define RX_MV(T, name)                                                                          \
    RX_EXTERN void __launch_bounds__(128, MV<T>::ok ? RX_MV_MINB : 0) rx_matvec_##name(const uint8_t* w, const float* x,   \
                                                          float* y, int n_out, int n_in) {     \
        matvec_impl<T>(w, x, y, n_out, n_in);                                                   \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128, MV<T>::ok ? RX_MV_MINB : 0) rx_matvec3_##name(                                    \
        const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* x, float* y0,    \
        float* y1, float* y2, int n0, int n1, int n2, int n_in) {                               \
        matvec3_impl<T>(w0, w1, w2, x, y0, y1, y2, n0, n1, n2, n_in);                           \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128, MV<T>::ok ? RX_MV_MINB_GLU : 0) rx_matvec_glu_##name(const uint8_t* wg, const uint8_t* wu, \
                                                              const float* x, float* y, int n_out, \
                                                              int n_in, int op) {               \
        matvec_glu_impl<T>(wg, wu, x, y, n_out, n_in, op);                                      \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128, MV<T>::ok ? RX_MV_MINB : 0) rx_matvec3n_##name(                                   \
        const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const float* a, const float* b, \
        const float* nw, float eps, float* s, float* y0, float* y1, float* y2, int n0, int n1,  \
        int n2, int n_in) {                                                                     \
        matvec3n_impl<T>(w0, w1, w2, a, b, nw, eps, s, y0, y1, y2, n0, n1, n2, n_in);           \
    }                                                                                           \
    RX_EXTERN void __launch_bounds__(128, MV<T>::ok ? RX_MV_MINB_GLU : 0) rx_matvec_glun_##name(                                \
        const uint8_t* wg, const uint8_t* wu, const float* a, const float* b, const float* nw,  \
        float eps, float* s, float* y, int n_out, int n_in, int op) {                           \
        matvec_glun_impl<T>(wg, wu, a, b, nw, eps, s, y, n_out, n_in, op);                      \
    }
RX_FOR_EACH_TYPE(RX_MV)
