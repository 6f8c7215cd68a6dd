"""The `deepseek2` architecture (DeepSeek-V2 / V3): multi-head latent attention (MLA) and a MoE FFN
with shared experts after `leading_dense_block_count` dense layers.

- queries: q_lora_rank set (V3, V2): q = attn_q_b(rms_norm(attn_q_a(x), attn_q_a_norm)); absent (V2-Lite):
  q = attn_q(x). Each head is [nope (key_length_mla - n_rot) ; rope (n_rot)];
- keys/values are compressed: attn_kv_a_mqa(x) = [c (kv_lora_rank) ; k_pe (n_rot)], c normed by
  attn_kv_a_norm, k_pe one RoPE'd key part shared by all heads. The cache holds only c and k_pe per
  position (kv_lora_rank + n_rot floats per layer), never full K/V;
- attention uses the absorbed form the converter prepares (attn_k_b (n_head, kv_lora_rank, nope),
  attn_v_b (n_head, v_head, kv_lora_rank), split from kv_b_proj): score = (k_b q_nope) . c + q_pe . k_pe,
  out = v_b (softmax . c). The unsplit legacy attn_kv_b layout is not read;
- RoPE is NORM (interleaved pairs, HF rope_interleave) on the rope parts only, with YaRN frequencies
  when `rope.scaling.type` is yarn; softmax scale 1/sqrt(key_length_mla) * mscale^2, mscale =
  1 + 0.1 * mscale_all_dim * ln(factor), mscale_all_dim = `rope.scaling.yarn_log_multiplier` / 0.1
  (the converter writes 0.1 * mscale_all_dim). cos/sin are not rescaled: that assumes HF's mscale ==
  mscale_all_dim, true of every released config;
- MoE layers: router ffn_gate_inp, scores softmax (expert_gating_func 1 / absent, V2) or sigmoid (2, V3),
  top-k chosen on scores + exp_probs_b (when present) but weighted by the scores, renormalized when
  expert_weights_norm, times expert_weights_scale; plus expert_shared_count shared experts (a dense
  SwiGLU of width n_ff_exp * n_shared). Group-limited routing (expert_group_used_count <
  expert_group_count) is V3's (groups ranked by the sum of their 2 best choice scores) and only with
  sigmoid scoring; with softmax (V2's group_limited_greedy) it is refused. MTP layers are not read.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import ROPE_NORM, Backend
from reflex.errors import InvalidRequest, ModelFormatError, UnsupportedArchitecture
from reflex.models._common import (KVCache, _key, _Weights, check_forward_args, head_out, invalid_key,
                                   n_vocab_of)
from reflex.models.qwen3moe import _flag

GATING_SOFTMAX, GATING_SIGMOID = 1, 2


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int             # {arch}.embedding_length
    n_layer: int            # {arch}.block_count
    n_head: int             # {arch}.attention.head_count
    n_ff: int               # {arch}.feed_forward_length (dense layers)
    rms_eps: float          # {arch}.attention.layer_norm_rms_epsilon
    rope_freq_base: float   # {arch}.rope.freq_base
    n_ctx_train: int        # {arch}.context_length
    n_rot: int              # {arch}.rope.dimension_count (qk_rope_head_dim)
    kv_lora_rank: int       # {arch}.attention.kv_lora_rank
    head_k: int             # {arch}.attention.key_length_mla (qk_nope + qk_rope)
    head_v: int             # {arch}.attention.value_length_mla (v_head_dim)
    q_lora_rank: int = 0    # {arch}.attention.q_lora_rank (0: absent, plain attn_q)
    n_dense_lead: int = 0   # {arch}.leading_dense_block_count
    n_expert: int = 0       # {arch}.expert_count
    n_expert_used: int = 0  # {arch}.expert_used_count
    n_expert_shared: int = 0  # {arch}.expert_shared_count
    n_ff_exp: int = 0       # {arch}.expert_feed_forward_length
    expert_weights_scale: float = 1.0  # {arch}.expert_weights_scale
    expert_weights_norm: bool = False  # {arch}.expert_weights_norm (absent: false, as llama.cpp)
    gating_func: int = GATING_SOFTMAX  # {arch}.expert_gating_func
    n_group: int = 1        # {arch}.expert_group_count
    n_group_used: int = 1   # {arch}.expert_group_used_count
    yarn: bool = False      # {arch}.rope.scaling.type == "yarn"
    rope_factor: float = 1.0      # {arch}.rope.scaling.factor
    n_ctx_orig: int = 0           # {arch}.rope.scaling.original_context_length
    yarn_beta_fast: float = 32.0  # {arch}.rope.scaling.yarn_beta_fast
    yarn_beta_slow: float = 1.0   # {arch}.rope.scaling.yarn_beta_slow
    yarn_log_mul: float = 0.0     # {arch}.rope.scaling.yarn_log_multiplier (0.1 * mscale_all_dim)
    arch: str = "deepseek2"

    @property
    def head_nope(self) -> int:
        return self.head_k - self.n_rot

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        for key, attr in (("embedding_length", "n_embd"), ("block_count", "n_layer"),
                          ("attention.head_count", "n_head"), ("context_length", "n_ctx_train"),
                          ("vocab_size", "n_vocab"), ("attention.kv_lora_rank", "kv_lora_rank"),
                          ("attention.value_length_mla", "head_v")):
            if getattr(self, attr) <= 0:
                bad(key, f"must be positive, got {getattr(self, attr)}")
        if not (0.0 < self.rms_eps < 1.0) or not math.isfinite(self.rms_eps):
            bad("attention.layer_norm_rms_epsilon", f"{self.rms_eps}")
        if not (self.rope_freq_base > 0.0) or not math.isfinite(self.rope_freq_base):
            bad("rope.freq_base", f"{self.rope_freq_base}")
        if self.n_rot <= 0 or self.n_rot % 2:
            bad("rope.dimension_count", f"{self.n_rot} (must be positive and even)")
        if self.head_k <= self.n_rot:
            bad("attention.key_length_mla", f"{self.head_k} (must exceed rope.dimension_count {self.n_rot})")
        if self.q_lora_rank < 0:
            bad("attention.q_lora_rank", f"{self.q_lora_rank}")
        if not 0 <= self.n_dense_lead <= self.n_layer:
            bad("leading_dense_block_count", f"{self.n_dense_lead} (block_count {self.n_layer})")
        if self.n_dense_lead > 0 and self.n_ff <= 0:
            bad("feed_forward_length", f"must be positive, got {self.n_ff}")
        if self.n_dense_lead < self.n_layer:  # some layers are sparse
            if self.n_expert <= 0:
                bad("expert_count", f"must be positive, got {self.n_expert}")
            if not 0 < self.n_expert_used <= self.n_expert:
                bad("expert_used_count", f"{self.n_expert_used} (expert_count {self.n_expert})")
            if self.n_ff_exp <= 0:
                bad("expert_feed_forward_length", f"must be positive, got {self.n_ff_exp}")
            if self.n_expert_shared < 0:
                bad("expert_shared_count", f"{self.n_expert_shared}")
            if self.gating_func not in (GATING_SOFTMAX, GATING_SIGMOID):
                bad("expert_gating_func", f"{self.gating_func} (1 softmax or 2 sigmoid)")
            if not math.isfinite(self.expert_weights_scale):
                bad("expert_weights_scale", f"{self.expert_weights_scale}")
            if self.n_group <= 0 or self.n_expert % self.n_group:
                bad("expert_group_count", f"{self.n_group} (must divide expert_count {self.n_expert})")
            if not 0 < self.n_group_used <= self.n_group:
                bad("expert_group_used_count", f"{self.n_group_used} (expert_group_count {self.n_group})")
            if self.n_group_used < self.n_group and self.n_expert_used > self.n_group_used * (self.n_expert // self.n_group):
                bad("expert_used_count", f"{self.n_expert_used} exceeds the experts of {self.n_group_used} groups")
        if self.yarn:
            if not (self.rope_factor >= 1.0) or not math.isfinite(self.rope_factor):
                bad("rope.scaling.factor", f"{self.rope_factor}")
            if self.n_ctx_orig <= 0:
                bad("rope.scaling.original_context_length", f"must be positive, got {self.n_ctx_orig}")

    @classmethod
    def from_gguf(cls, f, arch: str) -> "HParams":
        n_layer = _key(f, arch, "block_count", int)
        n_dense = _key(f, arch, "leading_dense_block_count", int, 0)
        sparse = n_dense < n_layer
        kv_lora = _key(f, arch, "attention.kv_lora_rank", int)
        n_rot = _key(f, arch, "rope.dimension_count", int)
        # the converter's MQA view of MLA: key_length = kv_lora_rank + n_rot, value_length = kv_lora_rank
        for key, want in (("attention.key_length", kv_lora + n_rot), ("attention.value_length", kv_lora)):
            got = _key(f, arch, key, int, want)
            if got != want:
                invalid_key(arch, key, f"{got} (expected {want} for the MLA latent layout)")
        n_group = _key(f, arch, "expert_group_count", int, 1)
        n_group_used = _key(f, arch, "expert_group_used_count", int, n_group)
        if (sparse and n_group_used < n_group
                and _key(f, arch, "expert_gating_func", int, GATING_SOFTMAX) != GATING_SIGMOID):
            # V2's group_limited_greedy ranks groups by their max softmax score: not verified, refused
            raise UnsupportedArchitecture(f"{arch}: group-limited routing with softmax scoring "
                                          f"(expert_group_used_count < expert_group_count) is not implemented")
        scaling = f.get(f"{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "yarn"):
            raise UnsupportedArchitecture(f"{arch}: rope scaling {scaling!r} is not implemented (none, yarn)")
        yarn = scaling == "yarn"
        return cls(
            n_vocab=n_vocab_of(f, arch),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=n_layer,
            n_head=_key(f, arch, "attention.head_count", int),
            n_ff=_key(f, arch, "feed_forward_length", int, 0),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            n_rot=n_rot,
            kv_lora_rank=kv_lora,
            head_k=_key(f, arch, "attention.key_length_mla", int),
            head_v=_key(f, arch, "attention.value_length_mla", int),
            q_lora_rank=_key(f, arch, "attention.q_lora_rank", int, 0),
            n_dense_lead=n_dense,
            n_expert=_key(f, arch, "expert_count", int, 0),
            n_expert_used=_key(f, arch, "expert_used_count", int, 0),
            n_expert_shared=_key(f, arch, "expert_shared_count", int, 0),
            n_ff_exp=_key(f, arch, "expert_feed_forward_length", int, 0),
            expert_weights_scale=_key(f, arch, "expert_weights_scale", float, 1.0),
            expert_weights_norm=_flag(f, f"{arch}.expert_weights_norm", False),
            gating_func=_key(f, arch, "expert_gating_func", int, GATING_SOFTMAX),
            n_group=n_group,
            n_group_used=n_group_used,
            yarn=yarn,
            rope_factor=_key(f, arch, "rope.scaling.factor", float, 1.0) if yarn else 1.0,
            n_ctx_orig=_key(f, arch, "rope.scaling.original_context_length", int, 0) if yarn else 0,
            yarn_beta_fast=_key(f, arch, "rope.scaling.yarn_beta_fast", float, 32.0),
            yarn_beta_slow=_key(f, arch, "rope.scaling.yarn_beta_slow", float, 1.0),
            yarn_log_mul=_key(f, arch, "rope.scaling.yarn_log_multiplier", float, 0.0),
            arch=arch,
        )


def rope_inv_freq(hp: HParams) -> np.ndarray:
    """(n_rot/2,) inverse frequencies: base^(-2i/n_rot), or YaRN's per-dim blend of those
    (extrapolation, high frequencies) and those / factor (interpolation, low frequencies) with a
    linear ramp between the correction dims of beta_fast and beta_slow rotations."""
    d, base = hp.n_rot, hp.rope_freq_base
    extra = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)     # (d/2,)
    if not hp.yarn or hp.rope_factor == 1.0:
        return extra

    def corr_dim(n_rotations):
        return d * math.log(hp.n_ctx_orig / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    lo = max(math.floor(corr_dim(hp.yarn_beta_fast)), 0)
    hi = min(math.ceil(corr_dim(hp.yarn_beta_slow)), d - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    keep = 1.0 - ramp                                                 # 1: extrapolate, 0: interpolate
    return extra / hp.rope_factor * (1.0 - keep) + extra * keep


def attn_scale(hp: HParams) -> float:
    scale = 1.0 / math.sqrt(hp.head_k)
    if hp.yarn and hp.rope_factor > 1.0 and hp.yarn_log_mul:
        mscale = 1.0 + hp.yarn_log_mul * math.log(hp.rope_factor)  # yarn_log_mul = 0.1 * mscale_all_dim
        scale *= mscale * mscale
    return scale


def _rows(f, b: Backend, name: str, shape: tuple, groups, keep):
    """The weight `name` (numpy shape `shape`, 2-D) with only some rows kept: rows are taken as
    `groups` equal groups and `keep` (a slice) picks rows inside each group. Rows are whole quant
    blocks, so the selection is done on the raw bytes (any ggml type) before the backend sees them."""
    t = f.tensors.get(name)
    if t is None:
        raise ModelFormatError(f"missing tensor {name!r}", kind="missing_tensor")
    if tuple(t.shape) != tuple(shape):
        raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}",
                               kind="tensor_shape")
    raw = np.asarray(f.tensor_bytes(name)).view(np.uint8).reshape(groups, shape[0] // groups, -1)
    sel = np.ascontiguousarray(raw[:, keep])                          # (groups, kept, row_bytes)
    n = sel.shape[0] * sel.shape[1]
    return b.prepare_weight(sel.reshape(-1), t.ggml_type, (n, shape[1]))


class MLACache(KVCache):
    """Per layer the compressed latent only: k[i] = c (n_ctx, 1, kv_lora_rank) and v[i] = k_pe
    (n_ctx, 1, n_rot), the RoPE'd shared key part (aliases c / pe)."""

    def __init__(self, backend, n_layer: int, kv_lora_rank: int, n_rot: int, n_ctx: int):
        if n_ctx <= 0:
            raise InvalidRequest(f"n_ctx must be positive, got {n_ctx}")
        self.n_ctx = n_ctx
        self.n = 0
        self.k = [backend.zeros((n_ctx, 1, kv_lora_rank)) for _ in range(n_layer)]
        self.v = [backend.zeros((n_ctx, 1, n_rot)) for _ in range(n_layer)]
        self.pos = np.zeros(n_ctx, dtype=np.int64)
        self.c, self.pe = self.k, self.v


