"""Gated DeltaNet ops (qwen35 linear-attention layers) for the NumPy backend: the gated delta rule recurrence and its helpers.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_deltanet.py, kernels/deltanet.cu) is tested against. The conv before the rule is
`ssm_conv` (numpy_ssm.py); recurrent states come from `ssm_state` (float32 zeros).
"""
from __future__ import annotations

import numpy as np


def _softplus(x):
    return np.logaddexp(np.float32(0.0), x).astype(np.float32)


class NumpyDeltaNetOps:

    def sigmoid_mul(self, x, gate):
        """x * sigmoid(gate), same shapes (qwen35's attention output gate). Returns a new array."""
        return (x / (1.0 + np.exp(-gate))).astype(np.float32)

    def state_copy(self, x):
        """A new float32 state array holding x's values (snapshots of recurrent caches)."""
        return np.array(x, dtype=np.float32, copy=True)

    def gated_delta_rule(self, qkv, alpha, beta, ssm_a, dt_bias, state, n_k_head: int, eps: float):
        """The gated delta rule over T tokens, one token at a time, carrying `state`.

        qkv: (T, 2 * n_k_head * d_k + n_v_head * d_v) the conv + SiLU output, channels [q | k | v]
        (q, k with n_k_head heads of d_k; v with n_v_head heads of d_v); alpha, beta: (T, n_v_head)
        the raw `ssm_alpha` / `ssm_beta` projections; ssm_a: (n_v_head,) = -exp(A_log) (GGUF
        `blk.N.ssm_a`); dt_bias: (n_v_head,) (`blk.N.ssm_dt.bias`); state: (n_v_head, d_k, d_v),
        updated in place. Value head h reads key head h % n_k_head (the converter reorders V heads
        from grouped to tiled order).
        Per head: q, k L2-normalized (x / sqrt(sum x^2 + eps)), q scaled by 1/sqrt(d_k);
        g = ssm_a * softplus(alpha + dt_bias), b = sigmoid(beta); then for each t
            S = exp(g_t) S;  S += k_t (b_t (v_t - k_t^T S))^T;  o_t = q_t^T S.
        Returns o: (T, n_v_head, d_v).
        """
        n_v, d_k, d_v = state.shape
        qkv = np.asarray(qkv, dtype=np.float32)
        T = qkv.shape[0]
        kd = n_k_head * d_k
        if qkv.shape[1] != 2 * kd + n_v * d_v or n_v % n_k_head:
            raise ValueError(f"gated_delta_rule: qkv {qkv.shape} does not fit state {state.shape}, "
                             f"n_k_head {n_k_head}")
        q = qkv[:, :kd].reshape(T, n_k_head, d_k)                       # (T, n_k_head, d_k)
        k = qkv[:, kd:2 * kd].reshape(T, n_k_head, d_k)
        v = qkv[:, 2 * kd:].reshape(T, n_v, d_v)                        # (T, n_v_head, d_v)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / np.float32(np.sqrt(d_k))
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        heads = np.arange(n_v) % n_k_head                               # tiled: v head h -> k head h % n_k
        q, k = q[:, heads], k[:, heads]                                 # (T, n_v_head, d_k)
        decay = np.exp(ssm_a * _softplus(alpha + dt_bias))              # (T, n_v_head)
        b = 1.0 / (1.0 + np.exp(-np.asarray(beta, dtype=np.float32)))  # (T, n_v_head)
        S = state.astype(np.float32)                                    # (n_v_head, d_k, d_v)
        out = np.empty((T, n_v, d_v), dtype=np.float32)
        for t in range(T):
            S = S * decay[t][:, None, None]
            kv = np.einsum("hk,hkv->hv", k[t], S)                       # (n_v_head, d_v)
            delta = b[t][:, None] * (v[t] - kv)
            S = S + k[t][:, :, None] * delta[:, None, :]
            out[t] = np.einsum("hk,hkv->hv", q[t], S)
        state[...] = S
        return out
