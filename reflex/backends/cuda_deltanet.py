"""Gated DeltaNet ops (qwen35 linear-attention layers) for the CUDA backend: launches of kernels/deltanet.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_deltanet.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1).
"""
from __future__ import annotations


class CudaDeltaNetOps:
    pass
