"""The CUDA backend's Python side -- deferred ops, fusion grouping (REFLEX_CUDA_FUSE levels 0, 1,
2), argument order of every launch, the captured-step path reading the device state -- run on
the CPU: a fake driver executes each kernel launch with a NumPy emulation of what the kernel's
header says it computes, and whole synthetic models (llama, qwen3, gemma3) must give the NumPy
backend's logits. The CUDA code itself is not exercised (tests/test_cuda_kernels.py and
test_cuda_model.py do that on a GPU); this runs in CI without one. Needs the smollm2 vocab
($REFLEX_VOCAB_GGUF or the store), else skips.
"""
import ctypes
import importlib

import numpy as np
import pytest

from reflex.backends import cuda_driver as drv
from reflex.quants import dequantize

MEM = None  # the fake device memory (allocated by the fixture)

def f32(p, n): return MEM[p:p + 4 * n].view(np.float32)
def f16(p, n): return MEM[p:p + 2 * n].view(np.float16)
def i32(p, n): return MEM[p:p + 4 * n].view(np.int32)
def f64(p, n): return MEM[p:p + 8 * n].view(np.float64)

from reflex.backends.cuda_backend import TYPES  # noqa: E402
SUF = {v[0]: (k, v[1], v[2]) for k, v in TYPES.items()}

def W(p, suf, n_out, n_in):
    t, qk, ts = SUF[suf]
    nb = n_out * n_in // qk * ts
    return dequantize(MEM[p:p + nb].copy(), t, (n_out, n_in)).astype(np.float64)

def rms(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y

def rope_rows(xr, p, invf, n_rot, mode):
    y = xr.astype(np.float32).copy()
    half = n_rot // 2
    a = p * invf[:half]
    c, s = np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)
    i = np.arange(half)
    i0, i1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + half)
    x0, x1 = xr[..., i0].copy(), xr[..., i1].copy()
    y[..., i0] = x0 * c - x1 * s
    y[..., i1] = x0 * s + x1 * c
    return y

