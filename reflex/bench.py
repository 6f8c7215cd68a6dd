"""`reflex bench`: cold time-to-first-token, prefill and decode speed, memory and energy of a model.

Per model (every number is measured, none is estimated):
- cold: N fresh `python -m reflex generate -m MODEL PROMPT -n 1 --temperature 0 --backend B`
  processes, timed here, outside the process (like `llama-simple -n 1`): spawn to the first byte
  of the generated token on its stdout (`first_token`, what a caller waits for) and spawn to exit
  (`median_s`...: the process lifetime, incl. CUDA teardown); median/min/max; the page cache is warmed by one untimed run first. With drop_caches, once more
  after `sync; echo 3 > /proc/sys/vm/drop_caches` (needs root; otherwise reported as skipped with
  the reason). A probe process doing the same steps prints the stage stamps inside the process
  (PROBE below); stamps are seconds since the spawn, on CLOCK_MONOTONIC, which perf_counter reads
  on Linux in every process alike.
- in-process, in a child process of its own (a clean device and a peak RSS of its own): prefill of
  a prompt of random token ids (median of up to 5 after one warm run), decode of gen_tokens greedy
  tokens ignoring EOS (on CUDA through the CUDA-graph decoder, capture cost reported apart, and
  eagerly), peak memory, energy per request (prefill + decode) from NVML's total-energy counter
  minus the idle draw measured for 1 s before (ctypes on libnvidia-ml.so.1; unavailable without).
- with llama_cpp=DIR (a llama.cpp build): llama-simple -n 1 cold runs (same N, median; first
  token and exit timed the same way) and
  llama-bench pp/tg on the same file, and the ratios reflex / llama.cpp.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "Hello my name is"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The probe: the steps of `reflex generate -n 1`, stamped. argv: model backend prompt; env
# REFLEX_BENCH_T0 = perf_counter just before the spawn. Variants (experiments, --probe-variants):
# REFLEX_PROBE_EXIT=1 os._exit after the token (no teardown), REFLEX_PROBE_RESET=1 time the
# context teardown, REFLEX_PROBE_LATE=1 start the CUDA context only after the engine import.
PROBE = r"""
import time
T = {"interpreter_start": time.perf_counter()}
import json, os, sys
model, backend, prompt = sys.argv[1:4]
late = os.environ.get("REFLEX_PROBE_LATE") == "1"
if backend in ("cuda", "gpu") and not late:
    from reflex.backends import cuda_driver
    cuda_driver.start()
import numpy
T["numpy"] = time.perf_counter()
from reflex.engine import Engine
T["engine_module"] = time.perf_counter()
if backend in ("cuda", "gpu") and late:
    from reflex.backends import cuda_driver
    cuda_driver.start()
e = Engine(model, backend=backend)
t_eng = time.perf_counter()
lt = e.load_timings
T["imports"] = t_eng - lt["load_s"]
T["open"] = t_eng - lt["model_s"] - lt["tokenizer_s"]
T["tokenizer"] = t_eng - lt["model_s"]
T["weights_staged"] = t_eng
r = e.generate(prompt, max_tokens=1, temperature=0)
T["first_token"] = time.perf_counter()
T["prefill"] = T["first_token"] - max(0.0, r.timings["first_token_s"] - r.timings["prefill_s"])
t0 = float(os.environ["REFLEX_BENCH_T0"])
out = {"stamps": {k: v - t0 for k, v in T.items()},
       "load": lt, "gen": r.timings, "tokens": r.tokens}
b = e.model.backend
if backend in ("cuda", "gpu"):
    ct = b.timings
    st = ct.get("init_started_at")
    if st is not None:
        out["cuda_context"] = {"started": st - t0, "context_ready": st + ct["cuda_init_s"] - t0,
                               "module_loaded": st + ct["cuda_init_s"] + ct["module_load_s"] - t0}
    out["cuda"] = {k: v for k, v in ct.items() if k != "init_started_at"}
    pf = ct.get("weights_prefetch")
    if pf and "started_at" in pf:   # the weights' copy (cuda_driver.prefetch), s since spawn
        out["weights_copy"] = {"queued": pf["queued_at"] - t0, "started": pf["started_at"] - t0,
                               "done": pf["started_at"] + pf["copy_s"] - t0, "waited_s": pf.get("wait_s")}
    out["device"], out["cc"], out["jit"] = b.ctx.name, list(b.ctx.cc), b.jit
