"""The `gemma4` architecture (text decoder): gemma3's sandwich-normed block with Gemma 4's changes.

What stays as in gemma3.py: sqrt(n_embd)-scaled tied embedding, attn/ffn pre- and post-norms,
per-head q/k RMSNorm before NEOX RoPE, GeGLU (tanh GELU). What differs (llama.cpp's converter,
conversion/gemma.py Gemma4Model; graph src/models/gemma4.cpp; transformers Gemma4TextModel):

- layer kinds come from `gemma4.attention.sliding_window_pattern` (bool per layer, true = local),
  not from a fixed period; local and global layers have their own head_dim (`key_length_swa` /
  `key_length`), RoPE width (`rope.dimension_count_swa` / `rope.dimension_count`), RoPE base
  (`rope.freq_base_swa` / `rope.freq_base`) and kv-head count (`attention.head_count_kv` may be a
  per-layer array, as may `feed_forward_length`: the double-wide MLP of the KV-shared layers);
- attention scale 1.0 (the q/k norms replace 1/sqrt(head_dim)); V gets a weightless RMSNorm;
- global layers use "proportional" partial RoPE, stored by the converter as `rope_freqs.weight`
  (head_dim/2 factors: 1 for the rotated leading pairs, 1e30 for the rest, so NEOX pair (i, i+d/2)
  turns only for i < k). Reflex has no freq-factor RoPE op: at load time the q/k rows of those layers
  are permuted so dims [0, k) and [d/2, d/2 + k) come first, then NEOX RoPE over n_rot 2k with base
  base^(2k/d) turns exactly those pairs at exactly base^(-2i/d) (q.k is invariant under the same
  permutation of both; V is computed from the unpermuted weight);
- `attention_k_eq_v`: a global layer without `attn_v` uses its K projection (before k-norm and
  RoPE) as V;
- the last `attention.shared_kv_layers` layers have no K/V of their own: each reads the KV cache of
  the last earlier layer of its kind (transformers' kv_sharing "store"/"reuse");
- per-layer token embeddings (`embedding_length_per_layer_input` > 0, Gemma 4 E2B/E4B): per layer i
  pe_i = (rms_norm(x0 @ per_layer_model_proj_i / sqrt(n_embd)) + per_layer_token_embd[tok, i] *
  sqrt(n_pl)) / sqrt(2), x0 the scaled input embedding; after the FFN residual
  x += rms_norm(proj(gelu_tanh(inp_gate(x)) * pe_i), post_norm);
- every layer's output is multiplied by its scalar `blk.N.layer_output_scale`;
- the logits are soft-capped, cap * tanh(logits / cap), with `final_logit_softcapping` (`lm_head`).
Norm weights are used as stored (Gemma 4's RMSNorm multiplies by w, converter norm_shift 0).
- MoE layers (26B-A4B, `ffn_gate_inp` present): the dense MLP's output is post-normed
  (`post_ffw_norm_1`) and the routed experts' (class MoE) added before `post_ffw_norm`.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import ROPE_NEOX, Backend
from reflex.backends.numpy_moe import route_ref
from reflex.errors import ModelFormatError
from reflex.models._common import (KVCache, _key, _Weights, check_decoder_keys, check_forward_args,
                                   head_out, invalid_key, n_vocab_of, window_mask)
from reflex.quants import dequantize, get as quant_type

ROPE_FREQ_BASE_SWA = 10000.0  # local layers' RoPE base when rope.freq_base_swa is absent
UNROTATED = 1e20              # rope_freqs factors above this leave their pair unrotated


def _per_layer(f, arch: str, key: str, n_layer: int, default=None) -> list[int]:
    """A key that is either one integer for every layer or an array of n_layer integers."""
    full = f"{arch}.{key}"
    v = f.get(full, None)
    if v is None:
        if default is None:
            raise ModelFormatError(f"missing hyperparameter {full!r}", kind="missing_key")
        return [default] * n_layer
    if np.ndim(v) == 0:
        return [_key(f, arch, key, int)] * n_layer
    vals = list(v)
    if len(vals) != n_layer or any(isinstance(x, (bool, np.bool_)) for x in vals):
        invalid_key(arch, key, f"{vals!r} (expected {n_layer} integers)")
    return [int(x) for x in vals]


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int              # gemma4.embedding_length
    n_layer: int             # gemma4.block_count
    n_head: int              # gemma4.attention.head_count
    n_head_kv_arr: list      # gemma4.attention.head_count_kv (scalar or per layer)
    n_ff_arr: list           # gemma4.feed_forward_length (scalar or per layer)
    rms_eps: float           # gemma4.attention.layer_norm_rms_epsilon
    rope_freq_base: float    # gemma4.rope.freq_base (global layers)
    n_ctx_train: int         # gemma4.context_length
    head_dim: int            # gemma4.attention.key_length (global layers)
    head_dim_swa: int        # gemma4.attention.key_length_swa (local layers)
    swa_pattern: list        # gemma4.attention.sliding_window_pattern (True = local)
    n_swa: int = 0           # gemma4.attention.sliding_window
    n_rot: int = 0           # gemma4.rope.dimension_count (default head_dim)
    n_rot_swa: int = 0       # gemma4.rope.dimension_count_swa (default head_dim_swa)
    rope_freq_base_swa: float = ROPE_FREQ_BASE_SWA  # gemma4.rope.freq_base_swa
    n_kv_shared: int = 0     # gemma4.attention.shared_kv_layers
    n_embd_per_layer: int = 0  # gemma4.embedding_length_per_layer_input (0 = no per-layer embeddings)
    softcap: float = 0.0     # gemma4.final_logit_softcapping (0 = none)
    n_expert: int = 0        # gemma4.expert_count (0 = dense)
    n_expert_used: int = 0   # gemma4.expert_used_count
    n_ff_exp: int = 0        # gemma4.expert_feed_forward_length
    arch: str = "gemma4"

    # check_decoder_keys reads scalar n_head_kv / n_ff: the smallest of each stands in for the array
    @property
    def n_head_kv(self) -> int:
        return min(self.n_head_kv_arr)

    @property
    def n_ff(self) -> int:
        return min(self.n_ff_arr)

    def is_swa(self, i: int) -> bool:
        return bool(self.swa_pattern[i])

    def layer_head_dim(self, i: int) -> int:
        return self.head_dim_swa if self.is_swa(i) else self.head_dim

    def kv_source(self, i: int) -> int:
        """The layer whose KV cache layer i attends over: itself, or for the last n_kv_shared layers
        the last layer of the same kind before them."""
        first_shared = self.n_layer - self.n_kv_shared
        if i < first_shared:
            return i
        for j in range(first_shared - 1, -1, -1):
            if self.is_swa(j) == self.is_swa(i):
                return j
        return -1  # rejected in __post_init__

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        if len(self.swa_pattern) != self.n_layer:
            bad("attention.sliding_window_pattern", f"{len(self.swa_pattern)} entries for {self.n_layer} layers")
        check_decoder_keys(self)
        for i, n_kv in enumerate(self.n_head_kv_arr):
            if n_kv <= 0 or self.n_head % n_kv:
                bad("attention.head_count_kv", f"layer {i}: {n_kv} does not divide head_count {self.n_head}")
        for key, d in (("attention.key_length", self.head_dim), ("attention.key_length_swa", self.head_dim_swa)):
            if d <= 0 or d % 2:
                bad(key, f"{d} (must be positive and even)")
        if self.n_rot == 0:
            self.n_rot = self.head_dim
        if self.n_rot_swa == 0:
            self.n_rot_swa = self.head_dim_swa
        for key, r, d in (("rope.dimension_count", self.n_rot, self.head_dim),
                          ("rope.dimension_count_swa", self.n_rot_swa, self.head_dim_swa)):
            if r < 0 or r > d or r % 2:
                bad(key, f"{r} (head_dim {d})")
        for key, v in (("rope.freq_base", self.rope_freq_base), ("rope.freq_base_swa", self.rope_freq_base_swa)):
            if not (v > 0.0) or not math.isfinite(v):
                bad(key, f"{v}")
        if self.n_swa < 0 or (self.n_swa == 0 and any(self.swa_pattern)):
            bad("attention.sliding_window", f"{self.n_swa} with sliding-window layers present")
        if not (0 <= self.n_kv_shared < self.n_layer):
            bad("attention.shared_kv_layers", f"{self.n_kv_shared} (block_count {self.n_layer})")
        for i in range(self.n_layer):
            if self.kv_source(i) < 0:
                bad("attention.shared_kv_layers",
                    f"layer {i} shares the KV of an earlier layer of its kind, but there is none")
            elif self.n_head_kv_arr[self.kv_source(i)] != self.n_head_kv_arr[i]:
                bad("attention.head_count_kv", f"layer {i} differs from the layer whose KV it shares")
        if self.n_embd_per_layer < 0:
            bad("embedding_length_per_layer_input", f"{self.n_embd_per_layer}")
        if self.n_expert < 0 or not (0 <= self.n_expert_used <= self.n_expert) or self.n_ff_exp < 0:
            bad("expert_used_count", f"{self.n_expert_used} of {self.n_expert} experts, n_ff_exp {self.n_ff_exp}")
        if self.softcap < 0.0 or not math.isfinite(self.softcap):
            bad("final_logit_softcapping", f"{self.softcap}")

    @classmethod
    def from_gguf(cls, f, arch: str = "gemma4") -> "HParams":
        n_layer = _key(f, arch, "block_count", int)
        head_dim = _key(f, arch, "attention.key_length", int)
        head_dim_swa = _key(f, arch, "attention.key_length_swa", int, head_dim)
        for k, d in (("value_length", head_dim), ("value_length_swa", head_dim_swa)):
            v_len = _key(f, arch, f"attention.{k}", int, d)
            if v_len != d:
                raise ModelFormatError(f"{arch}.attention.{k} {v_len} != key length {d}", kind="invalid_key")
        pattern = f.get(f"{arch}.attention.sliding_window_pattern", None)
        if pattern is None:
            raise ModelFormatError(f"missing hyperparameter '{arch}.attention.sliding_window_pattern'",
                                   kind="missing_key")
        if np.ndim(pattern) == 0:
            invalid_key(arch, "attention.sliding_window_pattern", f"{pattern!r} (expected a bool per layer)")
        n_head = _key(f, arch, "attention.head_count", int)
        return cls(
            n_vocab=n_vocab_of(f, arch),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv_arr=_per_layer(f, arch, "attention.head_count_kv", n_layer, n_head),
            n_ff_arr=_per_layer(f, arch, "feed_forward_length", n_layer),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            rope_freq_base=_key(f, arch, "rope.freq_base", float, 10000.0),
            n_ctx_train=_key(f, arch, "context_length", int),
            head_dim=head_dim,
            head_dim_swa=head_dim_swa,
            swa_pattern=[bool(x) for x in pattern],
            n_swa=_key(f, arch, "attention.sliding_window", int, 0),
            n_rot=_key(f, arch, "rope.dimension_count", int, 0),
            n_rot_swa=_key(f, arch, "rope.dimension_count_swa", int, 0),
            rope_freq_base_swa=_key(f, arch, "rope.freq_base_swa", float, ROPE_FREQ_BASE_SWA),
            n_kv_shared=_key(f, arch, "attention.shared_kv_layers", int, 0),
            n_embd_per_layer=_key(f, arch, "embedding_length_per_layer_input", int, 0),
            softcap=_key(f, arch, "final_logit_softcapping", float, 0.0),
            n_expert=_key(f, arch, "expert_count", int, 0),
            n_expert_used=_key(f, arch, "expert_used_count", int, 0),
            n_ff_exp=_key(f, arch, "expert_feed_forward_length", int, 0),
            arch=arch,
        )


def _rope_plan(f, hp: HParams):
    """Global layers' RoPE as (row permutation of a head or None, n_rot, freq_base) from
    `rope_freqs.weight` (see the module docstring); without the tensor, plain NEOX over n_rot."""
    if "rope_freqs.weight" not in f.tensors:
        return None, hp.n_rot, hp.rope_freq_base
    t = f.tensors["rope_freqs.weight"]
    h = hp.n_rot // 2
    if tuple(t.shape) != (h,):
        raise ModelFormatError(f"tensor 'rope_freqs.weight' has shape {tuple(t.shape)}, expected ({h},)",
                               kind="tensor_shape")
    ff = dequantize(f.tensor_bytes("rope_freqs.weight"), t.ggml_type, t.shape).reshape(-1)
    k = int(np.sum(ff == 1.0))
    if not (np.all(ff[:k] == 1.0) and np.all(ff[k:] > UNROTATED)):
        raise ModelFormatError("rope_freqs.weight: only leading factors 1 then unrotated (>1e20) pairs "
                               "(Gemma 4's proportional RoPE) are supported", kind="unsupported_tensor")
    if k == h:
        return None, hp.n_rot, hp.rope_freq_base
    d = hp.head_dim
    perm = np.concatenate([np.arange(k), h + np.arange(k), np.arange(k, h), np.arange(h + k, d)])
    # base^(2k/n_rot): NEOX over n_rot 2k turns pair i at base'^(-2i/2k) = base^(-2i/n_rot)
    return perm, 2 * k, hp.rope_freq_base ** (2 * k / hp.n_rot)


class _W(_Weights):
    """_Weights plus row-permuted loads (rows are whole quant blocks, so any ggml type permutes)."""

    def info(self, name, shape):
        """The tensor's entry, after the usual missing / shape checks of get()."""
        t = self.f.tensors.get(name)
        if t is None or tuple(t.shape) != tuple(shape):
            self.get(name, shape)  # raises the categorized error
        return t

    def rows(self, name, shape, rows):
        t = self.info(name, shape)
        raw = self.f.tensor_bytes(name).reshape(shape[0], -1)[rows]
        return self.b.prepare_weight(np.ascontiguousarray(raw).reshape(-1), t.ggml_type,
                                     (len(rows),) + tuple(shape[1:]))

    def vec(self, name, shape, perm=None):
        """A small vector (norm weight) as float32 numpy, permuted, then prepared as F32."""
        t = self.info(name, shape)
        v = dequantize(self.f.tensor_bytes(name), t.ggml_type, t.shape).reshape(shape).astype(np.float32)
        if perm is not None:
            v = v[perm]
        return self.b.prepare_weight(np.ascontiguousarray(v).view(np.uint8).reshape(-1), 0, tuple(shape))

    def vec_np(self, name, shape):
        """A small tensor as a host float32 array (routing-side scales)."""
        t = self.info(name, shape)
        return dequantize(self.f.tensor_bytes(name), t.ggml_type, t.shape).reshape(shape).astype(np.float32)

    def scalar(self, name) -> float:
        t = self.info(name, (1,))
        return float(dequantize(self.f.tensor_bytes(name), t.ggml_type, t.shape).reshape(-1)[0])


