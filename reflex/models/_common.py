"""Pieces the decoder architectures share beyond llama.py's skeleton.

llama.py stays the reference skeleton; gemma3 / qwen2 / qwen3 reuse its metadata reader (`_key`) and
weight loader (`_Weights`) and add what they need: a KV cache that remembers each slot's RoPE position
(sliding-window layers under a tree mask must compare positions, not slots), the forward() argument
checks, and the final norm + output projection.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.errors import ContextOverflow, InvalidRequest, ModelFormatError
from reflex.models.llama import _key, _Weights, check_decoder_keys, invalid_key  # noqa: F401  (re-exported for the model files)

__all__ = ["_key", "_Weights", "check_decoder_keys", "invalid_key", "KVCache", "DecoderHParams", "n_vocab_of", "check_forward_args", "window_mask",
           "head_out", "PreNormBlock", "DecoderModel"]


class KVCache:
    """Per-layer K/V buffers sized to n_ctx; `n` is the number of positions filled.

    `pos[s]` is the RoPE position written to slot s (equal to s unless forward() got `positions`)."""

    def __init__(self, backend, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int):
        if n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        self.n_ctx = n_ctx
        self.n = 0
        shape = (n_ctx, n_head_kv, head_dim)
        self.k = [backend.zeros(shape) for _ in range(n_layer)]  # each (n_ctx, n_head_kv, head_dim)
        self.v = [backend.zeros(shape) for _ in range(n_layer)]
        self.pos = np.zeros(n_ctx, dtype=np.int64)               # (n_ctx,)

    def __len__(self):
        return self.n

    def truncate(self, n: int):
        """Forget positions >= n (e.g. to reuse a shared prefix)."""
        self.n = max(0, min(n, self.n))


def check_forward_args(token_ids, cache: KVCache, n_vocab: int, positions, attn_mask, output):
    """Validate forward()'s arguments exactly as llama.Model.forward does.

    Returns (ids (T,), pos (T,), n_past, mask or None); records pos in cache.pos (nothing else is
    changed, so a rejected call leaves the cache as it was)."""
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    T = ids.shape[0]
    if T == 0:
        raise InvalidRequest("forward() needs at least one token")
    if ids.min() < 0 or ids.max() >= n_vocab:
        raise InvalidRequest(f"token id out of range [0, {n_vocab})")
    if output not in ("logits", "hidden", "raw"):
        raise InvalidRequest(f"unknown forward output {output!r}")
    n_past = cache.n
    if n_past + T > cache.n_ctx:
        raise ContextOverflow(f"{n_past} cached + {T} new tokens exceed n_ctx {cache.n_ctx}")
    if positions is None:
        pos = np.arange(n_past, n_past + T)                      # (T,)
    else:
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        if pos.shape != (T,):
            raise InvalidRequest(f"positions has shape {pos.shape}, expected ({T},)")
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask, dtype=bool)
        if attn_mask.shape != (T, n_past + T):
            raise InvalidRequest(f"attn_mask has shape {attn_mask.shape}, expected {(T, n_past + T)}")
    cache.pos[n_past:n_past + T] = pos
    return ids, pos, n_past, attn_mask


def window_mask(cache: KVCache, pos, n_past: int, window: int, mask):
    """The explicit (T, S) visibility of a sliding-window layer when the caller chose positions or a
    mask: visible = (mask, default causal by slot) AND pos_q - pos_k < window, on RoPE positions.

    Returns None when slots and positions coincide and no mask is given: the backend's own `window`
    argument (on slots) is then the same thing and cheaper."""
    T = pos.shape[0]
    S = n_past + T
    kpos = cache.pos[:S]
    if mask is None and np.array_equal(kpos, np.arange(S)):
        return None
    if mask is None:
        mask = np.arange(S)[None, :] <= (n_past + np.arange(T))[:, None]  # causal on slots
    return mask & ((pos[:, None] - kpos[None, :]) < window)                # (T, S)


def head_out(b, x, output_norm, eps: float, output_w, output: str, last_only: bool):
    """Final RMSNorm and output projection, with forward()'s `output` / `last_only` conventions."""
    if last_only:
        x = x[-1:]
    x = b.rms_norm(x, output_norm, eps)                          # (T, n_embd)
    if output == "hidden":
        return b.to_numpy(x)
    logits = b.matmul(x, output_w)                               # (T, n_vocab)
    return logits if output == "raw" else b.to_numpy(logits)


