"""Shared machinery for quant types: the registry and the per-type base class.

Every quant type is a small class deriving from :class:`QuantType`. It declares
its GGML type id, name, block size (elements per block) and type size (bytes
per block), and implements ``dequantize_blocks`` (and optionally
``quantize_blocks``) over a 2-D ``(n_blocks, type_size)`` uint8 array. No code
loops over blocks in Python; the drivers in ``__init__`` only loop over large
chunks of blocks to keep temporaries cache-sized.
"""
from __future__ import annotations

import numpy as np

QUANTS: dict[int, type["QuantType"]] = {}


def register(cls):
    """Class decorator: add a quant type to QUANTS under its GGML type id."""
    if cls.type_id in QUANTS:
        raise ValueError(f"duplicate quant type id {cls.type_id}")
    QUANTS[cls.type_id] = cls
    return cls


class QuantType:
    type_id: int = -1
    name: str = "?"
    block_size: int = 1   # elements per block
    type_size: int = 1    # bytes per block
    can_quantize: bool = False
    # blocks handled per chunk by the driver (bounds temporaries' size)
    chunk_blocks: int = 16384

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray, out: np.ndarray) -> None:
        """blocks: (n, type_size) uint8 -> write (n, block_size) float32 into out."""
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, x: np.ndarray) -> np.ndarray:
        """x: (n, block_size) float32 -> (n, type_size) uint8."""
        raise NotImplementedError(f"quantization to {cls.name} is not implemented")

    def __repr__(self) -> str:  # pragma: no cover
        return f"<{self.name} id={self.type_id} {self.block_size} el / {self.type_size} B>"


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Read the fp16 field at byte `offset` of each block as float32, shape (n, 1)."""
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view(np.float16).astype(np.float32)


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """(n, 1) float -> (n, 2) uint8 little-endian fp16 bytes."""
    return np.ascontiguousarray(v, dtype=np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C roundf semantics (ties away from zero), as ggml's reference quantizers use."""
    return np.trunc(x + np.copysign(np.float32(0.5), x)).astype(np.float32)
