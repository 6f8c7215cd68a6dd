"""K-quants: 256-element super-blocks (QK_K = 256) split into sub-blocks.

Offsets below are byte offsets inside one super-block.
"""
from __future__ import annotations

import numpy as np

from ._base import QuantType, f16_bytes, f16_field, register, round_half_away

QK_K = 256
_SH2 = np.array([0, 2, 4, 6], dtype=np.uint8)
_SH8 = np.arange(8, dtype=np.uint8)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12-byte 6-bit (scale, min) x 8 field of Q4_K / Q5_K.

        byte 0..3  : SSssssss  scale[0..3] low 6 bits; top 2 bits -> scale[4..7] bits 4..5
        byte 4..7  : MMmmmmmm  min[0..3]   low 6 bits; top 2 bits -> min[4..7]   bits 4..5
        byte 8..11 : mmmmssss  low nibble -> scale[4..7] bits 0..3, high -> min[4..7] bits 0..3
    """
    a, b, c = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    s = np.empty((sc.shape[0], 8), np.uint8)
    m = np.empty((sc.shape[0], 8), np.uint8)
    s[:, :4] = a & 0x3F
    m[:, :4] = b & 0x3F
    s[:, 4:] = (c & 0x0F) | ((a >> 2) & 0x30)
    m[:, 4:] = (c >> 4) | ((b >> 2) & 0x30)
    return s, m


def _pack_scale_min_k4(s: np.ndarray, m: np.ndarray) -> np.ndarray:
    s = s.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.empty((s.shape[0], 12), np.uint8)
    out[:, 0:4] = (s[:, :4] & 0x3F) | ((s[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (s[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


@register
class Q2_K(QuantType):
    """
    | scales: u8 x 16 (lo nibble scale, hi nibble min) | qs: u8 x 64 (2-bit) | d: f16 | dmin: f16 |
    type_size = 16 + 64 + 2 + 2 = 84
    16 sub-blocks of 16; element (half h, shift k, l<32) = (qs[32h + l] >> 2k) & 3,
    sub-block index = (8h + 2k + l // 16);  x = d*sc*q - dmin*m
    """
    type_id, name, block_size, type_size = 10, "Q2_K", QK_K, 16 + 64 + 2 + 2

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        n = blocks.shape[0]
        sc = blocks[:, :16]
        d = f16_field(blocks, 80)
        dmin = f16_field(blocks, 82)
        dl = (d * (sc & 0x0F).astype(np.float32))[:, :, None]
        ml = (dmin * (sc >> 4).astype(np.float32))[:, :, None]
        qs = blocks[:, 16:80].reshape(n, 2, 1, 32)
        q = (qs >> _SH2.reshape(1, 1, 4, 1)) & np.uint8(3)
        o = out.reshape(n, 16, 16)
        o[...] = q.reshape(n, 16, 16)
        o *= dl
        o -= ml


@register
class Q3_K(QuantType):
    """
    | hmask: u8 x 32 | qs: u8 x 64 (2-bit low) | scales: 12 B (16 x 6-bit) | d: f16 |
    type_size = 32 + 64 + 12 + 2 = 110
    q = low2 - 4 * (1 - hbit); hbit of element (h, k, l) = (hmask[l] >> (4h + k)) & 1
    scales: bytes 0..7 low nibbles -> sc[0..7], high nibbles -> sc[8..15];
            bytes 8..11 2-bit pairs (shift 0,2,4,6) -> bits 4..5 of sc[4s + j]; sc -= 32
    x = d * sc * q
    """
    type_id, name, block_size, type_size = 11, "Q3_K", QK_K, 32 + 64 + 12 + 2

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        n = blocks.shape[0]
        raw = blocks[:, 96:108]
        lo = np.empty((n, 16), np.uint8)
        lo[:, :8] = raw[:, :8] & 0x0F
        lo[:, 8:] = raw[:, :8] >> 4
        hi = ((raw[:, None, 8:12] >> _SH2.reshape(1, 4, 1)) & 3).reshape(n, 16)
        sc = ((lo | (hi << 4)).view(np.int8) - np.int8(32)).astype(np.float32)
        dl = (f16_field(blocks, 108) * sc)[:, :, None]
        qs = blocks[:, 32:96].reshape(n, 2, 1, 32)
        ql = (qs >> _SH2.reshape(1, 1, 4, 1)) & np.uint8(3)          # (n,2,4,32)
        hm = blocks[:, None, :32]
        hb = (hm >> _SH8.reshape(1, 8, 1)) & np.uint8(1)              # (n,8,32)
        hb ^= np.uint8(1)
        hb <<= np.uint8(2)
        q = ql.reshape(n, 8, 32).view(np.int8)
        q -= hb.view(np.int8)
        o = out.reshape(n, 16, 16)
        o[...] = q.reshape(n, 16, 16)
        o *= dl


@register
class Q4_K(QuantType):
    """
    | d: f16 | dmin: f16 | scales: 12 B (8 x 6-bit scale, 8 x 6-bit min) | qs: u8 x 128 |
    type_size = 2 + 2 + 12 + 128 = 144
    8 sub-blocks of 32: qs[32c + l] low nibble -> sub-block 2c, high nibble -> 2c + 1
    x = (d * sc) * q - dmin * m
    """
    type_id, name, block_size, type_size = 12, "Q4_K", QK_K, 2 + 2 + 12 + 128
    can_quantize = True
    nbits = 4

    @classmethod
    def _scales(cls, blocks, n):
        s, m = _scale_min_k4(blocks[:, 4:16])
        dl = (f16_field(blocks, 0) * s.astype(np.float32))[:, :, None]
        ml = (f16_field(blocks, 2) * m.astype(np.float32))[:, :, None]
        return dl, ml

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        n = blocks.shape[0]
        dl, ml = cls._scales(blocks, n)
        qs = blocks[:, 16:].reshape(n, 4, 32)
        q = np.empty((n, 4, 2, 32), np.uint8)
        np.bitwise_and(qs, np.uint8(0x0F), out=q[:, :, 0])
        np.right_shift(qs, np.uint8(4), out=q[:, :, 1])
        o = out.reshape(n, 8, 32)
        o[...] = q.reshape(n, 8, 32)
        o *= dl
        o -= ml

    @classmethod
    def _pack(cls, d, dmin, scales, q):
        n = q.shape[0]
        q = q.reshape(n, 4, 2, 32)
        qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, 128)
        return np.concatenate([f16_bytes(d), f16_bytes(dmin), scales, qs], axis=1)

    @classmethod
    def quantize_blocks(cls, x):
        return _quantize_k_affine(cls, x)


@register
class Q5_K(Q4_K):
    """
    | d: f16 | dmin: f16 | scales: 12 B | qh: u8 x 32 | qs: u8 x 128 |
    type_size = 2 + 2 + 12 + 32 + 128 = 176
    as Q4_K, plus bit 4 of element l of sub-block s = (qh[l] >> s) & 1
    """
    type_id, name, block_size, type_size = 13, "Q5_K", QK_K, 2 + 2 + 12 + 32 + 128
    nbits = 5

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        n = blocks.shape[0]
        dl, ml = cls._scales(blocks, n)
        qs = blocks[:, 48:].reshape(n, 4, 32)
        q = np.empty((n, 4, 2, 32), np.uint8)
        np.bitwise_and(qs, np.uint8(0x0F), out=q[:, :, 0])
        np.right_shift(qs, np.uint8(4), out=q[:, :, 1])
        q = q.reshape(n, 8, 32)
        hb = (blocks[:, None, 16:48] >> _SH8.reshape(1, 8, 1)) & np.uint8(1)
        hb <<= np.uint8(4)
        q |= hb
        o = out.reshape(n, 8, 32)
        o[...] = q
        o *= dl
        o -= ml

    @classmethod
    def _pack(cls, d, dmin, scales, q):
        n = q.shape[0]
        q = q.reshape(n, 8, 32)
        qh = np.zeros((n, 32), np.uint8)
        for s in range(8):  # 8 bit planes, vectorized over all blocks
            qh |= ((q[:, s] >> 4) & 1) << s
        q4 = (q & 0x0F).reshape(n, 4, 2, 32)
        qs = (q4[:, :, 0] | (q4[:, :, 1] << 4)).reshape(n, 128)
        return np.concatenate([f16_bytes(d), f16_bytes(dmin), scales, qh, qs], axis=1)


@register
class Q6_K(QuantType):
    """
    | ql: u8 x 128 (low 4 bits) | qh: u8 x 64 (high 2 bits) | scales: int8 x 16 | d: f16 |
    type_size = 128 + 64 + 16 + 2 = 210
    halves h = 0,1 of 128 elements; in half h, element 32k + l (k < 4, l < 32):
      low  = (ql[64h + 32(k & 1) + l] >> 4(k >> 1)) & 15
      high = (qh[32h + l] >> 2k) & 3
    q = low | high << 4, x = d * sc[e // 16] * (q - 32)
    """
    type_id, name, block_size, type_size = 14, "Q6_K", QK_K, 128 + 64 + 16 + 2
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        n = blocks.shape[0]
        dl = (f16_field(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]
        ql = blocks[:, :128].reshape(n, 2, 64)
        q = np.empty((n, 2, 2, 64), np.uint8)
        np.bitwise_and(ql, np.uint8(0x0F), out=q[:, :, 0])
        np.right_shift(ql, np.uint8(4), out=q[:, :, 1])
        q = q.reshape(n, 2, 4, 32)
        hb = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> _SH2.reshape(1, 1, 4, 1)) & np.uint8(3)
        hb <<= np.uint8(4)
        q |= hb
        qi = q.view(np.int8)
        qi -= np.int8(32)
        o = out.reshape(n, 16, 16)
        o[...] = qi.reshape(n, 16, 16)
        o *= dl

    @classmethod
    def quantize_blocks(cls, x):
        n = x.shape[0]
        xs = x.reshape(n, 16, 16)
        # signed sub-block scale: largest-magnitude value maps to -32
        imax = np.abs(xs).argmax(axis=2)[:, :, None]
        s = np.take_along_axis(xs, imax, axis=2)[:, :, 0] / np.float32(-32)
        amax_s = np.abs(s).max(axis=1, keepdims=True)
        d = amax_s / np.float32(127)
        d16 = d.astype(np.float16).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            isc = np.where(d16 == 0, 0, s / d16)
        sc = np.clip(round_half_away(isc), -128, 127).astype(np.int8)
        ds = (d16 * sc.astype(np.float32))[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            qf = np.where(ds == 0, 0, xs / ds)
        q = (np.clip(round_half_away(qf), -32, 31).astype(np.int16) + 32).astype(np.uint8)
        q = q.reshape(n, 2, 4, 32)
        low = (q & 0x0F)
        ql = np.empty((n, 2, 2, 32 * 2), np.uint8)  # (n, half, nibble-pos, 64)
        lo4 = low.reshape(n, 2, 2, 64)  # k>>1 selects nibble, (k&1, l) selects byte
        ql = (lo4[:, :, 0] | (lo4[:, :, 1] << 4)).reshape(n, 128)
        hi = (q >> 4) & 3
        qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(n, 64)
        return np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d16)], axis=1)


def _quantize_k_affine(cls, x):
    """Round-to-nearest affine quantization for Q4_K / Q5_K with a small scale search."""
    n = x.shape[0]
    qmax = (1 << cls.nbits) - 1
    xs = x.reshape(n, 8, 32)
    mn = np.minimum(xs.min(axis=2), 0)
    mx = xs.max(axis=2)
    # per sub-block candidate scales; choose the one with the least squared error
    best_s = (mx - mn) / np.float32(qmax)
    best_m = -mn
    best_err = None
    for f in (1.0, 0.95, 0.9, 0.85):
        s = ((mx - mn) / np.float32(qmax * f)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(round_half_away(np.where(s[:, :, None] == 0, 0, (xs - mn[:, :, None]) / s[:, :, None])), 0, qmax)
        err = ((q * s[:, :, None] + mn[:, :, None] - xs) ** 2).sum(axis=2)
        if best_err is None:
            best_err, best_s = err, s
        else:
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s, best_s)
    d = best_s.max(axis=1, keepdims=True) / np.float32(63)
    dmin = best_m.max(axis=1, keepdims=True) / np.float32(63)
    d16 = d.astype(np.float16).astype(np.float32)
    dm16 = dmin.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(round_half_away(np.where(d16 == 0, 0, best_s / d16)), 0, 63).astype(np.uint8)
        mq = np.clip(round_half_away(np.where(dm16 == 0, 0, best_m / dm16)), 0, 63).astype(np.uint8)
    dl = (d16 * sc.astype(np.float32))[:, :, None]
    ml = (dm16 * mq.astype(np.float32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        qf = np.where(dl == 0, 0, (xs + ml) / dl)
    q = np.clip(round_half_away(qf), 0, qmax).astype(np.uint8)
    return cls._pack(d16, dm16, _pack_scale_min_k4(sc, mq), q)
