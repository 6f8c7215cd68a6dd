"""Multi-head latent attention ops (deepseek2) for the CUDA backend: launches of kernels/mla.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_mla.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1).
"""
from __future__ import annotations


class CudaMLAOps:
    pass
