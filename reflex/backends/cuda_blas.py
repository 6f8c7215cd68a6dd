"""A thin ctypes binding of cuBLAS: one float32 GEMM for prefill products.

Why cuBLAS: prefill products (T > 8 rows) dequantize one weight into a float32 scratch and multiply.
Our hand-written tiled SGEMM (kernels/matmul.cu rx_sgemm_nt) reached ~12 TFLOP/s on the H200; the
f16 tensor-core GEMM is 2.7x faster but its ~1e-3 product error broke GPU parity of small fixtures.
cublasSgemm keeps full float32 products (no TF32: the handle stays in CUBLAS_DEFAULT_MATH, which does
not allow TF32 unless NVIDIA_TF32_OVERRIDE says so) at a far higher rate. Its kernels are
precompiled SASS shipped with the library: nothing is JIT-compiled.

Cold start: the library (and libcublasLt) is loaded only when the first product with T > 8 rows
runs, never at import; `load_s` records what that cost. Where no libcublas is found, `get()`
returns None and the backend keeps rx_sgemm_nt.

Layout: cuBLAS is column-major. Our x (T, n_in) row-major is x^T (n_in, T) column-major; a weight
(n_out, n_in) row-major is (n_in, n_out) column-major. out (T, n_out) row-major = out^T (n_out, T)
column-major = op_T(W_cm) (n_out x n_in) @ x_cm (n_in x T): sgemm(T, N, m=n_out, n=T, k=n_in,
A=W lda=n_in, B=x ldb=n_in, C=out ldc=n_out).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import time

from reflex.backends import cuda_driver as drv

_c = ctypes
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1

_lock = threading.Lock()
_blas = None          # the Blas, False once loading failed
_SONAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")


def _candidates() -> list[str]:
    """Where libcublas may live: the loader's path first, then CUDA toolkits and pip wheels."""
    out = list(_SONAMES)
    roots = [os.environ.get("CUDA_PATH", ""), os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    for r in roots:
        if r:
            for so in _SONAMES:
                out += sorted(glob.glob(os.path.join(r, "lib*", so)))
                out += sorted(glob.glob(os.path.join(r, "targets", "*", "lib", so)))
    for p in sys.path:   # nvidia-cublas wheels: site-packages/nvidia/cublas/lib or nvidia/cu13/lib
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            for so in _SONAMES:
                out += sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib", so)))
    return out


class Blas:
    def __init__(self, lib, stream):
        self.lib = lib
        h = _c.c_void_p()
        t = time.perf_counter()
        rc = lib.cublasCreate_v2(_c.byref(h))
        if rc:
            raise OSError(f"cublasCreate_v2 status {rc}")
        self.handle = h
        rc = lib.cublasSetStream_v2(h, stream)
        if rc:
            raise OSError(f"cublasSetStream_v2 status {rc}")
        self.create_s = time.perf_counter() - t
        self._sgemm = lib.cublasSgemm_v2
        self._sgemm.argtypes = [_c.c_void_p, _c.c_int, _c.c_int, _c.c_int, _c.c_int, _c.c_int,
                                _c.c_void_p, _c.c_uint64, _c.c_int, _c.c_uint64, _c.c_int,
                                _c.c_void_p, _c.c_uint64, _c.c_int]
        # alpha / beta read from host memory (CUBLAS_POINTER_MODE_HOST, the default), kept alive here
        self._one, self._zero = _c.c_float(1.0), _c.c_float(0.0)

    def gemm_nt(self, x_ptr: int, w_ptr: int, out_ptr: int, T: int, n_out: int, n_in: int):
        """out (T, n_out) = x (T, n_in) @ w (n_out, n_in)^T, float32, on the backend's stream."""
        rc = self._sgemm(self.handle, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, _c.byref(self._one),
                         w_ptr, n_in, x_ptr, n_in, _c.byref(self._zero), out_ptr, n_out)
        if rc:
            from reflex.backends.cuda_driver import CudaError
            raise CudaError(f"cublasSgemm_v2 status {rc} (T={T}, n_out={n_out}, n_in={n_in})")


def get(stream) -> "Blas | None":
    """The process's cuBLAS handle bound to `stream`, loading the library on first use; None where
    it is disabled (REFLEX_CUDA_CUBLAS=0) or not installed."""
    global _blas
    if _blas is None:
        with _lock:
            if _blas is None:
                _blas = _load(stream)
    return _blas or None


def _load(stream):
    if os.environ.get("REFLEX_CUDA_CUBLAS", "1") == "0":
        return False
    t = time.perf_counter()
    for name in _candidates():
        try:
            lib = drv.load_library(name)   # GIL released: it may load on the context thread
        except OSError:
            continue
        try:
            b = Blas(lib, stream)
        except (OSError, AttributeError):
            return False
        b.path = name
        b.load_s = time.perf_counter() - t
        return b
    return False
