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

# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*P(t)*exp(-z^2), t = 1/(1 + p*z), z >= 0; |error| <= 1.5e-7
_AS_P = np.float32(0.3275911)
_AS_A = tuple(np.float32(v) for v in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))
_GELU_CHUNK = 1 << 16  # elements per pass: the ~6 temporaries stay in L2


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU x * Phi(x) in float32, chunked and in place: ~20x faster than a float64
    pass, max |error| ~4e-7 against math.erf (SciPy-free; math.erf per element costs ~0.2 us)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    r2 = np.float32(1.0 / np.sqrt(2.0))
    for s in range(0, xf.size, _GELU_CHUNK):
        xs = xf[s:s + _GELU_CHUNK]
        z = np.abs(xs)
        z *= r2                                   # z = |x| / sqrt(2)
        t = z * _AS_P
        t += np.float32(1.0)
        np.reciprocal(t, out=t)
        q = t * _AS_A[0]
        for a in _AS_A[1:]:
            q += a
            q *= t
        np.square(z, out=z)
        np.negative(z, out=z)
        np.exp(z, out=z)
        z *= q
        z *= np.float32(0.5)                      # z = Phi(-|x|) = (1 - erf(|x|/sqrt2)) / 2
        o = of[s:s + _GELU_CHUNK]
        np.subtract(np.float32(1.0), z, out=o)    # Phi(|x|)
        np.copyto(o, z, where=xs < 0)             # Phi(x) for negative x
        o *= xs
    return out


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
        # query heads grouped by their kv head: (n_kv, g*T, d), row index = j*T + t
        qg = q.reshape(T, n_kv, g, d).transpose(1, 2, 0, 3).reshape(n_kv, g * T, d)
        s = np.matmul(qg, k) * np.float32(scale)  # (n_kv, g*T, S)
        s = s.reshape(n_kv, g, T, S)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != (T, S):
                raise ValueError(f"attention mask shape {mask.shape}, expected {(T, S)}")
            hidden = ~mask
        else:
            qpos = n_past + np.arange(T)[:, None]        # (T, 1) query slots
            kpos = np.arange(S)[None, :]                 # (1, S) key slots
            hidden = (kpos > qpos) if causal else np.zeros((T, S), dtype=bool)
            if window and window > 0:
                hidden = hidden | (qpos - kpos >= window)
        if hidden.any():
            s[:, :, hidden] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        o = np.matmul(s.reshape(n_kv, g * T, S), v)  # (n_kv, g*T, d)
        return o.reshape(n_kv, g, T, d).transpose(2, 0, 1, 3).reshape(T, n_head, d)

    def silu(self, x):
        return x / (1.0 + np.exp(-x))

    def gelu_tanh(self, x):
        c = np.float32(np.sqrt(2.0 / np.pi))
        return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))

    def gelu(self, x):
        return _gelu_erf(x)

    def layer_norm(self, x, w, b, eps: float):
        mu = np.mean(x, axis=-1, keepdims=True)
        xc = x - mu
        var = np.mean(np.square(xc), axis=-1, keepdims=True)
        y = xc * (1.0 / np.sqrt(var + np.float32(eps)))
        if w is not None:
            y = y * w
        if b is not None:
            y = y + b
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
