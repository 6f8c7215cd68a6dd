"""The `qwen35` architecture (Qwen3.5 dense): Gated DeltaNet linear-attention layers interleaved with
gated full-attention layers, as llama.cpp's converter lays them out.

- layer kind: `qwen35.attention.recurrent_layers` (bool per layer; absent: every
  `full_attention_interval`-th layer is full attention, default 4);
- every block: x + mixer(rms_norm(x, attn_norm)), then + ffn(rms_norm(., post_attention_norm)); the
  converter has already added Qwen3.5's zero-centred "1 +" to every RMSNorm weight except ssm_norm;
- full attention: attn_q holds per head [q (head_dim) | gate (head_dim)]; q/k RMSNorm per head,
  partial NEOX RoPE on the first n_rot dims (`rope.dimension_count`), output * sigmoid(gate).
  `rope.dimension_sections` (interleaved M-RoPE) is read and checked, but text-only positions are
  equal in every section, where M-RoPE is plain NEOX RoPE;
- linear attention (Gated DeltaNet): attn_qkv -> causal depthwise conv (ssm_conv1d, kernel
  `ssm.conv_kernel`) -> SiLU -> gated delta rule (q/k L2-normalized, beta = sigmoid(ssm_beta x),
  g = ssm_a * softplus(ssm_alpha x + ssm_dt.bias), ssm_a = -exp(A_log)) with a state
  (n_v_head, d_k, d_v) per layer -> RMSNorm(ssm_norm) * silu(attn_gate x) -> ssm_out.
  Sizes: d_k = d_v = `ssm.state_size`, n_k_head = `ssm.group_count`, n_v_head =
  `ssm.time_step_rank`, n_v_head * d_v = `ssm.inner_size`;
- recurrent layers cannot hide one branch from another, so `tree_mask = False`: branches are scored
  from cache snapshots (`Cache.snapshot()` / `restore()`).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import ROPE_NEOX, Backend
from reflex.errors import InvalidRequest, ModelFormatError
from reflex.models.llama import FFN
from reflex.models._common import (KVCache, _key, _Weights, check_decoder_keys, check_forward_args, head_out,
                                   invalid_key, n_vocab_of)


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int            # qwen35.embedding_length
    n_layer: int           # qwen35.block_count
    n_head: int            # qwen35.attention.head_count
    n_head_kv: int         # qwen35.attention.head_count_kv
    n_ff: int              # qwen35.feed_forward_length
    rms_eps: float         # qwen35.attention.layer_norm_rms_epsilon
    rope_freq_base: float  # qwen35.rope.freq_base
    n_ctx_train: int       # qwen35.context_length
    head_dim: int          # qwen35.attention.key_length (= value_length)
    n_rot: int             # qwen35.rope.dimension_count
    rope_sections: tuple   # qwen35.rope.dimension_sections (4 entries; sum = n_rot / 2)
    recurrent: tuple       # per layer: True = Gated DeltaNet, False = full attention
    d_conv: int            # qwen35.ssm.conv_kernel
    d_state: int           # qwen35.ssm.state_size (d_k = d_v)
    n_k_head: int          # qwen35.ssm.group_count
    n_v_head: int          # qwen35.ssm.time_step_rank
    d_inner: int           # qwen35.ssm.inner_size (= n_v_head * d_state)
    arch: str = "qwen35"

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        check_decoder_keys(self)
        if self.head_dim <= 0 or self.head_dim % 2:
            bad("attention.key_length", f"{self.head_dim} (must be positive and even)")
        if not (self.rope_freq_base > 0.0) or not math.isfinite(self.rope_freq_base):
            bad("rope.freq_base", f"{self.rope_freq_base}")
        if self.n_rot <= 0 or self.n_rot > self.head_dim or self.n_rot % 2:
            bad("rope.dimension_count", f"{self.n_rot} (head_dim {self.head_dim})")
        if len(self.rope_sections) != 4 or min(self.rope_sections) < 0 or 2 * sum(self.rope_sections) != self.n_rot:
            bad("rope.dimension_sections", f"{list(self.rope_sections)} (4 entries summing to n_rot / 2 = "
                                           f"{self.n_rot // 2})")
        if len(self.recurrent) != self.n_layer:
            bad("attention.recurrent_layers", f"{len(self.recurrent)} entries for {self.n_layer} layers")
        for key, v in (("ssm.conv_kernel", self.d_conv), ("ssm.state_size", self.d_state),
                       ("ssm.group_count", self.n_k_head), ("ssm.time_step_rank", self.n_v_head)):
            if any(self.recurrent) and v <= 0:
                bad(key, f"must be positive, got {v}")
        if any(self.recurrent):
            if self.n_v_head % self.n_k_head:
                bad("ssm.group_count", f"{self.n_k_head} does not divide time_step_rank {self.n_v_head}")
            if self.d_inner != self.n_v_head * self.d_state:
                bad("ssm.inner_size", f"{self.d_inner} != time_step_rank {self.n_v_head} x state_size "
                                      f"{self.d_state}")

    @classmethod
    def from_gguf(cls, f, arch: str = "qwen35") -> "HParams":
        n_layer = _key(f, arch, "block_count", int)
        head_dim = _key(f, arch, "attention.key_length", int)
        v_len = _key(f, arch, "attention.value_length", int, head_dim)
        if v_len != head_dim:
            raise ModelFormatError(f"{arch}.attention.value_length {v_len} != key_length {head_dim}",
                                   kind="invalid_key")
        rec = f.get(f"{arch}.attention.recurrent_layers", None)
        if rec is None:
            every = _key(f, arch, "full_attention_interval", int, 4)
            if every <= 0:
                invalid_key(arch, "full_attention_interval", f"must be positive, got {every}")
            rec = [(i + 1) % every != 0 for i in range(n_layer)]
        sections = f.get(f"{arch}.rope.dimension_sections", None)
        if sections is None:
            raise ModelFormatError(f"missing hyperparameter '{arch}.rope.dimension_sections'", kind="missing_key")
        try:
            rec = tuple(bool(r) for r in np.asarray(rec).reshape(-1))
            sections = tuple(int(s) for s in np.asarray(sections).reshape(-1))
        except (TypeError, ValueError):
            raise ModelFormatError(f"invalid {arch}.attention.recurrent_layers / rope.dimension_sections",
                                   kind="invalid_key") from None
        n_head = _key(f, arch, "attention.head_count", int)
        return cls(
            n_vocab=n_vocab_of(f, arch),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=_key(f, arch, "attention.head_count_kv", int, n_head),
            n_ff=_key(f, arch, "feed_forward_length", int),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            head_dim=head_dim,
            n_rot=_key(f, arch, "rope.dimension_count", int),
            rope_sections=sections,
            recurrent=rec,
            d_conv=_key(f, arch, "ssm.conv_kernel", int, 0),
            d_state=_key(f, arch, "ssm.state_size", int, 0),
            n_k_head=_key(f, arch, "ssm.group_count", int, 0),
            n_v_head=_key(f, arch, "ssm.time_step_rank", int, 0),
            d_inner=_key(f, arch, "ssm.inner_size", int, 0),
            arch=arch,
        )


class Attention:
    """Gated full attention: q/k RMSNorm, partial NEOX RoPE, output * sigmoid(gate)."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        d, E = hp.head_dim, hp.n_embd
        self.hp = hp
        self.wq, self.wg = _head_split(w, p + "attn_q.weight", hp.n_head, d, E)  # each (n_head*head_dim, n_embd)
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
        gate = b.matmul(x, self.wg)                                     # (T, n_head*head_dim)
        k = b.matmul(x, self.wk).reshape(T, hp.n_head_kv, hp.head_dim)  # (T, n_head_kv, head_dim)
        v = b.matmul(x, self.wv).reshape(T, hp.n_head_kv, hp.head_dim)
        q = b.rms_norm(q, self.q_norm, hp.rms_eps)
        k = b.rms_norm(k, self.k_norm, hp.rms_eps)
        q = b.rope(q, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        k = b.rope(k, pos, hp.n_rot, hp.rope_freq_base, ROPE_NEOX)
        b.kv_write(k_cache, k, n_past)
        b.kv_write(v_cache, v, n_past)
        o = b.attention(q, k_cache, v_cache, n_past, self.scale, mask=mask)  # (T, n_head, head_dim)
        o = b.sigmoid_mul(o.reshape(T, hp.n_head * hp.head_dim), gate)
        return b.matmul(o, self.wo)                                           # (T, n_embd)


def _head_split(w: _Weights, name: str, n_head: int, d: int, n_in: int):
    """attn_q.weight (n_head * 2 * d, n_in), rows per head [q (d) | gate (d)] -> (wq, wgate), each
    (n_head * d, n_in). Rows are contiguous byte ranges in every GGUF type (quantized too)."""
    t = w.f.tensors.get(name)
    if t is None:
        raise ModelFormatError(f"missing tensor {name!r}", kind="missing_tensor")
    if tuple(t.shape) != (n_head * 2 * d, n_in):
        raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {(n_head * 2 * d, n_in)}",
                               kind="tensor_shape")
    raw = np.frombuffer(w.f.tensor_bytes(name), dtype=np.uint8).reshape(n_head, 2, d, -1)  # (head, q|gate, d, row_bytes)
    return [w.b.prepare_weight(np.ascontiguousarray(raw[:, j]).reshape(-1), t.ggml_type, (n_head * d, n_in))
            for j in (0, 1)]


