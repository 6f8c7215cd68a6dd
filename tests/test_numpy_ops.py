"""NumPy backend ops against float64 formulas written out here (math.erf, the textbook softmax
attention), including the fast paths: GELU's sign-free form with a fused bias and in place,
the in-place (add +) layer norm, and attention's skipped max shift (taken only under a score
bound) next to the shifted path for large scores."""
import math

import numpy as np
import pytest

from reflex.backends.base import Backend
from reflex.backends.numpy_backend import NumpyBackend, _gelu_erf

B = NumpyBackend()


def gelu64(x):
    x = np.asarray(x, np.float64)
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def test_gelu_matches_erf_over_range():
    x = np.linspace(-12, 12, 100_003).astype(np.float32)
    assert np.abs(_gelu_erf(x) - gelu64(x)).max() < 1e-6
    assert _gelu_erf(np.array([0.0], np.float32))[0] == 0.0


@pytest.mark.parametrize("shape", [(1, 7), (3, 1536), (50, 1536), (200_000,)])
def test_gelu_bias_and_in_place(shape):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    bias = (rng.standard_normal(shape[-1]) * 2).astype(np.float32)
    ref = gelu64(x.astype(np.float64) + bias)
    out = _gelu_erf(x, bias=bias)
    assert np.abs(out - ref).max() < 2e-6
    y = x.copy()
    r = _gelu_erf(y, out=y, bias=bias)
    assert r is y and np.abs(y - ref).max() < 2e-6


def test_linear_and_linear_gelu():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, 24)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)          # (n_out, n_in)
    bias = rng.standard_normal(40).astype(np.float32)
    lin64 = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    assert np.abs(B.linear(x, w, bias) - lin64).max() < 1e-4
    assert np.abs(B.linear(x, w) - (lin64 - bias)).max() < 1e-4
    assert np.abs(B.linear_gelu(x, w, bias) - gelu64(lin64)).max() < 1e-4
    # the base class's composition (what the CUDA backend inherits) gives the same values
    assert np.abs(Backend.linear_gelu(B, x, w, bias) - B.linear_gelu(x, w, bias)).max() < 1e-5
    assert np.abs(Backend.linear(B, x, w, bias) - B.linear(x, w, bias)).max() == 0.0


def ln64(x, w, b, eps):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def test_layer_norm_and_add_layer_norm():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((33, 384)) * 5 + 2).astype(np.float32)
    r = rng.standard_normal((33, 384)).astype(np.float32)
    w = rng.random(384).astype(np.float32)
    b = rng.standard_normal(384).astype(np.float32)
    x0, r0 = x.copy(), r.copy()
    assert np.abs(B.layer_norm(x, w, b, 1e-12) - ln64(x, w, b, 1e-12)).max() < 5e-6
    assert np.abs(B.add_layer_norm(x, r, w, b, 1e-5) - ln64(x.astype(np.float64) + r, w, b, 1e-5)).max() < 5e-6
    assert np.abs(B.layer_norm(x, None, None, 1e-6) - ln64(x, 1.0, 0.0, 1e-6)).max() < 5e-6
    assert np.array_equal(x, x0) and np.array_equal(r, r0)     # inputs untouched


def attention64(q, k, v, n_past, scale, visible):
    T, H, d = q.shape
    n_kv = k.shape[1]
    g = H // n_kv
    S = n_past + T
    out = np.zeros((T, H, d))
    for h in range(H):
        s = q[:, h].astype(np.float64) @ k[:S, h // g].astype(np.float64).T * scale   # (T, S)
        s = np.where(visible, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (s / s.sum(-1, keepdims=True)) @ v[:S, h // g]
    return out


@pytest.mark.parametrize("amp", [0.3, 12.0])            # bounded scores (shift skipped) / large ones
@pytest.mark.parametrize("case", ["bidir", "causal", "window", "mask", "past"])
def test_attention_against_float64(case, amp):
    rng = np.random.default_rng(4)
    T, H, n_kv, d, n_past = 40, 6, 2, 16, (23 if case == "past" else 0)
    S = n_past + T
    q = (rng.standard_normal((T, H, d)) * amp).astype(np.float32)
    k = (rng.standard_normal((S, n_kv, d)) * amp).astype(np.float32)
    v = rng.standard_normal((S, n_kv, d)).astype(np.float32)
    scale = 1.0 / math.sqrt(d)
    qpos, kpos = n_past + np.arange(T)[:, None], np.arange(S)[None, :]
    kw, visible = {}, np.ones((T, S), bool)
    if case == "bidir":
        kw["causal"] = False
    elif case in ("causal", "past"):
        visible = kpos <= qpos
    elif case == "window":
        kw["window"] = 7
        visible = (kpos <= qpos) & (qpos - kpos < 7)
    elif case == "mask":
        visible = rng.random((T, S)) < 0.5
        visible[np.arange(T), np.arange(T)] = True
        kw["mask"] = visible
    got = B.attention(q, k, v, n_past, scale, **kw)
    ref = attention64(q, k, v, n_past, scale, visible)
    if amp > 1:   # scores far above the skip bound: the shifted path must still be exact
        assert (q.astype(np.float64) ** 2).sum(-1).max() * (k.astype(np.float64) ** 2).sum(-1).max() \
            * scale ** 2 > 64.0 ** 2
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