class Attention:
    def __init__(self, w: _W, hp: HParams, i: int, rope_plan):
        p = f"blk.{i}."
        E = hp.n_embd
        self.hp = hp
        self.swa = hp.is_swa(i)
        self.src = hp.kv_source(i)
        d = self.d = hp.layer_head_dim(i)
        self.n_kv = hp.n_head_kv_arr[i]
        perm, self.n_rot, self.freq_base = (None, hp.n_rot_swa, hp.rope_freq_base_swa) if self.swa else rope_plan
        q_rows = None if perm is None else np.concatenate([h * d + perm for h in range(hp.n_head)])
        k_rows = None if perm is None else np.concatenate([h * d + perm for h in range(self.n_kv)])
        qs, ks = (hp.n_head * d, E), (self.n_kv * d, E)
        self.wq = w.get(p + "attn_q.weight", qs) if perm is None else w.rows(p + "attn_q.weight", qs, q_rows)
        self.q_norm = w.vec(p + "attn_q_norm.weight", (d,), perm)   # (head_dim,)
        self.wo = w.get(p + "attn_output.weight", (E, hp.n_head * d))  # (n_embd, n_head*head_dim)
        self.own_kv = self.src == i
        if self.own_kv:
            self.wk = w.get(p + "attn_k.weight", ks) if perm is None else w.rows(p + "attn_k.weight", ks, k_rows)
            self.k_norm = w.vec(p + "attn_k_norm.weight", (d,), perm)
            # attention_k_eq_v: no attn_v -> V is the (unpermuted) K projection
            self.wv = w.get(p + ("attn_v.weight" if w.has(p + "attn_v.weight") else "attn_k.weight"), ks)

    def __call__(self, b: Backend, x, pos, cache: KVCache, n_past: int, mask=None):
        hp, d = self.hp, self.d
        T = x.shape[0]
        q = b.matmul(x, self.wq).reshape(T, hp.n_head, d)               # (T, n_head, head_dim)
        q = b.rope(b.rms_norm(q, self.q_norm, hp.rms_eps), pos, self.n_rot, self.freq_base, ROPE_NEOX)
        kc, vc = cache.k[self.src], cache.v[self.src]
        if self.own_kv:
            k = b.matmul(x, self.wk).reshape(T, self.n_kv, d)           # (T, n_head_kv, head_dim)
            v = b.matmul(x, self.wv).reshape(T, self.n_kv, d)           # (T, n_head_kv, head_dim)
            k = b.rope(b.rms_norm(k, self.k_norm, hp.rms_eps), pos, self.n_rot, self.freq_base, ROPE_NEOX)
            v = b.rms_norm(v, None, hp.rms_eps)
            b.kv_write(kc, k, n_past)
            b.kv_write(vc, v, n_past)
        window = 0
        if self.swa:
            m = window_mask(cache, pos, n_past, hp.n_swa, mask)
            if m is None:
                window = hp.n_swa  # slots == positions: the backend's own window test
            mask = m
        o = b.attention(q, kc, vc, n_past, 1.0, window=window, mask=mask)  # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * d), self.wo)            # (T, n_embd)


