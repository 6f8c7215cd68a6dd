"""CUDA ssm ops (kernels/ssm.cu) against the NumPy reference ops (numpy_ssm.py), on random inputs.

The NumPy ops are themselves checked against transformers (through the granitehybrid parity
fixture, tests/test_models_parity.py); here the GPU must match them to <= 1e-5 relative, including
the carried state across calls (prefill then single steps). Skipped without a CUDA GPU or kernels.
"""
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")


@pytest.fixture(scope="module")
def gb():
    from reflex.backends.cuda_backend import CudaBackend
    return CudaBackend()


@pytest.fixture(scope="module")
def nb():
    from reflex.backends.numpy_backend import NumpyBackend
    return NumpyBackend()


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


@pytest.mark.parametrize("C,K,bias", [(96, 4, True), (300, 4, False), (64, 2, True)])
def test_ssm_conv_matches_numpy_with_state(gb, nb, C, K, bias):
    rng = np.random.default_rng(C + K)
    w = rng.standard_normal((C, K)).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32) if bias else None
    st_n = nb.ssm_state((K - 1, C))
    st_g = gb.ssm_state((K - 1, C))
    wg = gb.prepare_weight(w.view(np.uint8), 0, (C, K))
    bg = gb.prepare_weight(b.view(np.uint8), 0, (C,)) if bias else None
    for T in (7, 1, 1, 3):   # prefill, then steps: the state carries over
        x = rng.standard_normal((T, C)).astype(np.float32)
        ref = nb.ssm_conv(x, st_n, w, b)
        out = gb.ssm_conv(x, st_g, wg, bg)
        assert rel(gb.to_numpy(out), ref) < 1e-5
        assert rel(gb.to_numpy(st_g), st_n) < 1e-6


@pytest.mark.parametrize("n_head,head_dim,d_state,n_group", [(4, 16, 8, 1), (8, 32, 16, 2)])
def test_ssm_scan_matches_numpy_with_state(gb, nb, n_head, head_dim, d_state, n_group):
    rng = np.random.default_rng(n_head * d_state)
    ld = n_head * head_dim + 2 * n_group * d_state
    A = -np.exp(rng.standard_normal(n_head)).astype(np.float32)
    D = rng.standard_normal(n_head).astype(np.float32)
    dtb = rng.standard_normal(n_head).astype(np.float32)
    Ag, Dg, bg = (gb.prepare_weight(v.view(np.uint8), 0, (n_head,)) for v in (A, D, dtb))
    st_n = nb.ssm_state((n_head, head_dim, d_state))
    st_g = gb.ssm_state((n_head, head_dim, d_state))
    for T in (6, 1, 1):
        xbc = rng.standard_normal((T, ld)).astype(np.float32)
        dt = (rng.standard_normal((T, n_head)) * 3).astype(np.float32)   # both softplus branches
        dt[0, 0] = 25.0
        ref = nb.ssm_scan(xbc, dt, st_n, A, D, dtb, n_group)
        out = gb.ssm_scan(xbc, dt, st_g, Ag, Dg, bg, n_group)
        assert np.abs(ref).max() > 0
        assert rel(gb.to_numpy(out), ref) < 1e-5
        assert rel(gb.to_numpy(st_g), st_n) < 1e-5


def test_granitehybrid_model_on_cuda_matches_numpy():
    """The whole granitehybrid fixture (Mamba-2 + attention + MoE) on the CUDA backend, unchanged model
    code: prompt logits within 1e-3 relative of the NumPy backend (itself checked against
    transformers by the parity runner), 8 greedy tokens identical, and snapshot/restore on device."""
    from reflex.models import load_model

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fixtures", "granitehybrid.gguf")
    mn, mg = load_model(path, "numpy"), load_model(path, "cuda")
    ids = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30]
    ln = mn.forward(ids, mn.new_cache(32))
    cg = mg.new_cache(32)
    lg = mg.forward(ids, cg)
    assert float(np.max(np.abs(lg - ln)) / np.max(np.abs(ln))) < 1e-3
    snap = cg.snapshot()
    outs = []
    for model, cache, last in ((mn, mn.new_cache(32), None), (mg, cg, lg)):
        if last is None:
            last = model.forward(ids, cache)
        out = []
        for _ in range(8):
            out.append(int(np.argmax(last[-1])))
            last = model.forward([out[-1]], cache)
        outs.append(out)
    assert outs[0] == outs[1]
    cg.restore(snap)
    again = mg.forward([outs[1][0]], cg)
    ref = mn.forward(ids + [outs[1][0]], mn.new_cache(32))[-1:]
    assert float(np.max(np.abs(again - ref)) / np.max(np.abs(ref))) < 1e-3
