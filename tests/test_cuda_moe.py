"""CUDA expert_matmul (MoE expert products) against a CPU reference, and qwen3moe on the CUDA backend.

References: the expert products against float64 products of the weights dequantized by
reflex.quants (itself checked bit for bit against the `gguf` package in tests/test_quants.py); the
qwen3moe fixture's prompt logits against the transformers outputs recorded by
scripts/make_model_refs.py (KV caches are float16 on the GPU, so 1e-2 relative here, not 1e-3).
Unselected experts hold NaN, so a product that read them (a wrong expert offset) fails.
Device-routed decode ops (moe_route, moe_ffn: kernels/moe.cu rx_moe_route / rx_moe_glu_* /
rx_moe_down_*) against the NumPy backend's ops, which are checked here on the CPU against a plain
per-token loop (float64, weights dequantized by reflex.quants); qwen3moe decode replayed from a
CUDA graph; and, on the CPU, the CUDA side's MoE launches through test_cuda_fusion_plumbing.py's
fake driver (kernels emulated from their headers). GPU tests skip cleanly where there is no CUDA GPU or the kernels are not built (CI has no GPU).
"""
import json
import os

import numpy as np
import pytest

from reflex.backends import cuda_driver

# GPU tests take the `gb` fixture, which skips without a GPU; the NumPy op tests run everywhere
NO_GPU = not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available())

HERE = os.path.dirname(os.path.abspath(__file__))
GGUF = os.path.join(HERE, "data", "fixtures", "qwen3moe.gguf")


@pytest.fixture(scope="module")
def gb():
    if NO_GPU:
        pytest.skip("no CUDA GPU or kernels not built")
    from reflex.backends.cuda_backend import CudaBackend
    return CudaBackend()


def _weight(t, n_expert, n_out, n_in, rng, nan_experts=()):
    """Raw bytes of a (n_expert, n_out, n_in) weight of type t (F16 or Q8_0), with NaN scales/values
    in `nan_experts`; returns (raw, float64 dequantized with NaN experts zeroed)."""
    from reflex.quants import dequantize
    x = rng.standard_normal((n_expert, n_out, n_in)).astype(np.float32)
    if t == 1:
        raw = x.astype(np.float16).view(np.uint8).reshape(n_expert, -1).copy()
    else:
        from reflex.quants import quantize
        raw = np.asarray(quantize(x.reshape(-1, n_in), t)).view(np.uint8).reshape(n_expert, -1).copy()
    ref = dequantize(raw.reshape(-1), t, (n_expert, n_out, n_in)).astype(np.float64)
    for e in nan_experts:
        raw[e] = 0xFF  # f16 0xFFFF is NaN; Q8_0's d field too
        ref[e] = 0.0
    return raw.reshape(-1), ref


@pytest.mark.parametrize("t", [1, 8])
@pytest.mark.parametrize("T", [1, 3, 24])
def test_expert_matmul(gb, t, T):
    rng = np.random.default_rng([7, t, T])
    n_expert, K, n_out, n_in = 8, 2, 96, 64
    ids = np.stack([rng.choice(6, K, replace=False) for _ in range(T)])   # experts 6, 7 never chosen
    raw, ref_w = _weight(t, n_expert, n_out, n_in, rng, nan_experts=(6, 7))
    w = gb.prepare_weight(raw, t, (n_expert, n_out, n_in))
    wt = rng.random((T, K)).astype(np.float32)
    x2 = rng.standard_normal((T, n_in)).astype(np.float32)
    x3 = rng.standard_normal((T, K, n_in)).astype(np.float32)
    ref2 = np.einsum("tkoi,ti->tko", ref_w[ids], x2)
    ref3 = np.einsum("tkoi,tki->tko", ref_w[ids], x3)

    def rel(a, b):
        assert np.all(np.isfinite(a)), "non-finite output: an unselected expert was read"
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    assert rel(gb.to_numpy(gb.expert_matmul(gb.upload(x2), w, ids)), ref2) <= 1e-5
    assert rel(gb.to_numpy(gb.expert_matmul(gb.upload(x3), w, ids)), ref3) <= 1e-5
    got = gb.to_numpy(gb.expert_matmul(gb.upload(x3), w, ids, wt))
    assert got.shape == (T, n_out)
    assert rel(got, (ref3 * wt[..., None]).sum(1)) <= 1e-5


