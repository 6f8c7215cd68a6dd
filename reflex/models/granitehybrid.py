"""The `granitehybrid` architecture (Granite 4.0-H): Mamba-2 layers interleaved with attention layers.

- layer kind from `granitehybrid.attention.head_count_kv`, one value per layer: 0 = Mamba-2 layer
  (recurrent), > 0 = attention layer with that many KV heads (as llama.cpp decides it);
- Granite multipliers: token embeddings times `embedding_scale`, attention scores scaled by
  `attention.scale` (instead of 1/sqrt(head_dim)), each mixer and FFN output times `residual_scale`
  before its residual add, logits divided by `logit_scale` (folded into output_norm at load, so the
  `hidden` output is already in logit units: hidden @ token_embd^T = logits);
- attention has no positional encoding (NoPE): the converter writes `rope.scaling.finetuned` false
  for hybrid Granite; a file asking for RoPE (Bamba-style) is refused rather than guessed;
- Mamba-2 mixer: ssm_in (d_in_proj, n_embd) split by rows at load into z (d_inner), xBC
  (d_inner + 2 n_group d_state) and dt (n_head); xBC -> ssm_conv (kernel `ssm.conv_kernel`, bias) ->
  SiLU -> ssm_scan with A = ssm_a (= -exp(A_log), written by the converter), D = ssm_d, dt bias
  ssm_dt.bias + softplus; y * silu(z), RMSNorm per group of d_inner / n_group times ssm_norm; ssm_out;
- FFN: MoE (softmax router over all experts, top-k renormalized, qwen3moe's expert FFN) plus a
  shared SwiGLU expert (`*_shexp`, `expert_shared_feed_forward_length`) when expert_count > 0
  (Granite 4.0-H-Tiny/Small); a dense SwiGLU FFN otherwise (Micro);
- the cache holds KV for attention layers and (conv window, SSM state) per Mamba layer; it cannot
  rewind to a middle position, so `tree_mask` is False and forks go through snapshot()/restore().
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from reflex.backends.base import Backend
from reflex.errors import InvalidRequest, ModelFormatError, UnsupportedArchitecture
from reflex.models import qwen3moe
from reflex.models._common import KVCache, _key, _Weights, check_forward_args, head_out, invalid_key, n_vocab_of
from reflex.models.llama import FFN as DenseFFN


@dataclasses.dataclass
class HParams:
    n_vocab: int
    n_embd: int            # granitehybrid.embedding_length
    n_layer: int           # granitehybrid.block_count
    n_head: int            # granitehybrid.attention.head_count
    n_head_kv: list        # granitehybrid.attention.head_count_kv, per layer (0: Mamba-2 layer)
    n_ff: int              # granitehybrid.feed_forward_length (expert size when MoE)
    rms_eps: float         # granitehybrid.attention.layer_norm_rms_epsilon
    n_ctx_train: int       # granitehybrid.context_length
    d_conv: int            # granitehybrid.ssm.conv_kernel
    d_state: int           # granitehybrid.ssm.state_size
    n_group: int           # granitehybrid.ssm.group_count
    d_inner: int           # granitehybrid.ssm.inner_size
    n_ssm_head: int        # granitehybrid.ssm.time_step_rank (llama.cpp's use: the SSM head count)
    embedding_scale: float = 1.0   # granitehybrid.embedding_scale
    attention_scale: float = 0.0   # granitehybrid.attention.scale (0: 1/sqrt(head_dim))
    residual_scale: float = 1.0    # granitehybrid.residual_scale
    logit_scale: float = 1.0       # granitehybrid.logit_scale
    n_expert: int = 0              # granitehybrid.expert_count
    n_expert_used: int = 0         # granitehybrid.expert_used_count
    n_ff_shexp: int = 0            # granitehybrid.expert_shared_feed_forward_length
    arch: str = "granitehybrid"

    def __post_init__(self):
        def bad(key, why):
            invalid_key(self.arch, key, why)

        for key, attr in (("embedding_length", "n_embd"), ("block_count", "n_layer"),
                          ("attention.head_count", "n_head"), ("feed_forward_length", "n_ff"),
                          ("context_length", "n_ctx_train"), ("vocab_size", "n_vocab"),
                          ("ssm.conv_kernel", "d_conv"), ("ssm.state_size", "d_state"),
                          ("ssm.group_count", "n_group"), ("ssm.inner_size", "d_inner"),
                          ("ssm.time_step_rank", "n_ssm_head")):
            if getattr(self, attr) <= 0:
                bad(key, f"must be positive, got {getattr(self, attr)}")
        if len(self.n_head_kv) != self.n_layer:
            bad("attention.head_count_kv", f"{len(self.n_head_kv)} values for {self.n_layer} layers")
        for v in self.n_head_kv:
            if v < 0 or (v > 0 and self.n_head % v):
                bad("attention.head_count_kv", f"{v} does not divide head_count {self.n_head}")
        if self.n_embd % self.n_head:
            bad("embedding_length", f"{self.n_embd} not divisible by head_count {self.n_head}")
        if self.d_inner % self.n_ssm_head or self.n_ssm_head % self.n_group:
            bad("ssm.time_step_rank", f"{self.n_ssm_head} heads do not fit inner_size {self.d_inner} "
                                      f"and group_count {self.n_group}")
        if not (0.0 < self.rms_eps < 1.0):
            bad("attention.layer_norm_rms_epsilon", f"{self.rms_eps}")
        for key, attr in (("embedding_scale", "embedding_scale"), ("residual_scale", "residual_scale"),
                          ("logit_scale", "logit_scale")):
            v = getattr(self, attr)
            if not (math.isfinite(v) and v > 0.0):
                bad(key, f"{v} (must be finite and positive)")
        if not (math.isfinite(self.attention_scale) and self.attention_scale >= 0.0):
            bad("attention.scale", f"{self.attention_scale}")
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            bad("expert_used_count", f"{self.n_expert_used} (expert_count {self.n_expert})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_gguf(cls, f, arch: str) -> "HParams":
        n_layer = _key(f, arch, "block_count", int)
        kv = f.get(f"{arch}.attention.head_count_kv", None)
        if kv is None:
            raise ModelFormatError(f"missing hyperparameter '{arch}.attention.head_count_kv'", kind="missing_key")
        kv = [int(v) for v in np.atleast_1d(np.asarray(kv)).reshape(-1)]
        if len(kv) == 1:
            kv = kv * n_layer
        rope = f.get(f"{arch}.rope.scaling.finetuned", None)
        if rope is None or bool(rope):
            raise UnsupportedArchitecture(f"{arch} with RoPE on its attention layers (rope.scaling.finetuned "
                                          f"{rope!r}) is not supported: only NoPE (Granite 4.0-H)")
        return cls(
            n_vocab=n_vocab_of(f, arch),
            n_embd=_key(f, arch, "embedding_length", int),
            n_layer=n_layer,
            n_head=_key(f, arch, "attention.head_count", int),
            n_head_kv=kv,
            n_ff=_key(f, arch, "feed_forward_length", int),
            rms_eps=_key(f, arch, "attention.layer_norm_rms_epsilon", float),
            n_ctx_train=_key(f, arch, "context_length", int),
            d_conv=_key(f, arch, "ssm.conv_kernel", int),
            d_state=_key(f, arch, "ssm.state_size", int),
            n_group=_key(f, arch, "ssm.group_count", int),
            d_inner=_key(f, arch, "ssm.inner_size", int),
            n_ssm_head=_key(f, arch, "ssm.time_step_rank", int),
            embedding_scale=_key(f, arch, "embedding_scale", float, 1.0),
            attention_scale=_key(f, arch, "attention.scale", float, 0.0),
            residual_scale=_key(f, arch, "residual_scale", float, 1.0),
            logit_scale=_key(f, arch, "logit_scale", float, 1.0),
            n_expert=_key(f, arch, "expert_count", int, 0),
            n_expert_used=_key(f, arch, "expert_used_count", int, 0),
            n_ff_shexp=_key(f, arch, "expert_shared_feed_forward_length", int, 0),
            arch=arch,
        )


def _vector(w: _Weights, name: str, n: int, scale: float = 1.0):
    """A float32 (n,) weight from a tensor of n elements in any shape (ssm_a / ssm_d are (n_head, 1),
    ssm_norm is (n_group, d_inner / n_group)), optionally scaled at load."""
    from reflex.quants import dequantize

    t = w.f.tensors.get(name)
    if t is None:
        raise ModelFormatError(f"missing tensor {name!r}", kind="missing_tensor")
    if math.prod(t.shape) != n:
        raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {n} elements",
                               kind="tensor_shape")
    v = dequantize(w.f.tensor_bytes(name), t.ggml_type, tuple(t.shape)).reshape(n).astype(np.float32)
    if scale != 1.0:
        v = (v * np.float32(scale)).astype(np.float32)
    return w.b.prepare_weight(v.view(np.uint8), 0, (n,))


def _row_split(w: _Weights, name: str, shape: tuple, rows: list):
    """A 2-D weight split by output rows into several weights (block rows are contiguous bytes), so
    each part is its own product instead of a column slice of one activation."""
    t = w.f.tensors.get(name)
    if t is None:
        raise ModelFormatError(f"missing tensor {name!r}", kind="missing_tensor")
    if tuple(t.shape) != tuple(shape):
        raise ModelFormatError(f"tensor {name!r} has shape {tuple(t.shape)}, expected {tuple(shape)}",
                               kind="tensor_shape")
    raw = w.f.tensor_bytes(name)
    row = raw.size // shape[0]
    out, r0 = [], 0
    for n in rows:
        out.append(w.b.prepare_weight(raw[r0 * row:(r0 + n) * row], t.ggml_type, (n, shape[1])))
        r0 += n
    return out


class Mamba2:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E, D, H, G, N = hp.n_embd, hp.d_inner, hp.n_ssm_head, hp.n_group, hp.d_state
        self.hp = hp
        self.n_conv = D + 2 * G * N                                     # xBC channels
        self.w_z, self.w_xbc, self.w_dt = _row_split(w, p + "ssm_in.weight", (2 * D + 2 * G * N + H, E),
                                                     [D, self.n_conv, H])
        self.conv_w = w.get(p + "ssm_conv1d.weight", (self.n_conv, hp.d_conv))  # (C, d_conv)
        self.conv_b = w.get(p + "ssm_conv1d.bias", (self.n_conv,)) if w.has(p + "ssm_conv1d.bias") else None
        self.dt_b = w.get(p + "ssm_dt.bias", (H,))
        self.A = _vector(w, p + "ssm_a", H)                              # (n_head,) = -exp(A_log)
        self.D = _vector(w, p + "ssm_d", H)
        self.norm = _vector(w, p + "ssm_norm.weight", D)                 # (d_inner,) group-major
        self.w_out = w.get(p + "ssm_out.weight", (E, D))

    def __call__(self, b: Backend, x, conv_state, ssm_state):
        hp = self.hp
        T = x.shape[0]
        z = b.matmul(x, self.w_z)                                        # (T, d_inner)
        xbc = b.silu(b.ssm_conv(b.matmul(x, self.w_xbc), conv_state, self.conv_w, self.conv_b))  # (T, C)
        dt = b.matmul(x, self.w_dt)                                      # (T, n_head)
        y = b.ssm_scan(xbc, dt, ssm_state, self.A, self.D, self.dt_b, hp.n_group)  # (T, d_inner)
        y = b.mul(y, b.silu(z))
        g = hp.d_inner // hp.n_group
        y = b.rms_norm(y.reshape(T * hp.n_group, g), None, hp.rms_eps).reshape(T, hp.d_inner)
        return b.matmul(b.mul(y, self.norm), self.w_out)                 # (T, n_embd)


class Attention:
    """NoPE attention with Granite's score scale."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        d, E, kv = hp.head_dim, hp.n_embd, hp.n_head_kv[i]
        self.hp, self.n_kv = hp, kv
        self.wq = w.get(p + "attn_q.weight", (hp.n_head * d, E))        # (n_head*head_dim, n_embd)
        self.wk = w.get(p + "attn_k.weight", (kv * d, E))               # (n_head_kv*head_dim, n_embd)
        self.wv = w.get(p + "attn_v.weight", (kv * d, E))
        self.wo = w.get(p + "attn_output.weight", (E, hp.n_head * d))
        self.scale = hp.attention_scale or 1.0 / math.sqrt(d)

    def __call__(self, b: Backend, x, k_cache, v_cache, n_past: int):
        hp = self.hp
        T, d = x.shape[0], hp.head_dim
        q = b.matmul(x, self.wq).reshape(T, hp.n_head, d)               # (T, n_head, head_dim)
        k = b.matmul(x, self.wk).reshape(T, self.n_kv, d)               # (T, n_head_kv, head_dim)
        v = b.matmul(x, self.wv).reshape(T, self.n_kv, d)
        b.kv_write(k_cache, k, n_past)
        b.kv_write(v_cache, v, n_past)
        o = b.attention(q, k_cache, v_cache, n_past, self.scale)        # (T, n_head, head_dim)
        return b.matmul(o.reshape(T, hp.n_head * d), self.wo)           # (T, n_embd)


