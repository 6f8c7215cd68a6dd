"""Mamba-2 selective-state-space ops (granitehybrid) for the CUDA backend: launches of kernels/ssm.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_ssm.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1).
"""
from __future__ import annotations


class CudaSSMOps:
    pass