def test_expert_matmul_errors(gb):
    from reflex.errors import InvalidRequest
    rng = np.random.default_rng(1)
    raw, _ = _weight(1, 4, 16, 32, rng)
    w = gb.prepare_weight(raw, 1, (4, 16, 32))
    x = gb.upload(rng.standard_normal((2, 32)).astype(np.float32))
    with pytest.raises(InvalidRequest, match="expert id"):
        gb.expert_matmul(x, w, np.array([[0, 4], [1, 2]]))
    with pytest.raises(InvalidRequest):
        gb.expert_matmul(x, w, np.array([0, 1]))


def test_qwen3moe_cuda_logits(gb):
    from reflex.models import load_model
    ref = json.load(open(os.path.join(HERE, "data", "qwen3moe_ref_models.json")))
    model = load_model(GGUF, gb)
    for case in ref["cases"][:3]:
        d = case["logits"]
        ours = gb.to_numpy(model.forward(case["prompt_ids"], model.new_cache(len(case["prompt_ids"])),
                                         output="raw"))[d["rows"]]
        err = max(np.max(np.abs(ours[r, d["top_ids"][r]] - np.array(d["top_values"][r])))
                  for r in range(len(d["rows"])))
        assert err / max(d["max_abs"]) < 1e-2
        # decode steps (T = 1: the matvec path on expert views) agree with the prefill
        cache = model.new_cache(len(case["prompt_ids"]))
        steps = np.concatenate([gb.to_numpy(model.forward([t], cache, output="raw"))
                                for t in case["prompt_ids"]])[d["rows"]]
        assert np.max(np.abs(steps - ours)) / max(d["max_abs"]) < 1e-2


# ---- moe_route / moe_ffn ------------------------------------------------------------------------

def _logits(rng, T, n_expert):
    """Router logits with exact ties (the lower id must win) and near ties (1e-3 apart)."""
    lg = rng.standard_normal((T, n_expert)).astype(np.float32)
    for t in range(T):
        a, b, c, d = rng.choice(n_expert, 4, replace=False)
        lg[t, b] = lg[t, a]                             # exact tie
        lg[t, d] = lg[t, c] + np.float32(1e-3)          # near tie
        lg[t, rng.integers(n_expert)] = lg[t].max()     # a tie at the top
    return lg


def _route_loop(lg, K, norm):
    """The routing written out per token: float64 softmax, experts sorted by (-p, id)."""
    ids, wts = [], []
    for row in lg.astype(np.float64):
        p = np.exp(row - row.max())
        p /= p.sum()
        sel = sorted(range(len(p)), key=lambda i: (-p[i], i))[:K]
        w = p[sel]
        ids.append(sel)
        wts.append(w / w.sum() if norm else w)
    return np.array(ids), np.array(wts)


def _expert_weight(t, n_expert, n_out, n_in, rng, nan_experts=()):
    """Raw GGUF bytes of a (n_expert, n_out, n_in) weight of type t; every byte of the experts in
    `nan_experts` is 0xFF, so their block scales (f16 0xFFFF) are NaN and reading them shows."""
    from reflex.quants import quantize
    x = rng.standard_normal((n_expert, n_out, n_in)).astype(np.float32)
    if t == 1:
        raw = x.astype(np.float16).view(np.uint8).reshape(n_expert, -1).copy()
    else:
        raw = np.asarray(quantize(x.reshape(-1, n_in), t)).view(np.uint8).reshape(n_expert, -1).copy()
    for e in nan_experts:
        raw[e] = 0xFF
    return raw.reshape(-1)


def _ffn_loop(x, wg, wu, wd, ids, wts):
    """out[t] = sum_k wts[t, k] * Wd[e] (silu(Wg[e] x[t]) * (Wu[e] x[t])), e = ids[t, k], in float64."""
    out = np.zeros((x.shape[0], wd.shape[1]))
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = ids[t, k]
            g, u = wg[e] @ x[t], wu[e] @ x[t]
            out[t] += wts[t, k] * (wd[e] @ (g / (1 + np.exp(-g)) * u))
    return out


def test_numpy_moe_route_matches_loop():
    from reflex.backends.numpy_backend import NumpyBackend
    b = NumpyBackend()
    rng = np.random.default_rng(3)
    for n_expert, K in ((8, 2), (128, 8), (5, 5)):
        lg = _logits(rng, 6, n_expert)
        for norm in (True, False):
            ids, wts = b.moe_route(lg, K, norm)
            assert ids.dtype == np.int32 and wts.dtype == np.float32 and ids.shape == wts.shape == (6, K)
            ref_ids, ref_w = _route_loop(lg, K, norm)
            assert np.array_equal(ids, ref_ids)
            assert np.max(np.abs(wts - ref_w)) <= 1e-6
    ids, _ = b.moe_route(np.zeros((1, 6), np.float32), 3)
    assert ids.tolist() == [[0, 1, 2]]  # all tied: the lowest ids


