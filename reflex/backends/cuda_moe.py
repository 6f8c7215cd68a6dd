"""Mixture-of-experts FFN ops for the CUDA backend: launches of kernels/moe.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_moe.py, uses the
backend's helpers (self._f32, self.empty, self.k, self.capturing). The decode path (T <=
MATVEC_MAX_T) never reads the routing on the host: rx_moe_route writes expert ids and weights to
device arrays, rx_moe_glu_<type> / rx_moe_down_<type> read them there, so a qwen3moe decode step is
2 launches per layer for the experts (3 when gate and up differ in type) plus 1 for the routing,
and it can be captured into a CUDA graph. Longer inputs (prefill) read the ids on the host once
and keep expert_matmul (one product per selected expert over all its rows: the weights are read
once per expert, not once per token).
"""
from __future__ import annotations

import numpy as np

from reflex.errors import InvalidRequest

MOE_THREADS, MOE_MAX_EXPERT = 256, 1024  # kernels/moe.cu RX_MOE_THREADS, RX_MOE_MAX_EXPERT


class CudaMoEOps:

    def moe_route(self, logits, k: int, norm: bool = True):
        from reflex.backends.numpy_moe import route_ref
        logits = self._f32(logits, "moe_route logits")
        n_expert = logits.shape[-1]
        T = logits.size // n_expert if n_expert else 0
        k = int(k)
        if not 0 < k <= n_expert:
            raise InvalidRequest(f"moe_route: k {k} for {n_expert} experts")
        if n_expert > MOE_MAX_EXPERT:
            # more experts than rx_moe_route keeps in shared memory: route on the host
            if self.capturing:
                raise InvalidRequest(f"moe_route: {n_expert} experts (> {MOE_MAX_EXPERT}) cannot be captured")
            ids, wt = route_ref(logits.get().reshape(T, n_expert), k, norm)
            return self.upload(ids, "i32"), self.upload(wt)
        ids, wts = self.empty((T, k), "i32"), self.empty((T, k))  # (T, K)
        if T:
            self.k("rx_moe_route", "pppiii")((T, 1, 1), MOE_THREADS, logits.ptr, ids.ptr, wts.ptr, n_expert, k,
                                             1 if norm else 0)
        return ids, wts

    def _moe_shapes(self, w_gate, w_up, w_down):
        from reflex.backends.cuda_backend import QWeight
        if not all(isinstance(w, QWeight) and w.ndim == 3 for w in (w_gate, w_up, w_down)):
            raise InvalidRequest("cuda backend: moe_ffn needs prepared 3-D expert weights")
        n_expert, n_ff, n_embd = w_gate.shape
        if w_up.shape != w_gate.shape or w_down.shape != (n_expert, n_embd, n_ff):
            raise InvalidRequest(f"moe_ffn: expert weights {w_gate.shape}, {w_up.shape}, {w_down.shape}")
        return n_expert, n_ff, n_embd

    def moe_capturable(self, w_gate, w_up, w_down) -> bool:
        n_expert, n_ff, n_embd = self._moe_shapes(w_gate, w_up, w_down)
        return n_expert <= MOE_MAX_EXPERT and n_ff % 8 == 0 and n_embd % 8 == 0

    def moe_ffn(self, x, w_gate, w_up, w_down, ids, weights):
        from reflex.backends.cuda_backend import MATVEC_MAX_T, DArray
        if self._staged:
            self._commit()
        n_expert, n_ff, n_embd = self._moe_shapes(w_gate, w_up, w_down)
        x = self._f32(x, "moe_ffn input")
        if x.shape[-1] != n_embd:
            raise InvalidRequest(f"moe_ffn: input {x.shape} does not match expert weights {w_gate.shape}")
        T = x.size // n_embd
        K = ids.shape[-1]
        if tuple(ids.shape) != (T, K) or tuple(weights.shape) != (T, K):
            raise InvalidRequest(f"moe_ffn: ids {ids.shape}, weights {weights.shape} for {T} rows")
        on_device = isinstance(ids, DArray) and isinstance(weights, DArray)
        if not (T <= MATVEC_MAX_T and n_ff % 8 == 0 and n_embd % 8 == 0):
            if self.capturing:
                raise InvalidRequest(f"moe_ffn: {T} rows (n_ff_exp {n_ff}, n_embd {n_embd}) cannot be captured")
            # prefill: ids read on the host once (a sync), each selected expert run once over its rows
            ids_h = ids.get() if isinstance(ids, DArray) else np.asarray(ids)
            wt_h = weights.get() if isinstance(weights, DArray) else np.asarray(weights, dtype=np.float32)
            g = self.expert_matmul(x, w_gate, ids_h)                       # (T, K, n_ff_exp)
            u = self.expert_matmul(x, w_up, ids_h)                         # (T, K, n_ff_exp)
            return self.expert_matmul(self.swiglu(g, u), w_down, ids_h, wt_h)
        if not on_device:
            if self.capturing:
                raise InvalidRequest("moe_ffn: host ids / weights cannot be captured (use moe_route's arrays)")
            ids_h = np.asarray(ids, dtype=np.int64)
            if ids_h.size and (ids_h.min() < 0 or ids_h.max() >= n_expert):
                raise InvalidRequest(f"expert id out of range [0, {n_expert})")
            ids = self.upload(ids_h, "i32")
            weights = self.upload(np.asarray(weights, dtype=np.float32))
        if ids.dtype != "i32":
            raise InvalidRequest(f"moe_ffn: expert ids must be int32, got {ids.dtype}")
        weights = self._f32(weights, "moe_ffn weights")
        h = self.empty((T, K, n_ff))                                       # silu(gate) * up per slot
        if T and K:
            grid = ((n_ff + 3) // 4, K, T)
            sig = "pppppiiiili"
            if w_gate.ggml_type == w_up.ggml_type:
                self.k("rx_moe_glu_" + w_gate.suffix, sig)(grid, 128, w_gate.ptr, w_up.ptr, x.ptr, ids.ptr, h.ptr,
                                                           n_ff, n_embd, K, n_expert, w_gate.nbytes // n_expert, 0)
            else:  # gate and up of different types: two plain products, then silu(g) * u
                g, u = self.empty((T, K, n_ff)), self.empty((T, K, n_ff))
                for w, y in ((w_gate, g), (w_up, u)):
                    self.k("rx_moe_glu_" + w.suffix, sig)(grid, 128, w.ptr, 0, x.ptr, ids.ptr, y.ptr, n_ff, n_embd,
                                                          K, n_expert, w.nbytes // n_expert, 0)
                self.k("rx_glu", "pppli")(self._grid1(g.size), 256, g.ptr, u.ptr, h.ptr, g.size, 0)
        out = self.empty(x.shape[:-1] + (n_embd,))                         # (T, n_embd)
        if T:
            self.k("rx_moe_down_" + w_down.suffix, "pppppiiiil")(
                ((n_embd + 3) // 4, T, 1), 128, w_down.ptr, h.ptr, ids.ptr, weights.ptr, out.ptr, n_embd, n_ff, K,
                n_expert, w_down.nbytes // n_expert)
        return out
