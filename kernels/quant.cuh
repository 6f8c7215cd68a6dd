// quant.cuh -- GGUF block layouts and per-element dequantization, identical to reflex/quants.
//
// Every type is a struct Q<GGML_TYPE> with QK (elements per block), TS (bytes per block) and
// dq(blk, j): element j (0 <= j < QK) of the block starting at `blk`, as float32. The products
// are written with __fmul_rn / __fadd_rn / __fsub_rn so nvcc cannot contract them into an FMA:
// the result is bit-identical to the NumPy dequantizers (which round every step).
//
//   Q8_0 (8)  34 B/32 : | d f16 | qs i8 x32 |                 x = q * d
//   Q4_0 (2)  18 B/32 : | d f16 | qs u8 x16 |                 x = (q - 8) * d; q[j] = lo nibble of
//                        qs[j] (j < 16), hi nibble of qs[j-16]
//   Q4_1 (3)  20 B/32 : | d f16 | m f16 | qs u8 x16 |         x = q * d + m
//   Q5_0 (6)  22 B/32 : | d f16 | qh u32 | qs u8 x16 |        x = (q5 - 16) * d; bit 4 = qh bit j
//   Q5_1 (7)  24 B/32 : | d f16 | m f16 | qh u32 | qs x16 |   x = q5 * d + m
//   Q2_K (10) 84 B/256: | scales u8 x16 | qs u8 x64 | d f16 | dmin f16 |
//                        e = 128h + 32k + l: q = (qs[32h+l] >> 2k) & 3; s = scales[e/16]
//                        x = q * (d * (s & 15)) - dmin * (s >> 4)
//   Q3_K (11) 110 B/256: | hmask u8 x32 | qs u8 x64 | scales 12 B | d f16 |
//                        q = ((qs[32h+l] >> 2k) & 3) - 4 * (1 - ((hmask[l] >> (4h+k)) & 1))
//                        sc[i] = (lo4(i) | hi2(i) << 4) - 32;  x = q * (d * sc[e/16])
//   Q4_K (12) 144 B/256: | d f16 | dmin f16 | scales 12 B (6-bit sc, m x8) | qs u8 x128 |
//                        e = 64c + 32n + l: q = nibble n of qs[32c+l]; sub-block b = e/32
//                        x = q * (d * sc[b]) - dmin * m[b]
//   Q5_K (13) 176 B/256: | d | dmin | scales 12 B | qh u8 x32 | qs u8 x128 |  q |= ((qh[l] >> b) & 1) << 4
//   Q6_K (14) 210 B/256: | ql u8 x128 | qh u8 x64 | scales i8 x16 | d f16 |
//                        e = 128h + 32k + l: lo = (ql[64h + 32(k&1) + l] >> 4(k>>1)) & 15,
//                        hi = (qh[32h+l] >> 2k) & 3; x = (lo | hi << 4) - 32) * (d * sc[e/16])
//   F32 (0), F16 (1), BF16 (30): one element per "block".
#pragma once
#include "common.cuh"

template <int T> struct Q;

