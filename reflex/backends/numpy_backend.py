"""Reference CPU backend: float32 NumPy, weights dequantized once at load."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from reflex.backends.base import ROPE_NEOX, ROPE_NORM, Backend
from reflex.backends.numpy_deltanet import NumpyDeltaNetOps
from reflex.backends.numpy_embed import NumpyEmbedOps
from reflex.backends.numpy_mla import NumpyMLAOps
from reflex.backends.numpy_moe import NumpyMoEOps
from reflex.backends.numpy_ssm import NumpySSMOps
from reflex.errors import InvalidRequest, ModelFormatError

# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*P(t)*exp(-z^2), t = 1/(1 + p*z), z >= 0; |error| <= 1.5e-7.
# _gelu_erf works with a = |x| directly: Phi(-a) = erfc(a/sqrt2)/2 = t*P'(t)*exp(-a^2/2), where
# t = 1/(1 + (p/sqrt2)*a) and P' has the A&S coefficients halved (P(t) = t*(a1 + t*(a2 + ...))).
_G_P = np.float32(0.3275911 / np.sqrt(2.0))
_G_A = tuple(np.float32(v / 2.0) for v in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
_EXP_SAFE = 64.0  # |score| bound under which attention skips the max shift: exp(64) = 6e27, exp(-64) = 2e-28
_GELU_CHUNK = 1 << 16  # elements per pass: the 4 scratch buffers (1 MiB) stay in L2


def _gelu_erf(x: np.ndarray, out: np.ndarray | None = None, bias=None) -> np.ndarray:
    """Exact (erf) GELU x * Phi(x) in float32 (of x + bias, where a bias (n,) for the last axis is
    given), chunked, with max |error| ~4e-7 against math.erf (SciPy-free; math.erf per element
    costs ~0.2 us). `out` may be x itself (in place).

    GELU(x) = relu(x) - |x| * Phi(-|x|) for either sign (x >= 0: x - x*Phi(-x) = x*Phi(x); x < 0:
    -|x|*Phi(x) = x*Phi(x)), so no per-sign select is needed: `np.copyto(where=)` cost 4.5 ns per
    element, more than the whole rest (measured 8.3 -> 2.7 ns/element at (256, 1536), 1 thread).
    The bias is added chunk by chunk, while the chunk is in L2, instead of in a pass of its own."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    n = x.shape[-1] if x.ndim else 1
    xr, orows = x.reshape(-1, n), out.reshape(-1, n)                 # (rows, n), views
    step = max(1, _GELU_CHUNK // max(1, n))                          # rows per chunk
    m = min(step * n, x.size)
    bufs = [np.empty(m, np.float32) for _ in range(4)]
    for r in range(0, xr.shape[0], step):
        o2 = orows[r:r + step]
        if bias is not None:
            np.add(xr[r:r + step], bias, out=o2)
            xs = o2.reshape(-1)
        else:
            xs = xr[r:r + step].reshape(-1)
        a, t, q, e = (buf[:xs.size] for buf in bufs)
        np.abs(xs, out=a)
        np.multiply(a, _G_P, out=t)
        t += np.float32(1.0)
        np.reciprocal(t, out=t)                   # t = 1 / (1 + p*|x|/sqrt2)
        np.multiply(t, _G_A[0], out=q)
        for c in _G_A[1:]:
            q += c
            q *= t                                # q = P'(t)
        np.square(a, out=e)
        e *= np.float32(-0.5)
        np.exp(e, out=e)
        q *= e                                    # q = Phi(-|x|)
        q *= a
        o = o2.reshape(-1)
        np.maximum(xs, np.float32(0.0), out=o)    # xs may be o: a and q already hold what is needed
        o -= q
    return out


def _layer_norm_inplace(y: np.ndarray, w, b, eps: float) -> np.ndarray:
    """y (already centred, an owned float32 array) -> y / sqrt(var + eps) * w + b, in place.

    Each pass of the old form (mean, centre, square, mean, scale, weight, bias) made a new array;
    in place, with the variance as one row-wise dot, add + norm at (256, 384) went from 0.63 to
    0.14 ms (1 thread), same values within float32 rounding (8e-7 against float64)."""
    var = np.einsum("...i,...i->...", y, y)[..., None]   # (..., 1) sum of squares
    var *= np.float32(1.0 / y.shape[-1])
    var += np.float32(eps)
    np.sqrt(var, out=var)
    np.reciprocal(var, out=var)
    y *= var
    if w is not None:
        y *= w
    if b is not None:
        y += b
    return y


def set_blas_threads(n: int) -> bool:
    """Set the OpenBLAS thread count of the BLAS NumPy loaded (no threadpoolctl dependency).

    Returns False where the library or symbol is not found (then nothing changes). The setter is
    looked up once (reading /proc/self/maps costs ~15 ms; embed() switches threads per call)."""
    fn = _BLAS_SETTER.get("fn")
    if fn is not None:
        fn(ctypes.c_int(int(n)))
        return True
    try:
        with open("/proc/self/maps") as fh:
            libs = {ln.split()[-1] for ln in fh if "openblas" in ln and ".so" in ln}
    except OSError:
        return False
    # NumPy's own OpenBLAS first: faiss-cpu ships an OpenMP OpenBLAS whose setter would change
    # faiss's OpenMP team instead (measured: flat search 6 -> 15-40 ms after an embed)
    for path in sorted(libs, key=lambda p: ("numpy" not in p, p)):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                    "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                _BLAS_SETTER["fn"] = fn
                fn(ctypes.c_int(int(n)))
                return True
    return False


_BLAS_SETTER: dict = {}


class NumpyBackend(NumpySSMOps, NumpyDeltaNetOps, NumpyMLAOps, NumpyMoEOps, NumpyEmbedOps, Backend):
    # op families beyond the dense-transformer core live in mixins, one file per family
    name = "numpy"

    def __init__(self, n_threads: int | None = None, kv_f16: bool | None = None):
        """n_threads: BLAS threads (default: env REFLEX_NUM_THREADS, else the BLAS default).
        kv_f16: round what kv_write stores to float16, emulating the CUDA backend's KV storage
        (default: env REFLEX_NUMPY_KV_F16=1, else off: float32 caches, results unchanged)."""
        if kv_f16 is None:
            kv_f16 = os.environ.get("REFLEX_NUMPY_KV_F16", "") not in ("", "0")
        self.kv_f16 = bool(kv_f16)
        self._inv_freq = {}
        self.weight_bytes = 0  # float32 bytes of every prepared weight (the dequantized copies)
        if n_threads is None and os.environ.get("REFLEX_NUM_THREADS"):
            n_threads = int(os.environ["REFLEX_NUM_THREADS"])
        if n_threads:
            set_blas_threads(n_threads)

    # ---- weights / arrays ----------------------------------------------------------------------
    def prepare_weight(self, raw_bytes, ggml_type: int, shape: tuple):
        from reflex.quants import dequantize  # the shared dequantizers, F32/F16/BF16 included

        shape = tuple(int(s) for s in shape)
        try:
            # dequantize writes into a fresh, owned, contiguous float32 array, so no second copy
            # is needed (one copy of ~533 MB for SmolLM2 is already most of the load time)
            w = dequantize(raw_bytes, ggml_type, shape)
        except (ValueError, NotImplementedError) as e:
            raise ModelFormatError(f"tensor of shape {shape}: {e}", kind="tensor_shape") from e
        self.weight_bytes += w.nbytes
        return w

    def memory(self) -> dict:
        """Resident weight bytes (float32, dequantized at load) and the process's resident set."""
        rss = None
        try:
            with open("/proc/self/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
        return {"weight_bytes": self.weight_bytes, "process_rss_bytes": rss}

    def to_numpy(self, x):
        return np.asarray(x, dtype=np.float32)

    def zeros(self, shape: tuple):
        return np.zeros(shape, dtype=np.float32)

    # ---- ops -----------------------------------------------------------------------------------
    def embed(self, w, ids):
        return w[np.asarray(ids, dtype=np.int64)]  # (T, n_embd)

    def matmul(self, x, w):
        return x @ w.T  # (T, n_in) @ (n_in, n_out)

    def rms_norm(self, x, w, eps: float):
        ms = np.mean(np.square(x), axis=-1, keepdims=True)
        y = x * (1.0 / np.sqrt(ms + np.float32(eps)))
        return y if w is None else y * w

    def _freqs(self, n_rot: int, freq_base: float):
        key = (n_rot, float(freq_base))
        f = self._inv_freq.get(key)
        if f is None:
            # theta_i = base^(-2i / n_rot), computed in float64 then used for the angles
            f = float(freq_base) ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
            self._inv_freq[key] = f
        return f

    def rope(self, x, pos, n_rot: int, freq_base: float, mode: int = ROPE_NORM):
        T, n_head, head_dim = x.shape
        ang = np.asarray(pos, dtype=np.float64)[:, None] * self._freqs(n_rot, freq_base)[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]  # (T, 1, n_rot/2)
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        out = x.copy()
        if mode == ROPE_NORM:
            x0 = x[..., 0:n_rot:2]
            x1 = x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = x0 * cos - x1 * sin
            out[..., 1:n_rot:2] = x0 * sin + x1 * cos
        elif mode == ROPE_NEOX:
            h = n_rot // 2
            x0 = x[..., :h]
            x1 = x[..., h:n_rot]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:n_rot] = x0 * sin + x1 * cos
        else:
            raise ValueError(f"unknown rope mode {mode}")
        return out

    def kv_write(self, cache, x, start: int):
        # every cache write goes through here (K/V, and MLA's latent + RoPE caches), so kv_f16
        # rounds all stored keys/values as the GPU's float16 caches do; the cache stays float32
        if self.kv_f16:
            x = np.asarray(x, dtype=np.float32).astype(np.float16)
        cache[start:start + x.shape[0]] = x

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float | None = None, *,
                  window: int = 0, mask=None, causal: bool = True):
        T, n_head, d = q.shape
        n_kv = k_cache.shape[1]
        g = n_head // n_kv
        S = n_past + T
        if scale is None:
            scale = 1.0 / np.sqrt(d)
        k = k_cache[:S].transpose(1, 2, 0)  # (n_kv, d, S)
        v = v_cache[:S].transpose(1, 0, 2)  # (n_kv, S, d)
        # query heads grouped by their kv head: (n_kv, g*T, d), row index = j*T + t; the scale is
        # folded into q (T*n_head*d products instead of n_head*T*S)
        qg = (q * np.float32(scale)).reshape(T, n_kv, g, d).transpose(1, 2, 0, 3).reshape(n_kv, g * T, d)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (T, S):
                raise ValueError(f"attention mask shape {mask.shape}, expected {(T, S)}")
            hidden = ~mask
        elif causal or (window and window > 0):
            qpos = n_past + np.arange(T)[:, None]        # (T, 1) query slots
            kpos = np.arange(S)[None, :]                 # (1, S) key slots
            hidden = (kpos > qpos) if causal else np.zeros((T, S), dtype=bool)
            if window and window > 0:
                hidden = hidden | (qpos - kpos >= window)
        else:
            hidden = None
        # hidden slots as an additive -inf bias: one broadcast add (boolean-index assignment
        # cost several times more per score)
        bias = None if hidden is None or not hidden.any() else \
            np.where(hidden, np.float32(-np.inf), np.float32(0.0))   # (T, S)
        o = np.empty((n_kv, g * T, d), dtype=np.float32)
        # unmasked: a few kv heads at a time, so the scores (c, g*T, S) stay in L2 through
        # max / exp / sum / PV (bert's 12 heads x 256 x 256: 3.1 -> 2.5 ms, 1 thread)
        c = n_kv if bias is not None else max(1, min(n_kv, (1 << 16) // max(1, g * T * S)))
        # The row-max shift only keeps exp() finite. |q.k| <= |q| |k|, so where every score of a
        # kv group is bounded by _EXP_SAFE, exp() of the unshifted scores neither overflows nor
        # leaves float32's normal range, and softmax is unchanged up to rounding: the max and
        # subtract passes (0.64 of 2.45 ms at bert's 12 x 256 x 256) are skipped. The norms cost
        # T*n_head*d + S*n_kv*d, so only for prefill-sized T (a decode step's max pass is small).
        bound = None
        if T >= 16:
            qn = np.einsum("krd,krd->kr", qg, qg).max(axis=1)   # (n_kv,) max |q|^2 of each group
            kn = np.einsum("kds,kds->ks", k, k).max(axis=1)     # (n_kv,) max |k|^2
            bound = np.sqrt(qn * kn)                            # (n_kv,)
        for h0 in range(0, n_kv, c):
            h1 = min(n_kv, h0 + c)
            s = np.matmul(qg[h0:h1], k[h0:h1])          # (c, g*T, S)
            if bias is not None:
                s4 = s.reshape(h1 - h0, g, T, S)
                s4 += bias
            if bound is None or not bound[h0:h1].max() <= _EXP_SAFE:
                s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            den = s.sum(axis=-1, keepdims=True)         # (c, g*T, 1)
            oc = o[h0:h1]
            np.matmul(s, v[h0:h1], out=oc)              # (c, g*T, d), normalized after the product:
            oc /= den                                   # d divisions per row instead of S
        return o.reshape(n_kv, g, T, d).transpose(2, 0, 1, 3).reshape(T, n_head, d)

    def silu(self, x):
        return x / (1.0 + np.exp(-x))

    def gelu_tanh(self, x):
        c = np.float32(np.sqrt(2.0 / np.pi))
        return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))

    def gelu(self, x):
        return _gelu_erf(x)

    def layer_norm(self, x, w, b, eps: float):
        return _layer_norm_inplace(np.subtract(x, np.mean(x, axis=-1, keepdims=True), dtype=np.float32),
                                   w, b, eps)

    def add_layer_norm(self, x, r, w, b, eps: float):
        y = np.add(x, r, dtype=np.float32)
        y -= np.mean(y, axis=-1, keepdims=True)
        return _layer_norm_inplace(y, w, b, eps)

    def linear_gelu(self, x, w, bias=None):
        y = x @ w.T                                   # (T, n_out), fresh: bias and GELU in place
        return _gelu_erf(y, out=y, bias=bias)

    def linear(self, x, w, bias=None):
        y = x @ w.T                                   # a fresh (T, n_out) array: the bias goes in place
        if bias is not None:
            y += bias
        return y

    def mul(self, a, b):
        return a * b

    def add(self, a, b):
        return a + b

    def swiglu(self, gate, up):
        g = gate / (1.0 + np.exp(-gate))
        g *= up
        return g

    def expert_matmul(self, x, w, expert_ids, weights=None):
        ids = np.asarray(expert_ids, dtype=np.int64)             # (T, K)
        T, K = ids.shape
        n_expert, n_out, n_in = w.shape
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise InvalidRequest(f"expert id out of range [0, {n_expert})")
        x = np.asarray(x, dtype=np.float32)
        xs = np.broadcast_to(x[:, None, :], (T, K, n_in)) if x.ndim == 2 else x
        if xs.shape != (T, K, n_in):
            raise InvalidRequest(f"expert_matmul: input {x.shape} does not match ids {ids.shape}, weight {w.shape}")
        xs = xs.reshape(T * K, n_in)
        flat = ids.reshape(-1)
        y = np.empty((T * K, n_out), dtype=np.float32)
        # one GEMM per selected expert over all the slots routed to it (not one per slot)
        for e in np.unique(flat):
            rows = np.nonzero(flat == e)[0]
            y[rows] = xs[rows] @ w[e].T
        y = y.reshape(T, K, n_out)
        if weights is None:
            return y
        wt = np.asarray(weights, dtype=np.float32).reshape(T, K, 1)
        return (y * wt).sum(axis=1)                                # (T, n_out)
