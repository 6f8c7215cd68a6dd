"""The `bert` architecture: encoder-only, post-layer-norm, GELU (erf), bidirectional attention.

GGUF layout (llama.cpp's converter): token_embd, token_types, position_embd, token_embd_norm;
blk.N.attn_q/k/v/output (+bias), attn_output_norm, ffn_up/ffn_down (+bias), layer_output_norm;
optional classifier head cls (+bias, dense + tanh) and cls.output (+bias), used with RANK pooling.

    x = LN(tok_embd[ids] + token_types[type] + position_embd[pos])
    per block: x = LN(x + attn(x)); x = LN(x + down(gelu(up(x))))

There is no final norm and no LM head: forward() returns hidden states; pooling and the classifier
head are applied by reflex/embed.py.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import Backend
from reflex.errors import ContextOverflow, InvalidRequest, ModelFormatError
from reflex.models.llama import _key, _Weights

POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 0, 1, 2, 3, 4


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int          # bert.embedding_length
    n_layer: int         # bert.block_count
    n_head: int          # bert.attention.head_count
    n_ff: int            # bert.feed_forward_length
    norm_eps: float      # bert.attention.layer_norm_epsilon
    n_ctx_train: int     # bert.context_length (rows of position_embd)
    n_token_types: int   # tokenizer.ggml.token_type_count (rows of token_types)
    pooling_type: int    # bert.pooling_type
    causal: bool = False  # bert.attention.causal
    arch: str = "bert"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_head_kv(self) -> int:
        return self.n_head

    def __post_init__(self):
        a = self.arch

        def bad(key, why):
            raise ModelFormatError(f"invalid hyperparameter {a}.{key}: {why}", kind="invalid_key")

        for key, attr in (("embedding_length", "n_embd"), ("block_count", "n_layer"),
                          ("attention.head_count", "n_head"), ("feed_forward_length", "n_ff"),
                          ("context_length", "n_ctx_train"), ("vocab_size", "n_vocab")):
            if getattr(self, attr) <= 0:
                bad(key, f"must be positive, got {getattr(self, attr)}")
        if self.n_embd % self.n_head:
            bad("embedding_length", f"{self.n_embd} not divisible by head_count {self.n_head}")
        if not (0.0 < self.norm_eps < 1.0) or not math.isfinite(self.norm_eps):
            bad("attention.layer_norm_epsilon", f"{self.norm_eps}")
        if self.pooling_type not in (POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK):
            bad("pooling_type", f"{self.pooling_type} (NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4)")
        if self.n_token_types < 1:
            bad("token_type_count", f"{self.n_token_types}")

    @classmethod
    def from_gguf(cls, f, arch: str = "bert") -> "HParams":
        t = f.tensors
        if "token_embd.weight" not in t:
            raise ModelFormatError("missing tensor 'token_embd.weight'", kind="missing_tensor")
        n_vocab = t["token_embd.weight"].shape[0]
        n_types = f.get("tokenizer.ggml.token_type_count", None)
        if n_types is None:
            n_types = t["token_types.weight"].shape[0] if "token_types.weight" in t else 1
        # llama.cpp: a classifier head without a pooling key means RANK
        pool_default = POOLING_RANK if "cls.output.weight" in t or "cls.weight" in t else POOLING_NONE
        return cls(
            n_vocab=_key(f, arch, "vocab_size", int, n_vocab),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=_key(f, arch, "block_count", int),
            n_head=_key(f, arch, "attention.head_count", int),
            n_ff=_key(f, arch, "feed_forward_length", int),
            norm_eps=_key(f, arch, "attention.layer_norm_epsilon", float),
            n_ctx_train=_key(f, arch, "context_length", int),
            n_token_types=int(n_types),
            pooling_type=_key(f, arch, "pooling_type", int, pool_default),
            causal=bool(f.get(f"{arch}.attention.causal", False)),
            arch=arch,
        )


class KVCache:
    """Scratch K/V for one forward: bidirectional attention cannot extend a cache token by token,
    so `n` stays 0 and every forward sees only its own tokens."""

    def __init__(self, backend: Backend, hp: HParams, n_ctx: int):
        if n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        self.n_ctx = n_ctx
        self.n = 0

    def __len__(self):
        return self.n

    def truncate(self, n: int):
        self.n = 0


def block_diagonal_mask(seq_lens, causal: bool = False) -> np.ndarray:
    """bool (T, T), True = visible: each packed sequence sees only itself (causal inside if asked)."""
    T = int(sum(seq_lens))
    m = np.zeros((T, T), dtype=bool)
    s = 0
    for n in seq_lens:
        blk = np.ones((n, n), dtype=bool)
        m[s:s + n, s:s + n] = np.tril(blk) if causal else blk
        s += n
    return m


def _gemm_layout(w: _Weights, name: str, shape: tuple):
    """A matmul weight (n_out, n_in). On NumPy it is kept column-major, so the backend's
    `x @ w.T` reads a C-contiguous (n_in, n_out) matrix: OpenBLAS's no-transpose path, measured
    2-2.7x faster at T=12 on one thread (384x1536: 271 vs 732 us); same values, same op."""
    a = w.get(name, shape)
    if getattr(w.b, "name", "") == "numpy" and isinstance(a, np.ndarray) and a.ndim == 2:
        a = np.asfortranarray(a)
    return a


class Attention:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E = hp.n_embd
        self.hp = hp
        self.wq = _gemm_layout(w, p + "attn_q.weight", (E, E))       # (n_head*head_dim, n_embd)
        self.bq = w.get(p + "attn_q.bias", (E,))
        self.wk = _gemm_layout(w, p + "attn_k.weight", (E, E))
        self.bk = w.get(p + "attn_k.bias", (E,))
        self.wv = _gemm_layout(w, p + "attn_v.weight", (E, E))
        self.bv = w.get(p + "attn_v.bias", (E,))
        self.wo = _gemm_layout(w, p + "attn_output.weight", (E, E))
        self.bo = w.get(p + "attn_output.bias", (E,))
        self.scale = 1.0 / math.sqrt(hp.head_dim)

    def __call__(self, b: Backend, x, mask=None, seq_lens=None):
        hp = self.hp
        T = x.shape[0]
        q = b.linear(x, self.wq, self.bq).reshape(T, hp.n_head, hp.head_dim)  # (T, n_head, head_dim)
        k = b.linear(x, self.wk, self.bk).reshape(T, hp.n_head, hp.head_dim)
        v = b.linear(x, self.wv, self.bv).reshape(T, hp.n_head, hp.head_dim)
        if seq_lens is not None and len(seq_lens) > 1 and getattr(b, "name", "") != "numpy":
            # packed sequences on a device backend: one attention call under the block-diagonal
            # mask (the backend's own op; no host round trip to join per-sequence outputs)
            mask = block_diagonal_mask(seq_lens, hp.causal)                      # (T, T)
            seq_lens = None
        if seq_lens is None:
            o = b.attention(q, k, v, 0, self.scale, mask=mask, causal=hp.causal)  # (T, n_head, head_dim)
        else:
            # packed sequences on NumPy: the block-diagonal mask computed block by block (no T x T
            # scores); the outputs are host arrays, so joining them is a plain copy
            parts, s = [], 0
            for n in seq_lens:
                parts.append(b.attention(q[s:s + n], k[s:s + n], v[s:s + n], 0, self.scale,
                                         causal=hp.causal))
                s += n
            o = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        return b.linear(o.reshape(T, hp.n_embd), self.wo, self.bo)  # (T, n_embd)


class FFN:
    """down(gelu(up(x))), exact (erf) GELU as BERT uses."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.w_up = _gemm_layout(w, p + "ffn_up.weight", (hp.n_ff, hp.n_embd))      # (n_ff, n_embd)
        self.b_up = w.get(p + "ffn_up.bias", (hp.n_ff,))
        self.w_down = _gemm_layout(w, p + "ffn_down.weight", (hp.n_embd, hp.n_ff))  # (n_embd, n_ff)
        self.b_down = w.get(p + "ffn_down.bias", (hp.n_embd,))

    def __call__(self, b: Backend, x):
        h = b.linear_gelu(x, self.w_up, self.b_up)      # (T, n_ff)
        return b.linear(h, self.w_down, self.b_down)     # (T, n_embd)