class SharedFFN:
    """The shared expert: SwiGLU with `*_shexp` weights, run for every token."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        F, E = hp.n_ff_shexp, hp.n_embd
        self.w_gate = w.get(p + "ffn_gate_shexp.weight", (F, E))
        self.w_up = w.get(p + "ffn_up_shexp.weight", (F, E))
        self.w_down = w.get(p + "ffn_down_shexp.weight", (E, F))

    def __call__(self, b: Backend, x):
        return b.matmul(b.swiglu(b.matmul(x, self.w_gate), b.matmul(x, self.w_up)), self.w_down)


class MoEFFN:
    """Routed experts (qwen3moe's softmax top-k, renormalized: Granite's top-k softmax) + shared expert."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        moe_hp = dataclasses.make_dataclass("MoEHP", ["n_embd", "n_ff_exp", "n_expert", "n_expert_used",
                                                      "expert_weights_norm"])(
            hp.n_embd, hp.n_ff, hp.n_expert, hp.n_expert_used, True)
        self.routed = qwen3moe.FFN(w, moe_hp, i)
        self.shared = SharedFFN(w, hp, i) if hp.n_ff_shexp > 0 else None

    def __call__(self, b: Backend, x):
        out = self.routed(b, x)
        return out if self.shared is None else b.add(out, self.shared(b, x))


