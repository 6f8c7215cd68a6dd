"""Legacy 32-element block quants: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

In all of them element j of a block is stored in nibble/byte order:
4-bit types keep element j (j < 16) in the low nibble of qs[j] and element
j + 16 in the high nibble of qs[j]. 5-bit types keep the fifth bit of element j
in bit j of the little-endian uint32 ``qh``.
"""
from __future__ import annotations

import numpy as np

from ._base import QuantType, f16_bytes, f16_field, register, round_half_away

_U4 = np.uint8(4)
_M4 = np.uint8(0x0F)


def _nibbles(qs: np.ndarray, q: np.ndarray) -> None:
    """qs (n,16) uint8 -> q (n,32) uint8: low nibbles then high nibbles."""
    np.bitwise_and(qs, _M4, out=q[:, :16])
    np.right_shift(qs, _U4, out=q[:, 16:])


def _high_bits(qh: np.ndarray, q: np.ndarray) -> None:
    """OR bit j of the 4 qh bytes (little-endian uint32) into bit 4 of q[:, j]."""
    h = np.unpackbits(qh, axis=1, bitorder="little")
    h <<= _U4
    q |= h


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] & _M4) | (q[:, 16:] << _U4)


def _pack_high(q: np.ndarray) -> np.ndarray:
    return np.packbits((q >> _U4) & 1, axis=1, bitorder="little")


def _safe_inv(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)



def _quantize_min_scale(x, qmax: int):
    """Round-to-nearest for the `x = d*q + m` formats (Q4_1, Q5_1): q in [0, qmax]."""
    mx = x.max(axis=1, keepdims=True)
    mn = x.min(axis=1, keepdims=True)
    d = (mx - mn) / np.float32(qmax)
    # quantize against the fp16-rounded min/scale actually stored
    d16 = d.astype(np.float16).astype(np.float32)
    m16 = mn.astype(np.float16).astype(np.float32)
    q = np.clip(np.floor((x - m16) * _safe_inv(d16) + np.float32(0.5)), 0, qmax).astype(np.uint8)
    return d, mn, q

@register
class Q8_0(QuantType):
    """
    | d: f16 | qs: int8 x 32 |     type_size = 2 + 32 = 34
    x[j] = d * qs[j]
    """
    type_id, name, block_size, type_size = 8, "Q8_0", 32, 2 + 32
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        out[...] = blocks[:, 2:].view(np.int8)
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, x):
        d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
        q = round_half_away(x * _safe_inv(d))
        return np.concatenate([f16_bytes(d), q.astype(np.int8).view(np.uint8)], axis=1)


@register
class Q4_0(QuantType):
    """
    | d: f16 | qs: u8 x 16 (two 4-bit q per byte) |     type_size = 2 + 16 = 18
    x[j] = d * (q[j] - 8)
    """
    type_id, name, block_size, type_size = 2, "Q4_0", 32, 2 + 16
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        q = np.empty(out.shape, np.uint8)
        _nibbles(blocks[:, 2:], q)
        qi = q.view(np.int8)
        qi -= np.int8(8)
        out[...] = qi
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, x):
        # signed scale chosen so that the largest-magnitude value maps to -8
        imax = np.abs(x).argmax(axis=1)[:, None]
        d = np.take_along_axis(x, imax, axis=1) / np.float32(-8)
        q = np.clip(np.floor(x * _safe_inv(d) + np.float32(8.5)), 0, 15).astype(np.uint8)
        return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


@register
class Q4_1(QuantType):
    """
    | d: f16 | m: f16 | qs: u8 x 16 |     type_size = 2 + 2 + 16 = 20
    x[j] = d * q[j] + m
    """
    type_id, name, block_size, type_size = 3, "Q4_1", 32, 2 + 2 + 16
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        q = np.empty(out.shape, np.uint8)
        _nibbles(blocks[:, 4:], q)
        out[...] = q
        out *= f16_field(blocks, 0)
        out += f16_field(blocks, 2)

    @classmethod
    def quantize_blocks(cls, x):
        d, mn, q = _quantize_min_scale(x, 15)
        return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_nibbles(q)], axis=1)


@register
class Q5_0(QuantType):
    """
    | d: f16 | qh: u32 (bit j = 5th bit of q[j]) | qs: u8 x 16 |   type_size = 2 + 4 + 16 = 22
    x[j] = d * (q[j] - 16)
    """
    type_id, name, block_size, type_size = 6, "Q5_0", 32, 2 + 4 + 16
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        q = np.empty(out.shape, np.uint8)
        _nibbles(blocks[:, 6:], q)
        _high_bits(blocks[:, 2:6], q)
        qi = q.view(np.int8)
        qi -= np.int8(16)
        out[...] = qi
        out *= f16_field(blocks, 0)

    @classmethod
    def quantize_blocks(cls, x):
        imax = np.abs(x).argmax(axis=1)[:, None]
        d = np.take_along_axis(x, imax, axis=1) / np.float32(-16)
        q = np.clip(np.floor(x * _safe_inv(d) + np.float32(16.5)), 0, 31).astype(np.uint8)
        return np.concatenate([f16_bytes(d), _pack_high(q), _pack_nibbles(q)], axis=1)


@register
class Q5_1(QuantType):
    """
    | d: f16 | m: f16 | qh: u32 | qs: u8 x 16 |   type_size = 2 + 2 + 4 + 16 = 24
    x[j] = d * q[j] + m
    """
    type_id, name, block_size, type_size = 7, "Q5_1", 32, 2 + 2 + 4 + 16
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        q = np.empty(out.shape, np.uint8)
        _nibbles(blocks[:, 8:], q)
        _high_bits(blocks[:, 4:8], q)
        out[...] = q
        out *= f16_field(blocks, 0)
        out += f16_field(blocks, 2)

    @classmethod
    def quantize_blocks(cls, x):
        d, mn, q = _quantize_min_scale(x, 31)
        return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_high(q), _pack_nibbles(q)], axis=1)
