"""Ops for encoder / classifier-head models (bert's RANK head) on the NumPy backend: the reference
for kernels/embed.cu (reflex/backends/cuda_embed.py).

A mixin of NumpyBackend (numpy_backend.py)."""
from __future__ import annotations

import numpy as np


class NumpyEmbedOps:

    def tanh(self, x):
        """Elementwise tanh, float32 (the dense + tanh of a BERT classifier head)."""
        return np.tanh(np.asarray(x, dtype=np.float32))
