"""Mixture-of-experts FFN ops for the NumPy backend: expert routing and the routed SwiGLU FFN.

A mixin of NumpyBackend (numpy_backend.py); each op is the reference the CUDA version
(cuda_moe.py, kernels/moe.cu) is tested against.

- moe_route: float32 softmax over the router logits, top-k (ties to the lower expert id),
  optionally renormalized -- the routing qwen3moe (and granitehybrid's routed experts) use;
- moe_ffn: sum over the chosen experts of weight * down_e(silu(gate_e(x)) * up_e(x)), written with
  expert_matmul so its results are exactly those of the three expert_matmul calls it replaces.
"""
from __future__ import annotations

import numpy as np

from reflex.errors import InvalidRequest


def route_ref(logits, k: int, norm: bool):
    """(ids (T, k) int32, weights (T, k) float32) of logits (T, n_expert): see Backend.moe_route."""
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim != 2 or not 0 < int(k) <= logits.shape[1]:
        raise InvalidRequest(f"moe_route: logits {logits.shape}, k {k}")
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))              # (T, n_expert)
    p /= p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :int(k)]            # (T, k), best first
    wt = np.take_along_axis(p, ids, axis=-1)                             # (T, k)
    if norm:
        wt = wt / wt.sum(axis=-1, keepdims=True)
    return ids.astype(np.int32), wt.astype(np.float32)


class NumpyMoEOps:
    def moe_route(self, logits, k: int, norm: bool = True):
        return route_ref(logits, k, norm)

    def moe_ffn(self, x, w_gate, w_up, w_down, ids, weights):
        g = self.expert_matmul(x, w_gate, ids)                             # (T, K, n_ff_exp)
        u = self.expert_matmul(x, w_up, ids)                               # (T, K, n_ff_exp)
        return self.expert_matmul(self.swiglu(g, u), w_down, ids, weights)  # (T, n_embd)
