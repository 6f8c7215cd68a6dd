"""CUDA backend: our ahead-of-time compiled kernels (kernels/*.cu -> reflex/_kernels/reflex.fatbin)
launched through the driver API (reflex.backends.cuda_driver); no NVRTC, no CuPy.

- Weights stay on the GPU in their GGUF block format (`QWeight`); only 1-D tensors (norms, biases)
  become float32 device arrays. Decode products read the blocks directly (rx_matvec_*); prefill
  dequantizes one weight at a time into a reused scratch and runs a tiled float32 GEMM.
- Activations are float32 `DArray`s (device pointer + shape, NumPy order); KV caches (the only
  users of `zeros`) are float16.
- `capturing`: while a decode step is captured into a CUDA graph, the token id and the position
  are read from a small device state (written by the previous step's argmax), so the graph
  replays unchanged for every later token. `GreedyDecoder` drives that.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from reflex.backends import cuda_driver as drv
from reflex.backends.base import ROPE_NEOX, ROPE_NORM, Backend
from reflex.errors import InvalidRequest, ModelFormatError

# ggml type id -> kernel suffix (kernels/quant.cuh RX_FOR_EACH_TYPE); block size, bytes per block
TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2), 8: ("q8_0", 32, 34), 2: ("q4_0", 32, 18),
         3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 10: ("q2_k", 256, 84),
         11: ("q3_k", 256, 110), 12: ("q4_k", 256, 144), 13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210)}
_ITEM = {"f32": 4, "f16": 2, "i32": 4, "u8": 1}
_NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u8": np.uint8}
MATVEC_MAX_T = 8      # up to this many rows a product reads the blocks directly (no scratch)
ATT_CHUNK_DECODE = 256  # keys per split at T = 1 (splits over the KV length fill the GPU)


class _Buf:
    """One pooled device allocation; returned to the pool when the last array using it dies."""

    __slots__ = ("ctx", "ptr", "bucket")

    def __init__(self, ctx, nbytes):
        self.ctx = ctx
        self.ptr, self.bucket = ctx.pool_get(nbytes)

    def __del__(self):
        try:
            self.ctx.pool_put(self.ptr, self.bucket)
        except Exception:
            pass


class DArray:
    """A contiguous device array (float32 activations, float16 KV caches)."""

    __slots__ = ("ptr", "shape", "dtype", "buf", "backend")
    __array_priority__ = 100

    def __init__(self, backend, shape, dtype="f32", buf=None, ptr=None):
        self.backend = backend
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        if buf is None:
            buf = _Buf(backend.ctx, max(self.nbytes, 1))
            ptr = buf.ptr
        self.buf = buf
        self.ptr = buf.ptr if ptr is None else ptr

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * _ITEM[self.dtype]

    def __len__(self):
        return self.shape[0]

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(int(s) for s in shape)
        if -1 in shape:
            i = shape.index(-1)
            rest = math.prod(s for j, s in enumerate(shape) if j != i)
            shape[i] = self.size // rest if rest else 0
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return DArray(self.backend, shape, self.dtype, self.buf, self.ptr)

    def __getitem__(self, key):
        """Axis-0 indexing only (int or step-1 slice): the result stays a contiguous view."""
        if isinstance(key, tuple):
            if len(key) == 1:
                key = key[0]
            else:
                raise IndexError("DArray supports indexing on the first axis only")
        n = self.shape[0]
        row = (self.size // n if n else 0) * _ITEM[self.dtype]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {key} out of range for axis 0 of size {n}")
            return DArray(self.backend, self.shape[1:], self.dtype, self.buf, self.ptr + i * row)
        if isinstance(key, slice):
            a, b, st = key.indices(n)
            if st != 1:
                raise IndexError("DArray slices must have step 1")
            b = max(a, b)
            return DArray(self.backend, (b - a,) + self.shape[1:], self.dtype, self.buf, self.ptr + a * row)
        raise IndexError(f"unsupported DArray index {key!r}")

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, _NP[self.dtype])
        if out.nbytes:
            self.backend.ctx.d2h(out.ctypes.data, self.ptr, out.nbytes)
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.get()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self):
        return f"DArray(shape={self.shape}, dtype={self.dtype}, ptr=0x{self.ptr:x})"


class QWeight:
    """A 2-D+ weight resident in its GGUF block format: (n_out, n_in) rows of n_in/QK blocks."""

    __slots__ = ("ptr", "ggml_type", "shape", "nbytes", "suffix", "n_out", "n_in")

    def __init__(self, ptr, ggml_type, shape, nbytes):
        self.ptr, self.ggml_type, self.shape, self.nbytes = ptr, ggml_type, tuple(shape), nbytes
        self.suffix = TYPES[ggml_type][0]
        self.n_in = self.shape[-1]
        self.n_out = math.prod(self.shape[:-1])

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"QWeight({self.suffix}, shape={self.shape})"


class CudaBackend(Backend):
    name = "cuda"
    device_sampling = True  # the engine may call argmax / GreedyDecoder

    def __init__(self, fatbin: str | None = None):
        t0 = time.perf_counter()
        self.ctx = drv.get(fatbin)
        self.timings = dict(self.ctx.timings)
        self.timings["backend_wait_s"] = time.perf_counter() - t0
        self.jit = self.ctx.cc > (9, 0)  # newer than the newest SASS: the driver compiled our PTX
        self._k = {}
        self.capturing = False
        self.weight_bytes = 0
        self._state = DArray(self, (4,), "i32")  # [token, n_past, -, -] of a captured decode step
        self.ctx.memset0(self._state.ptr, 16)
        self._pos_cache = (None, None)

    # ---- kernels -------------------------------------------------------------------------------
    def k(self, name: str, sig: str):
        """The kernel `name` of the fatbin; `sig` gives its argument kinds (cuda_driver.Kernel)."""
        f = self._k.get(name)
        if f is None:
            f = self._k[name] = self.ctx.kernel(name, sig)
        return f

    def _grid1(self, n: int, threads: int = 256) -> tuple:
        return (max(1, min((n + threads - 1) // threads, self.ctx.sm_count * 8)), 1, 1)

    def empty(self, shape, dtype="f32") -> DArray:
        return DArray(self, shape, dtype)

    def upload(self, a: np.ndarray, dtype="f32") -> DArray:
        a = np.ascontiguousarray(a, dtype=_NP[dtype])
        d = DArray(self, a.shape, dtype)
        self.ctx.h2d(d.ptr, a.ctypes.data, a.nbytes)
        return d

    def synchronize(self):
        self.ctx.synchronize()

    # ---- weights / arrays ----------------------------------------------------------------------
    def prepare_weight(self, raw_bytes, ggml_type: int, shape: tuple):
        shape = tuple(int(s) for s in shape)
        ggml_type = int(ggml_type)
        if ggml_type not in TYPES:
            raise ModelFormatError(f"tensor of shape {shape}: GGML type {ggml_type} not supported by the cuda backend",
                                   kind="tensor_type")
        _, qk, ts = TYPES[ggml_type]
        n_el = math.prod(shape)
        if not shape or shape[-1] % qk:
            raise ModelFormatError(f"tensor of shape {shape}: row not a multiple of block size {qk}", kind="tensor_shape")
        nbytes = n_el // qk * ts
        raw = np.asarray(raw_bytes)
        if raw.dtype != np.uint8:
            raw = np.ascontiguousarray(raw).view(np.uint8)
        raw = raw.reshape(-1)
        if raw.size < nbytes:
            raise ModelFormatError(f"tensor of shape {shape}: need {nbytes} bytes, got {raw.size}", kind="tensor_shape")
        if len(shape) == 1:
            # norms and biases: small, used by elementwise kernels as float32 vectors
            from reflex.quants import dequantize
            v = self.upload(dequantize(raw[:nbytes], ggml_type, shape))
            self.weight_bytes += v.nbytes
            return v
        if not raw.flags.c_contiguous:
            raw = np.ascontiguousarray(raw)
        ptr = self.ctx.malloc_raw(nbytes)
        self.ctx.h2d(ptr, raw.ctypes.data, nbytes)  # straight from the memory map
        self.weight_bytes += nbytes
        return QWeight(ptr, ggml_type, shape, nbytes)

    def to_numpy(self, x):
        if isinstance(x, QWeight):
            return self.dequantize(x).get()
        if isinstance(x, DArray):
            a = x.get()
            return a.astype(np.float32) if a.dtype != np.float32 else a
        return np.asarray(x, dtype=np.float32)

    def zeros(self, shape: tuple):
        """Float16 zeros: KV caches are the only users (kernels/attention.cu reads f16)."""
        d = DArray(self, shape, "f16")
        self.ctx.memset0(d.ptr, d.nbytes)
        return d

    def _f32(self, x, what="input") -> DArray:
        if isinstance(x, DArray):
            if x.dtype != "f32":
                raise InvalidRequest(f"cuda backend: {what} must be float32, got {x.dtype}")
            return x
        if isinstance(x, QWeight):
            raise InvalidRequest(f"cuda backend: {what} is a quantized weight")
        return self.upload(np.asarray(x, dtype=np.float32))

    def _ints(self, v) -> DArray:
        return self.upload(np.asarray(v, dtype=np.int32).reshape(-1), "i32")

    # ---- ops -----------------------------------------------------------------------------------
    def dequantize(self, w: QWeight, out: DArray | None = None) -> DArray:
        out = out if out is not None else self.empty(w.shape)
        n = w.n_out * w.n_in
        self.k("rx_dequant_" + w.suffix, "ppll")(self._grid1(n), 256, w.ptr, out.ptr, w.n_out, w.n_in)
        return out

    def embed(self, w, ids):
        if not isinstance(w, QWeight):
            raise InvalidRequest("cuda backend: embed needs a 2-D weight")
        if self.capturing:
            n, ids_ptr, keep = 1, self._state.ptr, None
        else:
            keep = self._ints(ids)
            n, ids_ptr = keep.size, keep.ptr
        out = self.empty((n, w.n_in))
        self.k("rx_get_rows_" + w.suffix, "pppi")(((w.n_in + 255) // 256, n, 1), 256, w.ptr, ids_ptr, out.ptr, w.n_in)
        return out

    def matmul(self, x, w):
        x = self._f32(x, "matmul input")
        if not isinstance(w, QWeight):
            raise InvalidRequest("cuda backend: matmul needs a prepared 2-D weight")
        n_in, n_out = w.n_in, w.n_out
        if x.shape[-1] != n_in:
            raise InvalidRequest(f"matmul: input {x.shape} does not match weight {w.shape}")
        T = x.size // n_in
        out = self.empty(x.shape[:-1] + (n_out,))
        if T <= MATVEC_MAX_T and n_in % 8 == 0:
            self.k("rx_matvec_" + w.suffix, "pppii")(((n_out + 3) // 4, T, 1), 128, w.ptr, x.ptr, out.ptr, n_out, n_in)
        else:
            scratch = self.dequantize(w)
            self.k("rx_sgemm_nt", "pppiii")(((n_out + 63) // 64, (T + 63) // 64, 1), 256,
                                           x.ptr, scratch.ptr, out.ptr, T, n_out, n_in)
        return out

    def matmul2(self, x, w0, w1):
        """(x @ w0.T, x @ w1.T) for two weights of one shape and type (gate/up): one launch at decode."""
        x = self._f32(x, "matmul input")
        T = x.size // w0.n_in
        if (w0.shape != w1.shape or w0.ggml_type != w1.ggml_type or T > MATVEC_MAX_T or w0.n_in % 8):
            return self.matmul(x, w0), self.matmul(x, w1)
        y0, y1 = self.empty(x.shape[:-1] + (w0.n_out,)), self.empty(x.shape[:-1] + (w0.n_out,))
        self.k("rx_matvec2_" + w0.suffix, "pppppii")(((w0.n_out + 3) // 4, T, 2), 128, w0.ptr, w1.ptr, x.ptr,
                                                    y0.ptr, y1.ptr, w0.n_out, w0.n_in)
        return y0, y1

    def rms_norm(self, x, w, eps: float):
        x = self._f32(x, "rms_norm input")
        n = x.shape[-1]
        out = self.empty(x.shape)
        self.k("rx_rms_norm", "pppif")((x.size // n, 1, 1), 256, x.ptr, w.ptr if w is not None else 0,
                                       out.ptr, n, float(eps))
        return out

    def add_rms_norm(self, x, r, w, eps: float):
        """(x + r, rms_norm(x + r) * w) in one launch."""
        x, r = self._f32(x), self._f32(r)
        n = x.shape[-1]
        s, out = self.empty(x.shape), self.empty(x.shape)
        self.k("rx_add_rms_norm", "pppppif")((x.size // n, 1, 1), 256, x.ptr, r.ptr, s.ptr,
                                             w.ptr if w is not None else 0, out.ptr, n, float(eps))
        return s, out

    def layer_norm(self, x, w, b, eps: float):
        x = self._f32(x, "layer_norm input")
        n = x.shape[-1]
        out = self.empty(x.shape)
        self.k("rx_layer_norm", "ppppif")((x.size // n, 1, 1), 256, x.ptr, w.ptr if w is not None else 0,
                                          b.ptr if b is not None else 0, out.ptr, n, float(eps))
        return out

    def _positions(self, pos) -> DArray:
        pos = np.asarray(pos, dtype=np.int32).reshape(-1)
        last_np, last_d = self._pos_cache
        if last_np is not None and last_np.shape == pos.shape and np.array_equal(last_np, pos):
            return last_d
        d = self._ints(pos)
        self._pos_cache = (pos.copy(), d)
        return d

    def rope(self, x, pos, n_rot: int, freq_base: float, mode: int = ROPE_NORM):
        x = self._f32(x, "rope input")
        if mode not in (ROPE_NORM, ROPE_NEOX):
            raise ValueError(f"unknown rope mode {mode}")
        T, n_head, head_dim = x.shape
        if n_rot % 2 or n_rot > head_dim or head_dim % 2:
            raise InvalidRequest(f"rope: n_rot {n_rot} / head_dim {head_dim}")
        out = self.empty(x.shape)
        if self.capturing:
            pos_ptr, dyn = 0, self._state.ptr + 4
        else:
            pos_ptr, dyn = self._positions(pos).ptr, 0
        threads = max(32, min(256, ((head_dim // 2 + 31) // 32) * 32))
        self.k("rx_rope", "pppiiifip")((T * n_head, 1, 1), threads, x.ptr, out.ptr, pos_ptr, n_head, head_dim,
                                       int(n_rot), float(freq_base), 0 if mode == ROPE_NORM else 1, dyn)
        return out

    def kv_write(self, cache, x, start: int):
        x = self._f32(x, "kv_write input")
        if not isinstance(cache, DArray) or cache.dtype != "f16":
            raise InvalidRequest("cuda backend: KV cache must come from zeros()")
        row = math.prod(cache.shape[1:])
        if not self.capturing and int(start) + x.size // row > cache.shape[0]:
            raise InvalidRequest("kv_write past the end of the cache")
        dyn = self._state.ptr + 4 if self.capturing else 0
        self.k("rx_kv_write", "ppliip")(self._grid1(x.size), 256, cache.ptr, x.ptr, x.size, row, int(start), dyn)

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float | None = None, *,
                  window: int = 0, mask=None, causal: bool = True):
        q = self._f32(q, "attention query")
        T, n_head, d = q.shape
        n_ctx, n_kv, dk = k_cache.shape
        if dk != d or n_head % n_kv or d % 2 or d > 512:
            raise InvalidRequest(f"attention: q {q.shape} vs cache {k_cache.shape}")
        if scale is None:
            scale = 1.0 / math.sqrt(d)
        S = int(n_past) + T
        mask_d, S_mask = None, 0
        if mask is not None:
            if self.capturing:
                raise InvalidRequest("cuda backend: a mask cannot be captured")
            m = np.asarray(mask, dtype=bool)
            if m.shape != (T, S):
                raise ValueError(f"attention mask shape {m.shape}, expected {(T, S)}")
            mask_d, S_mask = self.upload(m.astype(np.uint8), "u8"), S
        if self.capturing:
            chunk = ATT_CHUNK_DECODE
            n_split = (n_ctx + chunk - 1) // chunk
            dyn = self._state.ptr + 4
        elif T == 1:
            chunk = ATT_CHUNK_DECODE
            n_split = (S + chunk - 1) // chunk
            dyn = 0
        else:
            chunk, n_split, dyn = max(S, 1), 1, 0
        out = self.empty((T, n_head, d))
        part = self.empty((T * n_head * n_split * (d + 2),)) if n_split > 1 else None
        self.k("rx_attention", "ppppppiiiipfiiii")(
            (T * n_head, n_split, 1), 128, q.ptr, k_cache.ptr, v_cache.ptr, out.ptr,
            part.ptr if part is not None else 0, mask_d.ptr if mask_d is not None else 0,
            n_head, n_kv, d, int(n_past), dyn, float(scale), int(window or 0), 1 if causal else 0, chunk, S_mask)
        if n_split > 1:
            self.k("rx_attn_combine", "ppii")((T * n_head, 1, 1), 128, part.ptr, out.ptr, n_split, d)
        return out

    def _unary(self, x, op):
        x = self._f32(x)
        out = self.empty(x.shape)
        self.k("rx_unary", "ppli")(self._grid1(x.size), 256, x.ptr, out.ptr, x.size, op)
        return out

    def silu(self, x):
        return self._unary(x, 0)

    def gelu_tanh(self, x):
        return self._unary(x, 1)

    def gelu(self, x):
        return self._unary(x, 2)

    def _binary(self, a, b, op):
        if np.isscalar(a) or (isinstance(a, np.ndarray) and a.ndim == 0):
            a, b = b, a  # add and mul commute
        a = self._f32(a)
        if np.isscalar(b) or (isinstance(b, np.ndarray) and b.ndim == 0):
            out = self.empty(a.shape)
            self.k("rx_binary", "pppllif")(self._grid1(a.size), 256, a.ptr, 0, out.ptr, a.size, 1, op, float(b))
            return out
        b = self._f32(b)
        if b.size > a.size:
            a, b = b, a
        if b.size != a.size and (not a.shape or b.size != a.shape[-1]):
            raise InvalidRequest(f"cannot broadcast {b.shape} to {a.shape}")
        out = self.empty(a.shape)
        self.k("rx_binary", "pppllif")(self._grid1(a.size), 256, a.ptr, b.ptr, out.ptr, a.size, b.size, op, 0.0)
        return out

    def mul(self, a, b):
        return self._binary(a, b, 1)

    def add(self, a, b):
        return self._binary(a, b, 0)

    def swiglu(self, gate, up):
        g, u = self._f32(gate), self._f32(up)
        out = self.empty(g.shape)
        self.k("rx_glu", "pppli")(self._grid1(g.size), 256, g.ptr, u.ptr, out.ptr, g.size, 0)
        return out

    def geglu(self, gate, up):
        g, u = self._f32(gate), self._f32(up)
        out = self.empty(g.shape)
        self.k("rx_glu", "pppli")(self._grid1(g.size), 256, g.ptr, u.ptr, out.ptr, g.size, 1)
        return out

    # ---- sampling ------------------------------------------------------------------------------
    def argmax(self, x, to_state: bool = False) -> DArray:
        """Device argmax of the last row of x -> (1,) int32 device array; with to_state the token
        also goes to the decode state (and the state position advances)."""
        x = self._f32(x)
        n = x.shape[-1]
        row = x.reshape(-1, n)[-1]
        out = self.empty((1,), "i32")
        self.k("rx_argmax", "pipp")((1, 1, 1), 1024, row.ptr, n, out.ptr, self._state.ptr if to_state else 0)
        return out

    def argmax_id(self, x) -> int:
        return int(self.argmax(x).get()[0])

    # ---- memory report -------------------------------------------------------------------------
    def memory(self) -> dict:
        free, total = self.ctx.mem_info()
        return {"weight_bytes": self.weight_bytes, "allocated_bytes": self.ctx.allocated,
                "peak_allocated_bytes": self.ctx.peak_allocated, "device_used_bytes": total - free,
                "device_total_bytes": total}


class GreedyDecoder:
    """Greedy generation with only token ids crossing to the host.

    prefill(ids) runs the prompt and returns the first token (argmax on the device). step(tok)
    runs one token: the first call captures the step into a CUDA graph (after the first token, so
    the first token is never delayed by it) and every later call just replays the graph, whose
    argmax writes the next token and position into the device state it reads. cache.n is kept in
    step with the replays."""

    def __init__(self, backend: CudaBackend, model, cache, use_graph: bool | None = None):
        self.b, self.model, self.cache = backend, model, cache
        if use_graph is None:
            use_graph = os.environ.get("REFLEX_CUDA_GRAPH", "1") != "0"
        self.use_graph = use_graph
        self.graph = None
        self.out = None
        self.capture_s = None
        self._host = np.zeros(4, np.int32)

    def prefill(self, ids) -> int:
        logits = self.model.forward(ids, self.cache, last_only=True, output="raw")
        return self.b.argmax_id(logits)

    def step(self, tok: int) -> int:
        from reflex.errors import ContextOverflow

        c = self.cache
        if c.n + 1 > c.n_ctx:
            raise ContextOverflow(f"{c.n} cached + 1 new token exceed n_ctx {c.n_ctx}")
        if not self.use_graph:
            logits = self.model.forward([tok], c, last_only=True, output="raw")
            return self.b.argmax_id(logits)
        b = self.b
        if self.graph is None:
            t0 = time.perf_counter()
            self._host[0], self._host[1] = tok, c.n
            b.ctx.h2d(b._state.ptr, self._host.ctypes.data, 8)
            b.synchronize()
            b.capturing = True
            b.ctx.begin_capture()
            try:
                logits = self.model.forward([tok], c, last_only=True, output="raw")  # cache.n += 1
                self.out = b.argmax(logits, to_state=True)
                self._keep = logits
            finally:
                b.capturing = False
                graph = b.ctx.end_capture()
            self.graph = graph
            self.capture_s = time.perf_counter() - t0
        else:
            c.n += 1
        self.graph.launch()
        b.ctx.d2h(self._host.ctypes.data, self.out.ptr, 4)
        return int(self._host[0])
