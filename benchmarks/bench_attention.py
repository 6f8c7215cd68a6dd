"""Decode attention (T = 1) on the CUDA backend: rx_attention + rx_attn_combine (the kernels decode
used before) against rx_attention_dec, at Qwen3-0.6B's shape (n_head 16, n_head_kv 8, head_dim
128) and Gemma-3's (n_head 4, n_head_kv 1, head_dim 256, sliding window 512).

Each variant is captured `--per-graph` times into one CUDA graph (what a decode step replays, so
launch gaps are the graph's, not Python's) and replayed until `--iters` calls ran; CUDA events
time the replays, µs per call = elapsed / calls. Two grid sizings each: "S" sizes the splits from
the current length (eager decode), "ctx" from n_ctx with the position read from device memory
(a captured decode step). The outputs of the old and new kernels are compared (rel error).

    python3 benchmarks/bench_attention.py [--iters 2000] [--per-graph 100] [--n-ctx 8256] [--json]
Exits 0 printing SKIP without a GPU or without built kernels.
"""
import argparse
import ctypes
import json
import math
import sys

import numpy as np

SHAPES = {"qwen3-0.6b": (16, 8, 128, 0), "gemma3": (4, 1, 256, 512)}
LENGTHS = [16, 128, 512, 2048, 8192]
OLD_CHUNK = 256  # keys per split of the old decode path (cuda_backend.attention before rx_attention_dec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--per-graph", type=int, default=100)
    ap.add_argument("--n-ctx", type=int, default=8192 + 64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import os

    from reflex.backends import cuda_driver as drv
    if not (os.path.exists(drv.default_fatbin()) and drv.available()):
        print("SKIP: no CUDA GPU or kernels not built")
        return 0
    from reflex.backends.cuda_backend import CudaBackend
    b = CudaBackend()
    ctx = b.ctx

    def event():
        e = ctypes.c_void_p()
        drv.check(drv._fn("cuEventCreate")(ctypes.byref(e), 0), "cuEventCreate")  # timing enabled
        return e

    e0, e1 = event(), event()

    def set_pos(n_past):
        ctx.h2d(b._state.ptr, np.array([0, n_past], np.int32).ctypes.data, 8)

    def old(q, kc, vc, n_past, scale, window, from_ctx):
        # the pre-rx_attention_dec T = 1 launches, verbatim
        _, n_head, d = q.shape
        n_ctx, n_kv, _ = kc.shape
        n_split = -(-(n_ctx if from_ctx else n_past + 1) // OLD_CHUNK)
        out = b.empty((1, n_head, d))
        part = b.empty((n_head * n_split * (d + 2),)) if n_split > 1 else None
        b.k("rx_attention", "ppppppiiiipfiiii")(
            (n_head, n_split, 1), 128, q.ptr, kc.ptr, vc.ptr, out.ptr, part.ptr if part else 0, 0,
            n_head, n_kv, d, n_past, b._state.ptr + 4 if from_ctx else 0, scale, window, 1, OLD_CHUNK, 0)
        if n_split > 1:
            b.k("rx_attn_combine", "ppii")((n_head, 1, 1), 128, part.ptr, out.ptr, n_split, d)
        return out

    def new(q, kc, vc, n_past, scale, window, from_ctx):
        b.capturing = from_ctx  # attention() then sizes the grid from n_ctx and reads the state
        try:
            return b.attention(q, kc, vc, n_past, scale, window=window)
        finally:
            b.capturing = False

    def time_us(fn):
        fn()  # outside the capture: the backend's one-time buffers (split counters)
        b.synchronize()
        ctx.begin_capture()
        try:
            for _ in range(a.per_graph):
                fn()
        finally:
            graph = ctx.end_capture()
        graph.launch()
        b.synchronize()
        reps = max(1, a.iters // a.per_graph)
        ctx.record(e0)
        for _ in range(reps):
            graph.launch()
        ctx.record(e1)
        ctx.wait(e1)
        ms = ctypes.c_float()
        drv.check(drv._fn("cuEventElapsedTime")(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
        return 1000.0 * ms.value / (reps * a.per_graph)

    rng = np.random.default_rng(0)
    rows = []
    for name, (n_head, n_kv, d, window) in SHAPES.items():
        n_ctx = a.n_ctx
        kc, vc = b.zeros((n_ctx, n_kv, d)), b.zeros((n_ctx, n_kv, d))
        b.kv_write(kc, b.upload(rng.standard_normal((n_ctx, n_kv, d)).astype(np.float32)), 0)
        b.kv_write(vc, b.upload(rng.standard_normal((n_ctx, n_kv, d)).astype(np.float32)), 0)
        q = b.upload(rng.standard_normal((1, n_head, d)).astype(np.float32))
        b.flush()
        scale = 1.0 / math.sqrt(d)
        for S in LENGTHS:
            n_past = S - 1
            set_pos(n_past)
            row = {"shape": name, "n_head": n_head, "n_head_kv": n_kv, "head_dim": d, "window": window, "S": S}
            o_old = b.to_numpy(old(q, kc, vc, n_past, scale, window, False))
            o_new = b.to_numpy(new(q, kc, vc, n_past, scale, window, True))
            row["rel_new_vs_old"] = float(np.linalg.norm(o_new - o_old) / np.linalg.norm(o_old))
            for kind, fn in (("old", old), ("new", new)):
                for sizing, from_ctx in (("S", False), ("ctx", True)):
                    row[f"{kind}_{sizing}_us"] = time_us(
                        lambda: fn(q, kc, vc, n_past, scale, window, from_ctx))
            rows.append(row)
    if a.json:
        print(json.dumps({"device": ctx.name, "n_ctx": a.n_ctx, "per_graph": a.per_graph, "rows": rows}, indent=1))
        return 0
    print(f"decode attention on {ctx.name}, µs per call (graph of {a.per_graph}, n_ctx {a.n_ctx})")
    print(f"{'shape':<11} {'S':>5} {'old S':>8} {'old ctx':>8} {'new S':>8} {'new ctx':>8} {'speed-up':>8} {'rel':>8}")
    for r in rows:
        print(f"{r['shape']:<11} {r['S']:>5} {r['old_S_us']:8.2f} {r['old_ctx_us']:8.2f} {r['new_S_us']:8.2f} "
              f"{r['new_ctx_us']:8.2f} {r['old_ctx_us'] / r['new_ctx_us']:7.2f}x {r['rel_new_vs_old']:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
