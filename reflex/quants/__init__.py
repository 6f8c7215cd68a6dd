"""Quantized tensor formats: dequantize / quantize GGML block types with numpy.

    dequantize(raw uint8, ggml_type, shape) -> float32 array of `shape`
    quantize(x float32, ggml_type)          -> uint8 raw bytes (rows concatenated)
    QUANTS[type_id]                         -> class with .name, .block_size, .type_size

One module per format family: simple (F32/F16/BF16), legacy (Q4_0..Q8_0),
kquants (Q2_K..Q6_K). Each type is a class registered by its GGML type id.
"""
from __future__ import annotations

import mmap

import numpy as np

from ._base import QUANTS, QuantType
from . import simple, legacy, kquants  # noqa: F401  (register types)

__all__ = ["QUANTS", "QuantType", "dequantize", "quantize", "get"]

# elements per driver chunk: keeps the per-chunk temporaries within cache
_CHUNK_ELEMS = 1 << 18


# outputs at least this large come from a pre-faulted anonymous mapping (see _empty_f32)
_POPULATE_BYTES = 16 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _empty_f32(shape: tuple) -> np.ndarray:
    """np.empty(shape, float32), pre-faulted when large.

    The first write to fresh memory costs a page fault per 4 KiB page; on this project's VMs that is
    1.1-1.2 s per 670 MB (Gemma's float32 embedding table), 4x the dequantization itself. MAP_POPULATE
    has the kernel fault the whole mapping in one call (0.28 s for the same 670 MB). The array keeps
    the mapping alive through .base and unmaps it when collected."""
    n = int(np.prod(shape, dtype=np.int64))
    if not _MAP_POPULATE or n * 4 < _POPULATE_BYTES:
        return np.empty(shape, np.float32)
    m = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE)
    return np.frombuffer(m, np.float32, n).reshape(shape)


def get(ggml_type: int) -> type[QuantType]:
    try:
        return QUANTS[int(ggml_type)]
    except KeyError:
        raise NotImplementedError(f"unsupported GGML type {ggml_type}") from None


def dequantize(raw: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    qt = get(ggml_type)
    shape = tuple(int(s) for s in shape)
    n_el = int(np.prod(shape, dtype=np.int64))
    if n_el % qt.block_size:
        raise ValueError(f"{n_el} elements not a multiple of {qt.name} block size {qt.block_size}")
    nb = n_el // qt.block_size
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1)
    if raw.size < nb * qt.type_size:
        raise ValueError(f"{qt.name}: need {nb * qt.type_size} bytes, got {raw.size}")
    blocks = raw[: nb * qt.type_size].reshape(nb, qt.type_size)
    out = _empty_f32((nb, qt.block_size))
    step = max(1, _CHUNK_ELEMS // qt.block_size)
    for i in range(0, nb, step):
        qt.dequantize_blocks(blocks[i:i + step], out[i:i + step])
    return out.reshape(shape)


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    qt = get(ggml_type)
    if not qt.can_quantize:
        raise NotImplementedError(f"quantization to {qt.name} is not implemented")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % qt.block_size:
        raise ValueError(f"last dim {x.shape[-1:]} not divisible by {qt.name} block size {qt.block_size}")
    blocks = x.reshape(-1, qt.block_size)
    nb = blocks.shape[0]
    out = np.empty((nb, qt.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMS // qt.block_size)
    for i in range(0, nb, step):
        out[i:i + step] = qt.quantize_blocks(blocks[i:i + step])
    return out.reshape(-1)
