"""Multi-head latent attention ops (deepseek2) for the NumPy backend: whatever MLA needs beyond the generic ops.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_mla.py, kernels/mla.cu) is tested against.
"""
from __future__ import annotations


class NumpyMLAOps:
    pass
