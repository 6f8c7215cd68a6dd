"""The `gemma3` architecture (text decoder): llama's skeleton with Gemma's changes.

- the token embedding is scaled by sqrt(n_embd) (tied: the same table is the output projection);
- every sub-layer output is RMS-normed again before the residual add (post_attention_norm,
  post_ffw_norm), and q/k get their own per-head RMSNorm (attn_q_norm, attn_k_norm) before RoPE;
- GeGLU feed-forward with tanh-approximated GELU;
- head_dim comes from key_length (256 for 270M, not n_embd / n_head), and the query scale is
  1/sqrt(key_length) (transformers' query_pre_attn_scalar == head_dim for these checkpoints);
- 5 of every 6 layers are local: sliding window `gemma3.attention.sliding_window` and RoPE base 10000;
  layer i is global iff (i + 1) % 6 == 0 (llama.cpp's swa pattern 6, transformers' layer_types),
  global layers use `gemma3.rope.freq_base` (and linear RoPE scaling where the file sets it);
- RoPE is NEOX (halves); Gemma's RMSNorm multiplies by (1 + w): llama.cpp's converter already stored
  w + 1 in the GGUF, so the norms here are plain x / rms * w.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import ROPE_NEOX, Backend
from reflex.errors import ModelFormatError
from reflex.models._common import (KVCache, _key, _Weights, check_decoder_keys, check_forward_args,
                                   head_out, invalid_key, n_vocab_of, window_mask)

SWA_PATTERN = 6           # layer i is global iff (i + 1) % SWA_PATTERN == 0
ROPE_FREQ_BASE_SWA = 10000.0  # local layers' RoPE base; gemma3 GGUFs do not store it


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int          # gemma3.embedding_length
    n_layer: int         # gemma3.block_count
    n_head: int          # gemma3.attention.head_count
    n_head_kv: int       # gemma3.attention.head_count_kv
    n_ff: int            # gemma3.feed_forward_length
    rms_eps: float       # gemma3.attention.layer_norm_rms_epsilon
    rope_freq_base: float  # gemma3.rope.freq_base (global layers)
    n_ctx_train: int     # gemma3.context_length
    head_dim: int = 0    # gemma3.attention.key_length (default n_embd / n_head)
    n_swa: int = 0       # gemma3.attention.sliding_window (0 = every layer global)
    rope_freq_base_swa: float = ROPE_FREQ_BASE_SWA  # gemma3.rope.freq_base_swa if present
    rope_scale: float = 1.0  # gemma3.rope.scaling.factor for type "linear" (global layers only)
    arch: str = "gemma3"

    @property
    def n_rot(self) -> int:
        return self.head_dim

    def is_swa(self, i: int) -> bool:
        return self.n_swa > 0 and (i + 1) % SWA_PATTERN != 0

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        check_decoder_keys(self)
        if self.head_dim == 0:
            if self.n_embd % self.n_head:
                bad("embedding_length", f"{self.n_embd} not divisible by head_count {self.n_head}")
            self.head_dim = self.n_embd // self.n_head
        if self.head_dim < 0 or self.head_dim % 2:
            bad("attention.key_length", f"{self.head_dim} (must be positive and even)")
        for key, v in (("rope.freq_base", self.rope_freq_base), ("rope.freq_base_swa", self.rope_freq_base_swa),
                       ("rope.scaling.factor", self.rope_scale)):
            if not (v > 0.0) or not math.isfinite(v):
                bad(key, f"{v}")
        if self.n_swa < 0:
            bad("attention.sliding_window", f"{self.n_swa}")

    @classmethod
    def from_gguf(cls, f, arch: str = "gemma3") -> "HParams":
        n_head = _key(f, arch, "attention.head_count", int)
        head_dim = _key(f, arch, "attention.key_length", int, 0)
        v_len = _key(f, arch, "attention.value_length", int, head_dim)
        if v_len != head_dim:
            raise ModelFormatError(f"{arch}.attention.value_length {v_len} != key_length {head_dim}",
                                   kind="invalid_key")
        scale = 1.0
        if f.get(f"{arch}.rope.scaling.type", "none") == "linear":
            scale = _key(f, arch, "rope.scaling.factor", float, 1.0)
        return cls(
            n_vocab=n_vocab_of(f, arch),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=_key(f, arch, "block_count", int),
            n_head=n_head,
            n_head_kv=_key(f, arch, "attention.head_count_kv", int, n_head),
            n_ff=_key(f, arch, "feed_forward_length", int),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            head_dim=head_dim,
            n_swa=_key(f, arch, "attention.sliding_window", int, 0),
            rope_freq_base_swa=_key(f, arch, "rope.freq_base_swa", float, ROPE_FREQ_BASE_SWA),
            rope_scale=scale,
            arch=arch,
        )


class Attention:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        d, E = hp.head_dim, hp.n_embd
        self.hp = hp
        self.swa = hp.is_swa(i)
        self.wq = w.get(p + "attn_q.weight", (hp.n_head * d, E))     # (n_head*head_dim, n_embd)
        self.wk = w.get(p + "attn_k.weight", (hp.n_head_kv * d, E))  # (n_head_kv*head_dim, n_embd)
        self.wv = w.get(p + "attn_v.weight", (hp.n_head_kv * d, E))
        self.wo = w.get(p + "attn_output.weight", (E, hp.n_head * d))
        self.q_norm = w.get(p + "attn_q_norm.weight", (d,))
        self.k_norm = w.get(p + "attn_k_norm.weight", (d,))
        self.scale = 1.0 / math.sqrt(d)
        if self.swa:
            self.freq_base, self.pos_scale = hp.rope_freq_base_swa, 1.0
        else:
            self.freq_base, self.pos_scale = hp.rope_freq_base, 1.0 / hp.rope_scale

    def __call__(self, b: Backend, x, pos, cache: KVCache, i: int, n_past: int, mask=None):
        hp = self.hp
        T = x.shape[0]
        q = b.matmul(x, self.wq).reshape(T, hp.n_head, hp.head_dim)     # (T, n_head, head_dim)
        k = b.matmul(x, self.wk).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        v = b.matmul(x, self.wv).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        q = b.rms_norm(q, self.q_norm, hp.rms_eps)
        k = b.rms_norm(k, self.k_norm, hp.rms_eps)
        rpos = pos if self.pos_scale == 1.0 else pos * self.pos_scale
        q = b.rope(q, rpos, hp.n_rot, self.freq_base, ROPE_NEOX)
        k = b.rope(k, rpos, hp.n_rot, self.freq_base, ROPE_NEOX)
        b.kv_write(cache.k[i], k, n_past)
        b.kv_write(cache.v[i], v, n_past)
        window = 0
        if self.swa:
            m = window_mask(cache, pos, n_past, hp.n_swa, mask)
            if m is None:
                window = hp.n_swa  # slots == positions: the backend's own window test
            mask = m
        o = b.attention(q, cache.k[i], cache.v[i], n_past, self.scale,
                        window=window, mask=mask)                       # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * hp.head_dim), self.wo)  # (T, n_embd)


class FFN:
    """GeGLU: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.w_gate = w.get(p + "ffn_gate.weight", (hp.n_ff, hp.n_embd))  # (n_ff, n_embd)
        self.w_up = w.get(p + "ffn_up.weight", (hp.n_ff, hp.n_embd))      # (n_ff, n_embd)
        self.w_down = w.get(p + "ffn_down.weight", (hp.n_embd, hp.n_ff))  # (n_embd, n_ff)

    def __call__(self, b: Backend, x):
        h = b.mul(b.gelu_tanh(b.matmul(x, self.w_gate)), b.matmul(x, self.w_up))  # (T, n_ff)
        return b.matmul(h, self.w_down)                                           # (T, n_embd)