class Attention:
    def __init__(self, f, w: _Weights, hp: HParams, i: int, inv_freq):
        p = f"blk.{i}."
        b = w.b
        H, E, R, P = hp.n_head, hp.n_embd, hp.kv_lora_rank, hp.n_rot
        N, V, K = hp.head_nope, hp.head_v, hp.head_k
        self.hp = hp
        self.inv_freq = inv_freq
        if hp.q_lora_rank:
            Q = hp.q_lora_rank
            self.wq_a = w.get(p + "attn_q_a.weight", (Q, E))                  # (q_lora_rank, n_embd)
            self.q_a_norm = w.get(p + "attn_q_a_norm.weight", (Q,))
            q_name, q_shape = p + "attn_q_b.weight", (H * K, Q)
        else:
            self.wq_a = None
            q_name, q_shape = p + "attn_q.weight", (H * K, E)
        # per head [nope ; rope] rows, split once here so no activation is ever sliced
        self.wq_nope = _rows(f, b, q_name, q_shape, H, slice(0, N))          # (n_head*nope, in)
        self.wq_pe = _rows(f, b, q_name, q_shape, H, slice(N, K))            # (n_head*n_rot, in)
        self.wkv_c = _rows(f, b, p + "attn_kv_a_mqa.weight", (R + P, E), 1, slice(0, R))  # (R, n_embd)
        self.wkv_pe = _rows(f, b, p + "attn_kv_a_mqa.weight", (R + P, E), 1, slice(R, R + P))
        self.kv_a_norm = w.get(p + "attn_kv_a_norm.weight", (R,))
        self.wk_b = w.get(p + "attn_k_b.weight", (H, R, N))                 # (n_head, kv_lora_rank, nope)
        self.wv_b = w.get(p + "attn_v_b.weight", (H, V, R))                 # (n_head, v_head, kv_lora_rank)
        self.wo = w.get(p + "attn_output.weight", (E, H * V))               # (n_embd, n_head*v_head)
        self.scale = attn_scale(hp)

    def __call__(self, b: Backend, x, pos, c_cache, pe_cache, n_past: int, mask=None):
        hp = self.hp
        T = x.shape[0]
        H = hp.n_head
        src = x
        if self.wq_a is not None:
            src = b.rms_norm(b.matmul(x, self.wq_a), self.q_a_norm, hp.rms_eps)       # (T, q_lora_rank)
        q_nope = b.matmul(src, self.wq_nope).reshape(T, H, hp.head_nope)            # (T, n_head, nope)
        q_pe = b.matmul(src, self.wq_pe).reshape(T, H, hp.n_rot)                    # (T, n_head, n_rot)
        q_pe = b.rope_freqs(q_pe, pos, self.inv_freq, ROPE_NORM)
        c = b.rms_norm(b.matmul(x, self.wkv_c), self.kv_a_norm, hp.rms_eps)          # (T, kv_lora_rank)
        k_pe = b.matmul(x, self.wkv_pe).reshape(T, 1, hp.n_rot)                     # (T, 1, n_rot)
        k_pe = b.rope_freqs(k_pe, pos, self.inv_freq, ROPE_NORM)
        b.kv_write(c_cache, c.reshape(T, 1, hp.kv_lora_rank), n_past)
        b.kv_write(pe_cache, k_pe, n_past)
        heads = np.broadcast_to(np.arange(H), (T, H))                               # (T, n_head) host ids
        q_lat = b.expert_matmul(q_nope, self.wk_b, heads)                           # (T, n_head, kv_lora_rank)
        o = b.mla_attention(q_lat, q_pe, c_cache, pe_cache, n_past, self.scale, mask=mask)
        o = b.expert_matmul(o, self.wv_b, heads)                                    # (T, n_head, v_head)
        return b.matmul(o.reshape(T, H * hp.head_v), self.wo)                       # (T, n_embd)


