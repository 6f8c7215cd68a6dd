"""Mamba-2 selective-state-space ops (granitehybrid) for the CUDA backend: launches of kernels/ssm.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_ssm.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1). Recurrent states are float32
device arrays from `ssm_state` (the backend's `zeros` is the float16 KV-cache allocator).
"""
from __future__ import annotations

from reflex.errors import InvalidRequest


class CudaSSMOps:

    def ssm_state(self, shape: tuple):
        from reflex.backends.cuda_backend import DArray
        d = DArray(self, shape, "f32")
        self.ctx.memset0(d.ptr, d.nbytes)
        return d

    def _ssm_vec(self, v):
        """A float32 device view of a weight: f32 QWeights are read in place, others dequantized."""
        from reflex.backends.cuda_backend import QWeight
        if v is None:
            return None
        if isinstance(v, QWeight):
            if self._staged:
                self._commit()
            return v if v.ggml_type == 0 else self.dequantize(v)
        return self._f32(v, "ssm weight")

    def _ssm_st(self, state, what):
        from reflex.backends.cuda_backend import DArray
        if not (isinstance(state, DArray) and state.dtype == "f32"):
            raise InvalidRequest(f"cuda backend: {what} must be a float32 device array (ssm_state)")
        return state

    def ssm_conv(self, x, state, w, b=None):
        x = self._f32(x, "ssm_conv input")
        state = self._ssm_st(state, "ssm_conv state")
        T, C = x.shape
        K = w.shape[1]
        if tuple(w.shape) != (C, K) or state.shape != (K - 1, C):
            raise InvalidRequest(f"ssm_conv: x {x.shape}, state {state.shape}, w {tuple(w.shape)} do not fit")
        wv, bv = self._ssm_vec(w), self._ssm_vec(b)
        out = self.empty((T, C))
        self.k("rx_ssm_conv", "pppppiii")(((C + 255) // 256, 1, 1), 256, x.ptr, state.ptr, wv.ptr,
                                          bv.ptr if bv is not None else 0, out.ptr, T, C, K)
        return out

    def ssm_scan(self, xbc, dt, state, A, D=None, dt_bias=None, n_group: int = 1):
        xbc, dt = self._f32(xbc, "ssm_scan xbc"), self._f32(dt, "ssm_scan dt")
        state = self._ssm_st(state, "ssm_scan state")
        n_head, head_dim, d_state = state.shape
        T, ld = xbc.shape[0], xbc.size // max(xbc.shape[0], 1)
        if ld != n_head * head_dim + 2 * n_group * d_state or n_head % n_group or head_dim > 1024:
            raise InvalidRequest(f"ssm_scan: xbc {xbc.shape} does not fit state {state.shape}, n_group {n_group}")
        Av, Dv, bv = self._ssm_vec(A), self._ssm_vec(D), self._ssm_vec(dt_bias)
        out = self.empty((T, n_head * head_dim))
        self.k("rx_ssm_scan", "pppppppiiiiii")((n_head, 1, 1), head_dim, xbc.ptr, dt.ptr, state.ptr, Av.ptr,
                                              Dv.ptr if Dv is not None else 0, bv.ptr if bv is not None else 0,
                                              out.ptr, T, n_head, head_dim, d_state, n_group, ld)
        return out
