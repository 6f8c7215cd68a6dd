"""NumpyBackend(kv_f16=True): kv_write stores keys/values rounded to float16 (the CUDA backend's KV
storage precision), so CPU runs can reproduce the GPU's cache rounding; off by default.
The reference here is NumPy's own float16 cast (IEEE round-to-nearest-even), independent of the op."""
import os

import numpy as np
import pytest

from reflex.backends.numpy_backend import NumpyBackend

FIX = os.path.join(os.path.dirname(__file__), "data", "fixtures")


def _x(seed=0):
    # values with more mantissa bits than float16 keeps, incl. one that overflows float16's range
    x = np.random.default_rng(seed).standard_normal((3, 2, 8)).astype(np.float32)
    x[0, 0, 0] = 1.0 + 2.0 ** -13   # rounds to 1.0 in float16
    x[0, 0, 1] = 70000.0            # beyond float16's max: inf, as a float16 cache would hold
    return x


def test_kv_write_rounds_to_f16():
    b = NumpyBackend(kv_f16=True)
    x = _x()
    cache = b.zeros((5, 2, 8))
    with np.errstate(over="ignore"):
        b.kv_write(cache, x, 1)
    assert cache.dtype == np.float32
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(cache[1:4], want)
    assert cache[1, 0, 0] == 1.0 and np.isinf(cache[1, 0, 1])
    assert not np.any(cache[0]) and not np.any(cache[4])        # nothing outside the slots
    assert np.any(cache[1:4] != x)                              # rounding did happen


def test_default_unchanged(monkeypatch):
    monkeypatch.delenv("REFLEX_NUMPY_KV_F16", raising=False)
    b = NumpyBackend()
    assert b.kv_f16 is False
    x = _x()
    cache = b.zeros((5, 2, 8))
    b.kv_write(cache, x, 2)
    np.testing.assert_array_equal(cache[2:5], x)                # float32 bits kept exactly


@pytest.mark.parametrize("val,on", [("1", True), ("0", False), ("", False)])
def test_env(monkeypatch, val, on):
    monkeypatch.setenv("REFLEX_NUMPY_KV_F16", val)
    assert NumpyBackend().kv_f16 is on
    assert NumpyBackend(kv_f16=not on).kv_f16 is (not on)       # the argument wins over the env


def test_model_logits_move_only_with_kv_f16(monkeypatch):
    """Through a real model (qwen3 fixture): default logits are bit-identical to a fresh default
    backend's; kv_f16 moves them by float16-rounding amounts (nonzero, small)."""
    from reflex.models import load_model

    monkeypatch.delenv("REFLEX_NUMPY_KV_F16", raising=False)
    path = os.path.join(FIX, "qwen3.gguf")
    ids = [1, 504, 3458, 282, 4649, 314, 2]
    a = load_model(path, NumpyBackend())
    b = load_model(path, NumpyBackend())
    c = load_model(path, NumpyBackend(kv_f16=True))
    la = a.forward(ids, a.new_cache(len(ids)))
    lb = b.forward(ids, b.new_cache(len(ids)))
    lc = c.forward(ids, c.new_cache(len(ids)))
    np.testing.assert_array_equal(la, lb)
    rel = float(np.max(np.abs(lc - la)) / np.max(np.abs(la)))
    assert 0 < rel < 1e-2, rel
