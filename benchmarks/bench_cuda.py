"""GPU benchmark: cold time-to-first-token, prefill and decode speed, memory, energy.

    python benchmarks/bench_cuda.py MODEL.gguf [MODEL2.gguf ...] [--runs 7] [--drop-caches]
                                    [--llama-cpp DIR] [--json OUT.json]

Per model:
- cold: N fresh `python -m reflex generate -m MODEL "Hello my name is" -n 1 --temperature 0
  --backend cuda` processes, wall time from spawn to exit measured here (like `llama-simple -n 1`),
  median/min/max; page cache warm (one untimed run first); with --drop-caches once more after
  `echo 3 > /proc/sys/vm/drop_caches`. A probe process with the same steps prints the in-process
  stage breakdown (stamps relative to the interpreter's start).
- prefill: a 512-token prompt (random ids), median of 5 after one warm run, tok/s.
- decode: 128 greedy tokens ignoring EOS through the CUDA-graph decoder (capture cost reported
  apart), and the same without the graph (eager launches, device argmax).
- memory: resident weight bytes vs the file's tensor bytes, peak bytes we allocated, device used.
- energy: NVML total-energy counter over prefill-512 + decode-128 minus idle draw (measured for
  1 s before) x duration, when nvidia-ml-py is importable.
With --llama-cpp DIR (a llama.cpp build), runs llama-simple -n 1 and llama-bench on the same file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Hello my name is"

PROBE = r"""
import time, sys, json
T = {"probe_start": time.perf_counter()}
import os
late = os.environ.get("REFLEX_PROBE_LATE") == "1"
from reflex.backends import cuda_driver
if not late:
    cuda_driver.start()
T["ctx_thread_started"] = time.perf_counter()
import numpy
T["numpy_imported"] = time.perf_counter()
if late:
    cuda_driver.start()
from reflex.engine import Engine
T["engine_imported"] = time.perf_counter()
e = Engine(sys.argv[1], backend="cuda")
T["engine_ready"] = time.perf_counter()
r = e.generate(sys.argv[2], max_tokens=1, temperature=0)
T["first_token"] = time.perf_counter()
b = e.model.backend
out = {k: round(v - T["probe_start"], 4) for k, v in T.items()}
out.update({"load": {k: round(v, 4) for k, v in e.load_timings.items()},
            "cuda": {k: round(v, 4) for k, v in b.timings.items() if k != "init_started_at"},
            "gen": r.timings, "jit": b.jit, "device": b.ctx.name, "cc": b.ctx.cc})
print(json.dumps(out), flush=True)
import os
if os.environ.get("REFLEX_PROBE_RESET") == "1":
    # how long the context teardown itself takes (what process exit pays)
    t = time.perf_counter()
    b.synchronize()
    cuda_driver._load_lib().cuDevicePrimaryCtxReset(b.ctx.device)
    print(json.dumps({"ctx_reset_s": time.perf_counter() - t}), flush=True)
    os._exit(0)
if os.environ.get("REFLEX_PROBE_EXIT") == "1":
    os._exit(0)
