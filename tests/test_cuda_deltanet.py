"""CUDA Gated DeltaNet ops (kernels/deltanet.cu) against the NumPy reference ops (numpy_deltanet.py),
and the qwen35 fixture's recurrent cache on the CUDA backend.

The NumPy ops are themselves checked against transformers through the qwen35 parity fixture
(tests/test_models_parity.py; tests/test_cuda_models_parity.py runs that fixture on the GPU against
the same recording). Here: the GPU ops match NumPy to <= 1e-5 relative, including the state carried
across calls (prefill, then single steps), both head layouts (n_k_head < n_v_head, equal) and
d_k != d_v; the model's snapshot/restore fork and prefill == step decode hold on the GPU.
Skipped without a CUDA GPU or built kernels (CI has no GPU).
"""
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fixtures", "qwen35.gguf")


@pytest.fixture(scope="module")
def gb():
    from reflex.backends.cuda_backend import CudaBackend
    return CudaBackend()


@pytest.fixture(scope="module")
def nb():
    from reflex.backends.numpy_backend import NumpyBackend
    return NumpyBackend()


def rel(a, b):
    a = np.asarray(a, np.float64)
    assert np.all(np.isfinite(a)), "non-finite output"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_sigmoid_mul(gb, nb):
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((2, 7, 96)).astype(np.float32) * 4
    got = gb.to_numpy(gb.sigmoid_mul(gb.upload(x), gb.upload(g)))
    assert rel(got, nb.sigmoid_mul(x, g)) < 1e-6


@pytest.mark.parametrize("nk,nv,dk,dv", [(2, 4, 16, 16), (3, 3, 8, 24), (1, 2, 128, 128), (4, 8, 64, 32)])
def test_gated_delta_rule_matches_numpy_with_state(gb, nb, nk, nv, dk, dv):
    rng = np.random.default_rng(nk * 100 + nv * 10 + dk)
    T = 9
    qkv = rng.standard_normal((T, 2 * nk * dk + nv * dv)).astype(np.float32)
    alpha, beta = (2 * rng.standard_normal((2, T, nv))).astype(np.float32)
    A = -np.exp(rng.standard_normal(nv)).astype(np.float32)
    dtb = rng.standard_normal(nv).astype(np.float32)
    st_n, st_g = nb.ssm_state((nv, dk, dv)), gb.ssm_state((nv, dk, dv))
    Ag, dg = gb.upload(A), gb.upload(dtb)
    # prefill of 6 tokens, then 3 single steps: the state is carried across calls on both sides
    for a, b in ((0, 6), (6, 7), (7, 8), (8, 9)):
        ref = nb.gated_delta_rule(qkv[a:b], alpha[a:b], beta[a:b], A, dtb, st_n, nk, 1e-6)
        got = gb.gated_delta_rule(gb.upload(qkv[a:b]), gb.upload(alpha[a:b]), gb.upload(beta[a:b]), Ag, dg,
                                  st_g, nk, 1e-6)
        assert got.shape == (b - a, nv, dv)
        assert rel(gb.to_numpy(got), ref) < 1e-5
    assert rel(gb.to_numpy(st_g), st_n) < 1e-5


def test_gated_delta_rule_bad_shapes(gb):
    from reflex.errors import InvalidRequest

    st = gb.ssm_state((4, 16, 16))
    v = gb.upload(np.zeros(4, np.float32))
    with pytest.raises(InvalidRequest):
        gb.gated_delta_rule(gb.upload(np.zeros((2, 100), np.float32)), gb.upload(np.zeros((2, 4), np.float32)),
                            gb.upload(np.zeros((2, 4), np.float32)), v, v, st, 2, 1e-6)
    with pytest.raises(InvalidRequest):
        gb.gated_delta_rule(gb.upload(np.zeros((2, 128), np.float32)), gb.upload(np.zeros((2, 4), np.float32)),
                            gb.upload(np.zeros((2, 4), np.float32)), v, v, gb.zeros((4, 16, 16)), 2, 1e-6)


def test_state_copy_is_independent(gb):
    x = gb.upload(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = gb.state_copy(x)
    gb.ctx.memset0(x.ptr, x.nbytes)
    assert np.array_equal(gb.to_numpy(y), np.arange(12, dtype=np.float32).reshape(3, 4))


def test_qwen35_cuda_recurrent_cache(gb):
    """On the GPU: prefill == step decode, and snapshot / restore forks equal separate forwards
    (the recurrent states are device arrays; the fixture's logits vs transformers are checked by
    tests/test_cuda_models_parity.py)."""
    from reflex.models import load_model

    m = load_model(FIXTURE, gb)
    seq = [504, 3458, 282, 4649, 314, 253, 1345, 2345, 17, 902]
    full = m.forward(seq, m.new_cache(len(seq)))
    cache = m.new_cache(len(seq))
    steps = np.concatenate([m.forward([t], cache) for t in seq])
    assert rel(steps, full) < 2e-3
    ctx, a, b = seq[:5], seq[5:8], seq[8:]
    cache = m.new_cache(len(seq))
    m.forward(ctx, cache)
    snap = cache.snapshot()
    got_a = m.forward(a, cache)
    cache.restore(snap)
    got_b = m.forward(b, cache)
    assert rel(got_a, m.forward(ctx + a, m.new_cache(8))[5:]) < 2e-3
    assert rel(got_b, m.forward(ctx + b, m.new_cache(7))[5:]) < 2e-3