print(json.dumps(out), flush=True)
if os.environ.get("REFLEX_PROBE_RESET") == "1" and backend in ("cuda", "gpu"):
    t = time.perf_counter()
    b.synchronize()
    cuda_driver._load_lib().cuDevicePrimaryCtxReset(b.ctx.device)
    print(json.dumps({"ctx_reset_s": time.perf_counter() - t}), flush=True)
    os._exit(0)
if os.environ.get("REFLEX_PROBE_EXIT") == "1":
    os._exit(0)
"""

# the order stages happen in one process; the CUDA context is created on a thread alongside
# (cuda_context: started / context_ready / module_loaded), so it is reported apart
STAGES = ("interpreter_start", "numpy", "engine_module", "imports", "open", "tokenizer", "weights_staged", "prefill",
          "first_token", "exit")


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run_timed(cmd, env):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, REFLEX_BENCH_T0=repr(t0)))
    return time.perf_counter() - t0, r


def _run_first_byte(cmd, env=None):
    """Spawn cmd; (seconds to its first stdout byte, seconds to exit, returncode, stderr tail).

    Both engines stream the generated text and flush it (reflex generate after each piece,
    llama-simple after each sampled token; its prompt echo sits unflushed in the same buffer), so
    the first byte on the pipe is the first token as a caller sees it. stderr goes to a temporary
    file: llama.cpp logs tens of KB there, which must not block on a full pipe."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        env = dict(env if env is not None else os.environ, REFLEX_BENCH_T0=repr(t0))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
        first = None
        while True:
            chunk = os.read(p.stdout.fileno(), 65536)
            if chunk and first is None:
                first = time.perf_counter() - t0
            if not chunk:
                break
        rc = p.wait()
        dt = time.perf_counter() - t0
        p.stdout.close()
        err.seek(0)
        tail = err.read().decode(errors="replace")[-1500:]
    return (first if first is not None else dt), dt, rc, tail


def _fail(what, r):
    from reflex.errors import ReflexError

    return ReflexError(f"{what} failed (exit {r.returncode}): {r.stderr.strip()[-1500:]}")


def _summary(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "all_s": [round(t, 4) for t in times]}


def _probe(model, backend, env):
    wall, r = _run_timed([sys.executable, "-c", PROBE, str(model), backend, PROMPT], env)
    if r.returncode != 0:
        raise _fail("probe", r)
    lines = r.stdout.strip().splitlines()
    d = json.loads(lines[0])
    for extra in lines[1:]:
        d.update(json.loads(extra))
    d["stamps"]["exit"] = wall
    d["wall_s"] = wall
    return d


