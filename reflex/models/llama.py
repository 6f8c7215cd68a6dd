"""The `llama` architecture: pre-norm decoder, RMSNorm, RoPE, grouped-query attention, SwiGLU.

GGUF llama files store Q/K with the rows permuted by the converter so that RoPE rotates adjacent
pairs (mode NORM); we therefore use NORM and never un-permute.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import ROPE_NORM, Backend
from reflex.errors import ContextOverflow, InvalidRequest, ModelFormatError

_MISSING = object()


def _key(f, arch: str, key: str, typ, default=_MISSING):
    full = f"{arch}.{key}"
    v = f.get(full, _MISSING)
    if v is _MISSING:
        if default is _MISSING:
            raise ModelFormatError(f"missing hyperparameter {full!r}", kind="missing_key")
        return default
    try:
        if isinstance(v, (bool, np.bool_)) or np.ndim(v) != 0:
            raise TypeError
        return typ(v)
    except (TypeError, ValueError):
        raise ModelFormatError(f"invalid hyperparameter {full!r}: {v!r}", kind="invalid_key") from None


def invalid_key(arch: str, key: str, why: str):
    raise ModelFormatError(f"invalid hyperparameter {arch}.{key}: {why}", kind="invalid_key")


def check_decoder_keys(hp):
    """The checks every decoder's hyperparameters share (llama, qwen*, gemma3): positive sizes,
    head_count_kv dividing head_count, a sane RMSNorm epsilon."""
    for key, attr in (("embedding_length", "n_embd"), ("block_count", "n_layer"),
                      ("attention.head_count", "n_head"), ("feed_forward_length", "n_ff"),
                      ("context_length", "n_ctx_train"), ("vocab_size", "n_vocab")):
        if getattr(hp, attr) <= 0:
            invalid_key(hp.arch, key, f"must be positive, got {getattr(hp, attr)}")
    if hp.n_head_kv <= 0 or hp.n_head % hp.n_head_kv:
        invalid_key(hp.arch, "attention.head_count_kv",
                    f"{hp.n_head_kv} does not divide head_count {hp.n_head}")
    if not (0.0 < hp.rms_eps < 1.0) or not math.isfinite(hp.rms_eps):
        invalid_key(hp.arch, "attention.layer_norm_rms_epsilon", f"{hp.rms_eps}")


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int          # llama.embedding_length
    n_layer: int         # llama.block_count
    n_head: int          # llama.attention.head_count
    n_head_kv: int       # llama.attention.head_count_kv
    n_ff: int            # llama.feed_forward_length
    rms_eps: float       # llama.attention.layer_norm_rms_epsilon
    rope_freq_base: float  # llama.rope.freq_base
    n_ctx_train: int     # llama.context_length
    n_rot: int = 0       # llama.rope.dimension_count (default head_dim)
    n_swa: int = 0       # llama.attention.sliding_window (Mistral-style; 0 = full attention)
    arch: str = "llama"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        check_decoder_keys(self)
        if self.n_embd % self.n_head:
            bad("embedding_length", f"{self.n_embd} not divisible by head_count {self.n_head}")
        if not (self.rope_freq_base > 0.0) or not math.isfinite(self.rope_freq_base):
            bad("rope.freq_base", f"{self.rope_freq_base}")
        if self.n_swa < 0:
            bad("attention.sliding_window", f"{self.n_swa}")
        if self.n_rot == 0:
            self.n_rot = self.head_dim
        if self.n_rot < 0 or self.n_rot > self.head_dim or self.n_rot % 2:
            bad("rope.dimension_count", f"{self.n_rot} (head_dim {self.head_dim})")

    @classmethod
    def from_gguf(cls, f, arch: str = "llama") -> "HParams":
        n_vocab = f.get(f"{arch}.vocab_size", None)
        if n_vocab is None:
            toks = f.get("tokenizer.ggml.tokens", None)
            if toks is not None:
                n_vocab = len(toks)
            elif "token_embd.weight" in f.tensors:
                n_vocab = f.tensors["token_embd.weight"].shape[0]
            else:
                raise ModelFormatError(f"missing hyperparameter '{arch}.vocab_size'", kind="missing_key")
        n_head = _key(f, arch, "attention.head_count", int)
        return cls(
            n_vocab=_key(f, arch, "vocab_size", int, n_vocab),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=_key(f, arch, "block_count", int),
            n_head=n_head,
            n_head_kv=_key(f, arch, "attention.head_count_kv", int, n_head),
            n_ff=_key(f, arch, "feed_forward_length", int),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            n_rot=_key(f, arch, "rope.dimension_count", int, 0),
            n_swa=_key(f, arch, "attention.sliding_window", int, 0),
            arch=arch,
        )


class KVCache:
    """Per-layer K/V buffers sized to n_ctx; `n` is the number of positions filled."""

    def __init__(self, backend: Backend, hp: HParams, n_ctx: int):
        if n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        self.n_ctx = n_ctx
        self.n = 0
        shape = (n_ctx, hp.n_head_kv, hp.head_dim)
        self.k = [backend.zeros(shape) for _ in range(hp.n_layer)]  # each (n_ctx, n_head_kv, head_dim)
        self.pos = np.zeros(n_ctx, dtype=np.int64)  # (n_ctx,) RoPE position of each slot (tree masks)
        self.v = [backend.zeros(shape) for _ in range(hp.n_layer)]

    def __len__(self):
        return self.n

    def truncate(self, n: int):
        """Forget positions >= n (e.g. to reuse a shared prefix)."""
        self.n = max(0, min(n, self.n))


class _Weights:
    def __init__(self, f, backend: Backend):
        self.f = f
        self.b = backend

    def has(self, name):
        return name in self.f.tensors

    def get(self, name, shape=None):
        t = self.f.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"missing tensor {name!r}", kind="missing_tensor")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}",
                                   kind="tensor_shape")
        return self.b.prepare_weight(self.f.tensor_bytes(name), t.ggml_type, tuple(t.shape))


class Attention:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        d, E = hp.head_dim, hp.n_embd
        self.hp = hp
        self.wq = w.get(p + "attn_q.weight", (hp.n_head * d, E))     # (n_head*head_dim, n_embd)
        self.wk = w.get(p + "attn_k.weight", (hp.n_head_kv * d, E))  # (n_head_kv*head_dim, n_embd)
        self.wv = w.get(p + "attn_v.weight", (hp.n_head_kv * d, E))
        self.wo = w.get(p + "attn_output.weight", (E, hp.n_head * d))
        self.scale = 1.0 / math.sqrt(d)

    def __call__(self, b: Backend, x, pos, k_cache, v_cache, n_past: int, mask=None):
        hp = self.hp
        T = x.shape[0]
        q = b.matmul(x, self.wq).reshape(T, hp.n_head, hp.head_dim)     # (T, n_head, head_dim)
        k = b.matmul(x, self.wk).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        v = b.matmul(x, self.wv).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        q = b.rope(q, pos, hp.n_rot, hp.rope_freq_base, ROPE_NORM)
        k = b.rope(k, pos, hp.n_rot, hp.rope_freq_base, ROPE_NORM)
        b.kv_write(k_cache, k, n_past)
        b.kv_write(v_cache, v, n_past)
        o = b.attention(q, k_cache, v_cache, n_past, self.scale,
                        window=hp.n_swa, mask=mask)                     # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * hp.head_dim), self.wo)  # (T, n_embd)


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
        return KVCache(self.backend, self.hp, n_ctx or self.hp.n_ctx_train)

    def forward(self, token_ids, cache: KVCache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Run `token_ids` in cache slots cache.n .. cache.n+T-1, appending their K/V to the cache.

        positions: RoPE positions (T,), default the slot numbers; system1 scoring passes positions
          that restart after the context for every candidate.
        attn_mask: optional bool (T, cache.n+T), True = visible (see Backend.attention); default causal.
        output: "logits" -> (T, n_vocab); "hidden" -> the final-normed hidden states (T, n_embd);
          "raw" -> the logits left as a backend array (a GPU backend samples on the device).
        Returned as float32 numpy (except "raw"); only the last row (1, ...) when last_only."""
        b = self.backend
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        T = ids.shape[0]
        if T == 0:
            raise InvalidRequest("forward() needs at least one token")
        if ids.min() < 0 or ids.max() >= self.hp.n_vocab:
            raise InvalidRequest(f"token id out of range [0, {self.hp.n_vocab})")
        if output not in ("logits", "hidden", "raw"):
            raise InvalidRequest(f"unknown forward output {output!r}")
        n_past = cache.n
        if n_past + T > cache.n_ctx:
            raise ContextOverflow(f"{n_past} cached + {T} new tokens exceed n_ctx {cache.n_ctx}")
        if positions is None:
            pos = np.arange(n_past, n_past + T)                     # (T,)
        else:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            if pos.shape != (T,):
                raise InvalidRequest(f"positions has shape {pos.shape}, expected ({T},)")
        if attn_mask is not None and self.hp.n_swa:
            # a given mask decides alone in Backend.attention, so the window joins it here, on the
            # slots' RoPE positions (a tree's branches share positions, not slot numbers)
            attn_mask = np.asarray(attn_mask, dtype=bool)
            kpos = np.concatenate([cache.pos[:n_past], pos])                 # (n_past+T,)
            attn_mask = attn_mask & ((pos[:, None] - kpos[None, :]) < self.hp.n_swa)
        cache.pos[n_past:n_past + T] = pos
        x = b.embed(self.tok_embd, ids)                             # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, pos, cache, n_past, attn_mask)
        cache.n = n_past + T
        if last_only:
            x = x[-1:]
        x = b.rms_norm(x, self.output_norm, self.hp.rms_eps)        # (T, n_embd)
        if output == "hidden":
            return b.to_numpy(x)
        logits = b.matmul(x, self.output)                           # (T, n_vocab)
        return logits if output == "raw" else b.to_numpy(logits)


def load(f, backend: Backend, arch: str = "llama") -> Model:
    # aliases (llama2, ...) keep their own key prefix in the file
    return Model(f, backend, HParams.from_gguf(f, arch))