"""

NUMPY_ONLY = "import time; t = time.perf_counter(); import numpy; print(time.perf_counter() - t)"


def cold(model, runs, drop):
    cmd = [sys.executable, "-m", "reflex", "generate", "-m", model, PROMPT, "-n", "1", "--temperature", "0",
           "--backend", "cuda"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def once():
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return dt

    once()  # page cache warm
    times = [once() for _ in range(runs)]
    res = {"runs": runs, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
           "all_s": [round(t, 4) for t in times]}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", "pass"], env=env)
    res["python_noop_s"] = time.perf_counter() - t0
    probes = []
    for _ in range(3):
        t0 = time.perf_counter()
        pr = subprocess.run([sys.executable, "-c", PROBE, model, PROMPT], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if pr.returncode == 0:
            d = json.loads(pr.stdout.strip().splitlines()[-1])
            d["wall_s"] = round(wall, 4)
            probes.append(d)
        else:
            res["probe_error"] = pr.stderr[-2000:]
    if probes:
        probes.sort(key=lambda d: d["wall_s"])
        res["breakdown_median_probe"] = probes[len(probes) // 2]
    # variants of the probe: os._exit after the token (no interpreter/context teardown), and
    # context creation started only after numpy is imported
    for name, extra in (("probe_os_exit", {"REFLEX_PROBE_EXIT": "1"}), ("probe_ctx_reset", {"REFLEX_PROBE_RESET": "1"}),
                        ("probe_openblas_default", {"OPENBLAS_NUM_THREADS": ""}),
                        ("probe_ctx_after_numpy", {"REFLEX_PROBE_LATE": "1"})):
        walls, last = [], None
        for _ in range(3):
            t0 = time.perf_counter()
            pr = subprocess.run([sys.executable, "-c", PROBE, model, PROMPT], capture_output=True, text=True,
                                env=dict(env, **extra))
            walls.append(time.perf_counter() - t0)
            if pr.returncode == 0:
                last = json.loads(pr.stdout.strip().splitlines()[-1])
        res[name + "_wall_s"] = sorted(walls)
        res[name + "_last"] = last
    nps = []
    for _ in range(3):
        pr = subprocess.run([sys.executable, "-c", NUMPY_ONLY], capture_output=True, text=True, env=env)
        nps.append(float(pr.stdout.strip()))
    res["import_numpy_alone_s"] = sorted(nps)
    if drop:
        try:
            subprocess.run(["sync"])
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3\n")
            res["dropped_caches_s"] = once()
        except OSError as e:
            res["dropped_caches_error"] = str(e)
    return res


def nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None, None


def inproc(model):
    import numpy as np
    from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
    from reflex.gguf import GGUFFile
    from reflex.models import load_model

    f = GGUFFile(model)
    tensor_bytes = sum(t.nbytes for t in f.tensors.values())
    b = CudaBackend()
    t0 = time.perf_counter()
    m = load_model(f, b)
    b.synchronize()
    load_s = time.perf_counter() - t0
    res = {"arch": m.arch, "n_layer": m.hp.n_layer, "tensor_bytes": tensor_bytes, "weight_bytes": b.weight_bytes,
           "weight_ratio": b.weight_bytes / tensor_bytes, "model_load_s": load_s}
    rng = np.random.default_rng(0)
    ids = rng.integers(100, m.hp.n_vocab - 100, 512).tolist()
    pyn, h = nvml()

    def prefill_once():
        cache = m.new_cache(512 + 130)
        t = time.perf_counter()
        dec = GreedyDecoder(b, m, cache)
        tok = dec.prefill(ids)
        return time.perf_counter() - t, dec, tok

    first_pf, _, _ = prefill_once()
    pf = sorted(prefill_once()[0] for _ in range(5))
    res["prefill512_first_s"] = first_pf
    res["prefill512_median_s"] = statistics.median(pf)
    res["prefill_tok_s"] = 512 / statistics.median(pf)

    def decode(use_graph, n=128, prompt_len=16):
        cache = m.new_cache(prompt_len + n + 2)
        dec = GreedyDecoder(b, m, cache, use_graph=use_graph)
        tok = dec.prefill(ids[:prompt_len])
        t_first = time.perf_counter()
        tok = dec.step(tok)  # first decode step (captures the graph when use_graph)
        t1 = time.perf_counter()
        for _ in range(n - 1):
            tok = dec.step(tok)
        t2 = time.perf_counter()
        return {"tok_s": (n - 1) / (t2 - t1), "ms_per_tok": 1e3 * (t2 - t1) / (n - 1),
                "first_step_s": t1 - t_first, "capture_s": dec.capture_s}

    res["decode_eager"] = decode(False)
    decode(True)
    runs = [decode(True) for _ in range(3)]
    res["decode_graph"] = sorted(runs, key=lambda r: r["tok_s"])[1]
    res["decode_graph_all_tok_s"] = [round(r["tok_s"], 1) for r in runs]
    if pyn is not None:
        try:
            b.synchronize()
            e0, t0 = pyn.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
            time.sleep(1.0)
            e1, t1 = pyn.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
            idle_w = (e1 - e0) / 1e3 / (t1 - t0)
            e2, t2 = pyn.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
            prefill_once()
            decode(True)
            b.synchronize()
            e3, t3 = pyn.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
            res["energy"] = {"idle_w": idle_w, "request_s": t3 - t2, "request_j_total": (e3 - e2) / 1e3,
                             "request_j_above_idle": (e3 - e2) / 1e3 - idle_w * (t3 - t2),
                             "what": "prefill 512 + decode 128 (graph, incl. capture)"}
        except Exception as e:  # counter not supported on this GPU / driver
            res["energy_error"] = repr(e)
    res["memory"] = b.memory()
    if pyn is not None:
        try:
            res["memory"]["nvml_used_bytes"] = pyn.nvmlDeviceGetMemoryInfo(h).used
        except Exception:
            pass
    return res


def llama_cpp(dirpath, model, runs):
    res = {}
    simple = os.path.join(dirpath, "llama-simple")
    if os.path.exists(simple):
        ts = []
        for i in range(runs + 1):
            t0 = time.perf_counter()
            subprocess.run([simple, "-m", model, "-n", "1", "-ngl", "99", PROMPT], capture_output=True)
            if i:
                ts.append(time.perf_counter() - t0)
        res["llama_simple_median_s"] = statistics.median(ts)
    bench = os.path.join(dirpath, "llama-bench")
    if os.path.exists(bench):
        r = subprocess.run([bench, "-m", model, "-ngl", "99", "-o", "json"], capture_output=True, text=True)
        try:
            res["llama_bench"] = [{"n_prompt": x["n_prompt"], "n_gen": x["n_gen"], "avg_ts": x["avg_ts"]}
                                  for x in json.loads(r.stdout)]
        except Exception:
            res["llama_bench_error"] = r.stderr[-1000:]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--llama-cpp", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    out = {}
    for model in args.models:
        r = {}
        if not args.no_cold:
            r["cold"] = cold(model, args.runs, args.drop_caches)
        r.update(inproc(model))
        if args.llama_cpp:
            r["llama_cpp"] = llama_cpp(args.llama_cpp, model, args.runs)
        out[os.path.basename(model)] = r
        print(json.dumps({os.path.basename(model): r}, indent=1), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    print(f"{'model':36s} {'cold med s':>10s} {'prefill t/s':>12s} {'decode t/s':>11s} {'eager t/s':>10s} "
          f"{'capture ms':>10s} {'w ratio':>8s}")
    for k, r in out.items():
        c = r.get("cold", {}).get("median_s")
        print(f"{k:36s} {c if c is None else round(c, 3)!s:>10s} {r['prefill_tok_s']:12.0f} "
              f"{r['decode_graph']['tok_s']:11.1f} {r['decode_eager']['tok_s']:10.1f} "
              f"{1e3 * (r['decode_graph']['capture_s'] or 0):10.1f} {r['weight_ratio']:8.4f}")


if __name__ == "__main__":
    main()