class DeltaNet:
    """Gated DeltaNet linear attention; its state lives in the cache (conv window + recurrent state)."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E, nv, dk = hp.n_embd, hp.n_v_head, hp.d_state
        self.hp = hp
        self.n_conv = 2 * hp.n_k_head * dk + hp.d_inner                            # conv channels [q | k | v]
        self.w_qkv = w.get(p + "attn_qkv.weight", (self.n_conv, E))               # (n_conv, n_embd)
        self.w_z = w.get(p + "attn_gate.weight", (hp.d_inner, E))                 # (d_inner, n_embd)
        self.w_alpha = w.get(p + "ssm_alpha.weight", (nv, E))                     # (n_v_head, n_embd)
        self.w_beta = w.get(p + "ssm_beta.weight", (nv, E))
        self.conv_w = w.get(p + "ssm_conv1d.weight", (self.n_conv, hp.d_conv))   # (n_conv, d_conv)
        self.ssm_a = w.get(p + "ssm_a", (nv,))                                    # -exp(A_log)
        self.dt_bias = w.get(p + "ssm_dt.bias", (nv,))
        self.norm = w.get(p + "ssm_norm.weight", (dk,))
        self.w_out = w.get(p + "ssm_out.weight", (E, hp.d_inner))                 # (n_embd, d_inner)

    def __call__(self, b: Backend, x, conv_state, state):
        hp = self.hp
        T = x.shape[0]
        qkv = b.ssm_conv(b.matmul(x, self.w_qkv), conv_state, self.conv_w)       # (T, n_conv)
        o = b.gated_delta_rule(b.silu(qkv), b.matmul(x, self.w_alpha), b.matmul(x, self.w_beta),
                               self.ssm_a, self.dt_bias, state, hp.n_k_head, hp.rms_eps)  # (T, n_v_head, d_v)
        z = b.matmul(x, self.w_z).reshape(T, hp.n_v_head, hp.d_state)             # (T, n_v_head, d_v)
        o = b.mul(b.rms_norm(o, self.norm, hp.rms_eps), b.silu(z))
        return b.matmul(o.reshape(T, hp.d_inner), self.w_out)                     # (T, n_embd)


class Cache(KVCache):
    """K/V for the full-attention layers (indexed by layer, empty placeholders on recurrent ones) and,
    per recurrent layer, the conv window (d_conv - 1, n_conv) and the delta-rule state
    (n_v_head, d_k, d_v). A recurrence cannot be rewound: `truncate` only to 0 or n, and branches
    go through `snapshot()` / `restore(snap)`."""

    def __init__(self, backend, hp: HParams, n_ctx: int, n_conv: int):
        if n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        self.backend = backend
        self.n_ctx = n_ctx
        self.n = 0
        kv = (n_ctx, hp.n_head_kv, hp.head_dim)
        self.k = [None if r else backend.zeros(kv) for r in hp.recurrent]   # each (n_ctx, n_head_kv, head_dim)
        self.v = [None if r else backend.zeros(kv) for r in hp.recurrent]
        self.pos = np.zeros(n_ctx, dtype=np.int64)
        self._shapes = ((hp.d_conv - 1, n_conv), (hp.n_v_head, hp.d_state, hp.d_state))
        self.conv, self.ssm = {}, {}
        self._reset_states(hp)

    def _reset_states(self, hp):
        b = self.backend
        for i, r in enumerate(hp.recurrent):
            if r:
                self.conv[i] = b.ssm_state(self._shapes[0])   # (d_conv-1, n_conv)
                self.ssm[i] = b.ssm_state(self._shapes[1])    # (n_v_head, d_k, d_v)
        self._hp = hp

    def truncate(self, n: int):
        n = max(0, min(n, self.n))
        if n == self.n:
            return
        if n != 0:
            raise InvalidRequest("qwen35 cache: recurrent layers cannot be truncated to a shorter prefix "
                                 "(use snapshot() / restore())")
        self.n = 0
        self._reset_states(self._hp)

    def snapshot(self):
        b = self.backend
        return (self.n, self.pos.copy(), {i: b.state_copy(s) for i, s in self.conv.items()},
                {i: b.state_copy(s) for i, s in self.ssm.items()})

    def restore(self, snap):
        b = self.backend
        n, pos, conv, ssm = snap
        self.n = n
        self.pos[:] = pos
        # copies again, so one snapshot can be restored any number of times
        self.conv = {i: b.state_copy(s) for i, s in conv.items()}
        self.ssm = {i: b.state_copy(s) for i, s in ssm.items()}


class Block:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.hp = hp
        self.i = i
        self.recurrent = hp.recurrent[i]
        self.attn_norm = w.get(p + "attn_norm.weight", (hp.n_embd,))
        self.post_norm = w.get(p + "post_attention_norm.weight", (hp.n_embd,))
        self.mixer = DeltaNet(w, hp, i) if self.recurrent else Attention(w, hp, i)
        self.ffn = FFN(w, hp, i)

    def __call__(self, b, x, pos, cache: Cache, n_past: int, mask=None):
        h = b.rms_norm(x, self.attn_norm, self.hp.rms_eps)                           # (T, n_embd)
        if self.recurrent:
            h = self.mixer(b, h, cache.conv[self.i], cache.ssm[self.i])
        else:
            h = self.mixer(b, h, pos, cache.k[self.i], cache.v[self.i], n_past, mask)
        x = b.add(x, h)
        h = b.rms_norm(x, self.post_norm, self.hp.rms_eps)
        return b.add(x, self.ffn(b, h))                                              # (T, n_embd)


class Model:
    tree_mask = False         # recurrent layers: branches via cache snapshot() / restore()
    graph_capturable = False  # decode state lives in per-layer recurrent arrays, not in the KV cache

    def __init__(self, f, backend, hp: HParams):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _Weights(f, backend)
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, hp.n_embd))  # (n_vocab, n_embd)
        self.blocks = [Block(w, hp, i) for i in range(hp.n_layer)]
        self.n_conv = 2 * hp.n_k_head * hp.d_state + hp.d_inner
        self.output_norm = w.get("output_norm.weight", (hp.n_embd,))
        if w.has("output.weight"):
            self.output = w.get("output.weight", (hp.n_vocab, hp.n_embd))    # (n_vocab, n_embd)
        else:
            self.output = self.tok_embd  # tied embeddings

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> Cache:
        return Cache(self.backend, self.hp, n_ctx or self.hp.n_ctx_train, self.n_conv)

    def forward(self, token_ids, cache: Cache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Same contract as llama.Model.forward, except that `attn_mask` may only be the plain causal
        mask (a recurrence sees every earlier token; branches go through cache snapshots)."""
        b = self.backend
        old = cache.pos[cache.n:cache.n + len(np.asarray(token_ids).reshape(-1))].copy()
        ids, pos, n_past, mask = check_forward_args(token_ids, cache, self.hp.n_vocab, positions,
                                                    attn_mask, output)
        if mask is not None:
            S = n_past + ids.shape[0]
            causal = np.arange(S)[None, :] <= (n_past + np.arange(ids.shape[0]))[:, None]
            if not np.array_equal(mask, causal):
                cache.pos[n_past:n_past + ids.shape[0]] = old
                raise InvalidRequest("qwen35 has recurrent layers: attn_mask can only be causal "
                                     "(score branches from cache snapshot() / restore())")
            mask = None
        x = b.embed(self.tok_embd, ids)                             # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, pos, cache, n_past, mask)
        cache.n = n_past + ids.shape[0]
        return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)


def load(f, backend: Backend, arch: str = "qwen35") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
