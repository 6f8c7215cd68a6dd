"""The `qwen2` architecture: llama's skeleton with biases on Q, K and V, and NEOX RoPE.

- attn_q.bias, attn_k.bias, attn_v.bias (the output projection and the FFN have none);
- RoPE is NEOX (halves): the converter does not permute Q/K for qwen models;
- head_dim is n_embd / n_head unless `qwen2.attention.key_length` says otherwise;
- the output projection is tied to token_embd when `output.weight` is absent.
"""
from __future__ import annotations

import math

import numpy as np

from reflex.backends.base import ROPE_NEOX, Backend
from reflex.models._common import DecoderHParams, KVCache, _Weights, check_forward_args, head_out

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


class FFN:
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.w_gate = w.get(p + "ffn_gate.weight", (hp.n_ff, hp.n_embd))  # (n_ff, n_embd)
        self.w_up = w.get(p + "ffn_up.weight", (hp.n_ff, hp.n_embd))      # (n_ff, n_embd)
        self.w_down = w.get(p + "ffn_down.weight", (hp.n_embd, hp.n_ff))  # (n_embd, n_ff)

    def __call__(self, b: Backend, x):
        h = b.swiglu(b.matmul(x, self.w_gate), b.matmul(x, self.w_up))  # (T, n_ff)
        return b.matmul(h, self.w_down)                                 # (T, n_embd)


class Block:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.hp = hp
        self.i = i
        self.attn_norm = w.get(p + "attn_norm.weight", (hp.n_embd,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (hp.n_embd,))
        self.attn = Attention(w, hp, i)
        self.ffn = FFN(w, hp, i)

    def __call__(self, b: Backend, x, pos, cache: KVCache, n_past: int, mask=None):
        h = b.rms_norm(x, self.attn_norm, self.hp.rms_eps)                           # (T, n_embd)
        x = b.add(x, self.attn(b, h, pos, cache.k[self.i], cache.v[self.i], n_past, mask))
        h = b.rms_norm(x, self.ffn_norm, self.hp.rms_eps)
        return b.add(x, self.ffn(b, h))                                               # (T, n_embd)


class Model:
    def __init__(self, f, backend: Backend, hp: HParams):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _Weights(f, backend)
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, hp.n_embd))  # (n_vocab, n_embd)
        self.blocks = [Block(w, hp, i) for i in range(hp.n_layer)]
        self.output_norm = w.get("output_norm.weight", (hp.n_embd,))
        if w.has("output.weight"):
            self.output = w.get("output.weight", (hp.n_vocab, hp.n_embd))    # (n_vocab, n_embd)
        else:
            self.output = self.tok_embd  # tied embeddings

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        hp = self.hp
        return KVCache(self.backend, hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx or hp.n_ctx_train)

    def forward(self, token_ids, cache: KVCache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Same contract as llama.Model.forward."""
        b = self.backend
        ids, pos, n_past, mask = check_forward_args(token_ids, cache, self.hp.n_vocab, positions,
                                                    attn_mask, output)
        x = b.embed(self.tok_embd, ids)                             # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, pos, cache, n_past, mask)
        cache.n = n_past + ids.shape[0]
        return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)


def load(f, backend: Backend, arch: str = "qwen2") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