template <> struct Q<0> {  // F32
    static constexpr int QK = 1, TS = 4;
    __device__ static float dq(const uint8_t* b, int) {
        uint32_t u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        return __uint_as_float(u);
    }
};
template <> struct Q<1> {  // F16
    static constexpr int QK = 1, TS = 2;
    __device__ static float dq(const uint8_t* b, int) { return rx_f16(b); }
};
template <> struct Q<30> {  // BF16: the top 16 bits of an f32
    static constexpr int QK = 1, TS = 2;
    __device__ static float dq(const uint8_t* b, int) {
        return __uint_as_float(((uint32_t)b[0] << 16) | ((uint32_t)b[1] << 24));
    }
};
template <> struct Q<8> {  // Q8_0
    static constexpr int QK = 32, TS = 34;
    __device__ static float dq(const uint8_t* b, int j) { return __fmul_rn((float)(int8_t)b[2 + j], rx_f16(b)); }
};
template <> struct Q<2> {  // Q4_0
    static constexpr int QK = 32, TS = 18;
    __device__ static float dq(const uint8_t* b, int j) {
        int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), rx_f16(b));
    }
};
template <> struct Q<3> {  // Q4_1
    static constexpr int QK = 32, TS = 20;
    __device__ static float dq(const uint8_t* b, int j) {
        int q = j < 16 ? (b[4 + j] & 15) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, rx_f16(b)), rx_f16(b + 2));
    }
};
template <> struct Q<6> {  // Q5_0
    static constexpr int QK = 32, TS = 22;
    __device__ static float dq(const uint8_t* b, int j) {
        int q = j < 16 ? (b[6 + j] & 15) : (b[6 + j - 16] >> 4);
        q |= ((b[2 + (j >> 3)] >> (j & 7)) & 1) << 4;
        return __fmul_rn((float)(q - 16), rx_f16(b));
    }
};
template <> struct Q<7> {  // Q5_1
    static constexpr int QK = 32, TS = 24;
    __device__ static float dq(const uint8_t* b, int j) {
        int q = j < 16 ? (b[8 + j] & 15) : (b[8 + j - 16] >> 4);
        q |= ((b[4 + (j >> 3)] >> (j & 7)) & 1) << 4;
        return __fadd_rn(__fmul_rn((float)q, rx_f16(b)), rx_f16(b + 2));
    }
};
template <> struct Q<10> {  // Q2_K
    static constexpr int QK = 256, TS = 84;
    __device__ static float dq(const uint8_t* b, int e) {
        int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
        int q = (b[16 + 32 * h + l] >> (2 * k)) & 3;
        int s = b[e >> 4];
        float dl = __fmul_rn(rx_f16(b + 80), (float)(s & 15));
        float ml = __fmul_rn(rx_f16(b + 82), (float)(s >> 4));
        return __fsub_rn(__fmul_rn((float)q, dl), ml);
    }
};
template <> struct Q<11> {  // Q3_K
    static constexpr int QK = 256, TS = 110;
    __device__ static float dq(const uint8_t* b, int e) {
        int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
        int q = (b[32 + 32 * h + l] >> (2 * k)) & 3;
        int hb = (b[l] >> (4 * h + k)) & 1;
        q -= 4 * (1 - hb);
        int i = e >> 4;
        const uint8_t* r = b + 96;
        int lo = i < 8 ? (r[i] & 15) : (r[i - 8] >> 4);
        int hi = (r[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        int sc = (int)(int8_t)(uint8_t)(lo | (hi << 4)) - 32;
        float dl = __fmul_rn(rx_f16(b + 108), (float)sc);
        return __fmul_rn((float)q, dl);
    }
};
// 6-bit (scale, min) pair b of the 12-byte Q4_K / Q5_K field at `s`
__device__ __forceinline__ void rx_scale_min_k4(const uint8_t* s, int b, int* sc, int* m) {
    if (b < 4) {
        *sc = s[b] & 63;
        *m = s[b + 4] & 63;
    } else {
        *sc = (s[b + 4] & 15) | ((s[b - 4] >> 2) & 0x30);
        *m = (s[b + 4] >> 4) | ((s[b] >> 2) & 0x30);
    }
}
template <> struct Q<12> {  // Q4_K
    static constexpr int QK = 256, TS = 144;
    __device__ static float dq(const uint8_t* b, int e) {
        int c = e >> 6, n = (e >> 5) & 1, l = e & 31, sb = e >> 5;
        int q = (b[16 + 32 * c + l] >> (4 * n)) & 15;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        float dl = __fmul_rn(rx_f16(b), (float)sc);
        float ml = __fmul_rn(rx_f16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn((float)q, dl), ml);
    }
};
template <> struct Q<13> {  // Q5_K
    static constexpr int QK = 256, TS = 176;
    __device__ static float dq(const uint8_t* b, int e) {
        int c = e >> 6, n = (e >> 5) & 1, l = e & 31, sb = e >> 5;
        int q = (b[48 + 32 * c + l] >> (4 * n)) & 15;
        q |= ((b[16 + l] >> sb) & 1) << 4;
        int sc, m;
        rx_scale_min_k4(b + 4, sb, &sc, &m);
        float dl = __fmul_rn(rx_f16(b), (float)sc);
        float ml = __fmul_rn(rx_f16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn((float)q, dl), ml);
    }
};
template <> struct Q<14> {  // Q6_K
    static constexpr int QK = 256, TS = 210;
    __device__ static float dq(const uint8_t* b, int e) {
        int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
        int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
        int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
        int q = (lo | (hi << 4)) - 32;
        float dl = __fmul_rn(rx_f16(b + 208), (float)(int8_t)b[192 + (e >> 4)]);
        return __fmul_rn((float)q, dl);
    }
};

// Element k of a row that starts at `row` (k counts elements along the row).
template <int T>
__device__ __forceinline__ float rx_dq_row(const uint8_t* row, long k) {
    return Q<T>::dq(row + (k / Q<T>::QK) * Q<T>::TS, (int)(k % Q<T>::QK));
}

// Instantiate MACRO(T, name) for every supported GGML type.
#define RX_FOR_EACH_TYPE(M) \
    M(0, f32) M(1, f16) M(30, bf16) M(8, q8_0) M(2, q4_0) M(3, q4_1) M(6, q5_0) M(7, q5_1) \
    M(10, q2_k) M(11, q3_k) M(12, q4_k) M(13, q5_k) M(14, q6_k)