class Block:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E = hp.n_embd
        self.hp = hp
        self.i = i
        self.attn = Attention(w, hp, i)
        self.attn_out_norm = w.get(p + "attn_output_norm.weight", (E,))
        self.attn_out_norm_b = w.get(p + "attn_output_norm.bias", (E,))
        self.ffn = FFN(w, hp, i)
        self.out_norm = w.get(p + "layer_output_norm.weight", (E,))
        self.out_norm_b = w.get(p + "layer_output_norm.bias", (E,))

    def __call__(self, b: Backend, x, mask=None, seq_lens=None):
        eps = self.hp.norm_eps
        x = b.add_layer_norm(x, self.attn(b, x, mask, seq_lens), self.attn_out_norm,
                             self.attn_out_norm_b, eps)                                  # (T, n_embd)
        return b.add_layer_norm(x, self.ffn(b, x), self.out_norm, self.out_norm_b, eps)


class Model:
    supports_packing = True  # forward(..., seq_lens=) packs sequences (reflex/embed.py)

    def __init__(self, f, backend: Backend, hp: HParams):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _Weights(f, backend)
        E = hp.n_embd
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, E))           # (n_vocab, n_embd)
        self.type_embd = (w.get("token_types.weight", (hp.n_token_types, E))  # (n_types, n_embd)
                          if w.has("token_types.weight") else None)
        self.pos_embd = w.get("position_embd.weight", (hp.n_ctx_train, E))   # (n_ctx_train, n_embd)
        self.embd_norm = w.get("token_embd_norm.weight", (E,))
        self.embd_norm_b = w.get("token_embd_norm.bias", (E,))
        self.blocks = [Block(w, hp, i) for i in range(hp.n_layer)]
        # classifier head (RANK pooling): optional dense + tanh, then the output projection
        self.cls = self.cls_b = self.cls_out = self.cls_out_b = None
        if w.has("cls.weight"):
            self.cls = w.get("cls.weight", (E, E))
            self.cls_b = w.get("cls.bias", (E,)) if w.has("cls.bias") else None
        if w.has("cls.output.weight"):
            t = f.tensors["cls.output.weight"]
            if len(t.shape) != 2 or t.shape[1] != E:
                raise ModelFormatError(f"tensor 'cls.output.weight' has shape {tuple(t.shape)}, "
                                       f"expected (n_labels, {E})", kind="tensor_shape")
            self.cls_out = w.get("cls.output.weight")                          # (n_labels, n_embd)
            n_out = t.shape[0]
            self.cls_out_b = w.get("cls.output.bias", (n_out,)) if w.has("cls.output.bias") else None
        labels = f.get(f"{hp.arch}.classifier.output_labels", None)
        self.labels = [str(x) for x in labels] if labels is not None else None

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    @property
    def has_head(self) -> bool:
        return self.cls_out is not None or self.cls is not None

    def new_cache(self, n_ctx: int | None = None) -> KVCache:
        return KVCache(self.backend, self.hp, n_ctx or self.hp.n_ctx_train)

    def forward(self, token_ids, cache: KVCache | None = None, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits", token_types=None, seq_lens=None) -> np.ndarray:
        """Encode `token_ids` (T,) in one pass; every call is independent (cache may be None).

        positions: absolute positions (T,), default 0..T-1 (packed sequences restart at 0 each).
        attn_mask: optional bool (T, T), True = visible; default all visible (bidirectional).
        seq_lens: packed sequence lengths summing to T: attention stays inside each (the
          block-diagonal mask, without building it); positions default to restart per sequence.
        token_types: segment ids (T,), default 0.
        output: "hidden" -> final hidden states (T, n_embd) as float32 numpy; "raw" -> backend array;
          "logits" (the decoders' default) is an InvalidRequest: bert has no LM head, so a generate()
          on an embedding model fails clearly instead of sampling from hidden states.
        """
        b, hp = self.backend, self.hp
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        T = ids.shape[0]
        if T == 0:
            raise InvalidRequest("forward() needs at least one token")
        if ids.min() < 0 or ids.max() >= hp.n_vocab:
            raise InvalidRequest(f"token id out of range [0, {hp.n_vocab})")
        if output not in ("hidden", "raw"):
            raise InvalidRequest(f"bert has no LM head: forward output must be 'hidden' or 'raw', "
                                 f"not {output!r}")
        if cache is not None and T > cache.n_ctx:
            raise ContextOverflow(f"{T} tokens exceed n_ctx {cache.n_ctx}")
        if seq_lens is not None:
            seq_lens = [int(n) for n in seq_lens]
            if any(n <= 0 for n in seq_lens) or sum(seq_lens) != T:
                raise InvalidRequest(f"seq_lens {seq_lens} must be positive and sum to {T}")
            if attn_mask is not None:
                raise InvalidRequest("give attn_mask or seq_lens, not both")
        if positions is None:
            if seq_lens is None:
                pos = np.arange(T)
            else:
                pos = np.concatenate([np.arange(n) for n in seq_lens])
        else:
            pos = np.asarray(positions, dtype=np.int64).reshape(-1)
            if pos.shape != (T,):
                raise InvalidRequest(f"positions has shape {pos.shape}, expected ({T},)")
        if pos.min() < 0 or pos.max() >= hp.n_ctx_train:
            raise ContextOverflow(f"position {int(pos.max())} beyond the model's {hp.n_ctx_train} "
                                  f"absolute positions")
        if attn_mask is not None:
            attn_mask = np.asarray(attn_mask, dtype=bool)
            if attn_mask.shape != (T, T):
                raise InvalidRequest(f"attn_mask has shape {attn_mask.shape}, expected ({T}, {T})")
        x = b.add(b.embed(self.tok_embd, ids), b.embed(self.pos_embd, pos))   # (T, n_embd)
        if self.type_embd is not None:
            tt = np.zeros(T, np.int64) if token_types is None else np.asarray(token_types, np.int64)
            if tt.shape != (T,) or tt.min() < 0 or tt.max() >= hp.n_token_types:
                raise InvalidRequest(f"token_types must be ({T},) in [0, {hp.n_token_types})")
            x = b.add(x, b.embed(self.type_embd, tt))
        x = b.layer_norm(x, self.embd_norm, self.embd_norm_b, hp.norm_eps)
        for blk in self.blocks:
            x = blk(b, x, attn_mask, seq_lens)
        if last_only:
            x = x[-1:]
        return x if output == "raw" else b.to_numpy(x)

    def head(self, x):
        """Classifier head on pooled rows x (N, n_embd) -> scores (N, n_labels) float32 numpy."""
        b = self.backend
        if self.cls is not None:
            x = b.matmul(x, self.cls)
            if self.cls_b is not None:
                x = b.add(x, self.cls_b)
            x = b.tanh(x)                                                  # (N, n_embd)
        if self.cls_out is not None:
            x = b.matmul(x, self.cls_out)
            if self.cls_out_b is not None:
                x = b.add(x, self.cls_out_b)
        return b.to_numpy(x)


def load(f, backend: Backend, arch: str = "bert") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
