"""Multi-head latent attention ops (deepseek2) for the CUDA backend: launches of kernels/mla.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_mla.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1). deepseek2 routes its experts on the
host, so it never runs under CUDA-graph capture; these ops refuse to be captured.
"""
from __future__ import annotations

import numpy as np

from reflex.backends.base import ROPE_NEOX, ROPE_NORM
from reflex.errors import InvalidRequest

MLA_THREADS, MLA_ACC = 128, 8  # kernels/mla.cu RX_MLA_THREADS, RX_MLA_ACC


class CudaMLAOps:

    def _no_capture(self, op):
        if self.capturing:
            raise InvalidRequest(f"cuda backend: {op} cannot be captured into a CUDA graph")

    def rope_freqs(self, x, pos, inv_freq, mode: int = ROPE_NORM):
        """rope.cu's rx_rope with caller-given inverse frequencies (uploaded once per distinct set)."""
        self._no_capture("rope_freqs")
        if mode not in (ROPE_NORM, ROPE_NEOX):
            raise ValueError(f"unknown rope mode {mode}")
        x = self._f32(x, "rope_freqs input")
        T, n_head, n_rot = x.shape
        inv = np.ascontiguousarray(inv_freq, dtype=np.float64).reshape(-1)
        if inv.shape[0] * 2 != n_rot:
            raise ValueError(f"rope_freqs: {inv.shape[0]} frequencies for {n_rot} dims")
        cache = self.__dict__.setdefault("_mla_invf", {})
        key = inv.tobytes()
        inv_d = cache.get(key)
        if inv_d is None:
            inv_d = cache[key] = self.upload(inv, "f64")
        pos_d = self._positions(pos)
        out = self.empty(x.shape)
        threads = max(32, (n_rot // 2 + 31) // 32 * 32)
        self.k("rx_rope", "ppppippiiiip")((T * n_head, 1, 1), threads, x.ptr, out.ptr, 0, 0, 0, pos_d.ptr,
                                          inv_d.ptr, n_head, n_rot, n_rot, 0 if mode == ROPE_NORM else 1, 0)
        return out

    def mla_attention(self, q_lat, q_pe, c_cache, pe_cache, n_past: int, scale: float, *, mask=None):
        from reflex.backends.cuda_backend import DArray
        self._no_capture("mla_attention")
        if self._kvq:
            self._flush_kv()
        q_lat = self._f32(q_lat, "mla_attention q_lat")
        q_pe = self._f32(q_pe, "mla_attention q_pe")
        T, n_head, R = q_lat.shape
        P = q_pe.shape[2]
        for cc, d, what in ((c_cache, R, "latent"), (pe_cache, P, "rope key")):
            if not (isinstance(cc, DArray) and cc.dtype == "f16") or tuple(cc.shape[1:]) != (1, d):
                raise InvalidRequest(f"mla_attention: {what} cache must be a (n_ctx, 1, {d}) cache from zeros()")
        if tuple(q_pe.shape[:2]) != (T, n_head) or R > MLA_THREADS * MLA_ACC:
            raise InvalidRequest(f"mla_attention: q_lat {q_lat.shape}, q_pe {q_pe.shape} (R <= {MLA_THREADS * MLA_ACC})")
        S = int(n_past) + T
        if S > c_cache.shape[0]:
            raise InvalidRequest("mla_attention past the end of the cache")
        mask_d = None
        if mask is not None:
            m = np.asarray(mask, dtype=bool)
            if m.shape != (T, S):
                raise ValueError(f"attention mask shape {m.shape}, expected {(T, S)}")
            mask_d = self.upload(m.astype(np.uint8), "u8")
        out = self.empty((T, n_head, R))
        shmem = 4 * (R + P + MLA_THREADS + 2)
        self.k("rx_mla_attention", "ppppppiiiif")(
            (T * n_head, 1, 1), MLA_THREADS, q_lat.ptr, q_pe.ptr, c_cache.ptr, pe_cache.ptr, out.ptr,
            mask_d.ptr if mask_d is not None else 0, n_head, R, P, int(n_past), float(scale), shmem=shmem)
        return out