@dataclasses.dataclass
class DecoderHParams:
    """llama.HParams plus head_dim from `{arch}.attention.key_length` (qwen3: 128 with n_embd / n_head
    = 64 for Qwen3-0.6B), for the llama-like decoders (qwen2, qwen3)."""
    n_vocab: int
    n_embd: int          # {arch}.embedding_length
    n_layer: int         # {arch}.block_count
    n_head: int          # {arch}.attention.head_count
    n_head_kv: int       # {arch}.attention.head_count_kv
    n_ff: int            # {arch}.feed_forward_length
    rms_eps: float       # {arch}.attention.layer_norm_rms_epsilon
    rope_freq_base: float  # {arch}.rope.freq_base
    n_ctx_train: int     # {arch}.context_length
    head_dim: int = 0    # {arch}.attention.key_length (default n_embd / n_head)
    n_rot: int = 0       # {arch}.rope.dimension_count (default head_dim)
    arch: str = "qwen3"

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
        if not (self.rope_freq_base > 0.0) or not math.isfinite(self.rope_freq_base):
            bad("rope.freq_base", f"{self.rope_freq_base}")
        if self.n_rot == 0:
            self.n_rot = self.head_dim
        if self.n_rot < 0 or self.n_rot > self.head_dim or self.n_rot % 2:
            bad("rope.dimension_count", f"{self.n_rot} (head_dim {self.head_dim})")

    @classmethod
    def from_gguf(cls, f, arch: str) -> "DecoderHParams":
        n_vocab = n_vocab_of(f, arch)
        n_head = _key(f, arch, "attention.head_count", int)
        head_dim = _key(f, arch, "attention.key_length", int, 0)
        v_len = _key(f, arch, "attention.value_length", int, head_dim)
        if v_len != head_dim:
            raise ModelFormatError(f"{arch}.attention.value_length {v_len} != key_length {head_dim}",
                                   kind="invalid_key")
        return cls(
            n_vocab=n_vocab,
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=_key(f, arch, "block_count", int),
            n_head=n_head,
            n_head_kv=_key(f, arch, "attention.head_count_kv", int, n_head),
            n_ff=_key(f, arch, "feed_forward_length", int),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            head_dim=head_dim,
            n_rot=_key(f, arch, "rope.dimension_count", int, 0),
            arch=arch,
        )


def n_vocab_of(f, arch: str) -> int:
    """`{arch}.vocab_size`, else the tokenizer's size, else token_embd's rows."""
    toks = f.get("tokenizer.ggml.tokens", None)
    if toks is not None:
        default = len(toks)
    elif "token_embd.weight" in f.tensors:
        default = f.tensors["token_embd.weight"].shape[0]
    else:
        return _key(f, arch, "vocab_size", int)
    return _key(f, arch, "vocab_size", int, default)


class PreNormBlock:
    """x + attn(rms_norm(x)), then + ffn(rms_norm(.)): the llama block, with the architecture's own
    attention and FFN classes (qwen2 biases, qwen3 q/k norms, qwen3moe experts)."""

    def __init__(self, w: _Weights, hp, i: int, attention_cls, ffn_cls):
        p = f"blk.{i}."
        self.hp = hp
        self.i = i
        self.attn_norm = w.get(p + "attn_norm.weight", (hp.n_embd,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (hp.n_embd,))
        self.attn = attention_cls(w, hp, i)
        self.ffn = ffn_cls(w, hp, i)

    def __call__(self, b, x, pos, cache: KVCache, n_past: int, mask=None):
        h = b.rms_norm(x, self.attn_norm, self.hp.rms_eps)                           # (T, n_embd)
        x = b.add(x, self.attn(b, h, pos, cache.k[self.i], cache.v[self.i], n_past, mask))
        h = b.rms_norm(x, self.ffn_norm, self.hp.rms_eps)
        return b.add(x, self.ffn(b, h))                                               # (T, n_embd)


class DecoderModel:
    """token_embd -> PreNormBlock x n_layer -> output_norm -> output (tied to token_embd when
    `output.weight` is absent). A model file subclasses it naming its `Attention` and `FFN`."""

    Attention = None
    FFN = None
    graph_capturable = True  # False where a step decides on the host (see cuda GreedyDecoder)

    def __init__(self, f, backend, hp):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _Weights(f, backend)
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, hp.n_embd))  # (n_vocab, n_embd)
        self.blocks = [PreNormBlock(w, hp, i, self.Attention, self.FFN) for i in range(hp.n_layer)]
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
