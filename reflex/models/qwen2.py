"""The `qwen2` architecture: llama's skeleton with biases on Q, K and V, and NEOX RoPE.

- attn_q.bias, attn_k.bias, attn_v.bias (the output projection and the FFN have none);
- RoPE is NEOX (halves): the converter does not permute Q/K for qwen models;
- head_dim is n_embd / n_head unless `qwen2.attention.key_length` says otherwise;
- the output projection is tied to token_embd when `output.weight` is absent.
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
        self.bq = w.get(p + "attn_q.bias", (hp.n_head * d,))           # (n_head*head_dim,)
        self.bk = w.get(p + "attn_k.bias", (hp.n_head_kv * d,))        # (n_head_kv*head_dim,)
        self.bv = w.get(p + "attn_v.bias", (hp.n_head_kv * d,))
        self.scale = 1.0 / math.sqrt(d)

    def __call__(self, b: Backend, x, pos, k_cache, v_cache, n_past: int, mask=None):
        hp = self.hp
        T = x.shape[0]
        q = b.add(b.matmul(x, self.wq), self.bq).reshape(T, hp.n_head, hp.head_dim)  # (T, n_head, head_dim)
        k = b.add(b.matmul(x, self.wk), self.bk).reshape(T, hp.n_head_kv, hp.head_dim)
        v = b.add(b.matmul(x, self.wv), self.bv).reshape(T, hp.n_head_kv, hp.head_dim)
        q = b.rope(q, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        k = b.rope(k, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        b.kv_write(k_cache, k, n_past)
        b.kv_write(v_cache, v, n_past)
        o = b.attention(q, k_cache, v_cache, n_past, self.scale, mask=mask)  # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * hp.head_dim), self.wo)      # (T, n_embd)


class Model(DecoderModel):
    Attention = Attention
    FFN = FFN


def load(f, backend: Backend, arch: str = "qwen2") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