class Block:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E = hp.n_embd
        self.hp = hp
        self.i = i
        self.attn_norm = w.get(p + "attn_norm.weight", (E,))
        self.post_attn_norm = w.get(p + "post_attention_norm.weight", (E,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (E,))
        self.post_ffn_norm = w.get(p + "post_ffw_norm.weight", (E,))
        self.attn = Attention(w, hp, i)
        self.ffn = FFN(w, hp, i)

    def __call__(self, b: Backend, x, pos, cache: KVCache, n_past: int, mask=None):
        eps = self.hp.rms_eps
        h = b.rms_norm(x, self.attn_norm, eps)                                    # (T, n_embd)
        h = self.attn(b, h, pos, cache, self.i, n_past, mask)
        x = b.add(x, b.rms_norm(h, self.post_attn_norm, eps))
        h = self.ffn(b, b.rms_norm(x, self.ffn_norm, eps))
        return b.add(x, b.rms_norm(h, self.post_ffn_norm, eps))                   # (T, n_embd)


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
            self.output = self.tok_embd  # tied embeddings (all released Gemma 3 checkpoints)
        self.embd_scale = np.float32(math.sqrt(hp.n_embd))

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        hp = self.hp
        return KVCache(self.backend, hp.n_layer, hp.n_head_kv, hp.head_dim, n_ctx or hp.n_ctx_train)

    def forward(self, token_ids, cache: KVCache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Same contract as llama.Model.forward. On local (sliding-window) layers a query sees a key
        iff the mask (default causal) allows it AND pos_q - pos_k < sliding_window, on RoPE positions."""
        b = self.backend
        ids, pos, n_past, mask = check_forward_args(token_ids, cache, self.hp.n_vocab, positions,
                                                    attn_mask, output)
        x = b.mul(b.embed(self.tok_embd, ids), self.embd_scale)     # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, pos, cache, n_past, mask)
        cache.n = n_past + ids.shape[0]
        return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)


def load(f, backend: Backend, arch: str = "gemma3") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
