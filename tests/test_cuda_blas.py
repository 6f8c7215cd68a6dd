"""cuBLAS prefill products (reflex/backends/cuda_blas.py) against the float64 product of the
`gguf`-independent reference dequantization (reflex.quants, itself checked bit for bit against the
`gguf` package in tests/test_quants*.py), and against our own rx_sgemm_nt fallback.
Skipped where there is no CUDA GPU or the kernels are not built (CI has no GPU); the cuBLAS cases
skip where libcublas is not installed (the backend then keeps rx_sgemm_nt, tested in
tests/test_cuda_kernels.py)."""
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def gb():
    from reflex.backends.cuda_backend import CudaBackend
    b = CudaBackend()
    if b._blas() is None:
        pytest.skip("libcublas not found: prefill keeps rx_sgemm_nt")
    return b


@pytest.mark.parametrize("t,n_out,n_in,T", [(12, 1000, 1024, 65), (14, 333, 512, 130), (8, 64, 96, 512),
                                            (0, 129, 40, 77), (1, 200, 72, 100)])
def test_cublas_matmul(gb, t, n_out, n_in, T):
    """T >= CUBLAS_MIN_T rows (cuBLAS from there); ragged shapes (n_out, T not multiples of any tile), F32 weights used in place, block formats
    through the float32 scratch: float32 accuracy (1e-5), and equal to rx_sgemm_nt within 1e-5."""
    from reflex.quants import dequantize, quantize
    rng = np.random.default_rng([t, n_out, T])
    wf = rng.standard_normal((n_out, n_in)).astype(np.float32)
    raw = quantize(wf, t).reshape(-1) if t else wf.view(np.uint8).reshape(-1)
    w = gb.prepare_weight(raw, t, (n_out, n_in))
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    got = gb.to_numpy(gb.matmul(gb.upload(x), w))
    ref = x.astype(np.float64) @ dequantize(raw, t, (n_out, n_in)).astype(np.float64).T
    assert got.shape == (T, n_out)
    assert rel(got, ref) <= 1e-5
    keep, gb._blas_h = gb._blas_h, False     # force the hand-written fallback
    try:
        alt = gb.to_numpy(gb.matmul(gb.upload(x), w))
    finally:
        gb._blas_h = keep
    assert rel(alt, got) <= 1e-5
    assert gb.timings["cublas_load_s"] > 0
