"""Gated DeltaNet ops (qwen35 linear-attention layers) for the NumPy backend: the gated delta rule recurrence and its helpers.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_deltanet.py, kernels/deltanet.cu) is tested against.
"""
from __future__ import annotations


class NumpyDeltaNetOps:
    pass
