"""The `qwen3` architecture: llama's skeleton with per-head q/k RMSNorm and NEOX RoPE.

- attn_q_norm / attn_k_norm (head_dim,) RMS-normalize each head of q and k before RoPE;
- head_dim comes from `qwen3.attention.key_length` (Qwen3-0.6B: 128 while n_embd / n_head = 64);
- RoPE is NEOX (halves): the converter does not permute Q/K for qwen models;
- no biases; the output projection is tied to token_embd when `output.weight` is absent.
"""
from __future__ import annotations

import math

from reflex.backends.base import ROPE_NEOX, Backend
from reflex.models.llama import FFN
from reflex.models._common import DecoderHParams, DecoderModel, _Weights

HParams = DecoderHParams


class Attention:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        d, E = hp.head_dim, hp.n_embd
        self.hp = hp
        self.wq = w.get(p + "attn_q.weight", (hp.n_head * d, E))     # (n_head*head_dim, n_embd)
        self.wk = w.get(p + "attn_k.weight", (hp.n_head_kv * d, E))  # (n_head_kv*head_dim, n_embd)
        self.wv = w.get(p + "attn_v.weight", (hp.n_head_kv * d, E))
        self.wo = w.get(p + "attn_output.weight", (E, hp.n_head * d))
        self.q_norm = w.get(p + "attn_q_norm.weight", (d,))
        self.k_norm = w.get(p + "attn_k_norm.weight", (d,))
        self.scale = 1.0 / math.sqrt(d)

    def __call__(self, b: Backend, x, pos, k_cache, v_cache, n_past: int, mask=None):
        hp = self.hp
        T = x.shape[0]
        q = b.matmul(x, self.wq).reshape(T, hp.n_head, hp.head_dim)     # (T, n_head, head_dim)
        k = b.matmul(x, self.wk).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        v = b.matmul(x, self.wv).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        q = b.rms_norm(q, self.q_norm, hp.rms_eps)
        k = b.rms_norm(k, self.k_norm, hp.rms_eps)
        q = b.rope(q, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        k = b.rope(k, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        b.kv_write(k_cache, k, n_past)
        b.kv_write(v_cache, v, n_past)
        o = b.attention(q, k_cache, v_cache, n_past, self.scale, mask=mask)  # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * hp.head_dim), self.wo)      # (T, n_embd)


class Model(DecoderModel):
    Attention = Attention
    FFN = FFN


def load(f, backend: Backend, arch: str = "qwen3") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
