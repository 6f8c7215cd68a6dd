"""A thin ctypes binding of the CUDA driver API (libcuda), just what the CUDA backend needs.

Why not CuPy: `import cupy` costs 0.3-0.6 s on the H200 machine, most of a 0.5 s cold-start budget,
and its elementwise/reduction ops JIT-compile through NVRTC. The driver API loads our AOT fatbin
(cuModuleLoadData), allocates, copies and launches; ctypes releases the GIL during every foreign
call, so context creation can run on a thread while the main thread imports and maps the model.

Importing this module loads nothing; `start()` begins cuInit + primary-context creation + module
load on a background thread, and `get()` waits for it.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
import time

_c = ctypes
CU_STREAM_CAPTURE_MODE_RELAXED = 2
_ATTR_CC_MAJOR, _ATTR_CC_MINOR, _ATTR_SM_COUNT = 75, 76, 16


from reflex.errors import ReflexError


class CudaError(ReflexError):
    """A failing driver call (category "device_error"); "backend_unavailable" when there is no
    driver, no GPU or no built fatbin."""
    category = "device_error"


_lib = None


def load_library(name: str) -> ctypes.CDLL:
    """ctypes.CDLL(name), with the load itself done while the GIL is released.

    ctypes.CDLL calls dlopen holding the GIL, so while the context thread loads libcuda (or
    libcublas) the main thread's imports stop: measured here with a 434 MB library, the main
    thread was blocked for the whole 0.24-0.41 s load. dlopen called as a ctypes foreign function
    releases the GIL like any other call; the CDLL that follows finds the library already loaded
    and only takes a reference (the first handle is never closed: these libraries stay for the
    process's lifetime anyway). Where libc's dlopen can't be reached, or it fails, CDLL does the
    load and raises its usual OSError."""
    try:
        libc = _c.CDLL(None)
        dlopen = libc.dlopen
        dlopen.restype, dlopen.argtypes = _c.c_void_p, (_c.c_char_p, _c.c_int)
        # the mode CDLL uses (it ORs RTLD_NOW into its default RTLD_LOCAL)
        dlopen(os.fsencode(name), os.RTLD_NOW | os.RTLD_LOCAL)
    except (AttributeError, OSError, TypeError):
        pass
    return _c.CDLL(name)


def _load_lib():
    global _lib
    if _lib is None:
        last = None
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                _lib = load_library(name)
                break
            except OSError as e:
                last = e
        if _lib is None:
            raise CudaError(f"CUDA driver library not found ({last})", category="backend_unavailable")
    return _lib


def _fn(name):
    return getattr(_load_lib(), name)


def check(rc: int, what: str = ""):
    if rc != 0:
        s = _c.c_char_p()
        try:
            _fn("cuGetErrorName")(rc, _c.byref(s))
            nm = s.value.decode() if s.value else str(rc)
        except Exception:
            nm = str(rc)
        raise CudaError(f"{what or 'CUDA call'} failed: {nm} ({rc})")


class Kernel:
    """One kernel of the module; `sig` lists argument kinds: p pointer, l int64, i int32, f float32.

    Arguments are packed into one reused buffer; cuLaunchKernel copies them at the call, so the
    buffer can be rewritten for the next launch right away."""

    __slots__ = ("name", "fn", "fmt", "buf", "params", "ctx")
    _sizes = {"p": ("Q", 8), "l": ("q", 8), "i": ("i", 4), "f": ("f", 4)}

    def __init__(self, ctx, name: str, sig: str):
        self.ctx = ctx
        self.name = name
        h = _c.c_void_p()
        check(_fn("cuModuleGetFunction")(_c.byref(h), ctx.module, name.encode()), f"cuModuleGetFunction({name})")
        self.fn = h
        fmt, offs, off = "<", [], 0
        for k in sig:
            code, size = self._sizes[k]
            pad = (-off) % size
            fmt += "x" * pad
            off += pad
            offs.append(off)
            fmt += code
            off += size
        self.fmt = fmt
        self.buf = _c.create_string_buffer(max(off, 8))
        base = _c.addressof(self.buf)
        self.params = (_c.c_void_p * max(len(offs), 1))(*[base + o for o in offs])

    def __call__(self, grid, block, *args, shmem: int = 0):
        struct.pack_into(self.fmt, self.buf, 0, *args)
        gx, gy, gz = grid
        rc = self.ctx.launch(self.fn, gx, gy, gz, block, 1, 1, shmem, self.ctx.stream, self.params, None)
        if rc:
            check(rc, f"launch {self.name} grid={grid} block={block}")


class Context:
    """Primary context of device 0, our stream, the loaded fatbin module and a size-bucketed pool."""

    def __init__(self, fatbin: str, device: int = 0):
        t0 = time.perf_counter()
        lib = _load_lib()
        if not os.path.exists(fatbin):
            raise CudaError(f"CUDA kernels not built ({fatbin} missing): run `python kernels/build.py`",
                            category="backend_unavailable")
        t_lib = time.perf_counter()
        rc = lib.cuInit(0)
        if rc:
            raise CudaError(f"no usable CUDA device (cuInit error {rc})", category="backend_unavailable")
        t_init = time.perf_counter()
        dev = _c.c_int()
        check(lib.cuDeviceGet(_c.byref(dev), device), "cuDeviceGet")
        self.device = dev.value
        ctx = _c.c_void_p()
        check(lib.cuDevicePrimaryCtxRetain(_c.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.ctx = ctx
        check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        t1 = time.perf_counter()
        major, minor, sms = _c.c_int(), _c.c_int(), _c.c_int()
        lib.cuDeviceGetAttribute(_c.byref(major), _ATTR_CC_MAJOR, dev)
        lib.cuDeviceGetAttribute(_c.byref(minor), _ATTR_CC_MINOR, dev)
        lib.cuDeviceGetAttribute(_c.byref(sms), _ATTR_SM_COUNT, dev)
        self.cc = (major.value, minor.value)
        self.sm_count = sms.value
        name = _c.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, dev)
        self.name = name.value.decode(errors="replace")
        stream = _c.c_void_p()
        check(lib.cuStreamCreate(_c.byref(stream), 0), "cuStreamCreate")
        self.stream = stream
        with open(fatbin, "rb") as fh:
            image = fh.read()
        self._image = _c.create_string_buffer(image, len(image))
        mod = _c.c_void_p()
        check(lib.cuModuleLoadData(_c.byref(mod), self._image), "cuModuleLoadData")
        self.module = mod
        t2 = time.perf_counter()
        self.launch = lib.cuLaunchKernel
        self._alloc = lib.cuMemAlloc_v2
        self._free_fn = lib.cuMemFree_v2
        self._h2d = lib.cuMemcpyHtoDAsync_v2
        self._d2h = lib.cuMemcpyDtoHAsync_v2
        self._sync = lib.cuStreamSynchronize
        self.pool: dict[int, list[int]] = {}
        self.allocated = 0        # bytes held from cuMemAlloc (pool + weights)
        self.peak_allocated = 0
        # cuda_init_s: dlopen libcuda + cuInit + primary context (the parts apart, for the breakdown)
        self.timings = {"cuda_init_s": t1 - t0, "module_load_s": t2 - t1, "dlopen_s": t_lib - t0,
                        "cuinit_s": t_init - t_lib, "primary_ctx_s": t1 - t_init}
        self.capturing = False

    # ---- memory --------------------------------------------------------------------------------
    @staticmethod
    def bucket(nbytes: int) -> int:
        n = max(int(nbytes), 256)
        if n <= 1 << 20:
            return (n + 255) & ~255
        step = 1 << max(n.bit_length() - 4, 12)  # <= 1/8 overhead for big buffers
        return (n + step - 1) // step * step

    def malloc_raw(self, nbytes: int) -> int:
        p = _c.c_uint64()
        rc = self._alloc(_c.byref(p), _c.c_size_t(nbytes))
        if rc:
            check(rc, f"cuMemAlloc({nbytes})")
        self.allocated += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return p.value

    def pool_get(self, nbytes: int) -> tuple[int, int]:
        b = self.bucket(nbytes)
        lst = self.pool.get(b)
        if lst:
            return lst.pop(), b
        return self.malloc_raw(b), b

    def pool_put(self, ptr: int, b: int):
        self.pool.setdefault(b, []).append(ptr)

    def h2d(self, dst: int, src_addr: int, nbytes: int):
        if nbytes:
            check(self._h2d(_c.c_uint64(dst), _c.c_void_p(src_addr), _c.c_size_t(nbytes), self.stream),
                  "cuMemcpyHtoDAsync")

    def d2d(self, dst: int, src: int, nbytes: int):
        if nbytes:
            check(_fn("cuMemcpyDtoDAsync_v2")(_c.c_uint64(dst), _c.c_uint64(src), _c.c_size_t(nbytes), self.stream),
                  "cuMemcpyDtoDAsync")

    def d2h(self, dst_addr: int, src: int, nbytes: int):
        check(self._d2h(_c.c_void_p(dst_addr), _c.c_uint64(src), _c.c_size_t(nbytes), self.stream),
              "cuMemcpyDtoHAsync")
        self.synchronize()

    def memset0(self, ptr: int, nbytes: int):
        check(_fn("cuMemsetD8Async")(_c.c_uint64(ptr), _c.c_ubyte(0), _c.c_size_t(nbytes), self.stream),
              "cuMemsetD8Async")

    def synchronize(self):
        check(self._sync(self.stream), "cuStreamSynchronize")

    def pinned_ints(self, n: int):
        """n int32 of page-locked host memory (asynchronous device->host copies land there)."""
        p = _c.c_void_p()
        check(_fn("cuMemAllocHost_v2")(_c.byref(p), _c.c_size_t(4 * n)), "cuMemAllocHost")
        return p.value, (_c.c_int32 * n).from_address(p.value)

    def d2h_async(self, dst_addr: int, src: int, nbytes: int):
        check(self._d2h(_c.c_void_p(dst_addr), _c.c_uint64(src), _c.c_size_t(nbytes), self.stream),
              "cuMemcpyDtoHAsync")

    def event(self):
        e = _c.c_void_p()
        check(_fn("cuEventCreate")(_c.byref(e), 2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
        return e

    def record(self, e):
        check(_fn("cuEventRecord")(e, self.stream), "cuEventRecord")

    def wait(self, e):
        check(_fn("cuEventSynchronize")(e), "cuEventSynchronize")

    def mem_info(self) -> tuple[int, int]:
        free, total = _c.c_size_t(), _c.c_size_t()
        check(_fn("cuMemGetInfo_v2")(_c.byref(free), _c.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def kernel(self, name: str, sig: str) -> Kernel:
        return Kernel(self, name, sig)

    # ---- graphs --------------------------------------------------------------------------------
    def begin_capture(self):
        check(_fn("cuStreamBeginCapture_v2")(self.stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")
        self.capturing = True

    def end_capture(self) -> "Graph":
        g = _c.c_void_p()
        self.capturing = False
        check(_fn("cuStreamEndCapture")(self.stream, _c.byref(g)), "cuStreamEndCapture")
        ex = _c.c_void_p()
        check(_fn("cuGraphInstantiateWithFlags")(_c.byref(ex), g, _c.c_ulonglong(0)), "cuGraphInstantiate")
        return Graph(self, g, ex)


class Graph:
    def __init__(self, ctx: Context, g, ex):
        self.ctx, self.g, self.ex = ctx, g, ex
        self._launch = _fn("cuGraphLaunch")

    def launch(self):
        rc = self._launch(self.ex, self.ctx.stream)
        if rc:
            check(rc, "cuGraphLaunch")

    def __del__(self):
        try:
            _fn("cuGraphExecDestroy")(self.ex)
            _fn("cuGraphDestroy")(self.g)
        except Exception:
            pass


# ---- one context per process, created on a background thread ----------------------------------
_thread = None
_ctx = None
_err = None
_t_start = None


def default_fatbin() -> str:
    env = os.environ.get("REFLEX_FATBIN")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_kernels", "reflex.fatbin")


def start(fatbin: str | None = None, blas: bool = False):
    """Begin creating the context (idempotent). Returns immediately. blas=True also loads cuBLAS
    on that thread once the context exists (cuda_blas.py: ~0.08 s of library loading on the H200),
    for callers that know their first request has a long prompt (RAG answers, prompts of >= 64
    tokens); everyone else loads it on first use, or never."""
    global _thread, _t_start
    if _thread is not None or _ctx is not None:
        return
    import sys
    if "numpy" not in sys.modules:
        # the GPU path does no host BLAS: a single-threaded OpenBLAS imports faster (it would
        # otherwise start one thread per core during `import numpy`); an explicit setting wins
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    path = fatbin or default_fatbin()
    _t_start = time.perf_counter()

    def work():
        global _ctx, _err
        try:
            ctx = Context(path)
        except BaseException as e:  # re-raised in get()
            _err = e
            return
        if blas:   # the context is current on this thread, which cublasCreate binds to
            try:
                from reflex.backends import cuda_blas
                b = cuda_blas.get(ctx.stream)
                if b:
                    ctx.timings["cublas_preload_s"] = b.load_s
            except Exception:   # loading again on first use reports the failure there
                pass
        _ctx = ctx

    _thread = threading.Thread(target=work, name="reflex-cuda-init", daemon=True)
    _thread.start()


def get(fatbin: str | None = None) -> Context:
    """The process's context; waits for start()'s thread. The context is made current here too
    (a context is current per thread)."""
    global _thread
    if _ctx is None and _err is None:
        start(fatbin)
    t0 = time.perf_counter()
    if _thread is not None:
        _thread.join()
    if _err is not None:
        raise _err
    check(_load_lib().cuCtxSetCurrent(_ctx.ctx), "cuCtxSetCurrent")
    _ctx.timings.setdefault("init_wait_s", time.perf_counter() - t0)
    _ctx.timings.setdefault("init_started_at", _t_start)
    return _ctx


# ---- the weights' copy, started as soon as the file is mapped -----------------------------------
# A GGUF file's data section is one run of aligned tensors, and the CUDA backend keeps weights in
# exactly that format, so the whole section can go to the device in one copy before the model
# object exists. Started right after the file is mapped (Engine), the copy -- 15-50 ms for the
# cold-start models, host memory read from the page cache through the driver's staging buffers --
# runs on a thread (ctypes releases the GIL) while the main thread builds the tokenizer and the
# model; CudaBackend._commit then only points the weights into it. Regions are keyed by the host
# address range they copied, so two models loaded one after the other (RAG) each find their own.
_prefetch: dict = {}   # (host_lo, host_hi) -> {"thread", "dev", "error", "copy_s", ...}


def prefetch(gguf) -> bool:
    """Begin copying gguf's tensor data to the device (returns at once). False when there is
    nothing to copy or no context was started."""
    import numpy as np

    if _thread is None and _ctx is None:
        return False
    tensors = getattr(gguf, "tensors", None)
    mm = getattr(gguf, "_mm", None)
    if not tensors or mm is None:
        return False
    lo = min(t.offset for t in tensors.values())
    hi = max(t.offset + t.nbytes for t in tensors.values())
    view = np.frombuffer(mm, dtype=np.uint8, count=hi - lo, offset=lo)   # keeps the map alive
    host = view.ctypes.data
    key = (host, host + (hi - lo))
    if key in _prefetch:
        return True
    job = {"view": view, "dev": 0, "error": None, "nbytes": hi - lo, "queued_at": time.perf_counter()}

    def work():
        try:
            if _thread is not None:
                _thread.join()
            if _err is not None:
                raise _err
            lib = _load_lib()
            check(lib.cuCtxSetCurrent(_ctx.ctx), "cuCtxSetCurrent")
            t0 = time.perf_counter()
            p = _c.c_uint64()
            check(_ctx._alloc(_c.byref(p), _c.c_size_t(job["nbytes"])), f"cuMemAlloc({job['nbytes']})")
            job["dev"] = p.value
            _ctx.h2d(p.value, host, job["nbytes"])
            job["started_at"], job["copy_s"] = t0, time.perf_counter() - t0
        except BaseException as e:   # the backend falls back to its own copy
            job["error"] = e
            if job["dev"]:   # allocated but not (fully) copied: never hand out that region
                _ctx._free_fn(_c.c_uint64(job["dev"]))
                job["dev"] = 0

    job["thread"] = threading.Thread(target=work, name="reflex-cuda-weights", daemon=True)
    _prefetch[key] = job
    job["thread"].start()
    return True


def take_prefetch(addr: int):
    """The finished prefetch whose host range holds addr, removed from the table (waits for its
    copy): ((host_lo, host_hi), job) or None. job["dev"] is 0 when the copy failed."""
    for key in list(_prefetch):
        if key[0] <= addr < key[1]:
            job = _prefetch.pop(key)
            t0 = time.perf_counter()
            job["thread"].join()
            job["wait_s"] = time.perf_counter() - t0
            job.pop("view", None)
            return key, job
    return None


def discard_prefetch(gguf):
    """Free the device copy of a file whose model was never built (a failed load)."""
    import numpy as np

    mm = getattr(gguf, "_mm", None)
    if mm is None:
        return
    base = np.frombuffer(mm, dtype=np.uint8, count=1).ctypes.data
    for key in [k for k in _prefetch if base <= k[0] and k[1] <= base + len(mm)]:
        job = _prefetch.pop(key)
        job["thread"].join()
        if job["dev"]:
            _ctx._free_fn(_c.c_uint64(job["dev"]))


def available() -> bool:
    """True when a CUDA driver and a GPU are present (no context is created)."""
    try:
        lib = _load_lib()
    except CudaError:
        return False
    if lib.cuInit(0) != 0:
        return False
    n = _c.c_int()
    return lib.cuDeviceGetCount(_c.byref(n)) == 0 and n.value > 0
