"""Multi-head latent attention ops (deepseek2) for the NumPy backend: whatever MLA needs beyond the generic ops.

A mixin of NumpyBackend (numpy_backend.py); each op documents its shapes and is the reference the
CUDA version (cuda_mla.py, kernels/mla.cu) is tested against.

- rope_freqs: RoPE with caller-given inverse frequencies (YaRN's blend of interpolated and
  extrapolated frequencies is not base^(-2i/n_rot), so the generic `rope` cannot express it);
- mla_attention: attention over the compressed latent cache. Keys are [c ; k_pe] (kv_lora_rank +
  rope dims, one shared "head"), values are c alone, so the key and value widths differ, which the
  generic `attention` op does not allow; queries arrive already absorbed through attn_k_b.
"""
from __future__ import annotations

import numpy as np

from reflex.backends.base import ROPE_NEOX, ROPE_NORM


class NumpyMLAOps:
    def rope_freqs(self, x, pos, inv_freq, mode: int = ROPE_NORM):
        """Rotary embedding on x (T, n_head, n_rot) at positions pos (T,) with inverse frequencies
        inv_freq (n_rot/2,) (a host array); every dim of x rotates. Returns a new array."""
        T, n_head, n_rot = x.shape
        inv_freq = np.asarray(inv_freq, dtype=np.float64).reshape(-1)
        if inv_freq.shape[0] * 2 != n_rot:
            raise ValueError(f"rope_freqs: {inv_freq.shape[0]} frequencies for {n_rot} dims")
        ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]   # (T, n_rot/2)
        cos = np.cos(ang).astype(np.float32)[:, None, :]                        # (T, 1, n_rot/2)
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        out = np.empty_like(x)
        if mode == ROPE_NORM:
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = x0 * cos - x1 * sin
            out[..., 1::2] = x0 * sin + x1 * cos
        elif mode == ROPE_NEOX:
            h = n_rot // 2
            x0, x1 = x[..., :h], x[..., h:]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:] = x0 * sin + x1 * cos
        else:
            raise ValueError(f"unknown rope mode {mode}")
        return out

    def mla_attention(self, q_lat, q_pe, c_cache, pe_cache, n_past: int, scale: float, *, mask=None):
        """Softmax attention of every query head over one shared latent key/value stream.

        q_lat (T, n_head, R) -- queries absorbed into the latent space (q_nope @ k_b per head);
        q_pe (T, n_head, P)  -- the RoPE'd query part; c_cache (n_ctx, 1, R) latents c (normed
        kv_a output), pe_cache (n_ctx, 1, P) the RoPE'd shared key part, both filled for slots
        0 .. n_past+T-1 (S slots). score[t, h, s] = scale * (q_lat[t, h] . c[s] + q_pe[t, h] . pe[s]);
        returns sum_s softmax(score)[t, h, s] * c[s]: (T, n_head, R). Visibility: mask (T, S) bool,
        True = visible, when given; else causal on slots (s <= n_past + t)."""
        T, n_head, R = q_lat.shape
        S = n_past + T
        c = c_cache[:S, 0]                                               # (S, R)
        pe = pe_cache[:S, 0]                                             # (S, P)
        s = (np.matmul(q_lat, c.T) + np.matmul(q_pe, pe.T)) * np.float32(scale)  # (T, n_head, S)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (T, S):
                raise ValueError(f"attention mask shape {mask.shape}, expected {(T, S)}")
            hidden = ~mask
        else:
            hidden = np.arange(S)[None, :] > (n_past + np.arange(T))[:, None]   # (T, S)
        s = np.where(hidden[:, None, :], -np.inf, s).astype(np.float32)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return np.matmul(s, c).astype(np.float32)                        # (T, n_head, R)