class FFN:
    """GeGLU: down(gelu_tanh(gate(x)) * up(x)), n_ff per layer."""

    def __init__(self, w: _W, hp: HParams, i: int):
        p, F, E = f"blk.{i}.", hp.n_ff_arr[i], hp.n_embd
        self.w_gate = w.get(p + "ffn_gate.weight", (F, E))  # (n_ff, n_embd)
        self.w_up = w.get(p + "ffn_up.weight", (F, E))      # (n_ff, n_embd)
        self.w_down = w.get(p + "ffn_down.weight", (E, F))  # (n_embd, n_ff)

    def __call__(self, b: Backend, x):
        h = b.mul(b.gelu_tanh(b.matmul(x, self.w_gate)), b.matmul(x, self.w_up))  # (T, n_ff)
        return b.matmul(h, self.w_down)                                           # (T, n_embd)


class MoE:
    """Gemma 4's routed experts (26B-A4B), added to the dense MLP's output in every MoE layer.

    Router on the residual stream x (not the pre-normed input): logits = ffn_gate_inp @
    (rms_norm(x) * ffn_gate_inp.scale / sqrt(n_embd)); float32 softmax over all experts, top-k,
    renormalized to sum 1, times the chosen experts' `ffn_down_exps.scale` (transformers'
    per_expert_scale). Experts: down_e(gelu_tanh(gate_e(h)) * up_e(h)) on h = rms_norm(x, pre_ffw_norm_2);
    a fused `ffn_gate_up_exps` (n_expert, 2 n_ff_exp, n_embd), gate rows first, is split at load."""

    def __init__(self, w: _W, hp: HParams, i: int):
        p = f"blk.{i}."
        E, F, X = hp.n_embd, hp.n_ff_exp, hp.n_expert
        self.hp = hp
        self.w_router = w.get(p + "ffn_gate_inp.weight", (X, E))        # (n_expert, n_embd)
        self.router_scale = w.get(p + "ffn_gate_inp.scale", (E,))       # (n_embd,)
        self.expert_scale = (w.vec_np(p + "ffn_down_exps.scale", (X,)) if w.has(p + "ffn_down_exps.scale")
                             else np.ones(X, np.float32))                 # (n_expert,) host
        if w.has(p + "ffn_gate_up_exps.weight"):
            name = p + "ffn_gate_up_exps.weight"
            t = w.info(name, (X, 2 * F, E))
            raw = w.f.tensor_bytes(name).reshape(X, 2 * F, -1)           # rows are whole quant blocks
            self.w_gate = w.b.prepare_weight(np.ascontiguousarray(raw[:, :F]).reshape(-1), t.ggml_type, (X, F, E))
            self.w_up = w.b.prepare_weight(np.ascontiguousarray(raw[:, F:]).reshape(-1), t.ggml_type, (X, F, E))
        else:
            self.w_gate = w.get(p + "ffn_gate_exps.weight", (X, F, E))  # (n_expert, n_ff_exp, n_embd)
            self.w_up = w.get(p + "ffn_up_exps.weight", (X, F, E))      # (n_expert, n_ff_exp, n_embd)
        self.w_down = w.get(p + "ffn_down_exps.weight", (X, E, F))      # (n_expert, n_embd, n_ff_exp)
        self.pre_norm = w.get(p + "pre_ffw_norm_2.weight", (E,))
        self.post_norm = w.get(p + "post_ffw_norm_2.weight", (E,))

    def route(self, b: Backend, x):
        """(expert ids (T, K), weights (T, K)) on the host."""
        hp = self.hp
        r = b.mul(b.rms_norm(x, self.router_scale, hp.rms_eps), np.float32(1.0 / math.sqrt(hp.n_embd)))
        logits = b.to_numpy(b.matmul(r, self.w_router)).astype(np.float32)  # (T, n_expert)
        # qwen3moe's softmax top-k with renormalized weights, then the per-expert scale
        ids, wt = route_ref(logits, hp.n_expert_used, True)                   # (T, K), best first
        return ids, (wt * self.expert_scale[ids]).astype(np.float32)

    def __call__(self, b: Backend, x):
        ids, wt = self.route(b, x)
        h = b.rms_norm(x, self.pre_norm, self.hp.rms_eps)                   # (T, n_embd)
        g = b.expert_matmul(h, self.w_gate, ids)                           # (T, K, n_ff_exp)
        u = b.expert_matmul(h, self.w_up, ids)                             # (T, K, n_ff_exp)
        y = b.expert_matmul(b.mul(b.gelu_tanh(g), u), self.w_down, ids, wt)  # (T, n_embd)
        return b.rms_norm(y, self.post_norm, self.hp.rms_eps)


