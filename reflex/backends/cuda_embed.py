"""Ops for encoder / classifier-head models (bert's RANK head) on the CUDA backend: launches of
kernels/embed.cu. Same signatures and shapes as numpy_embed.py.

A mixin of CudaBackend (cuda_backend.py): uses the backend's helpers (self._f32, self.empty,
self.k, self._grid1)."""
from __future__ import annotations


class CudaEmbedOps:

    def tanh(self, x):
        x = self._f32(x, "tanh input")
        out = self.empty(x.shape)
        self.k("rx_tanh", "ppl")(self._grid1(x.size), 256, x.ptr, out.ptr, x.size)
        return out