class Block:
    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        self.hp, self.i = hp, i
        self.recurrent = hp.n_head_kv[i] == 0
        self.attn_norm = w.get(p + "attn_norm.weight", (hp.n_embd,))
        self.ffn_norm = w.get(p + "ffn_norm.weight", (hp.n_embd,))
        self.mixer = Mamba2(w, hp, i) if self.recurrent else Attention(w, hp, i)
        self.ffn = MoEFFN(w, hp, i) if hp.n_expert > 0 else DenseFFN(w, hp, i)

    def __call__(self, b: Backend, x, cache: "HybridCache", n_past: int):
        hp = self.hp
        h = b.rms_norm(x, self.attn_norm, hp.rms_eps)                   # (T, n_embd)
        if self.recurrent:
            h = self.mixer(b, h, cache.conv[self.i], cache.ssm[self.i])
        else:
            j = cache.kv_slot[self.i]
            h = self.mixer(b, h, cache.k[j], cache.v[j], n_past)
        x = b.add(x, b.mul(h, hp.residual_scale))
        h = self.ffn(b, b.rms_norm(x, self.ffn_norm, hp.rms_eps))
        return b.add(x, b.mul(h, hp.residual_scale))                    # (T, n_embd)


class HybridCache(KVCache):
    """KV buffers for the attention layers only, plus per Mamba-2 layer i: conv[i] (d_conv-1, C), the
    last inputs of the conv, and ssm[i] (n_head, head_dim, d_state), float32 backend arrays."""

    def __init__(self, backend, hp: HParams, n_ctx: int):
        attn = [i for i in range(hp.n_layer) if hp.n_head_kv[i] > 0]
        n_kv = max([hp.n_head_kv[i] for i in attn] or [1])
        super().__init__(backend, len(attn), n_kv, hp.head_dim, n_ctx)
        self.backend, self.hp = backend, hp
        self.kv_slot = {i: j for j, i in enumerate(attn)}
        self.conv, self.ssm = {}, {}
        self._zero_states()

    def _zero_states(self):
        hp, b = self.hp, self.backend
        for i in range(hp.n_layer):
            if hp.n_head_kv[i] == 0:
                self.conv[i] = b.ssm_state((hp.d_conv - 1, hp.d_inner + 2 * hp.n_group * hp.d_state))
                self.ssm[i] = b.ssm_state((hp.n_ssm_head, hp.d_inner // hp.n_ssm_head, hp.d_state))

    def truncate(self, n: int):
        """Only to the start (or a no-op): recurrent state holds no per-position history."""
        if n >= self.n:
            return
        if n > 0:
            raise InvalidRequest(f"{self.hp.arch}: recurrent state cannot rewind to position {n} of {self.n}; "
                                 "use snapshot()/restore()")
        self.n = 0
        self._zero_states()

    def snapshot(self):
        b = self.backend
        return (self.n, {i: b.add(s, 0.0) for i, s in self.conv.items()},
                {i: b.add(s, 0.0) for i, s in self.ssm.items()})

    def restore(self, snap):
        """Back to a snapshot (KV slots past its n are simply overwritten later); reusable."""
        n, conv, ssm = snap
        b = self.backend
        self.n = n
        self.conv = {i: b.add(s, 0.0) for i, s in conv.items()}
        self.ssm = {i: b.add(s, 0.0) for i, s in ssm.items()}


class Model:
    tree_mask = False         # a recurrent state cannot hold two branches at once
    # not captured: its MoE layers route on the device now (qwen3moe.FFN), but the Mamba-2 decode
    # path has not been checked under CUDA-graph capture
    graph_capturable = False

    def __init__(self, f, backend: Backend, hp: HParams):
        self.backend, self.hp, self.arch = backend, hp, hp.arch
        w = _Weights(f, backend)
        self.tok_embd = w.get("token_embd.weight", (hp.n_vocab, hp.n_embd))  # (n_vocab, n_embd)
        self.blocks = [Block(w, hp, i) for i in range(hp.n_layer)]
        # logits / logit_scale, folded into the final norm (the output projection is linear)
        self.output_norm = _vector(w, "output_norm.weight", hp.n_embd, 1.0 / hp.logit_scale)
        if w.has("output.weight"):
            self.output = w.get("output.weight", (hp.n_vocab, hp.n_embd))
        else:
            self.output = self.tok_embd  # tied embeddings (the real family)

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def new_cache(self, n_ctx: int | None = None) -> HybridCache:
        return HybridCache(self.backend, self.hp, n_ctx or min(self.hp.n_ctx_train, 4096))

    def forward(self, token_ids, cache: HybridCache, last_only: bool = False, positions=None,
                attn_mask=None, output: str = "logits") -> np.ndarray:
        """llama.Model.forward's contract, except that positions / attn_mask (tree decoding) are
        refused: the recurrent layers see tokens strictly in order."""
        if positions is not None or attn_mask is not None:
            raise InvalidRequest(f"{self.arch}: positions / attn_mask are not supported (recurrent layers)")
        b = self.backend
        ids, _, n_past, _ = check_forward_args(token_ids, cache, self.hp.n_vocab, None, None, output)
        x = b.mul(b.embed(self.tok_embd, ids), self.hp.embedding_scale)  # (T, n_embd)
        for blk in self.blocks:
            x = blk(b, x, cache, n_past)
        cache.n = n_past + ids.shape[0]
        return head_out(b, x, self.output_norm, self.hp.rms_eps, self.output, output, last_only)


def load(f, backend: Backend, arch: str = "granitehybrid") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