def test_numpy_moe_ffn_matches_loop():
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.quants import dequantize
    b = NumpyBackend()
    rng = np.random.default_rng(4)
    n_expert, n_ff, n_embd, T, K = 6, 64, 32, 5, 3
    raws = [(8, _expert_weight(8, n_expert, n_ff, n_embd, rng), (n_expert, n_ff, n_embd)),
            (8, _expert_weight(8, n_expert, n_ff, n_embd, rng), (n_expert, n_ff, n_embd)),
            (1, _expert_weight(1, n_expert, n_embd, n_ff, rng), (n_expert, n_embd, n_ff))]
    ws = [b.prepare_weight(r, t, s) for t, r, s in raws]
    ref_w = [dequantize(r, t, s).astype(np.float64) for t, r, s in raws]
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    ids, wts = b.moe_route(rng.standard_normal((T, n_expert)).astype(np.float32), K)
    got = b.moe_ffn(x, *ws, ids, wts)
    ref = _ffn_loop(x.astype(np.float64), *ref_w, ids, wts.astype(np.float64))
    assert got.shape == (T, n_embd)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 1e-5


@pytest.mark.parametrize("n_expert,K", [(8, 2), (8, 8), (128, 2), (128, 8)])
@pytest.mark.parametrize("T", [1, 4])
def test_moe_route_cuda(gb, n_expert, K, T):
    from reflex.backends.numpy_backend import NumpyBackend
    nb = NumpyBackend()
    rng = np.random.default_rng([n_expert, K, T])
    lg = _logits(rng, T, n_expert)
    for norm in (True, False):
        ids, wts = gb.moe_route(gb.upload(lg), K, norm)
        assert ids.dtype == "i32" and ids.shape == wts.shape == (T, K)
        ref_ids, ref_w = nb.moe_route(lg, K, norm)
        assert np.array_equal(ids.get(), ref_ids)
        got = wts.get()
        assert np.max(np.abs(got - ref_w)) <= 1e-5 * np.max(np.abs(ref_w))


def test_moe_route_cuda_errors(gb):
    from reflex.errors import InvalidRequest
    x = gb.upload(np.zeros((1, 8), np.float32))
    for k in (0, 9):
        with pytest.raises(InvalidRequest):
            gb.moe_route(x, k)
    # more experts than the kernel keeps in shared memory: routed on the host, same result
    lg = np.random.default_rng(0).standard_normal((2, 1500)).astype(np.float32)
    ids, wts = gb.moe_route(gb.upload(lg), 4)
    from reflex.backends.numpy_moe import route_ref
    ref_ids, ref_w = route_ref(lg, 4, True)
    assert np.array_equal(ids.get(), ref_ids) and np.allclose(wts.get(), ref_w, rtol=1e-6)


# (gate/up type, down type): Q4_K_M's pair (down Q6_K), Q4_K throughout, Q8_0, F16; and gate/up
# of different types (two plain products + rx_glu)
FFN_TYPES = [((12, 12), 14), ((12, 12), 12), ((8, 8), 8), ((1, 1), 1), ((12, 14), 8)]


