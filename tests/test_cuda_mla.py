"""CUDA MLA ops (reflex/backends/cuda_mla.py, kernels/mla.cu) against the NumPy reference ops
(reflex/backends/numpy_mla.py, themselves checked against a decompressed multi-head attention in
tests/test_deepseek2.py), and the deepseek2 fixture on the CUDA backend against the recorded
transformers logits and greedy tokens (tests/data/deepseek2_ref_models.json).
Skipped cleanly where there is no CUDA GPU or the kernels are not built (CI has no GPU).
"""
import json
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

pytestmark = pytest.mark.skipif(
    not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()),
    reason="no CUDA GPU or kernels not built")

DATA = os.path.join(os.path.dirname(__file__), "data")


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


@pytest.mark.parametrize("T,n_past,H,R,P,masked", [
    (5, 4, 3, 10, 8, False),       # the fixture's shapes, prefill after a prefix
    (5, 4, 3, 10, 8, True),        # explicit tree-style mask
    (1, 300, 4, 512, 64, False),   # DeepSeek-V3's latent widths, decode over > 2 key chunks
    (37, 0, 2, 200, 16, False),    # prefill, R not a multiple of the block
])
def test_mla_attention(gb, nb, T, n_past, H, R, P, masked):
    rng = np.random.default_rng(T * 1000 + R)
    S, n_ctx = n_past + T, n_past + T + 3
    q_lat = rng.standard_normal((T, H, R)).astype(np.float32)
    q_pe = rng.standard_normal((T, H, P)).astype(np.float32)
    c = rng.standard_normal((n_ctx, 1, R)).astype(np.float16).astype(np.float32)   # as the f16 cache holds
    pe = rng.standard_normal((n_ctx, 1, P)).astype(np.float16).astype(np.float32)
    mask = None
    if masked:
        mask = rng.random((T, S)) < 0.5
        mask[:, 0] = True
    scale = 1.0 / np.sqrt(R + P) * 0.5
    want = nb.mla_attention(q_lat, q_pe, c, pe, n_past, scale, mask=mask)
    c_d, pe_d = gb.zeros((n_ctx, 1, R)), gb.zeros((n_ctx, 1, P))
    gb.kv_write(c_d, gb.upload(c), 0)
    gb.kv_write(pe_d, gb.upload(pe), 0)
    got = gb.to_numpy(gb.mla_attention(gb.upload(q_lat), gb.upload(q_pe), c_d, pe_d, n_past, scale, mask=mask))
    assert got.shape == want.shape
    assert rel(got, want) < 1e-4


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_freqs(gb, nb, mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 5, 63, 1000, 40000])
    inv = 10000.0 ** (-np.arange(0, 64, 2) / 64) / np.linspace(1.0, 40.0, 32)   # YaRN-like blend
    want = nb.rope_freqs(x, pos, inv, mode)
    got = gb.to_numpy(gb.rope_freqs(gb.upload(x), pos, inv, mode))
    assert rel(got, want) < 1e-5


def test_deepseek2_fixture_on_cuda(gb):
    """The whole model on the CUDA backend, unchanged: prompt logits vs the recorded transformers
    logits (relative 1e-2: f16 KV cache) and the recorded greedy tokens."""
    from reflex.models import load_model

    path = os.path.join(DATA, "fixtures", "deepseek2.gguf")
    with open(os.path.join(DATA, "deepseek2_ref_models.json")) as fh:
        ref = json.load(fh)
    model = load_model(path, gb)
    case = ref["cases"][0]
    ids = case["prompt_ids"]
    d = case["logits"]
    h = model.forward(ids, model.new_cache(len(ids)), output="hidden")
    ours = gb.to_numpy(gb.matmul(gb.upload(np.asarray(h)[d["rows"]]), model.output))
    err = max(float(np.max(np.abs(ours[r, d["top_ids"][r]] - np.array(d["top_values"][r]))))
              for r in range(len(d["rows"])))
    assert err / max(d["max_abs"]) < 1e-2
    cache = model.new_cache(len(ids) + len(case["greedy_ids"]))
    lg = model.forward(ids, cache, last_only=True)
    out = []
    for _ in range(len(case["greedy_ids"])):
        out.append(int(np.argmax(lg[-1])))
        lg = model.forward([out[-1]], cache)
    assert out == case["greedy_ids"]
