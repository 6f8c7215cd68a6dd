"""CUDA backend: our ahead-of-time compiled kernels (kernels/*.cu -> reflex/_kernels/reflex.fatbin)
launched through the driver API (reflex.backends.cuda_driver); no NVRTC, no CuPy.

- Weights stay on the GPU in their GGUF block format (`QWeight`); only 1-D tensors (norms, biases)
  become float32 device arrays. Decode products read the blocks directly (rx_matvec_*); prefill
  dequantizes one weight at a time into a reused f16 scratch and runs a tensor-core GEMM
  (activations scaled per row into f16, f32 accumulation); F32/BF16 weights, and rows not a
  multiple of 8, keep the dequantize-to-f32 + tiled float32 GEMM.
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
import weakref

import numpy as np

from reflex.backends import cuda_driver as drv
from reflex.backends.base import ROPE_NEOX, ROPE_NORM, Backend
from reflex.backends.cuda_deltanet import CudaDeltaNetOps
from reflex.backends.cuda_embed import CudaEmbedOps
from reflex.backends.cuda_mla import CudaMLAOps
from reflex.backends.cuda_moe import CudaMoEOps
from reflex.backends.cuda_ssm import CudaSSMOps
from reflex.errors import InvalidRequest, ModelFormatError

# ggml type id -> kernel suffix (kernels/quant.cuh RX_FOR_EACH_TYPE); block size, bytes per block
TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2), 8: ("q8_0", 32, 34), 2: ("q4_0", 32, 18),
         3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 10: ("q2_k", 256, 84),
         11: ("q3_k", 256, 110), 12: ("q4_k", 256, 144), 13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210)}
_ITEM = {"f32": 4, "f16": 2, "i32": 4, "u8": 1, "f64": 8}
_NP = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "u8": np.uint8, "f64": np.float64}
MATVEC_MAX_T = 8      # up to this many rows a product reads the blocks directly (no scratch)
CUBLAS_MIN_T = 64     # from this many rows products go to cuBLAS SGEMM (cuda_blas.py)
RN_FUSE_MAX_IN = 8192     # a product rebuilds rms_norm(a + b) in shared memory up to this n_in (32 KB)
RN_FUSE_MAX_ROWS = 32768  # ... and only for this many output rows (not the vocabulary head)
PENALTY_MAX_RING = 256  # longest repeat-penalty window the device decoder keeps (rx_repeat_penalty: one block)
ATT_CHUNK_DECODE = 64  # fewest keys per split of rx_attention_dec (T = 1): splits only for long contexts
# rx_attention_dec splits until about this many blocks per SM: at d = 128 (212 registers) one
# 256-thread block fits per SM, and 2 measured slower on the H200 at S = 2048..8192 (a second wave)
ATT_DEC_BLOCKS_PER_SM = 1
ATT_DEC_MAX_SPLIT = 128     # at most this many splits (the last block merges them one after another)
ATT_DEC_THREADS = 256       # = DEC_WARPS * 32 in kernels/attention.cu
# head_dim -> (rx_attention_dec_<variant>, most query heads per block: GMAX in kernels/attention.cu)
ATT_DEC_VARIANT = {64: ("d64", 8), 128: ("d128", 4), 256: ("d256", 2), 512: ("d512", 1)}


class _Buf:
    """One pooled device allocation; returned to the pool when the last array using it dies.

    `pend` is set while the buffer's contents are a deferred op not yet launched (see
    CudaBackend._m): ("mv", x, w, T) a product, ("add", a, b, n), ("rope", x, pos_ptr, dyn, args),
    ("act", g, op) an activation of a pending product."""

    __slots__ = ("ctx", "ptr", "bucket", "pend", "__weakref__")

    def __init__(self, ctx, nbytes):
        self.ctx = ctx
        self.pend = None
        self.ptr, self.bucket = ctx.pool_get(nbytes)

    def __del__(self):
        try:
            self.ctx.pool_put(self.ptr, self.bucket)
        except Exception:
            pass


class _StaticBuf:
    """Device memory owned elsewhere (a weight segment): never pooled, never pending."""

    __slots__ = ("ptr", "pend", "__weakref__")

    def __init__(self, ptr=0):
        self.ptr = ptr
        self.pend = None


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
        self.backend.flush(self)
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


class CudaBackend(CudaSSMOps, CudaDeltaNetOps, CudaMLAOps, CudaMoEOps, CudaEmbedOps, Backend):
    # op families beyond the dense-transformer core live in mixins (cuda_<family>.py)
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
        # fusion level (REFLEX_CUDA_FUSE): 0 none; 1 the deferred-op fusions below; 2 (default) also
        # per-head norm + RoPE + KV write in one launch (rx_norm_rope_kv); 3 also add + RMSNorm
        # folded into the following Q/K/V or gate/up product (rx_matvec3n_*, rx_matvec_glun_*),
        # T <= 8. Level 3 is opt-in: on the H200 each folding product recomputes the norm per block
        # and got 2.5-5 us slower than the launch it saves (graph decode 557 vs 573 tok/s Qwen3-shaped,
        # 969 vs 987 SmolLM2-shaped, session 4 call C), though eager decode gains
        self.fuse = {"0": 0, "1": 1, "3": 3}.get(os.environ.get("REFLEX_CUDA_FUSE", "2").strip(), 2)
        # prefill products on f16 tensor cores (rx_hgemm_nt) only when asked (REFLEX_CUDA_F16_GEMM=1):
        # 2.7x faster prefill, but its ~1e-3 product error broke GPU parity of the small fixtures
        # (gemma4moe, qwen35, granitehybrid, deepseek2, system1 scores) on the H200, so float32 tiles
        # stay the default until those tolerances are understood
        self.f16_gemm = os.environ.get("REFLEX_CUDA_F16_GEMM", "0") == "1"
        self._blas_h = None  # cuda_blas.Blas once loaded, False where unavailable
        self._recent = []   # weakrefs to the latest pending buffers (siblings share one launch)
        self._kvq = []      # deferred kv_write calls (K and V share one launch)
        self._staged = []   # weights prepared but not yet copied (see _commit)
        self._invf = {}     # RoPE inverse frequencies per (n_rot, base)
        self._amax = DArray(self, (4,), "i32")  # rx_argmax's (key, counter) scratch, self-resetting
        self.ctx.memset0(self._amax.ptr, 16)

    # ---- deferred ops: a few launches fused without any change to the model files ------------
    # matmul (T <= 8), add, rope and kv_write may return before launching. Reading a pending array
    # (any op's input, to_numpy) launches it -- together with its pending siblings: Q/K/V products
    # of one x become one rx_matvec3, rope Q + rope K one rx_rope, K and V cache writes one
    # rx_kv_write, an add followed by rms_norm one rx_add_rms_norm, gate/up/act/mul one
    # rx_matvec_glu. Inputs of ops are never written in place, so deferring cannot change results.
    def _defer(self, out: DArray, pend):
        out.buf.pend = pend
        self._recent.append(weakref.ref(out.buf))
        if len(self._recent) > 12:
            del self._recent[0]
        return out

    def _siblings(self, buf, same) -> list:
        sib = []
        for r in self._recent:
            o = r()
            if o is not None and o.pend is not None and o is not buf and same(o.pend):
                sib.append(o)
        return sib

    def _m(self, x):
        if isinstance(x, DArray) and x.buf.pend is not None:
            self._resolve(x.buf)
        return x

    def flush(self, x=None):
        """Launch deferred cache writes (and x's deferred op)."""
        if self._kvq:
            self._flush_kv()
        if x is not None:
            self._m(x)

    def _resolve(self, buf):
        pend = buf.pend
        kind = pend[0]
        if kind == "mv":
            _, x, w, T = pend
            group = [buf] + self._siblings(buf, lambda p: p[0] == "mv" and p[1] is x and p[3] == T
                                           and p[2].ggml_type == w.ggml_type)
            for i in range(0, len(group), 3):
                part = group[i:i + 3]
                ws = [b.pend[2] for b in part] + [None] * (3 - len(part))
                ptrs = [b.ptr for b in part] + [0] * (3 - len(part))
                ns = [wi.n_out if wi is not None else 0 for wi in ws]
                wp = [wi.ptr if wi is not None else 0 for wi in ws]
                rn = self._rn_inputs(x, sum(ns))
                if rn is not None:  # x = rms_norm(a + b) rebuilt inside the product (rx_matvec3n)
                    a, b2, nw, eps, s = rn
                    self.k("rx_matvec3n_" + w.suffix, "ppppppfppppiiii")(
                        ((sum(ns) + 3) // 4, T, 1), 128, wp[0], wp[1], wp[2], a, b2, nw, eps, s,
                        ptrs[0], ptrs[1], ptrs[2], ns[0], ns[1], ns[2], w.n_in, shmem=4 * w.n_in)
                else:
                    self._m(x)
                    self.k("rx_matvec3_" + w.suffix, "pppppppiiii")(
                        ((sum(ns) + 3) // 4, T, 1), 128, wp[0], wp[1], wp[2], x.ptr, ptrs[0], ptrs[1], ptrs[2],
                        ns[0], ns[1], ns[2], w.n_in)
                for b in part:
                    b.pend = None
        elif kind == "add":
            _, a, b, n = pend
            buf.pend = None
            self.k("rx_binary", "pppllif")(self._grid1(n), 256, a.ptr, b.ptr, buf.ptr, n, b.size, 0, 0.0)
        elif kind == "rope":
            _, x, pos_ptr, dyn, args, _keep = pend
            group = [buf] + self._siblings(buf, lambda p: p[0] == "rope" and p[2] == pos_ptr and p[3] == dyn
                                           and p[4] == args)
            second = group[1] if len(group) > 1 else None
            x2 = second.pend[1] if second is not None else None
            T, n_head, head_dim = x.shape
            n_head2 = x2.shape[1] if x2 is not None and x2.shape[0] == T else 0
            if not n_head2:
                second, x2 = None, None
            n_rot, base, mode = args
            threads = max(32, min(256, ((n_rot // 2 + 31) // 32) * 32))
            self.k("rx_rope", "ppppippiiiip")((T * (n_head + n_head2), 1, 1), threads, x.ptr, buf.ptr,
                                              x2.ptr if x2 is not None else 0, second.ptr if second else 0,
                                              n_head2, pos_ptr, self._inv_freq(n_rot, base).ptr, n_head, head_dim,
                                              n_rot, mode, dyn)
            buf.pend = None
            if second is not None:
                second.pend = None
        elif kind == "rn":
            _, x, w, eps = pend
            buf.pend = None
            self._rms_norm_now(x, w, eps, buf)
        elif kind == "hnorm":
            _, x, w, eps = pend
            buf.pend = None
            self._m(x)
            n = x.shape[-1]
            self.k("rx_rms_norm", "pppif")((x.size // n, 1, 1), 256, x.ptr, w.ptr if w is not None else 0,
                                           buf.ptr, n, eps)
        elif kind == "nrope":
            self._nrope_launch(buf)
        elif kind == "act":
            _, g, op = pend
            buf.pend = None
            self._m(g)
            self.k("rx_unary", "ppli")(self._grid1(g.size), 256, g.ptr, buf.ptr, g.size, op)
        else:
            raise AssertionError(kind)

    def _rn_inputs(self, x, n_rows: int):
        """x pending ("rn", src, w, eps) -- a row norm waiting for its product -- and worth folding
        into a product of n_rows outputs: (a, b, w, eps, s) device pointers for rx_matvec3n /
        rx_matvec_glun (b, s 0 when src is not a pending add), src's add marked done (the product
        writes it). None otherwise: the caller resolves x and runs the plain product."""
        p = x.buf.pend if isinstance(x, DArray) else None
        if (p is None or p[0] != "rn" or x.ptr != x.buf.ptr or x.shape[-1] > RN_FUSE_MAX_IN
                or n_rows > RN_FUSE_MAX_ROWS):
            return None
        _, src, w, eps = p
        wp = w.ptr if w is not None else 0
        q = src.buf.pend
        if q is not None and q[0] == "add" and src.ptr == src.buf.ptr and src.size == q[3] and q[2].size == q[3]:
            _, a, b, _n = q
            self._m(a)
            self._m(b)
            src.buf.pend = None  # the product's blocks with blockIdx.x == 0 write src = a + b
            return a.ptr, b.ptr, wp, eps, src.ptr
        self._m(src)
        return src.ptr, 0, wp, eps, 0

    def _nrope_launch(self, buf, kv=None):
        """Launch a pending ("nrope", x, normed, w, eps, pos_ptr, dyn, args, keep) -- (norm +) RoPE of
        one (T, n_head, head_dim) tensor -- with one pending sibling at the same positions (Q beside
        K) in one rx_norm_rope_kv. kv = (cache, start, v, v_cache): buf's result also goes to the
        cache (v to v_cache; v may be None)."""
        _, x, normed, w, eps, pos_ptr, dyn, args, _keep = buf.pend
        T, n_head, head_dim = x.shape
        key = (pos_ptr, dyn, args)
        sib = self._siblings(buf, lambda p: p[0] == "nrope" and (p[5], p[6], p[7]) == key
                             and p[1].shape[0] == T and p[1].shape[2] == head_dim)
        second = sib[0] if sib else None
        x2 = second.pend[1] if second is not None else None
        self._m(x)
        if x2 is not None:
            self._m(x2)
        norm = (1 if normed else 0) | (2 if second is not None and second.pend[2] else 0)
        w2, eps2 = (second.pend[3], second.pend[4]) if second is not None else (None, 0.0)
        n_head2 = x2.shape[1] if x2 is not None else 0
        n_rot, base, mode = args
        kc, start, v, vc = kv if kv is not None else (None, 0, None, None)
        kv_dyn = self._state.ptr + 4 if (kv is not None and self.capturing) else 0
        threads = max(32, min(256, ((head_dim // 2 + 31) // 32) * 32))
        self.k("rx_norm_rope_kv", "ppppppippiiiipiffpppip")(
            (T * (n_head + n_head2), 1, 1), threads, x.ptr, buf.ptr, w.ptr if w is not None else 0,
            x2.ptr if x2 is not None else 0, second.ptr if second is not None else 0,
            w2.ptr if w2 is not None else 0, n_head2, pos_ptr, self._inv_freq(n_rot, base).ptr, n_head, head_dim,
            n_rot, mode, dyn, norm, eps, eps2, kc.ptr if kc is not None else 0, v.ptr if v is not None else 0,
            vc.ptr if vc is not None else 0, int(start), kv_dyn)
        buf.pend = None
        if second is not None:
            second.pend = None

    def _flush_kv(self):
        q, self._kvq = self._kvq, []
        i = 0
        while i < len(q):
            cache, x, start, row = q[i]
            if self.fuse >= 2 and i + 1 < len(q) and q[i + 1][1].buf.pend is not None \
                    and q[i + 1][1].buf.pend[0] == "nrope" and not (x.buf.pend and x.buf.pend[0] == "nrope"):
                q[i], q[i + 1] = q[i + 1], q[i]  # V queued before K: K leads the fused launch
                cache, x, start, row = q[i]
            p = x.buf.pend
            if (self.fuse >= 2 and p is not None and p[0] == "nrope" and x.ptr == x.buf.ptr
                    and row == x.shape[1] * x.shape[2]):
                # K's (norm +) RoPE, its cache write, V's cache write (and Q's norm + RoPE) in one launch
                kv, step = (cache, start, None, None), 1
                if i + 1 < len(q):
                    c2, x2, s2, r2 = q[i + 1]
                    if s2 == start and r2 == row and x2.size == x.size and c2 is not cache:
                        kv, step = (cache, start, self._f32(x2), c2), 2
                if x.buf.pend is not None:  # resolving V cannot touch K's pending op, but be sure
                    self._nrope_launch(x.buf, kv)
                    i += step
                    continue
            pair = None
            if i + 1 < len(q):
                c2, x2, s2, r2 = q[i + 1]
                if s2 == start and r2 == row and x2.size == x.size and c2 is not cache:
                    pair = (c2, self._f32(x2))
            x = self._f32(x)
            dyn = self._state.ptr + 4 if self.capturing else 0
            self.k("rx_kv_write", "pppplii" + "p")(self._grid1(x.size), 256, cache.ptr, x.ptr,
                                                   pair[0].ptr if pair else 0, pair[1].ptr if pair else 0,
                                                   x.size, row, int(start), dyn)
            i += 2 if pair else 1

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
        if self._staged:
            self._commit()
        self.flush()
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
        if not raw.flags.c_contiguous:
            raw = np.ascontiguousarray(raw)
        if len(shape) == 1 and ggml_type == 0:
            # float32 vectors (norms, biases) are used as they are: staged with the block weights
            v = DArray(self, shape, "f32", buf=_StaticBuf(), ptr=0)
            self._staged.append((v, raw, nbytes))
            return v
        if len(shape) == 1:
            # other 1-D tensors: small, used by elementwise kernels as float32 vectors
            from reflex.quants import dequantize
            v = self.upload(dequantize(raw[:nbytes], ggml_type, shape))
            self.weight_bytes += v.nbytes
            return v
        w = QWeight(0, ggml_type, shape, nbytes)
        self._staged.append((w, raw, nbytes))
        return w

    def _commit(self):
        """Copy every staged weight to the device: tensors adjacent in the memory map (a GGUF
        file's data section is one run of aligned tensors) go in one allocation and one copy
        straight from the map, so loading is a few large transfers instead of one per tensor."""
        staged, self._staged = self._staged, []
        staged.sort(key=lambda e: e[1].ctypes.data)
        staged = self._take_prefetched(staged)
        i = 0
        while i < len(staged):
            start = staged[i][1].ctypes.data
            end = start + staged[i][2]
            j = i + 1
            while j < len(staged):
                a = staged[j][1].ctypes.data
                if not (end <= a < end + 4096):  # alignment padding only between neighbours
                    break
                end = a + staged[j][2]
                j += 1
            n = end - start
            base = self.ctx.malloc_raw(n)
            self.ctx.h2d(base, start, n)
            self.weight_bytes += n
            self._point(staged[i:j], base, start)
            i = j

    @staticmethod
    def _point(entries, base: int, host_start: int):
        """Point staged weights at their bytes in a device copy of host [host_start, ...)."""
        for obj, raw, _ in entries:
            p = base + (raw.ctypes.data - host_start)
            if isinstance(obj, QWeight):
                obj.ptr = p
            else:
                obj.buf.ptr = p
                obj.ptr = p

    def _take_prefetched(self, staged: list) -> list:
        """Point the staged weights that lie in a region cuda_driver.prefetch already copied into
        that copy; returns the rest. A region most of whose bytes no weight uses (a model that
        rearranges its tensors on the host first) is freed rather than kept: resident weights stay
        <= 1.02x the tensor bytes, at the price of a wasted copy for such models."""
        if not staged:
            return staged
        got = drv.take_prefetch(staged[0][1].ctypes.data)
        if got is None:
            return staged
        (lo, hi), job = got
        self.timings["weights_prefetch"] = {k: job[k] for k in ("nbytes", "copy_s", "wait_s", "started_at",
                                                                  "queued_at") if k in job}
        if not job["dev"]:
            self.timings["weights_prefetch"]["error"] = str(job["error"])
            return staged
        inside = [e for e in staged if lo <= e[1].ctypes.data and e[1].ctypes.data + e[2] <= hi]
        used = sum(e[2] for e in inside)
        if used < 0.98 * (hi - lo):
            self.ctx._free_fn(drv._c.c_uint64(job["dev"]))
            self.timings["weights_prefetch"]["freed_unused"] = True
            return staged
        base = job["dev"]
        self.ctx.allocated += hi - lo
        self.ctx.peak_allocated = max(self.ctx.peak_allocated, self.ctx.allocated)
        self.weight_bytes += hi - lo
        self._point(inside, base, lo)
        ids = {id(e) for e in inside}
        return [e for e in staged if id(e) not in ids]

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

    def _f32_plain(self, x, what="input") -> DArray:
        if isinstance(x, DArray):
            if x.dtype != "f32":
                raise InvalidRequest(f"cuda backend: {what} must be float32, got {x.dtype}")
            return x
        if isinstance(x, QWeight):
            raise InvalidRequest(f"cuda backend: {what} is a quantized weight")
        return self.upload(np.asarray(x, dtype=np.float32))

    def _f32(self, x, what="input") -> DArray:  # noqa: F811  (the checked version, resolving deferred ops)
        if self._staged:
            self._commit()  # x may be a staged float32 weight vector
        if isinstance(x, DArray):
            if x.dtype != "f32":
                raise InvalidRequest(f"cuda backend: {what} must be float32, got {x.dtype}")
            if x.buf.pend is not None:
                self._resolve(x.buf)
            return x
        return self._f32_plain(x, what)

    def _ints(self, v) -> DArray:
        return self.upload(np.asarray(v, dtype=np.int32).reshape(-1), "i32")

    # ---- ops -----------------------------------------------------------------------------------
    def dequantize(self, w: QWeight, out: DArray | None = None) -> DArray:
        if self._staged:
            self._commit()
        out = out if out is not None else self.empty(w.shape)
        n = w.n_out * w.n_in
        self.k("rx_dequant_" + w.suffix, "ppll")(self._grid1(n), 256, w.ptr, out.ptr, w.n_out, w.n_in)
        return out

    def embed(self, w, ids):
        if not isinstance(w, QWeight):
            raise InvalidRequest("cuda backend: embed needs a 2-D weight")
        if self._staged:
            self._commit()
        if self.capturing:
            n, ids_ptr, keep = 1, self._state.ptr, None
        else:
            keep = self._ints(ids)
            n, ids_ptr = keep.size, keep.ptr
        out = self.empty((n, w.n_in))
        self.k("rx_get_rows_" + w.suffix, "pppi")(((w.n_in + 255) // 256, n, 1), 256, w.ptr, ids_ptr, out.ptr, w.n_in)
        return out

    def matmul(self, x, w):
        p = x.buf.pend if self.fuse >= 3 and isinstance(x, DArray) and x.dtype == "f32" else None
        if not (p is not None and p[0] == "rn" and isinstance(w, QWeight) and x.shape[-1] == w.n_in
                and x.size // w.n_in <= MATVEC_MAX_T and w.n_in % 8 == 0):
            x = self._f32(x, "matmul input")  # (a norm waiting for this product stays pending)
        if not isinstance(w, QWeight):
            raise InvalidRequest("cuda backend: matmul needs a prepared 2-D weight")
        if self._staged:
            self._commit()
        n_in, n_out = w.n_in, w.n_out
        if x.shape[-1] != n_in:
            raise InvalidRequest(f"matmul: input {x.shape} does not match weight {w.shape}")
        T = x.size // n_in
        out = self.empty(x.shape[:-1] + (n_out,))
        if T <= MATVEC_MAX_T and n_in % 8 == 0 and self.fuse:
            return self._defer(out, ("mv", x, w, T))
        if T <= MATVEC_MAX_T and n_in % 8 == 0:
            self.k("rx_matvec_" + w.suffix, "pppii")(((n_out + 3) // 4, T, 1), 128, w.ptr, x.ptr, out.ptr, n_out, n_in)
        elif self.f16_gemm and n_in % 8 == 0 and w.ggml_type not in (0, 30):
            # tensor cores: weight dequantized into a reused f16 scratch, activations scaled per row
            # into f16 (no overflow), f32 accumulation (kernels/matmul.cu rx_hgemm_nt)
            wh = self.empty(w.shape, "f16")
            self.k("rx_dequant_h_" + w.suffix, "ppll")(self._grid1(w.n_out * n_in), 256, w.ptr, wh.ptr, w.n_out, n_in)
            xh, sc = self.empty((T, n_in), "f16"), self.empty((T,))
            self.k("rx_x_to_half", "pppii")((T, 1, 1), 256, x.ptr, xh.ptr, sc.ptr, T, n_in)
            self.k("rx_hgemm_nt", "ppppiii")(((n_out + 63) // 64, (T + 63) // 64, 1), 128,
                                            xh.ptr, wh.ptr, sc.ptr, out.ptr, T, n_out, n_in)
        else:
            # float32 products: the weight dequantized into a float32 scratch (bit-exact, an F32
            # weight is used in place), then cuBLAS SGEMM where the library is installed
            # (cuda_blas.py: loaded on the first such product), else our tiled rx_sgemm_nt
            scratch = w if w.ggml_type == 0 else self.dequantize(w)
            # below CUBLAS_MIN_T rows our tiled SGEMM is as fast as cuBLAS for these shapes, and a
            # short prompt or one sentence to embed then never waits for the library to load
            blas = self._blas() if T >= CUBLAS_MIN_T else None
            if blas is not None:
                blas.gemm_nt(x.ptr, scratch.ptr, out.ptr, T, n_out, n_in)
            else:
                self.k("rx_sgemm_nt", "pppiii")(((n_out + 63) // 64, (T + 63) // 64, 1), 256,
                                               x.ptr, scratch.ptr, out.ptr, T, n_out, n_in)
        return out

    def _blas(self):
        """cuBLAS for prefill products, loaded on first use (never on the short-prompt cold path)."""
        if self._blas_h is None:
            from reflex.backends import cuda_blas

            self._blas_h = cuda_blas.get(self.ctx.stream) or False
            if self._blas_h:
                self.timings["cublas_load_s"] = self._blas_h.load_s
                if "cublas_preload_s" in self.timings:   # loaded on the context thread: not waited for
                    self.timings["cublas_load_s"] = 0.0
        return self._blas_h or None

    def matmul2(self, x, w0, w1):
        """(x @ w0.T, x @ w1.T) for two weights of one shape and type (gate/up): one launch at decode."""
        if self._staged:
            self._commit()
        x = self._f32(x, "matmul input")
        T = x.size // w0.n_in
        if (w0.n_in != w1.n_in or w0.ggml_type != w1.ggml_type or T > MATVEC_MAX_T or w0.n_in % 8):
            return self.matmul(x, w0), self.matmul(x, w1)
        y0, y1 = self.empty(x.shape[:-1] + (w0.n_out,)), self.empty(x.shape[:-1] + (w1.n_out,))
        self.k("rx_matvec3_" + w0.suffix, "pppppppiiii")(((w0.n_out + w1.n_out + 3) // 4, T, 1), 128, w0.ptr,
                                                        w1.ptr, 0, x.ptr, y0.ptr, y1.ptr, 0, w0.n_out, w1.n_out,
                                                        0, w0.n_in)
        return y0, y1

    def rms_norm(self, x, w, eps: float):
        if self._staged:
            self._commit()
        if (self.fuse >= 3 and isinstance(x, DArray) and x.dtype == "f32" and x.ndim == 2
                and x.shape[0] <= MATVEC_MAX_T and x.shape[-1] % 8 == 0 and x.shape[-1] <= RN_FUSE_MAX_IN
                and (w is None or w.size == x.shape[-1])):
            # decode pre-norm: waits for the product that reads it (rx_matvec3n / rx_matvec_glun)
            return self._defer(self.empty(x.shape), ("rn", x, w, float(eps)))
        if (self.fuse >= 2 and isinstance(x, DArray) and x.dtype == "f32" and x.ndim == 3
                and x.shape[0] <= MATVEC_MAX_T and x.shape[-1] <= 512 and x.shape[-1] % 2 == 0
                and (w is None or w.size == x.shape[-1])):
            # per-head q/k norm at decode: waits for the RoPE that follows (rx_norm_rope_kv)
            return self._defer(self.empty(x.shape), ("hnorm", x, w, float(eps)))
        return self._rms_norm_now(x, w, eps)

    def _rms_norm_now(self, x, w, eps: float, out_buf=None):
        """rms_norm launched now (into out_buf's memory when given: a deferred "rn" resolving)."""
        mk = (lambda shape: DArray(self, shape, "f32", out_buf)) if out_buf is not None else self.empty
        if isinstance(x, DArray) and x.buf.pend is not None and x.buf.pend[0] == "add":
            _, a, b, n_all = x.buf.pend
            if x.ptr == x.buf.ptr and x.size == n_all and b.size == n_all:
                # the pending residual add and this norm in one launch; the sum lands in x's buffer
                x.buf.pend = None
                n = x.shape[-1]
                out = mk(x.shape)
                self.k("rx_add_rms_norm", "pppppif")((x.size // n, 1, 1), 256, a.ptr, b.ptr, x.ptr,
                                                     w.ptr if w is not None else 0, out.ptr, n, float(eps))
                return out
        x = self._f32(x, "rms_norm input")
        n = x.shape[-1]
        out = mk(x.shape)
        self.k("rx_rms_norm", "pppif")((x.size // n, 1, 1), 256, x.ptr, w.ptr if w is not None else 0,
                                       out.ptr, n, float(eps))
        return out

    def add_rms_norm(self, x, r, w, eps: float):
        """(x + r, rms_norm(x + r) * w) in one launch."""
        if self._staged:
            self._commit()
        x, r = self._f32(x), self._f32(r)
        n = x.shape[-1]
        s, out = self.empty(x.shape), self.empty(x.shape)
        self.k("rx_add_rms_norm", "pppppif")((x.size // n, 1, 1), 256, x.ptr, r.ptr, s.ptr,
                                             w.ptr if w is not None else 0, out.ptr, n, float(eps))
        return s, out

    def layer_norm(self, x, w, b, eps: float):
        if self._staged:
            self._commit()
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

    def _inv_freq(self, n_rot: int, base: float) -> DArray:
        """base^(-2i / n_rot), i < n_rot/2, in float64 as the NumPy backend computes it (cached)."""
        key = (n_rot, base)
        f = self._invf.get(key)
        if f is None:
            f = self._invf[key] = self.upload(float(base) ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot), "f64")
        return f

    def rope(self, x, pos, n_rot: int, freq_base: float, mode: int = ROPE_NORM):
        if self._staged:
            self._commit()
        fused = (self.fuse >= 2 and isinstance(x, DArray) and x.dtype == "f32" and x.ndim == 3
                 and x.shape[0] <= MATVEC_MAX_T and x.shape[-1] <= 512)
        if not fused:
            x = self._f32(x, "rope input")
        if mode not in (ROPE_NORM, ROPE_NEOX):
            raise ValueError(f"unknown rope mode {mode}")
        T, n_head, head_dim = x.shape
        if n_rot % 2 or n_rot > head_dim or head_dim % 2:
            raise InvalidRequest(f"rope: n_rot {n_rot} / head_dim {head_dim}")
        out = self.empty(x.shape)
        if self.capturing:
            pos_ptr, dyn, keep = 0, self._state.ptr + 4, None
        else:
            keep = self._positions(pos)
            pos_ptr, dyn = keep.ptr, 0
        args = (int(n_rot), float(freq_base), 0 if mode == ROPE_NORM else 1)
        if fused:
            # decode: (norm +) RoPE (+ cache write) launched together with the sibling tensor
            p = x.buf.pend
            if p is not None and p[0] == "hnorm" and x.ptr == x.buf.ptr and x.shape == p[1].shape:
                return self._defer(out, ("nrope", p[1], True, p[2], p[3], pos_ptr, dyn, args, keep))
            return self._defer(out, ("nrope", x, False, None, 0.0, pos_ptr, dyn, args, keep))
        self._defer(out, ("rope", x, pos_ptr, dyn, args, keep))  # keep: positions stay alive
        if not self.fuse:
            self._resolve(out.buf)
        return out

    def kv_write(self, cache, x, start: int):
        if self.fuse >= 2 and isinstance(x, DArray) and x.dtype == "f32" and x.buf.pend is not None:
            if self._staged:
                self._commit()
        else:
            x = self._f32(x, "kv_write input")  # a pending K/V waits for _flush_kv (rx_norm_rope_kv)
        if not isinstance(cache, DArray) or cache.dtype != "f16":
            raise InvalidRequest("cuda backend: KV cache must come from zeros()")
        row = math.prod(cache.shape[1:])
        if not self.capturing and int(start) + x.size // row > cache.shape[0]:
            raise InvalidRequest("kv_write past the end of the cache")
        self._kvq.append((cache, x, int(start), row))
        if not self.fuse:
            self._flush_kv()

    def attention(self, q, k_cache, v_cache, n_past: int, scale: float | None = None, *,
                  window: int = 0, mask=None, causal: bool = True):
        if self._kvq:
            self._flush_kv()
        q = self._f32(q, "attention query")
        T, n_head, d = q.shape
        k_cache, v_cache = self._as_f16(k_cache), self._as_f16(v_cache)
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
        dyn = self._state.ptr + 4 if self.capturing else 0
        out = self.empty((T, n_head, d))
        if T == 1 and mask_d is None:
            # rx_attention_dec: one block per (kv head, group of its query heads, split). The kernel
            # cuts the visible keys into splits itself (n_past may only be known on the device);
            # the grid's y is an upper bound -- from n_ctx when capturing, so the graph replays at
            # any position -- and blocks past the run-time split count exit at once.
            G = n_head // n_kv
            var, gmax = ATT_DEC_VARIANT.get(d) or (("g256", 2) if d <= 256 else ("g512", 1))
            n_grp = -(-G // gmax)
            gb = -(-G // n_grp)  # balanced groups, each <= gmax heads
            blocks = n_kv * n_grp
            n_vis = n_ctx if self.capturing else S
            if window and window > 0:
                n_vis = min(n_vis, int(window))
            want = -(-ATT_DEC_BLOCKS_PER_SM * self.ctx.sm_count // blocks)
            Y = max(1, min(want, -(-n_vis // ATT_CHUNK_DECODE), ATT_DEC_MAX_SPLIT))
            part = self.empty((n_head * Y * (d + 2),)) if Y > 1 else None
            cnt = getattr(self, "_att_cnt", None)
            if cnt is None or cnt.size < blocks:
                # split counters of the last-block merge; each launch leaves them at 0. The memset
                # is a stream op, so even an allocation made while capturing is zeroed in order
                cnt = self._att_cnt = DArray(self, (max(blocks, 256),), "i32")
                self.ctx.memset0(cnt.ptr, 4 * cnt.size)
            self.k("rx_attention_dec_" + var, "ppppppiiiiipfii")(
                (blocks, Y, 1), ATT_DEC_THREADS, q.ptr, k_cache.ptr, v_cache.ptr, out.ptr,
                part.ptr if part is not None else 0, cnt.ptr, n_head, n_kv, d, gb, int(n_past), dyn,
                float(scale), int(window or 0), ATT_CHUNK_DECODE)
            return out
        if self.capturing:
            # a captured T > 1 step: the split count comes from n_ctx, splits past S stay empty
            chunk = 256
            n_split = (n_ctx + chunk - 1) // chunk
        else:
            chunk, n_split = max(S, 1), 1
        part = self.empty((T * n_head * n_split * (d + 2),)) if n_split > 1 else None
        self.k("rx_attention", "ppppppiiiipfiiii")(
            (T * n_head, n_split, 1), 128, q.ptr, k_cache.ptr, v_cache.ptr, out.ptr,
            part.ptr if part is not None else 0, mask_d.ptr if mask_d is not None else 0,
            n_head, n_kv, d, int(n_past), dyn, float(scale), int(window or 0), 1 if causal else 0, chunk, S_mask)
        if n_split > 1:
            self.k("rx_attn_combine", "ppii")((T * n_head, 1, 1), 128, part.ptr, out.ptr, n_split, d)
        return out

    def _as_f16(self, kv):
        """A float32 K or V given in place of a cache (an encoder attending over its own (T, n_kv, d)
        projections, as bert does) -> a float16 copy, the layout the attention kernel reads."""
        if isinstance(kv, DArray) and kv.dtype == "f16":
            return kv
        kv = self._f32(kv, "attention key/value")
        out = DArray(self, kv.shape, "f16")
        self.k("rx_kv_write", "pppplii" + "p")(self._grid1(kv.size), 256, out.ptr, kv.ptr, 0, 0, kv.size, 1, 0, 0)
        return out

    def _unary(self, x, op):
        if (op in (0, 1) and self.fuse and isinstance(x, DArray) and x.buf.pend is not None
                and x.buf.pend[0] == "mv" and x.ptr == x.buf.ptr):
            return self._defer(self.empty(x.shape), ("act", x, op))
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

    def _glu_fusable(self, g, u):
        """g = act(pending product of x), u = pending product of the same x, same type and shape."""
        if not (isinstance(g, DArray) and isinstance(u, DArray) and g.buf.pend and u.buf.pend):
            return None
        pg, pu = g.buf.pend, u.buf.pend
        if pg[0] != "act" or pu[0] != "mv" or u.ptr != u.buf.ptr:
            return None
        gm = pg[1]
        pm = gm.buf.pend
        if pm is None or pm[0] != "mv" or pm[1] is not pu[1] or pm[3] != pu[3]:
            return None
        wg, wu = pm[2], pu[2]
        if wg.ggml_type != wu.ggml_type or wg.shape != wu.shape:
            return None
        return pu[1], wg, wu, pu[3], pg[2]

    def _glu_launch(self, x, wg, wu, T, op, shape):
        out = self.empty(shape)
        rn = self._rn_inputs(x, wg.n_out)
        if rn is not None:  # x = rms_norm(a + b) rebuilt inside the product (rx_matvec_glun)
            a, b, nw, eps, s = rn
            self.k("rx_matvec_glun_" + wg.suffix, "pppppfppiii")(
                ((wg.n_out + 3) // 4, T, 1), 128, wg.ptr, wu.ptr, a, b, nw, eps, s, out.ptr, wg.n_out, wg.n_in, op,
                shmem=4 * wg.n_in)
            return out
        self._m(x)
        self.k("rx_matvec_glu_" + wg.suffix, "ppppiii")(((wg.n_out + 3) // 4, T, 1), 128, wg.ptr, wu.ptr, x.ptr,
                                                       out.ptr, wg.n_out, wg.n_in, op)
        return out

    def _binary(self, a, b, op):
        if op == 1 and self.fuse:
            f = self._glu_fusable(a, b) or self._glu_fusable(b, a)
            if f is not None:
                return self._glu_launch(*f, shape=a.shape)
        if (op == 0 and self.fuse and isinstance(a, DArray) and isinstance(b, DArray)
                and a.shape == b.shape and a.dtype == b.dtype == "f32"):
            a, b = self._f32(a), self._f32(b)
            return self._defer(self.empty(a.shape), ("add", a, b, a.size))
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

    def expert_matmul(self, x, w, expert_ids, weights=None):
        """Base contract. A 3-D weight's expert e is the contiguous byte range e * nbytes / n_expert
        of its buffer, so each expert is a 2-D `QWeight` view run by the ordinary matmul (matvec
        reading the blocks at decode, dequant + GEMM for larger groups): only the selected
        experts' weights are read. The slots routed to one expert are gathered into contiguous rows
        (rx_get_rows_f32) so each expert runs once; results go to their slots with rx_binary
        (scaled by the routing weight and accumulated when `weights` is given). expert_ids and
        weights are host arrays, so this op cannot be captured into a CUDA graph."""
        if self._staged:
            self._commit()
        if not isinstance(w, QWeight) or w.ndim != 3:
            raise InvalidRequest("cuda backend: expert_matmul needs a prepared 3-D weight")
        n_expert, n_out, n_in = w.shape
        ids = np.asarray(expert_ids, dtype=np.int64)               # (T, K)
        if ids.ndim != 2:
            raise InvalidRequest(f"expert_matmul: expert_ids must be (T, K), got {ids.shape}")
        T, K = ids.shape
        if ids.size and (ids.min() < 0 or ids.max() >= n_expert):
            raise InvalidRequest(f"expert id out of range [0, {n_expert})")
        x = self._f32(x, "expert_matmul input")
        if x.shape not in ((T, n_in), (T, K, n_in)):
            raise InvalidRequest(f"expert_matmul: input {x.shape} does not match ids {ids.shape}, weight {w.shape}")
        per_expert = w.nbytes // n_expert
        flat = ids.reshape(-1)
        src = np.repeat(np.arange(T), K) if x.ndim == 2 else np.arange(T * K)  # input row of each slot
        order = np.argsort(flat, kind="stable")
        gathered = self.empty((T * K, n_in))                       # slots sorted by expert
        inv = np.empty(T * K, dtype=np.int64)
        inv[order] = np.arange(T * K)                              # slot s -> its row in Y
        # one upload, before any expert runs: [input row per sorted slot | Y row per slot | routing
        # weights as float32 bits]. A copy from pageable memory waits for the stream, so a second
        # upload after the expert products would stall the host until they finished.
        host = np.empty(3 * T * K, dtype=np.int32)
        host[:T * K], host[T * K:2 * T * K] = src[order], inv
        if weights is not None:
            host[2 * T * K:] = np.asarray(weights, dtype=np.float32).reshape(T * K).view(np.int32)
        else:
            host[2 * T * K:] = 0
        idx = self._ints(host)
        pos_ptr, wt_ptr = idx.ptr + 4 * T * K, idx.ptr + 8 * T * K
        for c in range(0, T * K, 65535):  # rows on grid.y (at most 65535 per launch)
            n_c = min(65535, T * K - c)
            self.k("rx_get_rows_f32", "pppi")(((n_in + 255) // 256, n_c, 1), 256, x.ptr, idx.ptr + 4 * c,
                                              gathered.ptr + c * n_in * 4, n_in)
        # each selected expert once over its rows; results one expert after another into Y
        Y = self.empty((T * K, n_out))                             # (slots sorted by expert, n_out)
        row_bytes = n_out * 4
        a = 0
        while a < T * K:
            e = int(flat[order[a]])
            b = a
            while b < T * K and flat[order[b]] == e:
                b += 1
            view = QWeight(w.ptr + e * per_expert, w.ggml_type, (n_out, n_in), per_expert)
            y = self._f32(self.matmul(gathered[a:b], view), "expert product")  # (b - a, n_out)
            self.ctx.d2d(Y.ptr + a * row_bytes, y.ptr, (b - a) * row_bytes)
            a = b
        if weights is None:   # out[t, k] = Y[pos[t*K + k]]: one row gather
            out = self.empty((T, K, n_out))
            for c in range(0, T * K, 65535):
                n_c = min(65535, T * K - c)
                self.k("rx_get_rows_f32", "pppi")(((n_out + 255) // 256, n_c, 1), 256, Y.ptr, pos_ptr + 4 * c,
                                                  out.ptr + c * row_bytes, n_out)
        else:                 # out[t] = sum_k weight[t, k] * Y[pos[t*K + k]] (kernels/moe.cu)
            out = self.empty((T, n_out))
            for c in range(0, T, 65535):
                n_c = min(65535, T - c)
                self.k("rx_moe_combine", "ppppiii")(((n_out + 255) // 256, n_c, 1), 256, Y.ptr, pos_ptr + 4 * c * K,
                                                    wt_ptr + 4 * c * K, out.ptr + c * row_bytes, n_c, K, n_out)
        del idx, gathered
        return out

    def swiglu(self, gate, up):
        if self.fuse and isinstance(gate, DArray) and isinstance(up, DArray) and gate.buf.pend and up.buf.pend:
            pg, pu = gate.buf.pend, up.buf.pend
            if (pg[0] == pu[0] == "mv" and pg[1] is pu[1] and pg[3] == pu[3] and gate.ptr == gate.buf.ptr
                    and up.ptr == up.buf.ptr and pg[2].ggml_type == pu[2].ggml_type and pg[2].shape == pu[2].shape):
                return self._glu_launch(pg[1], pg[2], pu[2], pg[3], 0, gate.shape)
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
        self.k("rx_argmax", "pippp")(((n + 2047) // 2048, 1, 1), 256, row.ptr, n, out.ptr,
                                     self._state.ptr if to_state else 0, self._amax.ptr)
        return out

    def argmax_id(self, x) -> int:
        return int(self.argmax(x).get()[0])

    def penalty_ring(self, history, n_ring: int) -> DArray:
        """The device window of the repeat penalty: (1 + n_ring,) int32 = [push cursor, the last
        n_ring ids of history in ring order, -1 for empty slots] (kernels/sample.cu)."""
        if not 0 < n_ring <= PENALTY_MAX_RING:
            raise InvalidRequest(f"device repeat penalty: window {n_ring} outside 1..{PENALTY_MAX_RING}")
        h = [int(t) for t in history][-n_ring:]
        host = np.full(1 + n_ring, -1, np.int32)
        host[0] = len(h)
        host[1:1 + len(h)] = h
        return self.upload(host, "i32")

    def repeat_penalty(self, x, ring: DArray, penalty: float):
        """In place on the last row of x (logits): Sampler._penalize over the ring's window."""
        x = self._f32(x)
        n = x.shape[-1]
        row = x.reshape(-1, n)[-1]
        self.k("rx_repeat_penalty", "ppiif")((1, 1, 1), PENALTY_MAX_RING, row.ptr, ring.ptr, ring.size - 1, n,
                                           float(penalty))
        return x

    def ring_push(self, ring: DArray, tok: DArray):
        """Append the device token tok[0] to the penalty window (one thread, stays on the device)."""
        self.k("rx_ring_push", "pip")((1, 1, 1), 1, ring.ptr, ring.size - 1, tok.ptr)

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
    argmax writes the next token and position into the device state it reads. The host runs one
    step ahead: as soon as a step's token is read, the next step is already queued (it feeds on
    the device-side token), so the GPU does not idle while the host streams text. cache.n counts
    the steps handed out (a run-ahead step that is never asked for only wrote a KV row past it)."""

    def __init__(self, backend: CudaBackend, model, cache, use_graph: bool | None = None, *,
                 repeat_penalty: float = 1.0, repeat_last_n: int = 64, history=()):
        self.b, self.model, self.cache = backend, model, cache
        # greedy with a repeat penalty (rag ask uses 1.15): the window of the last repeat_last_n
        # tokens lives on the device (prompt tail uploaded once, each chosen token pushed by a
        # kernel), so the penalty runs inside the captured step and no logits cross to the host
        self.penalty = float(repeat_penalty)
        self.ring = (backend.penalty_ring(history, repeat_last_n)
                     if self.penalty != 1.0 and repeat_last_n != 0 else None)
        if use_graph is None:
            # a model that decides on the host mid-step (deepseek2 and gemma4 route experts there) cannot be
            # replayed from a graph; it still gets device argmax, launched eagerly
            use_graph = (os.environ.get("REFLEX_CUDA_GRAPH", "1") != "0"
                         and getattr(model, "graph_capturable", True))
        self.use_graph = use_graph
        self.graph = None
        self.out = None
        self.capture_s = None
        self._host = np.zeros(4, np.int32)
        self._ahead = None  # (slot) of a queued step not yet handed out

    def _choose(self, logits, to_state: bool = False) -> DArray:
        b = self.b
        if self.ring is not None:
            b.repeat_penalty(logits, self.ring, self.penalty)
        out = b.argmax(logits, to_state=to_state)
        if self.ring is not None:
            b.ring_push(self.ring, out)
        return out

    def prefill(self, ids) -> int:
        logits = self.model.forward(ids, self.cache, last_only=True, output="raw")
        return int(self._choose(logits).get()[0])

    def _queue(self, slot: int):
        b = self.b
        self.graph.launch()
        b.ctx.d2h_async(self._pin_addr + 4 * slot, self.out.ptr, 4)
        b.ctx.record(self._ev[slot])

    def step(self, tok: int) -> int:
        from reflex.errors import ContextOverflow

        c = self.cache
        if c.n + 1 > c.n_ctx:
            raise ContextOverflow(f"{c.n} cached + 1 new token exceed n_ctx {c.n_ctx}")
        if not self.use_graph:
            logits = self.model.forward([tok], c, last_only=True, output="raw")
            return int(self._choose(logits).get()[0])
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
                self.out = self._choose(logits, to_state=True)
                self._keep = logits
            finally:
                b.capturing = False
                graph = b.ctx.end_capture()
            self.graph = graph
            self._pin_addr, self._pin = b.ctx.pinned_ints(2)
            self._ev = [b.ctx.event(), b.ctx.event()]
            self._slot = 0
            self._queue(0)
            self.capture_s = time.perf_counter() - t0
        elif self._ahead is None:
            c.n += 1
            self._slot ^= 1
            self._queue(self._slot)
        else:
            c.n += 1
            self._slot = self._ahead
        slot = self._slot
        self._ahead = None
        if c.n + 1 <= c.n_ctx:  # queue the next step before waiting for this one's token
            self._ahead = slot ^ 1
            self._queue(slot ^ 1)
        b.ctx.wait(self._ev[slot])
        return int(self._pin[slot])

    def __del__(self):
        if self.graph is None:
            return
        try:
            self.b.ctx.synchronize()  # a run-ahead step may still copy into the pinned slots
            drv._fn("cuMemFreeHost")(drv._c.c_void_p(self._pin_addr))
            for e in self._ev:
                drv._fn("cuEventDestroy_v2")(e)
        except Exception:
            pass
