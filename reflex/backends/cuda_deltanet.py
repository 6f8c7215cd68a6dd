"""Gated DeltaNet ops (qwen35 linear-attention layers) for the CUDA backend: launches of kernels/deltanet.cu.

A mixin of CudaBackend (cuda_backend.py): same signatures and shapes as numpy_deltanet.py, uses the
backend's helpers (self._f32, self.empty, self.k, self._grid1) and the SSM mixin's float32 state
helpers (cuda_ssm.py: ssm_state allocates the recurrent states, _ssm_vec reads 1-D weights).
"""
from __future__ import annotations

from reflex.errors import InvalidRequest

_MAX_DK = 256  # kernels/deltanet.cu RX_DN_MAX_DK (q/k of one head staged in shared memory)


class CudaDeltaNetOps:

    def sigmoid_mul(self, x, gate):
        x, gate = self._f32(x, "sigmoid_mul x"), self._f32(gate, "sigmoid_mul gate")
        if x.size != gate.size:
            raise InvalidRequest(f"sigmoid_mul: x {x.shape} and gate {gate.shape} differ in size")
        out = self.empty(x.shape)
        self.k("rx_sigmoid_mul", "pppl")(self._grid1(x.size), 256, x.ptr, gate.ptr, out.ptr, x.size)
        return out

    def state_copy(self, x):
        # through the host: snapshots are rare and small next to a forward pass
        return self.upload(self.to_numpy(x))

    def gated_delta_rule(self, qkv, alpha, beta, ssm_a, dt_bias, state, n_k_head: int, eps: float):
        qkv = self._f32(qkv, "gated_delta_rule qkv")
        alpha, beta = self._f32(alpha, "gated_delta_rule alpha"), self._f32(beta, "gated_delta_rule beta")
        state = self._ssm_st(state, "gated_delta_rule state")
        n_v, d_k, d_v = state.shape
        T = qkv.shape[0]
        if (qkv.size != T * (2 * n_k_head * d_k + n_v * d_v) or n_k_head <= 0 or n_v % n_k_head
                or alpha.size != T * n_v or beta.size != T * n_v or d_k > _MAX_DK or d_v > 1024):
            raise InvalidRequest(f"gated_delta_rule: qkv {qkv.shape}, alpha {alpha.shape}, beta {beta.shape} "
                                 f"do not fit state {state.shape}, n_k_head {n_k_head}")
        av, bv = self._ssm_vec(ssm_a), self._ssm_vec(dt_bias)
        out = self.empty((T, n_v, d_v))
        self.k("rx_gated_delta_rule", "pppppppiiiiif")((n_v, 1, 1), d_v, qkv.ptr, alpha.ptr, beta.ptr, av.ptr,
                                                       bv.ptr, state.ptr, out.ptr, T, n_k_head, n_v, d_k, d_v,
                                                       float(eps))
        return out