class K:
    def __init__(self, ctx, name, sig): self.name, self.ctx = name, ctx
    def __call__(self, grid, block, *a, shmem=0):
        n = self.name
        self.ctx.log.append(n)
        gx, gy, gz = grid
        if n.startswith("rx_get_rows_"):
            w, ids, out, n_in = a
            for r in range(gy):
                tok = int(i32(ids + 4 * r, 1)[0])
                t, qk, ts = SUF[n[12:]]
                rb = n_in // qk * ts
                f32(out + 4 * r * n_in, n_in)[:] = dequantize(MEM[w + tok * rb: w + (tok + 1) * rb].copy(), t, (1, n_in))[0]
        elif n.startswith("rx_matvec3n_") or n.startswith("rx_matvec3_") or n.startswith("rx_matvec_glu"):
            T = gy
            if n.startswith("rx_matvec3n_"):
                suf = n[12:]
                w0, w1, w2, A, B, nw, eps, s, y0, y1, y2, n0, n1, n2, n_in = a
                xa = f32(A, T * n_in).reshape(T, n_in).astype(np.float64)
                if B: xa = (f32(A, T * n_in) + f32(B, T * n_in)).reshape(T, n_in).astype(np.float64)
                if s: f32(s, T * n_in)[:] = xa.reshape(-1)
                x = rms(xa, f32(nw, n_in) if nw else None, eps)
                for w, y, no in ((w0, y0, n0), (w1, y1, n1), (w2, y2, n2)):
                    if no: f32(y, T * no)[:] = (x @ W(w, suf, no, n_in).T).reshape(-1)
            elif n.startswith("rx_matvec3_"):
                suf = n[11:]
                w0, w1, w2, X, y0, y1, y2, n0, n1, n2, n_in = a
                x = f32(X, T * n_in).reshape(T, n_in).astype(np.float64)
                for w, y, no in ((w0, y0, n0), (w1, y1, n1), (w2, y2, n2)):
                    if no: f32(y, T * no)[:] = (x @ W(w, suf, no, n_in).T).reshape(-1)
            else:
                if n.startswith("rx_matvec_glun_"):
                    suf = n[15:]
                    wg, wu, A, B, nw, eps, s, y, n_out, n_in, op = a
                    xa = f32(A, T * n_in).astype(np.float64)
                    if B: xa = xa + f32(B, T * n_in)
                    xa = xa.reshape(T, n_in)
                    if s: f32(s, T * n_in)[:] = xa.reshape(-1)
                    x = rms(xa, f32(nw, n_in) if nw else None, eps)
                else:
                    suf = n[14:]
                    wg, wu, X, y, n_out, n_in, op = a
                    x = f32(X, T * n_in).reshape(T, n_in).astype(np.float64)
                g = x @ W(wg, suf, n_out, n_in).T
                u = x @ W(wu, suf, n_out, n_in).T
                act = g / (1 + np.exp(-g)) if op == 0 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
                f32(y, T * n_out)[:] = (act * u).reshape(-1)
        elif n.startswith("rx_matvec_"):
            w, X, y, n_out, n_in = a
            x = f32(X, gy * n_in).reshape(gy, n_in).astype(np.float64)
            f32(y, gy * n_out)[:] = (x @ W(w, n[10:], n_out, n_in).T).reshape(-1)
        elif n == "rx_rms_norm":
            X, w, y, nn, eps = a
            f32(y, gx * nn)[:] = rms(f32(X, gx * nn).reshape(gx, nn), f32(w, nn) if w else None, eps).reshape(-1)
        elif n == "rx_add_rms_norm":
            X, R, s, w, y, nn, eps = a
            v = f32(X, gx * nn) + f32(R, gx * nn)
            f32(s, gx * nn)[:] = v
            f32(y, gx * nn)[:] = rms(v.reshape(gx, nn), f32(w, nn) if w else None, eps).reshape(-1)
        elif n == "rx_rope":
            x, y, x2, y2, nh2, pos, invf, nh, hd, n_rot, mode, dyn = a
            T = gx // (nh + nh2)
            ps = [int(i32(dyn, 1)[0]) + t for t in range(T)] if dyn else list(i32(pos, T))
            for X, Y, h in ((x, y, nh), (x2, y2, nh2)):
                if not h: continue
                xr = f32(X, T * h * hd).reshape(T, h, hd)
                out = np.stack([rope_rows(xr[t], ps[t], f64(invf, n_rot // 2), n_rot, mode) for t in range(T)])
                f32(Y, T * h * hd)[:] = out.reshape(-1)
        elif n == "rx_norm_rope_kv":
            (x, y, w, x2, y2, w2, nh2, pos, invf, nh, hd, n_rot, mode, dyn, norm, eps, eps2, kc, v, vc, start,
             kvdyn) = a
            T = gx // (nh + nh2)
            ps = [int(i32(dyn, 1)[0]) + t for t in range(T)] if dyn else list(i32(pos, T))
            for j, (X, Y, Wt, h, e) in enumerate(((x, y, w, nh, eps), (x2, y2, w2, nh2, eps2))):
                if not h: continue
                xr = f32(X, T * h * hd).reshape(T, h, hd).astype(np.float64)
                if (norm >> j) & 1: xr = rms(xr, f32(Wt, hd) if Wt else None, e)
                xr = xr.astype(np.float32)
                out = np.stack([rope_rows(xr[t], ps[t], f64(invf, n_rot // 2), n_rot, mode) for t in range(T)])
                f32(Y, T * h * hd)[:] = out.reshape(-1)
                if j == 0 and kc:
                    st = int(i32(kvdyn, 1)[0]) if kvdyn else start
                    f16(kc + 2 * st * h * hd, T * h * hd)[:] = out.reshape(-1)
                    if vc: f16(vc + 2 * st * h * hd, T * h * hd)[:] = f32(v, T * h * hd)
        elif n == "rx_kv_write":
            c, x, c2, x2, nn, row, start, dyn = a
            st = int(i32(dyn, 1)[0]) if dyn else start
            f16(c + 2 * st * row, nn)[:] = f32(x, nn)
            if c2: f16(c2 + 2 * st * row, nn)[:] = f32(x2, nn)
        elif n == "rx_attention":
            q, k, v, o, part, mask, nh, nkv, d, n_past, dyn, scale, window, causal, chunk, S_mask = a
            assert not mask
            if dyn: n_past = int(i32(dyn, 1)[0])
            T = gx // nh
            S = n_past + T
            Q = f32(q, T * nh * d).reshape(T, nh, d).astype(np.float64)
            Kc = f16(k, S * nkv * d).reshape(S, nkv, d).astype(np.float64)
            Vc = f16(v, S * nkv * d).reshape(S, nkv, d).astype(np.float64)
            out = np.zeros((T, nh, d))
            for t in range(T):
                for h in range(nh):
                    kh = h // (nh // nkv)
                    jmax = n_past + t + 1 if causal else S
                    jlo = max(0, n_past + t - window + 1) if window > 0 else 0
                    sc = Kc[jlo:jmax, kh] @ Q[t, h] * scale
                    p = np.exp(sc - sc.max()); p /= p.sum()
                    out[t, h] = p @ Vc[jlo:jmax, kh]
            f32(o, T * nh * d)[:] = out.reshape(-1)
        elif n == "rx_attn_combine":
            pass  # rx_attention above wrote o in full
        elif n.startswith("rx_attention_dec_"):  # kernels/attention.cu: the T = 1 decode kernel
            q, k, v, o, part, cnt, nh, nkv, d, gb, n_past, dyn, scale, window, min_chunk = a
            if dyn: n_past = int(i32(dyn, 1)[0])
            G = nh // nkv
            assert 1 <= gb <= G and gx == nkv * -(-G // gb) and gy >= 1 and min_chunk > 0
            S = n_past + 1
            Q = f32(q, nh * d).reshape(nh, d).astype(np.float64)
            Kc = f16(k, S * nkv * d).reshape(S, nkv, d).astype(np.float64)
            Vc = f16(v, S * nkv * d).reshape(S, nkv, d).astype(np.float64)
            jlo = max(0, n_past - window + 1) if window > 0 else 0
            out = np.zeros((nh, d))
            for h in range(nh):
                sc = Kc[jlo:S, h // G] @ Q[h] * scale
                p = np.exp(sc - sc.max()); p /= p.sum()
                out[h] = p @ Vc[jlo:S, h // G]
            f32(o, nh * d)[:] = out.reshape(-1)
        elif n == "rx_binary":
            A, B, out, nn, nb, op, sc = a
            x = f32(A, nn)
            b = np.tile(f32(B, nb), nn // nb) if B else np.float32(sc)
            f32(out, nn)[:] = x + b if op == 0 else x * b
        elif n == "rx_unary":
            X, out, nn, op = a
            g = f32(X, nn).astype(np.float64)
            f32(out, nn)[:] = g / (1 + np.exp(-g)) if op == 0 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
        elif n == "rx_glu":
            G, U, out, nn, op = a
            g = f32(G, nn).astype(np.float64)
            act = g / (1 + np.exp(-g)) if op == 0 else 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
            f32(out, nn)[:] = act * f32(U, nn)
        elif n == "rx_moe_combine":   # kernels/moe.cu header
            Y, pos, wts, out, T, Kk, n_out = a
            for t in range(T):
                acc = np.zeros(n_out, np.float64)
                for k in range(Kk):
                    s = t * Kk + k
                    acc += float(f32(wts + 4 * s, 1)[0]) * f32(Y + 4 * n_out * int(i32(pos + 4 * s, 1)[0]), n_out)
                f32(out + 4 * n_out * t, n_out)[:] = acc
        elif n == "rx_repeat_penalty":  # kernels/sample.cu header
            x, ring, n_ring, nn, pen = a
            row = f32(x, nn)
            seen = set()
            for i in range(n_ring):
                t = int(i32(ring + 4 * (1 + i), 1)[0])
                if 0 <= t < nn and t not in seen:
                    seen.add(t)
                    v = row[t]
                    row[t] = np.float32(v / np.float32(pen)) if v > 0 else np.float32(v * np.float32(pen))
        elif n == "rx_ring_push":
            ring, n_ring, tok = a
            r = i32(ring, 1 + n_ring)
            r[1 + r[0] % n_ring] = i32(tok, 1)[0]
            r[0] += 1
        elif n == "rx_argmax":
            row, nn, out, state, amax = a
            tok = int(np.argmax(f32(row, nn)))
            i32(out, 1)[0] = tok
            if state:
                st = i32(state, 2); st[0] = tok; st[1] += 1
        else:
            raise NotImplementedError(n)

class Ctx:
    cc = (9, 0); sm_count = 132; timings = {}
    def __init__(self): self.log = []; self.top = 4096; self.allocated = self.peak_allocated = 0
    def pool_get(self, nb):
        p = self.top; self.top += (nb + 255) // 256 * 256 + 256
        assert self.top < MEM.size
        return p, 0
    def pool_put(self, p, b): pass
    def malloc_raw(self, n): return self.pool_get(n)[0]
    def h2d(self, dst, src, n):
        MEM[dst:dst + n] = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(src))
    def d2h(self, dst, src, n):
        np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(dst))[:] = MEM[src:src + n]
    def memset0(self, p, n): MEM[p:p + n] = 0
    def d2d(self, dst, src, n): MEM[dst:dst + n] = MEM[src:src + n].copy()
    def synchronize(self): pass
    def kernel(self, name, sig): return K(self, name, sig)



TINY = dict(embedding_length=256, block_count=2, feed_forward_length=512,
            **{"attention.head_count": 4, "attention.head_count_kv": 2})


@pytest.fixture(scope="module")
def fake_device():
    global MEM
    MEM = np.zeros(256 << 20, np.uint8)
    ctx = Ctx()
    real = drv.get
    drv.get = lambda fatbin=None: ctx
    yield ctx
    drv.get = real
    MEM = None


def _load(path, b):
    from reflex.gguf import GGUFFile
    f = GGUFFile(path)
    arch = f.get("general.architecture")
    return importlib.import_module(f"reflex.models.{arch}").load(f, b, arch=arch)


# fused launches each level must use (and level-1 launches level 2 must no longer make)
EXPECT = {3: ({"rx_norm_rope_kv", "rx_attention_dec"}, {"rx_rope", "rx_kv_write"}),
          2: ({"rx_norm_rope_kv", "rx_attention_dec", "rx_add_rms_norm"}, {"rx_rope", "rx_kv_write"}),
          1: ({"rx_rope", "rx_kv_write"}, {"rx_norm_rope_kv"}), 0: ({"rx_rope"}, {"rx_norm_rope_kv"})}


@pytest.mark.parametrize("preset", ["smollm2-135m", "qwen3-0.6b", "gemma3-270m"])
def test_fusion_levels_match_numpy(fake_device, vocab, tmp_path_factory, preset):
    from reflex.backends.cuda_backend import CudaBackend
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.synth import synthesize_preset
    path = str(tmp_path_factory.mktemp("m") / f"{preset}.gguf")
    synthesize_preset(vocab, path, preset, seed=1, overrides=TINY)
    ids = [5, 17, 99, 3, 250, 11]
    cm = _load(path, NumpyBackend())
    cc = cm.new_cache(32)
    ref = [cm.forward(ids, cc, last_only=True)[-1]]
    for tok in (7, 8, 9):
        ref.append(cm.forward([tok], cc, last_only=True)[-1])
    counts = {}
    for level in (0, 1, 2, 3):
        b = CudaBackend()
        b.fuse = level
        m = _load(path, b)
        c = m.new_cache(32)
        out = [b.to_numpy(m.forward(ids, c, last_only=True, output="raw")).reshape(-1)]
        out.append(b.to_numpy(m.forward([7], c, last_only=True, output="raw")).reshape(-1))
        fake_device.log.clear()
        b.ctx.h2d(b._state.ptr, np.array([8, c.n], np.int32).ctypes.data, 8)  # the captured-step path
        b.capturing = True
        try:
            lg = m.forward([8], c, last_only=True, output="raw")
            tok = b.argmax(lg, to_state=True)
        finally:
            b.capturing = False
        launched = list(fake_device.log)
        counts[level] = len(launched)
        assert int(b.to_numpy(tok)[0]) == int(np.argmax(ref[2]))
        out.append(b.to_numpy(lg).reshape(-1))
        out.append(b.to_numpy(m.forward([9], c, last_only=True, output="raw")).reshape(-1))
        for o, r in zip(out, ref):
            # float16 KV cache against the reference's float32
            assert np.abs(o - r).max() <= 2e-3 * np.abs(r).max(), (preset, level)
        must, never = EXPECT[level]
        names = {"rx_attention_dec" if x.startswith("rx_attention_dec_") else x for x in launched}
        assert must <= names and not (never & names), (level, sorted(names))
        if level == 3:
            # only the output norm before the vocabulary head stays a launch of its own (gemma3's
            # post-attention / post-FFN norms read products, not a residual add, and stay too)
            assert launched.count("rx_add_rms_norm") == 1, launched
            assert preset == "gemma3-270m" or "rx_rms_norm" not in launched, launched
    assert counts[3] < counts[2] < counts[1] < counts[0], counts


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("T,x3d", [(1, False), (3, False), (2, True)])
def test_expert_matmul_matches_numpy(fake_device, T, x3d, weighted):
    """CudaBackend.expert_matmul's bookkeeping (slots sorted by expert, one product per expert, the
    expert-ordered buffer put back by one row gather or one rx_moe_combine) against the NumPy
    backend, with repeated and unused experts; decode-size T so the products are matvecs."""
    from reflex.backends.cuda_backend import CudaBackend
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.quants import quantize
    rng = np.random.default_rng([T, x3d, weighted])
    n_expert, n_out, n_in, K = 6, 48, 64, 3
    wf = rng.standard_normal((n_expert, n_out, n_in)).astype(np.float32)
    raw = quantize(wf.reshape(-1, n_in), 8).reshape(-1)
    ids = np.array([[4, 1, 4], [0, 5, 1], [2, 4, 0]][:T], dtype=np.int64)
    wts = rng.uniform(0.1, 1.0, (T, K)).astype(np.float32) if weighted else None
    x = rng.standard_normal((T, K, n_in) if x3d else (T, n_in)).astype(np.float32)
    nb, gb = NumpyBackend(), CudaBackend()
    ref = nb.expert_matmul(x, nb.prepare_weight(raw, 8, (n_expert, n_out, n_in)), ids, wts)
    got = gb.to_numpy(gb.expert_matmul(gb.upload(x), gb.prepare_weight(raw, 8, (n_expert, n_out, n_in)), ids, wts))
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
    if weighted:
        assert "rx_moe_combine" in fake_device.log and "rx_binary" not in fake_device.log[-20:]


@pytest.mark.parametrize("last_n", [4, 64])
def test_greedy_decoder_repeat_penalty_on_cpu(fake_device, vocab, tmp_path_factory, last_n):
    """GreedyDecoder with a repeat penalty (the device window: prompt tail uploaded, each chosen
    token pushed by rx_ring_push, rx_repeat_penalty before every argmax) picks the tokens of the
    host path, Sampler(temperature 0, repeat_penalty, repeat_last_n).sample over the whole history,
    on the NumPy backend with a float16 KV cache (the CUDA cache's rounding). The prompt ends with
    the model's own greedy continuation, so both the prompt's tail in the window and the pushed
    tokens decide tokens: leaving either out of the history changes the host's sequence too."""
    from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.sampling import Sampler
    from reflex.synth import synthesize_preset
    path = str(tmp_path_factory.mktemp("m") / "pen.gguf")
    synthesize_preset(vocab, path, "smollm2-135m", seed=3, overrides=TINY)
    n_new, pen = 14, 4.0

    def host(ids, penalty, prompt_in_window=True):
        cm = _load(path, NumpyBackend(kv_f16=True))
        c, hist = cm.new_cache(64), list(ids) if prompt_in_window else []
        s = Sampler(temperature=0, repeat_penalty=penalty, repeat_last_n=last_n)
        lg = cm.forward(ids, c, last_only=True)[-1]
        out = []
        for _ in range(n_new):
            t = s.sample(lg, hist) if hist or penalty == 1.0 else int(np.argmax(lg))
            out.append(t)
            hist.append(t)
            lg = cm.forward([t], c, last_only=True)[-1]
        return out

    ids = [5, 17, 99, 3]
    ids += host(ids, 1.0)[:4]  # 8 tokens: the fake driver emulates the T <= 8 (matvec) products only
    ref = host(ids, pen)
    assert ref != host(ids, 1.0) and ref != host(ids, pen, prompt_in_window=False)
    b = CudaBackend()
    m = _load(path, b)
    fake_device.log.clear()
    dec = GreedyDecoder(b, m, m.new_cache(64), use_graph=False, repeat_penalty=pen, repeat_last_n=last_n,
                        history=ids)
    got = [dec.prefill(ids)]
    while len(got) < n_new:
        got.append(dec.step(got[-1]))
    assert got == ref
    assert fake_device.log.count("rx_repeat_penalty") == n_new == fake_device.log.count("rx_ring_push")
