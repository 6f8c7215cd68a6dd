"""Mamba-2 selective-state-space ops (granitehybrid) for the NumPy backend: ssm_conv (the causal depthwise conv1d shared with qwen35's Gated DeltaNet) and the Mamba-2 selective scan.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_ssm.py, kernels/ssm.cu) is tested against.
"""
from __future__ import annotations

import numpy as np


class NumpySSMOps:

    def ssm_state(self, shape: tuple):
        """Float32 zeros for a recurrent state (conv window, SSM state); `zeros` is the KV-cache
        allocator and may be float16 on other backends."""
        return np.zeros(shape, dtype=np.float32)

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

    def ssm_scan(self, xbc, dt, state, A, D=None, dt_bias=None, n_group: int = 1):
        """Mamba-2 selective scan, sequential over tokens (so prefill equals step-by-step decode).

        xbc: (T, d_inner + 2 * n_group * d_state), per row x (n_head * head_dim) | B | C, the conv
        output after SiLU; dt: (T, n_head) raw time steps (before bias and softplus);
        state: (n_head, head_dim, d_state), updated in place; A: (n_head,) = -exp(A_log) (the GGUF
        `ssm_a`); D: (n_head,) skip (`ssm_d`); dt_bias: (n_head,) (`ssm_dt.bias`).
        Head h reads group h // (n_head / n_group). Per token:
            d = softplus(dt + dt_bias); s = s * exp(d * A) + d * x (outer) B; y = s @ C + D * x.
        Returns y: (T, n_head * head_dim).
        """
        xbc = np.asarray(xbc, dtype=np.float32)
        n_head, head_dim, d_state = state.shape
        T = xbc.shape[0]
        d_inner = n_head * head_dim
        if xbc.shape[1] != d_inner + 2 * n_group * d_state or n_head % n_group:
            raise ValueError(f"ssm_scan: xbc {xbc.shape} does not fit state {state.shape}, n_group {n_group}")
        x = xbc[:, :d_inner].reshape(T, n_head, head_dim)                              # (T, n_head, head_dim)
        rep = n_head // n_group
        B = np.repeat(xbc[:, d_inner:d_inner + n_group * d_state].reshape(T, n_group, d_state), rep, axis=1)
        C = np.repeat(xbc[:, d_inner + n_group * d_state:].reshape(T, n_group, d_state), rep, axis=1)
        d = np.asarray(dt, dtype=np.float32).reshape(T, n_head)
        if dt_bias is not None:
            d = d + dt_bias
        d = np.where(d > 20.0, d, np.log1p(np.exp(np.minimum(d, 20.0)))).astype(np.float32)  # softplus
        dA = np.exp(d * A).astype(np.float32)                                          # (T, n_head)
        y = np.empty((T, n_head, head_dim), dtype=np.float32)
        s = state
        for t in range(T):
            s *= dA[t][:, None, None]
            s += (d[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]                 # (n_head, head_dim, d_state)
            y[t] = np.einsum("hpn,hn->hp", s, C[t])
        if D is not None:
            y += D[None, :, None] * x
        return y.reshape(T, d_inner)