@pytest.mark.parametrize("types", FFN_TYPES, ids=["q4k-q6k", "q4k", "q8_0", "f16", "q4k-q6k-mixed-gate-up"])
@pytest.mark.parametrize("n_expert,K", [(8, 2), (128, 8)])
@pytest.mark.parametrize("T", [1, 3])
def test_moe_ffn_cuda(gb, types, n_expert, K, T):
    """Device ids (from rx_moe_route and uploaded) against the NumPy backend's moe_ffn on the same
    bytes; two experts never chosen hold NaN, so a product that read them fails."""
    from reflex.backends.numpy_backend import NumpyBackend
    nb = NumpyBackend()
    (tg, tu), td = types
    rng = np.random.default_rng([n_expert, K, T, tg, tu, td])
    n_embd, n_ff = 256, 512
    unused = (n_expert - 2, n_expert - 1)
    raws = [(tg, _expert_weight(tg, n_expert, n_ff, n_embd, rng, unused), (n_expert, n_ff, n_embd)),
            (tu, _expert_weight(tu, n_expert, n_ff, n_embd, rng, unused), (n_expert, n_ff, n_embd)),
            (td, _expert_weight(td, n_expert, n_embd, n_ff, rng, unused), (n_expert, n_embd, n_ff))]
    gw = [gb.prepare_weight(r, t, s) for t, r, s in raws]
    nw = [nb.prepare_weight(r, t, s) for t, r, s in raws]
    assert gb.moe_capturable(*gw)
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    lg = _logits(rng, T, n_expert)
    lg[:, list(unused)] = -1e4                                        # never routed
    ids, wts = gb.moe_route(gb.upload(lg), K)
    ids_h, wts_h = ids.get(), wts.get()
    ref = nb.moe_ffn(x, *nw, ids_h, wts_h)
    assert np.all(np.isfinite(ref))

    def rel(a):
        assert a.shape == ref.shape and np.all(np.isfinite(a)), "non-finite output: an unselected expert was read"
        return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))

    assert rel(gb.to_numpy(gb.moe_ffn(gb.upload(x), *gw, ids, wts))) <= 1e-5      # device ids
    assert rel(gb.to_numpy(gb.moe_ffn(gb.upload(x), *gw, ids_h, wts_h))) <= 1e-5  # host ids, uploaded


def test_moe_ffn_cuda_prefill(gb):
    """More rows than the decode kernels take: the host path (expert_matmul) gives the same result."""
    from reflex.backends.cuda_backend import MATVEC_MAX_T
    from reflex.backends.numpy_backend import NumpyBackend
    nb = NumpyBackend()
    rng = np.random.default_rng(11)
    n_expert, n_ff, n_embd, K, T = 16, 256, 256, 4, MATVEC_MAX_T + 5
    raws = [(12, _expert_weight(12, n_expert, n_ff, n_embd, rng), (n_expert, n_ff, n_embd)),
            (12, _expert_weight(12, n_expert, n_ff, n_embd, rng), (n_expert, n_ff, n_embd)),
            (14, _expert_weight(14, n_expert, n_embd, n_ff, rng), (n_expert, n_embd, n_ff))]
    gw = [gb.prepare_weight(r, t, s) for t, r, s in raws]
    nw = [nb.prepare_weight(r, t, s) for t, r, s in raws]
    x = rng.standard_normal((T, n_embd)).astype(np.float32)
    ids, wts = gb.moe_route(gb.upload(_logits(rng, T, n_expert)), K)
    ref = nb.moe_ffn(x, *nw, ids.get(), wts.get())
    got = gb.to_numpy(gb.moe_ffn(gb.upload(x), *gw, ids, wts))
    assert float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) <= 1e-4  # f32 GEMM over dequantized experts


def test_qwen3moe_cuda_graph_decode(gb):
    """Decode replayed from a CUDA graph (routing and experts on the device) gives the eager decode's
    tokens, and the transformers greedy tokens for the first steps (f16 KV flips one case at step 16)."""
    from reflex.backends.cuda_backend import GreedyDecoder
    from reflex.models import load_model
    ref = json.load(open(os.path.join(HERE, "data", "qwen3moe_ref_models.json")))
    model = load_model(GGUF, gb)
    assert model.graph_capturable
    n = 12
    for case in ref["cases"][:3]:
        ids = case["prompt_ids"]
        runs = []
        for use_graph in (True, False):
            dec = GreedyDecoder(gb, model, model.new_cache(len(ids) + n + 1), use_graph=use_graph)
            toks = [dec.prefill(ids)]
            while len(toks) < n:
                toks.append(dec.step(toks[-1]))
            runs.append(toks)
            if use_graph:
                assert dec.graph is not None
        assert runs[0] == runs[1]
        assert runs[0][:8] == case["greedy_ids"][:8]


# ---- the CUDA side's Python plumbing on the CPU (no GPU) ----------------------------------------
# tests/test_cuda_fusion_plumbing.py's fake driver runs each launch as a NumPy emulation of its
# kernel's header; here it also emulates kernels/moe.cu's three decode kernels (as their header
# says), so the launch arguments of moe_route / moe_ffn and the captured-step path are checked in CI.

def _plumbing():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_fusion_plumbing", os.path.join(HERE, "test_cuda_fusion_plumbing.py"))
    fp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fp)
    return fp