def _drop_caches():
    """Drop the page cache; returns None on success, else why it was not possible."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "needs root (writes /proc/sys/vm/drop_caches)"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as e:
        return f"cannot write /proc/sys/vm/drop_caches: {e}"
    return None


def cold(model, backend: str, runs: int, drop_caches: bool = False, probe_variants: bool = False) -> dict:
    env = _env()
    cmd = [sys.executable, "-m", "reflex", "generate", "-m", str(model), PROMPT, "-n", "1",
           "--temperature", "0", "--backend", backend]

    firsts = []

    def once():
        first, dt, rc, err = _run_first_byte(cmd, env)
        if rc != 0:
            from reflex.errors import ReflexError
            raise ReflexError(f"`reflex generate` failed (exit {rc}): {err.strip()}")
        firsts.append(first)
        return dt

    once()  # page cache warm, untimed
    firsts.clear()
    # median_s/min_s/max_s: spawn -> exit; first_token: spawn -> the token's first byte on stdout
    res = {"command": " ".join(cmd[1:]), "runs": runs, **_summary([once() for _ in range(runs)])}
    res["first_token"] = _summary(firsts)
    res["python_noop_s"] = _run_timed([sys.executable, "-c", "pass"], env)[0]
    r = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import numpy; "
                        "print(time.perf_counter() - t)"], capture_output=True, text=True, env=env)
    res["import_numpy_alone_s"] = float(r.stdout.strip()) if r.returncode == 0 else None
    probes = sorted((_probe(model, backend, env) for _ in range(min(runs, 3))), key=lambda d: d["wall_s"])
    p = probes[len(probes) // 2]  # the median probe by wall time
    res["stages"] = {k: round(p["stamps"][k], 5) for k in STAGES}
    res["stage_durations_s"] = {k: round(p["stamps"][k] - (p["stamps"][STAGES[i - 1]] if i else 0.0), 5)
                                for i, k in enumerate(STAGES)}
    res["probe"] = {k: v for k, v in p.items() if k not in ("stamps", "tokens")}
    if probe_variants:
        for name, extra in (("os_exit", {"REFLEX_PROBE_EXIT": "1"}), ("ctx_reset", {"REFLEX_PROBE_RESET": "1"}),
                            ("openblas_default", {"OPENBLAS_NUM_THREADS": ""}),
                            ("ctx_after_imports", {"REFLEX_PROBE_LATE": "1"}),
                            ("no_prefetch", {"REFLEX_CUDA_PREFETCH": "0"}),
                            ("eager_module_loading", {"CUDA_MODULE_LOADING": "EAGER"})):
            vs = [_probe(model, backend, dict(env, **extra)) for _ in range(3)]
            res["variant_" + name] = {"wall_s": sorted(round(v["wall_s"], 4) for v in vs),
                                      "first_token_s": sorted(round(v["stamps"]["first_token"], 4) for v in vs),
                                      "last": {k: v for k, v in vs[-1].items() if k != "tokens"}}
        # the same cold command without the weights' early copy: first byte, same runs
        if backend in ("cuda", "gpu"):
            env_np = dict(env, REFLEX_CUDA_PREFETCH="0")
            f0 = []
            for _ in range(runs):
                first, dt, rc, err = _run_first_byte(cmd, env_np)
                if rc != 0:
                    from reflex.errors import ReflexError
                    raise ReflexError(f"`reflex generate` (REFLEX_CUDA_PREFETCH=0) failed (exit {rc}): {err.strip()}")
                f0.append(first)
            res["first_token_no_prefetch"] = _summary(f0)
    if drop_caches:
        why = _drop_caches()
        res["dropped_caches"] = {"s": once(), "first_token_s": firsts[-1]} if why is None else {"skipped": why}
    return res


# ---- in-process measurements (run in a child: `python -c "from reflex.bench import _inproc_main..."`)
class NVML:
    """The few NVML calls we need, through ctypes on libnvidia-ml.so.1 (no Python dependency)."""

    def __init__(self, index: int = 0):
        import ctypes as c

        self._c = c
        self.lib = c.CDLL("libnvidia-ml.so.1")
        rc = self.lib.nvmlInit_v2()
        if rc:
            raise OSError(f"nvmlInit_v2 returned {rc}")
        self.h = c.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(c.c_uint(index), c.byref(self.h))
        if rc:
            raise OSError(f"nvmlDeviceGetHandleByIndex_v2({index}) returned {rc}")

    def energy_mj(self) -> int:
        """Total energy since the driver loaded, millijoules (Volta and newer)."""
        e = self._c.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, self._c.byref(e))
        if rc:
            raise OSError(f"nvmlDeviceGetTotalEnergyConsumption returned {rc}")
        return e.value

    def memory_used(self) -> int:
        class Mem(self._c.Structure):  # nvmlMemory_t
            _fields_ = [("total", self._c.c_ulonglong), ("free", self._c.c_ulonglong),
                        ("used", self._c.c_ulonglong)]
        m = Mem()
        rc = self.lib.nvmlDeviceGetMemoryInfo(self.h, self._c.byref(m))
        if rc:
            raise OSError(f"nvmlDeviceGetMemoryInfo returned {rc}")
        return m.used


def _nvml():
    """(NVML, None) or (None, why it is unavailable)."""
    try:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        return NVML(int(vis) if vis.isdigit() else 0), None
    except (OSError, AttributeError) as e:
        return None, f"NVML unavailable: {e}"


def inproc(model, backend: str, prompt_tokens: int, gen_tokens: int, repeats: int = 5) -> dict:
    import resource

    cuda = backend in ("cuda", "gpu")
    if cuda:  # before numpy, as `reflex generate` does (single-threaded OpenBLAS, overlapped init)
        from reflex.backends import cuda_driver
        cuda_driver.start()

    import numpy as np

    from reflex.gguf import GGUFFile
    from reflex.models import load_model
    from reflex.store import resolve
    f = GGUFFile(resolve(str(model)))
    t0 = time.perf_counter()
    m = load_model(f, backend)
    b = m.backend
    if cuda:
        b.synchronize()
    hp = m.hp
    res = {"arch": m.arch, "n_layer": hp.n_layer, "n_vocab": hp.n_vocab, "load_s": time.perf_counter() - t0,
           "gguf_tensor_bytes": int(sum(t.nbytes for t in f.tensors.values()))}
    lo, hi = (100, hp.n_vocab - 100) if hp.n_vocab > 300 else (0, hp.n_vocab)
    ids = np.random.default_rng(0).integers(lo, hi, prompt_tokens).tolist()
    short = ids[:min(16, prompt_tokens)]
    sync = b.synchronize if cuda else (lambda: None)

    if cuda:
        from reflex.backends.cuda_backend import GreedyDecoder

        def prefill(p):
            dec = GreedyDecoder(b, m, m.new_cache(len(p) + gen_tokens + 2))
            return dec, dec.prefill(p)

        def step(dec, tok):
            return dec.step(tok)
    else:
        def prefill(p):
            cache = m.new_cache(len(p) + gen_tokens + 2)
            return cache, int(np.argmax(m.forward(p, cache, last_only=True)[-1]))

        def step(cache, tok):
            return int(np.argmax(m.forward([tok], cache, last_only=True)[-1]))

    def time_prefill():
        t = time.perf_counter()
        prefill(ids)
        sync()
        return time.perf_counter() - t

    first = time_prefill()
    pf = [time_prefill() for _ in range(max(1, repeats))]
    res["prefill"] = {"n_tokens": prompt_tokens, "first_s": first, "runs": len(pf),
                      "median_s": statistics.median(pf), "tok_s": prompt_tokens / statistics.median(pf)}
    if cuda:   # which product path the prefill took (cuBLAS SGEMM, f16 tensor cores or rx_sgemm_nt)
        res["prefill"]["gemm"] = ("f16-wmma" if b.f16_gemm else "cublas-sgemm" if b._blas_h
                                  else "rx_sgemm_nt")
        res["prefill"]["cublas_load_s"] = b.timings.get("cublas_load_s")

    def decode(use_graph=None):
        # gen_tokens tokens after a short prompt, EOS ignored; the first step apart (it captures
        # the CUDA graph), the rate over the others
        if cuda:
            dec = GreedyDecoder(b, m, m.new_cache(len(short) + gen_tokens + 2), use_graph=use_graph)
            tok = dec.prefill(short)
        else:
            dec, tok = prefill(short)
        t0 = time.perf_counter()
        tok = step(dec, tok)
        t1 = time.perf_counter()
        for _ in range(gen_tokens - 1):
            tok = step(dec, tok)
        sync()
        t2 = time.perf_counter()
        n = gen_tokens - 1
        return {"n_tokens": gen_tokens, "first_step_s": t1 - t0,
                "tok_s": n / (t2 - t1) if n else 1.0 / (t1 - t0),
                "ms_per_tok": 1e3 * (t2 - t1) / n if n else 1e3 * (t1 - t0),
                "graph_capture_s": getattr(dec, "capture_s", None) if cuda else None,
                "graph": bool(getattr(dec, "use_graph", False)) if cuda else False}

    if cuda:
        res["decode_eager"] = decode(False)
        # the decoder's own choice: a model with graph_capturable False (host MoE routing in deepseek2 and
        # gemma4, PLE rows, recurrent granitehybrid) runs eagerly
        decode(None)  # warm
        runs = sorted((decode(None) for _ in range(3)), key=lambda r: r["tok_s"])
        res["decode"] = dict(runs[1], all_tok_s=[round(r["tok_s"], 1) for r in runs])
    else:
        decode()  # warm
        res["decode"] = decode()

    nv, why = _nvml() if cuda else (None, "CPU backend: NVML measures the GPU only")
    if nv is None:
        res["energy"] = {"available": False, "reason": why}
    else:
        try:
            sync()
            e0, t0 = nv.energy_mj(), time.perf_counter()
            time.sleep(1.0)
            e1, t1 = nv.energy_mj(), time.perf_counter()
            idle_w = (e1 - e0) / 1e3 / (t1 - t0)
            # repeat the request for >= 1 s: the counter advances in steps of tens of ms
            n_req, e2, t2 = 0, nv.energy_mj(), time.perf_counter()
            while n_req == 0 or time.perf_counter() - t2 < 1.0:
                prefill(ids)
                dec = GreedyDecoder(b, m, m.new_cache(len(short) + gen_tokens + 2))
                tok = dec.prefill(short)
                for _ in range(gen_tokens):
                    tok = dec.step(tok)
                sync()
                n_req += 1
            e3, t3 = nv.energy_mj(), time.perf_counter()
            j = (e3 - e2) / 1e3
            res["energy"] = {"available": True, "idle_w": idle_w, "requests": n_req, "seconds": t3 - t2,
                             "j_per_request_total": j / n_req,
                             "j_per_request_above_idle": (j - idle_w * (t3 - t2)) / n_req,
                             "request": f"prefill {prompt_tokens} + decode {gen_tokens} (graph)"}
        except OSError as e:  # counter not supported on this GPU / driver
            res["energy"] = {"available": False, "reason": str(e)}
    mem = dict(b.memory())
    # ru_maxrss is KiB on Linux and lags the current RSS by a sample: the larger of the two
    mem["peak_rss_bytes"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                mem.get("process_rss_bytes") or 0)
    if cuda and nv is not None:
        try:
            mem["nvml_device_used_bytes"] = nv.memory_used()
        except OSError:
            pass
    res["memory"] = mem
    return res


def _inproc_main():
    from reflex.errors import ReflexError

    model, backend, pt, gt, rep = sys.argv[1:6]
    try:
        print(json.dumps(inproc(model, backend, int(pt), int(gt), int(rep))), flush=True)
    except ReflexError as e:  # the parent re-raises it with its category (e.g. backend_unavailable)
        print(json.dumps(e.to_json()), flush=True)
        sys.exit(e.exit_code)


# ---- llama.cpp on the same file ------------------------------------------------------------------
def llama_cpp(dirpath, model, backend: str, runs: int, prompt_tokens: int, gen_tokens: int) -> dict:
    ngl = "99" if backend in ("cuda", "gpu") else "0"
    res = {"dir": str(dirpath), "ngl": int(ngl)}
    simple = os.path.join(dirpath, "llama-simple")
    if os.path.isfile(simple):
        ts, firsts = [], []
        for i in range(runs + 1):  # the first run warms the page cache, untimed
            first, dt, rc, err = _run_first_byte([simple, "-m", str(model), "-n", "1", "-ngl", ngl, PROMPT])
            if rc != 0:
                res["llama_simple_error"] = err[-1000:]
                break
            if i:
                ts.append(dt)
                firsts.append(first)
        if ts:
            res["llama_simple"] = {"runs": len(ts), **_summary(ts), "first_token": _summary(firsts)}
    else:
        res["llama_simple_error"] = f"{simple} not found"
    bench = os.path.join(dirpath, "llama-bench")
    if os.path.isfile(bench):
        r = subprocess.run([bench, "-m", str(model), "-ngl", ngl, "-p", str(prompt_tokens), "-n", str(gen_tokens),
                            "-o", "json"], capture_output=True, text=True)
        try:
            for x in json.loads(r.stdout):
                if x.get("n_gen", 0) == 0 and x.get("n_prompt", 0) > 0:
                    res["pp_tok_s"] = float(x["avg_ts"])
                elif x.get("n_prompt", 0) == 0 and x.get("n_gen", 0) > 0:
                    res["tg_tok_s"] = float(x["avg_ts"])
        except (ValueError, KeyError, TypeError):
            res["llama_bench_error"] = (r.stderr or r.stdout)[-1000:]
    else:
        res["llama_bench_error"] = f"{bench} not found"
    return res


def ratios(r: dict) -> dict:
    """reflex vs llama.cpp on the same file: > 1 means reflex is faster."""
    lc, out = r.get("llama_cpp", {}), {}
    cold_med = r.get("cold", {}).get("median_s")
    if cold_med and "llama_simple" in lc:
        out["cold_speedup"] = lc["llama_simple"]["median_s"] / cold_med
        ft, lft = r["cold"].get("first_token", {}).get("median_s"), lc["llama_simple"].get("first_token", {})
        if ft and lft.get("median_s"):
            out["first_token_speedup"] = lft["median_s"] / ft
    if "pp_tok_s" in lc:
        out["prefill"] = r["prefill"]["tok_s"] / lc["pp_tok_s"]
    if "tg_tok_s" in lc:
        out["decode"] = r["decode"]["tok_s"] / lc["tg_tok_s"]
    return out


# ---- the whole run --------------------------------------------------------------------------------
def check_model(model, prompt_tokens: int, gen_tokens: int):
    """Resolve the model and check the prompt + generated tokens fit its context; raises the
    categorized errors (ModelNotFound, ModelFormatError, ContextOverflow) before anything runs."""
    from reflex.errors import ContextOverflow, ModelFormatError
    from reflex.gguf import GGUFFile
    from reflex.store import resolve

    path = resolve(str(model))
    f = GGUFFile(path)
    try:
        arch = f.metadata.get("general.architecture")
        n_ctx = f.metadata.get(f"{arch}.context_length")
    finally:
        f.close()
    if n_ctx is None:
        raise ModelFormatError(f"{path}: no {arch}.context_length in the metadata", kind="missing_key")
    if prompt_tokens + gen_tokens + 1 > int(n_ctx):
        raise ContextOverflow(f"{path.name}: a {prompt_tokens}-token prompt + {gen_tokens} generated tokens "
                              f"exceed the model's context of {n_ctx}")
    return path


def bench(models, backend: str = "numpy", runs: int = 5, drop_caches: bool = False, llama_cpp_dir=None,
          do_cold: bool = True, prompt_tokens: int = 512, gen_tokens: int = 128, probe_variants: bool = False,
          log=None) -> dict:
    from reflex.errors import InvalidRequest

    if backend not in ("numpy", "cuda", "gpu"):
        raise InvalidRequest(f"backend must be numpy or cuda, got {backend!r}")
    for name, v in (("runs", runs), ("prompt_tokens", prompt_tokens), ("gen_tokens", gen_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidRequest(f"{name} must be a positive integer, got {v!r}")
    if llama_cpp_dir is not None and not os.path.isdir(llama_cpp_dir):
        raise InvalidRequest(f"--llama-cpp {llama_cpp_dir!r} is not a directory")
    paths = [check_model(m, prompt_tokens, gen_tokens) for m in models]  # all errors before any run
    if backend in ("cuda", "gpu"):
        from reflex.backends import cuda_driver
        from reflex.errors import ReflexError

        if not os.path.exists(cuda_driver.default_fatbin()):
            raise ReflexError(f"CUDA kernels not built ({cuda_driver.default_fatbin()} missing): "
                              "run `python kernels/build.py`", category="backend_unavailable")
        if not cuda_driver.available():  # cuInit only, no context in this process
            raise ReflexError("no usable CUDA driver or GPU", category="backend_unavailable")
    out = {"backend": backend, "runs": runs, "prompt": PROMPT, "prompt_tokens": prompt_tokens,
           "gen_tokens": gen_tokens, "python": sys.version.split()[0], "models": []}
    env = _env()
    for path in paths:
        r = {"model": str(path), "file_bytes": os.path.getsize(path)}
        if do_cold:
            r["cold"] = cold(path, backend, runs, drop_caches, probe_variants)
            if log:
                log(f"{path.name}: cold median {r['cold']['median_s']:.3f} s")
        else:
            r["cold"] = {"skipped": "--no-cold"}
        p = subprocess.run([sys.executable, "-c", "import sys; from reflex.bench import _inproc_main; "
                            "_inproc_main()", str(path), backend, str(prompt_tokens), str(gen_tokens),
                            str(min(runs, 5))], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            try:
                err = json.loads(p.stdout.strip().splitlines()[-1])["error"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise _fail("in-process benchmark", p) from None
            from reflex.errors import ReflexError
            raise ReflexError(err["message"], category=err["category"])
        r.update(json.loads(p.stdout.strip().splitlines()[-1]))
        if llama_cpp_dir is not None:
            r["llama_cpp"] = llama_cpp(llama_cpp_dir, path, backend, runs, prompt_tokens, gen_tokens)
            r["ratios"] = ratios(r)
        if log:
            log(f"{path.name}: prefill {r['prefill']['tok_s']:.1f} tok/s, decode {r['decode']['tok_s']:.1f} tok/s")
        out["models"].append(r)
    return out


def table(res: dict) -> str:
    def f(v, fmt):
        w = "".join(ch for ch in fmt.split(".")[0] if ch.isdigit())
        return format("-", f">{w}") if v is None else format(v, fmt)

    lines = [f"backend {res['backend']}, {res['runs']} cold runs, prefill {res['prompt_tokens']} tok, "
             f"decode {res['gen_tokens']} tok",
             f"{'model':36s} {'ttft med s':>10s} {'cold med s':>10s} {'prefill t/s':>12s} {'decode t/s':>11s} {'eager t/s':>10s} "
             f"{'capture ms':>10s} {'peak MiB':>9s} {'J/req':>7s}"]
    for r in res["models"]:
        mem = r["memory"]
        peak = mem.get("peak_allocated_bytes") or mem.get("peak_rss_bytes")
        cap = r["decode"].get("graph_capture_s")
        en = r["energy"].get("j_per_request_above_idle")
        lines.append(f"{os.path.basename(r['model'])[:36]:36s} "
                     f"{f(r['cold'].get('first_token', {}).get('median_s'), '10.3f')} "
                     f"{f(r['cold'].get('median_s'), '10.3f')} "
                     f"{r['prefill']['tok_s']:12.1f} {r['decode']['tok_s']:11.1f} "
                     f"{f(r.get('decode_eager', {}).get('tok_s'), '10.1f')} "
                     f"{f(None if cap is None else 1e3 * cap, '10.1f')} {f(peak and peak / 2**20, '9.1f')} "
                     f"{f(en, '7.3f')}")
        if "ratios" in r:
            lc = r["llama_cpp"]
            ls = lc.get("llama_simple", {})
            lines.append(f"  llama.cpp: ttft {f(ls.get('first_token', {}).get('median_s'), '.3f')} s, "
                         f"cold {f(ls.get('median_s'), '.3f')} s, "
                         f"pp {f(lc.get('pp_tok_s'), '.1f')} tok/s, tg {f(lc.get('tg_tok_s'), '.1f')} tok/s | "
                         "reflex/llama.cpp: " + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items()))
        if "stages" in r["cold"]:
            lines.append("  stages (s since spawn): " + "  ".join(f"{k} {v:.3f}" for k, v in r["cold"]["stages"].items()))
        pr = r["cold"].get("probe", {})
        extra = [f"{k} {pr[k]}" for k in ("cuda_context", "weights_copy") if k in pr]
        if "first_token_no_prefetch" in r["cold"]:
            extra.append(f"ttft without the early weights copy {r['cold']['first_token_no_prefetch']['median_s']:.3f} s")
        for k, v in r["cold"].items():
            if k.startswith("variant_") and "first_token_s" in v:
                extra.append(f"{k[8:]} ttft {v['first_token_s']} exit {v['wall_s']}")
        lines.extend("  " + e for e in extra)
    return "\n".join(lines)
