"""The `qwen3moe` architecture: qwen3's attention with a sparse mixture-of-experts FFN in every layer.

- attention is qwen3's (per-head q/k RMSNorm, NEOX RoPE, head_dim from key_length);
- router `ffn_gate_inp` (n_expert, n_embd): softmax over all experts, the top `expert_used_count`
  kept, their weights renormalized to sum 1 when `qwen3moe.expert_weights_norm` is true. The converter
  does not write that key for qwen3moe and llama.cpp always renormalizes for it (Qwen3's
  norm_topk_prob is true), so it defaults to true;
- experts are 3-D tensors ffn_gate_exps / ffn_up_exps (n_expert, n_ff_exp, n_embd) and ffn_down_exps
  (n_expert, n_embd, n_ff_exp), n_ff_exp = `qwen3moe.expert_feed_forward_length`, run by the backend's
  moe_ffn (only the selected experts are read); no shared expert;
- routing (moe_route) and experts (moe_ffn) are backend ops whose ids and weights stay backend arrays:
  on CUDA they never reach the host at decode, so a decode step is captured into a CUDA graph;
- the output projection is untied in the real family (`output.weight`); tied when it is absent.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from reflex.backends.base import Backend
from reflex.errors import ModelFormatError
from reflex.models._common import DecoderHParams, DecoderModel, _key, _Weights
from reflex.models.qwen3 import Attention


@dataclasses.dataclass
class HParams(DecoderHParams):
    n_expert: int = 0             # {arch}.expert_count
    n_expert_used: int = 0        # {arch}.expert_used_count
    n_ff_exp: int = 0             # {arch}.expert_feed_forward_length
    expert_weights_norm: bool = True  # {arch}.expert_weights_norm (absent: true, as llama.cpp)
    arch: str = "qwen3moe"

    def __post_init__(self):
        super().__post_init__()

        def bad(key, why):
            raise ModelFormatError(f"invalid hyperparameter {self.arch}.{key}: {why}", kind="invalid_key")

        if self.n_expert <= 0:
            bad("expert_count", f"must be positive, got {self.n_expert}")
        if not 0 < self.n_expert_used <= self.n_expert:
            bad("expert_used_count", f"{self.n_expert_used} (expert_count {self.n_expert})")
        if self.n_ff_exp <= 0:
            bad("expert_feed_forward_length", f"must be positive, got {self.n_ff_exp}")

    @classmethod
    def from_gguf(cls, f, arch: str) -> "HParams":
        n_ff_exp = _key(f, arch, "expert_feed_forward_length", int)
        # feed_forward_length (the dense size) is unused when every layer is sparse; allow it absent
        base = DecoderHParams.from_gguf(_WithDefault(f, {f"{arch}.feed_forward_length": n_ff_exp}), arch)
        return cls(**dataclasses.asdict(base),
                   n_expert=_key(f, arch, "expert_count", int),
                   n_expert_used=_key(f, arch, "expert_used_count", int),
                   n_ff_exp=n_ff_exp,
                   expert_weights_norm=_flag(f, f"{arch}.expert_weights_norm", True))


def _flag(f, key: str, default: bool) -> bool:
    v = f.get(key, None)
    if v is None:
        return default
    if not isinstance(v, (bool, np.bool_)):
        raise ModelFormatError(f"invalid hyperparameter {key!r}: {v!r} (expected a bool)", kind="invalid_key")
    return bool(v)


class _WithDefault:
    """A GGUF file whose get() falls back to `defaults` for keys it lacks."""

    def __init__(self, f, defaults):
        self.f, self.defaults = f, defaults
        self.metadata = f.metadata
        self.tensors = f.tensors

    def get(self, key, default=None):
        return self.f.get(key, self.defaults.get(key, default))


class FFN:
    """Sparse MoE: sum over the top-k experts e of p_e * down_e(silu(gate_e(x)) * up_e(x))."""

    def __init__(self, w: _Weights, hp: HParams, i: int):
        p = f"blk.{i}."
        E, F, X = hp.n_embd, hp.n_ff_exp, hp.n_expert
        self.hp = hp
        self.w_router = w.get(p + "ffn_gate_inp.weight", (X, E))        # (n_expert, n_embd)
        self.w_gate = w.get(p + "ffn_gate_exps.weight", (X, F, E))      # (n_expert, n_ff_exp, n_embd)
        self.w_up = w.get(p + "ffn_up_exps.weight", (X, F, E))          # (n_expert, n_ff_exp, n_embd)
        self.w_down = w.get(p + "ffn_down_exps.weight", (X, E, F))      # (n_expert, n_embd, n_ff_exp)

    def route(self, b: Backend, x):
        """(expert ids (T, K) int32, weights (T, K) float32) as backend arrays: float32 softmax over all
        experts, top-k best first, renormalized when expert_weights_norm."""
        logits = b.matmul(x, self.w_router)                                # (T, n_expert)
        return b.moe_route(logits, self.hp.n_expert_used, self.hp.expert_weights_norm)

    def capturable(self, b: Backend) -> bool:
        return b.moe_capturable(self.w_gate, self.w_up, self.w_down)

    def __call__(self, b: Backend, x):
        ids, wt = self.route(b, x)                                         # (T, K), (T, K)
        return b.moe_ffn(x, self.w_gate, self.w_up, self.w_down, ids, wt)  # (T, n_embd)


class Model(DecoderModel):
    Attention = Attention
    FFN = FFN

    def __init__(self, f, backend: Backend, hp: HParams):
        super().__init__(f, backend, hp)
        # a decode step replays from a CUDA graph where every layer routes and runs its experts on
        # the device (the expert ids choose which weight bytes a step reads)
        self.graph_capturable = all(blk.ffn.capturable(backend) for blk in self.blocks)


def load(f, backend: Backend, arch: str = "qwen3moe") -> Model:
    return Model(f, backend, HParams.from_gguf(f, arch))