def _moe_emulate(fp, name, grid, a):
    """kernels/moe.cu's decode kernels in NumPy (float64), from the header; False for other kernels."""
    from reflex.backends.numpy_moe import route_ref
    if name == "rx_moe_route":
        L, ids, wts, ne, K, norm = a
        T = grid[0]
        i, w = route_ref(fp.f32(L, T * ne).reshape(T, ne), K, norm)
        fp.i32(ids, T * K)[:] = i.reshape(-1)
        fp.f32(wts, T * K)[:] = w.reshape(-1)
    elif name.startswith("rx_moe_glu_"):
        suf = name[len("rx_moe_glu_"):]
        wg, wu, X, ids, h, nf, ni, K, ne, eb, op = a
        assert grid == ((nf + 3) // 4, K, grid[2]) and op == 0
        for t in range(grid[2]):
            x = fp.f32(X + 4 * t * ni, ni).astype(np.float64)
            for k in range(K):
                e = int(fp.i32(ids + 4 * (t * K + k), 1)[0])
                assert 0 <= e < ne
                g = fp.W(wg + e * eb, suf, nf, ni) @ x
                if wu:
                    g = g / (1 + np.exp(-g)) * (fp.W(wu + e * eb, suf, nf, ni) @ x)
                fp.f32(h + 4 * (t * K + k) * nf, nf)[:] = g
    elif name.startswith("rx_moe_down_"):
        suf = name[len("rx_moe_down_"):]
        wd, h, ids, wts, y, n_embd, nf, K, ne, eb = a
        assert grid[0] == (n_embd + 3) // 4
        for t in range(grid[1]):
            acc = np.zeros(n_embd)
            for k in range(K):
                s = t * K + k
                e = int(fp.i32(ids + 4 * s, 1)[0])
                acc += float(fp.f32(wts + 4 * s, 1)[0]) * (fp.W(wd + e * eb, suf, n_embd, nf) @ fp.f32(h + 4 * s * nf, nf))
            fp.f32(y + 4 * t * n_embd, n_embd)[:] = acc
    else:
        return False
    return True


@pytest.fixture()
def fake_moe_device(monkeypatch):
    fp = _plumbing()
    fp.MEM = np.zeros(64 << 20, np.uint8)
    ctx = fp.Ctx()
    base_call = fp.K.__call__

    def call(self, grid, block, *a, shmem=0):
        if _moe_emulate(fp, self.name, grid, a):
            self.ctx.log.append(self.name)
            return None
        return base_call(self, grid, block, *a, shmem=shmem)

    monkeypatch.setattr(fp.K, "__call__", call)
    monkeypatch.setattr(cuda_driver, "get", lambda fatbin=None: ctx)
    yield ctx
    fp.MEM = None


@pytest.mark.parametrize("fuse", [0, 2, 3])
def test_qwen3moe_cuda_plumbing_on_cpu(fake_moe_device, fuse):
    """The fixture through CudaBackend on the fake device: prefill (T = 6), eager decode and a step
    run the captured way (token and position from the device state) give the NumPy backend's
    logits, with routing and experts in 3 launches per layer and no host read of the ids."""
    from reflex.backends.cuda_backend import CudaBackend
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.models import load_model
    cm = load_model(GGUF, NumpyBackend())
    b = CudaBackend()
    b.fuse = fuse
    m = load_model(GGUF, b)
    assert m.graph_capturable and not cm.graph_capturable
    ids = [5, 17, 99, 3, 250, 11]
    cc, c = cm.new_cache(16), m.new_cache(16)
    ref = [cm.forward(ids, cc, last_only=True)[-1]] + [cm.forward([t], cc, last_only=True)[-1] for t in (7, 8, 9)]
    out = [b.to_numpy(m.forward(ids, c, last_only=True, output="raw")).reshape(-1),
           b.to_numpy(m.forward([7], c, last_only=True, output="raw")).reshape(-1)]
    fake_moe_device.log.clear()
    b.ctx.h2d(b._state.ptr, np.array([8, c.n], np.int32).ctypes.data, 8)
    b.capturing = True
    try:
        lg = m.forward([8], c, last_only=True, output="raw")
    finally:
        b.capturing = False
    log = list(fake_moe_device.log)
    n_layer = m.hp.n_layer
    assert [log.count(k) for k in ("rx_moe_route", "rx_moe_glu_f16", "rx_moe_down_f16")] == [n_layer] * 3, log
    out.append(b.to_numpy(lg).reshape(-1))
    out.append(b.to_numpy(m.forward([9], c, last_only=True, output="raw")).reshape(-1))
    for o, r in zip(out, ref):
        assert np.abs(o - r).max() <= 2e-3 * np.abs(r).max()  # float16 KV cache against float32
