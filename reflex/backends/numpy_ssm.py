"""Mamba-2 selective-state-space ops (granitehybrid) for the NumPy backend: ssm_conv (the causal depthwise conv1d shared with qwen35's Gated DeltaNet) and the Mamba-2 selective scan.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_ssm.py, kernels/ssm.cu) is tested against.
"""
from __future__ import annotations

import numpy as np


class NumpySSMOps:

    def ssm_conv(self, x, state, w, b=None):
        """Causal depthwise conv1d over time with a carried state (Mamba-2 `ssm_conv1d`, and the
        conv of qwen35's Gated DeltaNet layers). No activation: the model applies it.

        x: (T, C) new inputs; state: (K-1, C) the previous K-1 inputs (zeros before the first token),
        a cache buffer updated in place to the last K-1 rows of [state; x]; w: (C, K), the GGUF
        tensor `blk.N.ssm_conv1d.weight` (ne0 = K); b: (C,) or None.
        Returns (T, C): out[t, c] = sum_j w[c, j] * xx[t + j, c] (+ b[c]) with xx = [state; x].
        """
        x = np.asarray(x, dtype=np.float32)
        T, K = x.shape[0], w.shape[1]
        xx = np.concatenate([state, x])                       # (K-1+T, C)
        out = xx[0:T] * w[:, 0]
        for j in range(1, K):
            out += xx[j:j + T] * w[:, j]
        if b is not None:
            out += b
        state[...] = xx[T:]                                   # the last K-1 inputs
        return out
