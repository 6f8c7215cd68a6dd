"""Gemma 4 ops for the NumPy backend: softcap (final-logit soft-capping).

A mixin of NumpyBackend (numpy_backend.py); the reference the CUDA version (cuda_gemma4.py,
kernels/gemma4.cu) is tested against.
"""
from __future__ import annotations

import numpy as np


class NumpyGemma4Ops:

    def softcap(self, x, cap: float):
        """cap * tanh(x / cap), elementwise, any shape (Gemma's final_logit_softcapping; llama.cpp
        computes it as scale(1/cap) -> tanh -> scale(cap), in float32 like here)."""
        x = np.asarray(x, dtype=np.float32)
        c = np.float32(cap)
        return (np.tanh(x * (np.float32(1.0) / c)) * c).astype(np.float32)
