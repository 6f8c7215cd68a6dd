"""Unquantized float formats: F32, F16, BF16 (block size 1).

    F32  : | f32 |        4 bytes / element
    F16  : | f16 |        2 bytes / element
    BF16 : | bf16 |       2 bytes / element (top 16 bits of an f32)
"""
from __future__ import annotations

import numpy as np

from ._base import QuantType, register


@register
class F32(QuantType):
    type_id, name, block_size, type_size = 0, "F32", 1, 4
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        out[...] = np.ascontiguousarray(blocks).view(np.float32)

    @classmethod
    def quantize_blocks(cls, x):
        return np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).reshape(-1, 4)


@register
class F16(QuantType):
    type_id, name, block_size, type_size = 1, "F16", 1, 2
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        out[...] = np.ascontiguousarray(blocks).view(np.float16)

    @classmethod
    def quantize_blocks(cls, x):
        return np.ascontiguousarray(x, dtype=np.float32).astype(np.float16).view(np.uint8).reshape(-1, 2)


@register
class BF16(QuantType):
    type_id, name, block_size, type_size = 30, "BF16", 1, 2
    can_quantize = True

    @classmethod
    def dequantize_blocks(cls, blocks, out):
        u = np.ascontiguousarray(blocks).view(np.uint16)
        o = out.view(np.uint32)
        o[...] = u
        o <<= np.uint32(16)

    @classmethod
    def quantize_blocks(cls, x):
        n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        nan = (n & 0x7FFFFFFF) > 0x7F800000
        r = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
        r = np.where(nan, ((n >> 16) & 0xFFFF) | 64, r)
        return r.astype(np.uint16).view(np.uint8).reshape(-1, 2)