class Block:
    def __init__(self, w: _W, hp: HParams, i: int, rope_plan):
        p, E = f"blk.{i}.", hp.n_embd
        self.hp = hp
        self.moe = None
        if w.has(p + "ffn_gate_inp.weight"):
            if not (hp.n_expert and hp.n_expert_used and hp.n_ff_exp):
                raise ModelFormatError(f"gemma4: layer {i} has a MoE router but expert_count / "
                                       "expert_used_count / expert_feed_forward_length are not set",
                                       kind="missing_key")
            self.moe = MoE(w, hp, i)
            self.post_ffn_norm_1 = w.get(p + "post_ffw_norm_1.weight", (E,))
        self.attn_norm = w.get(p + "attn_norm.weight", (E,))
        self.post_attn_norm = w.get(p + "post_attention_norm.weight", (E,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (E,))
        self.post_ffn_norm = w.get(p + "post_ffw_norm.weight", (E,))
        self.attn = Attention(w, hp, i, rope_plan)
        self.ffn = FFN(w, hp, i)
        n_pl = hp.n_embd_per_layer
        if n_pl:
            self.pl_gate = w.get(p + "inp_gate.weight", (n_pl, E))   # (n_pl, n_embd)
            self.pl_proj = w.get(p + "proj.weight", (E, n_pl))       # (n_embd, n_pl)
            self.pl_post_norm = w.get(p + "post_norm.weight", (E,))
        self.out_scale = w.scalar(p + "layer_output_scale.weight") if w.has(p + "layer_output_scale.weight") else 1.0

    def __call__(self, b: Backend, x, pos, cache: KVCache, n_past: int, mask=None, pe=None):
        eps = self.hp.rms_eps
        h = self.attn(b, b.rms_norm(x, self.attn_norm, eps), pos, cache, n_past, mask)
        x = b.add(x, b.rms_norm(h, self.post_attn_norm, eps))
        h = self.ffn(b, b.rms_norm(x, self.ffn_norm, eps))
        if self.moe is not None:  # dense MLP as the shared expert, plus the routed experts
            h = b.add(b.rms_norm(h, self.post_ffn_norm_1, eps), self.moe(b, x))
        x = b.add(x, b.rms_norm(h, self.post_ffn_norm, eps))                       # (T, n_embd)
        if pe is not None:
            g = b.mul(b.gelu_tanh(b.matmul(x, self.pl_gate)), pe)                   # (T, n_pl)
            x = b.add(x, b.rms_norm(b.matmul(g, self.pl_proj), self.pl_post_norm, eps))
        if self.out_scale != 1.0:
            x = b.mul(x, np.float32(self.out_scale))
        return x


class Cache(KVCache):
    """KVCache with per-layer shapes: local and global layers differ in head_dim and kv heads, and
    KV-shared layers have no buffers of their own (None: they read their source layer's)."""

    def __init__(self, backend, hp: HParams, n_ctx: int):
        super().__init__(backend, 0, 1, 1, n_ctx)
        for i in range(hp.n_layer):
            own = hp.kv_source(i) == i
            shape = (n_ctx, hp.n_head_kv_arr[i], hp.layer_head_dim(i))  # (n_ctx, n_head_kv, head_dim)
            self.k.append(backend.zeros(shape) if own else None)
            self.v.append(backend.zeros(shape) if own else None)


class Model:
    def __init__(self, f, backend: Backend, hp: HParams):
        self.backend = backend
        self.hp = hp
        self.arch = hp.arch
        w = _W(f, backend)
        E, V = hp.n_embd, hp.n_vocab
        self.tok_embd = w.get("token_embd.weight", (V, E))  # (n_vocab, n_embd)
        plan = _rope_plan(f, hp)
        self.blocks = [Block(w, hp, i, plan) for i in range(hp.n_layer)]
        self.output_norm = w.get("output_norm.weight", (E,))
        self.output = w.get("output.weight", (V, E)) if w.has("output.weight") else self.tok_embd
        self.embd_scale = np.float32(math.sqrt(E))
        n_pl, L = hp.n_embd_per_layer, hp.n_layer
        # a captured CUDA decode step reads the token id on the device for token_embd; the per-layer
        # rows tok * n_layer + i are computed on the host, so a PLE model decodes eagerly
        # (and its MoE layers route on the host; qwen3moe's device routing is not used here)
        self.graph_capturable = not n_pl and not any(blk.moe is not None for blk in self.blocks)
        if n_pl:
            # per_layer_token_embd (n_vocab, n_layer * n_pl) read as (n_vocab * n_layer, n_pl) rows:
            # row tok * n_layer + i is layer i's slice of token tok (whole quant blocks when n_pl is a
            # multiple of the block size), so one embed() per layer gathers it on any backend
            name = "per_layer_token_embd.weight"
            t = w.info(name, (V, L * n_pl))
            if n_pl % quant_type(t.ggml_type).block_size:
                raise ModelFormatError(f"{name}: per-layer width {n_pl} not a multiple of the "
                                       f"{quant_type(t.ggml_type).name} block size", kind="unsupported_tensor")
            self.pl_embd = backend.prepare_weight(f.tensor_bytes(name), t.ggml_type, (V * L, n_pl))
            mp = "per_layer_model_proj.weight"                     # (n_layer * n_pl, n_embd)
            self.pl_model_proj = [w.rows(mp, (L * n_pl, E), np.arange(i * n_pl, (i + 1) * n_pl))
                                  for i in range(L)]               # each (n_pl, n_embd)
            self.pl_proj_norm = w.get("per_layer_proj_norm.weight", (n_pl,))

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> Cache:
        return Cache(self.backend, self.hp, n_ctx or self.hp.n_ctx_train)

    def lm_head(self, hidden):
        """Final-normed hidden rows (R, n_embd) -> soft-capped logits (R, n_vocab), a backend array
        (system1 and the parity runner call it on output="hidden" rows)."""
        b, cap = self.backend, self.hp.softcap
        logits = b.matmul(hidden, self.output)                       # (R, n_vocab)
        if not cap:
            return logits
        # cap * tanh(logits / cap), as llama.cpp's graph: scale, tanh, scale (float32)
        return b.mul(b.tanh(b.mul(logits, np.float32(1.0 / cap))), np.float32(cap))

    def _per_layer_input(self, b: Backend, x0, ids, i: int):
        hp = self.hp
        n_pl = hp.n_embd_per_layer
        proj = b.mul(b.matmul(x0, self.pl_model_proj[i]), np.float32(1.0 / math.sqrt(hp.n_embd)))  # (T, n_pl)
        proj = b.rms_norm(proj, self.pl_proj_norm, hp.rms_eps)
        tok = b.mul(b.embed(self.pl_embd, ids * hp.n_layer + i), np.float32(math.sqrt(n_pl)))    # (T, n_pl)
        return b.mul(b.add(proj, tok), np.float32(2.0 ** -0.5))

    def forward(self, token_ids, cache: Cache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """Same contract as llama.Model.forward; sliding-window layers as in gemma3.Model.forward."""
        b = self.backend
        ids, pos, n_past, mask = check_forward_args(token_ids, cache, self.hp.n_vocab, positions,
                                                    attn_mask, output)
        x = b.mul(b.embed(self.tok_embd, ids), self.embd_scale)     # (T, n_embd)
        x0 = x
        for i, blk in enumerate(self.blocks):
            pe = self._per_layer_input(b, x0, ids, i) if self.hp.n_embd_per_layer else None
            x = blk(b, x, pos, cache, n_past, mask, pe)
        cache.n = n_past + ids.shape[0]
        if output == "hidden":
            return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)
        if last_only:
            x = x[-1:]
        logits = self.lm_head(b.rms_norm(x, self.output_norm, self.hp.rms_eps))  # (T, n_vocab)
        return logits if output == "raw" else b.to_numpy(logits)


def load(f, backend: Backend, arch: str = "gemma4") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