class DenseFFN:
    """SwiGLU down(silu(gate(x)) * up(x)) on ffn_{gate,up,down}{suffix} of width n_ff."""

    def __init__(self, w: _Weights, p: str, suffix: str, n_embd: int, n_ff: int):
        self.w_gate = w.get(p + f"ffn_gate{suffix}.weight", (n_ff, n_embd))  # (n_ff, n_embd)
        self.w_up = w.get(p + f"ffn_up{suffix}.weight", (n_ff, n_embd))      # (n_ff, n_embd)
        self.w_down = w.get(p + f"ffn_down{suffix}.weight", (n_embd, n_ff))  # (n_embd, n_ff)

    def __call__(self, b: Backend, x):
        return b.matmul(b.swiglu(b.matmul(x, self.w_gate), b.matmul(x, self.w_up)), self.w_down)


class MoEFFN:
    """Routed experts (top-k of n_expert) plus the shared experts, summed."""

    def __init__(self, f, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E, F, X = hp.n_embd, hp.n_ff_exp, hp.n_expert
        self.hp = hp
        self.w_router = w.get(p + "ffn_gate_inp.weight", (X, E))        # (n_expert, n_embd)
        self.w_gate = w.get(p + "ffn_gate_exps.weight", (X, F, E))      # (n_expert, n_ff_exp, n_embd)
        self.w_up = w.get(p + "ffn_up_exps.weight", (X, F, E))          # (n_expert, n_ff_exp, n_embd)
        self.w_down = w.get(p + "ffn_down_exps.weight", (X, E, F))      # (n_expert, n_embd, n_ff_exp)
        self.bias = None                                                # (n_expert,) host, selection only
        name = p + "exp_probs_b.bias"
        if w.has(name):
            from reflex.quants import dequantize

            t = f.tensors[name]
            if tuple(t.shape) != (X,):
                raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {(X,)}",
                                       kind="tensor_shape")
            self.bias = dequantize(np.asarray(f.tensor_bytes(name)).view(np.uint8), t.ggml_type, (X,))
        self.shared = (DenseFFN(w, p, "_shexp", E, F * hp.n_expert_shared)
                       if hp.n_expert_shared > 0 else None)

    def route(self, b: Backend, x):
        """(expert ids (T, K), weights (T, K)) on the host, float32."""
        if getattr(b, "capturing", False):
            raise InvalidRequest("deepseek2 routes on the host: CUDA-graph decode is not supported "
                                 "(set REFLEX_CUDA_GRAPH=0)")
        hp = self.hp
        logits = b.to_numpy(b.matmul(x, self.w_router)).astype(np.float32)    # (T, n_expert)
        if hp.gating_func == GATING_SIGMOID:
            p = 1.0 / (1.0 + np.exp(-logits))
        else:
            p = np.exp(logits - logits.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
        choice = p if self.bias is None else p + self.bias[None, :]           # bias picks, never weighs
        G, Gu = hp.n_group, hp.n_group_used
        if Gu < G:
            # V3 group-limited routing: rank groups by the sum of their 2 best choice scores, keep
            # the best n_group_used groups, choose experts only inside them
            T = choice.shape[0]
            grp = choice.reshape(T, G, hp.n_expert // G)                           # (T, G, experts/G)
            top2 = -np.sort(-grp, axis=-1)[:, :, :2].sum(axis=-1)                 # (T, G)
            keep = np.argsort(-top2, axis=-1, kind="stable")[:, :Gu]              # (T, Gu)
            allowed = np.zeros((T, G), dtype=bool)
            np.put_along_axis(allowed, keep, True, axis=-1)
            choice = np.where(np.repeat(allowed, hp.n_expert // G, axis=-1), choice, -np.inf)
        ids = np.argsort(-choice, axis=-1, kind="stable")[:, :hp.n_expert_used]  # (T, K)
        wt = np.take_along_axis(p, ids, axis=-1)                               # (T, K)
        if hp.expert_weights_norm:
            wt = wt / wt.sum(axis=-1, keepdims=True)
        return ids, (wt * np.float32(hp.expert_weights_scale)).astype(np.float32)

    def __call__(self, b: Backend, x):
        ids, wt = self.route(b, x)
        g = b.expert_matmul(x, self.w_gate, ids)                        # (T, K, n_ff_exp)
        u = b.expert_matmul(x, self.w_up, ids)                          # (T, K, n_ff_exp)
        y = b.expert_matmul(b.swiglu(g, u), self.w_down, ids, wt)       # (T, n_embd)
        return y if self.shared is None else b.add(y, self.shared(b, x))


class Block:
    def __init__(self, f, w: _Weights, hp: HParams, i: int, inv_freq):
        p = f"blk.{i}."
        self.hp = hp
        self.i = i
        self.attn_norm = w.get(p + "attn_norm.weight", (hp.n_embd,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (hp.n_embd,))
        self.attn = Attention(f, w, hp, i, inv_freq)
        self.ffn = (DenseFFN(w, p, "", hp.n_embd, hp.n_ff) if i < hp.n_dense_lead
                    else MoEFFN(f, w, hp, i))

    def __call__(self, b, x, pos, cache: MLACache, n_past: int, mask=None):
        h = b.rms_norm(x, self.attn_norm, self.hp.rms_eps)                          # (T, n_embd)
        x = b.add(x, self.attn(b, h, pos, cache.c[self.i], cache.pe[self.i], n_past, mask))
        h = b.rms_norm(x, self.ffn_norm, self.hp.rms_eps)
        return b.add(x, self.ffn(b, h))                                              # (T, n_embd)


class Model:
    graph_capturable = False  # expert routing reads the router's output on the host each step

    def __init__(self, f, backend, hp: HParams):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _Weights(f, backend)
        self.inv_freq = rope_inv_freq(hp)                                    # (n_rot/2,) host
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, hp.n_embd))  # (n_vocab, n_embd)
        self.blocks = [Block(f, w, hp, i, self.inv_freq) for i in range(hp.n_layer)]
        self.output_norm = w.get("output_norm.weight", (hp.n_embd,))
        if w.has("output.weight"):
            self.output = w.get("output.weight", (hp.n_vocab, hp.n_embd))    # (n_vocab, n_embd)
        else:
            self.output = self.tok_embd  # tied embeddings

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> MLACache:
        hp = self.hp
        return MLACache(self.backend, hp.n_layer, hp.kv_lora_rank, hp.n_rot, n_ctx or hp.n_ctx_train)

    def forward(self, token_ids, cache: MLACache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Same contract as llama.Model.forward."""
        b = self.backend
        ids, pos, n_past, mask = check_forward_args(token_ids, cache, self.hp.n_vocab, positions,
                                                    attn_mask, output)
        x = b.embed(self.tok_embd, ids)                                     # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, pos, cache, n_past, mask)
        cache.n = n_past + ids.shape[0]
        return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)


def load(f, backend: Backend, arch: str = "deepseek2") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
