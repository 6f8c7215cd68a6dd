"""Decode matrix-vector kernels (kernels/matvec.cu) on the GPU: microseconds per launch and the
effective weight bandwidth, at the shapes of a Qwen3-0.6B and a SmolLM2-135M decode layer.

    python benchmarks/bench_matvec.py [--types Q4_K,Q6_K,Q8_0,Q4_1] [--launches 2000] [--json]

Each case launches one kernel form with the backend's own grid (ceil(n_out / 4), T = 1), 128
threads. The launches are captured in a CUDA graph (a Python launch costs more than these kernels
run) and the graph is replayed, timed with CUDA events; µs/launch therefore includes the
graph's inter-kernel gap, as a captured decode step does. Each launch reads a different copy of
the weights (copies totalling >= 2x the 60 MB L2), so the weights come from HBM as they do in a
real decode step (the model's weights are far larger than L2). GB/s = weight bytes / time.
Random blocks with finite fp16 scales (the values do not change the kernels' work).
Prints SKIP and exits 0 where there is no CUDA GPU or the kernels are not built.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TYPES = {"Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
F16_FIELDS = {8: [0], 2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 12: [0, 2], 13: [0, 2], 14: [208]}
# (model, op, form, n_in, n_outs): form "mv" rx_matvec, "mv3" rx_matvec3 (Q, K, V), "glu"
# rx_matvec_glu (gate, up), and the fused-norm forms "mv3n" / "glun"
SHAPES = [
    ("qwen3-0.6b", "attn_qkv", "mv3", 1024, (2048, 1024, 1024)),
    ("qwen3-0.6b", "attn_qkv+norm", "mv3n", 1024, (2048, 1024, 1024)),
    ("qwen3-0.6b", "attn_output", "mv", 2048, (1024,)),
    ("qwen3-0.6b", "ffn_gate+up", "glu", 1024, (3072,)),
    ("qwen3-0.6b", "ffn_gate+up+norm", "glun", 1024, (3072,)),
    ("qwen3-0.6b", "ffn_down", "mv", 3072, (1024,)),
    ("smollm2-135m", "attn_qkv", "mv3", 576, (576, 192, 192)),
    ("smollm2-135m", "attn_output", "mv", 576, (576,)),
    ("smollm2-135m", "ffn_gate+up", "glu", 576, (1536,)),
    ("smollm2-135m", "ffn_down", "mv", 1536, (576,)),
]
L2_BYTES = 60 << 20


def random_blocks(t: int, n_rows: int, n_in: int, rng) -> np.ndarray:
    from reflex.quants import QUANTS
    q = QUANTS[t]
    nb = n_rows * n_in // q.block_size
    blocks = rng.integers(0, 256, size=(nb, q.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        v = (rng.uniform(0.5, 1.5, nb) * 0.01).astype(np.float16)
        blocks[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(-1)


class Timer:
    """CUDA events with timing on (the driver wrapper's own events have timing off)."""

    def __init__(self, ctx):
        from reflex.backends import cuda_driver as drv
        self.ctx, self.drv = ctx, drv
        self.a, self.b = ctypes.c_void_p(), ctypes.c_void_p()
        for e in (self.a, self.b):
            drv.check(drv._fn("cuEventCreate")(ctypes.byref(e), 0), "cuEventCreate")

    def time_ms(self, fn) -> float:
        drv = self.drv
        drv.check(drv._fn("cuEventRecord")(self.a, self.ctx.stream), "cuEventRecord")
        fn()
        drv.check(drv._fn("cuEventRecord")(self.b, self.ctx.stream), "cuEventRecord")
        drv.check(drv._fn("cuEventSynchronize")(self.b), "cuEventSynchronize")
        ms = ctypes.c_float()
        drv.check(drv._fn("cuEventElapsedTime")(ctypes.byref(ms), self.a, self.b), "cuEventElapsedTime")
        return ms.value


def run_case(gb, timer, tname, model, op, form, n_in, n_outs, launches, rng):
    from reflex.quants import QUANTS
    t = TYPES[tname]
    q = QUANTS[t]
    if n_in % q.block_size:
        return None   # a K-quant row must hold whole 256-element super-blocks (GGUF writes another type)
    sfx = tname.lower()
    ctx = gb.ctx
    outs = list(n_outs) * (2 if form in ("glu", "glun") else 1)
    sizes = [n * n_in // q.block_size * q.type_size for n in outs]
    wbytes = sum(sizes)
    n_copies = max(2, -(-2 * L2_BYTES // wbytes))
    host = [random_blocks(t, n, n_in, rng) for n in outs]
    copies = []
    for _ in range(n_copies):
        ptrs = []
        for h in host:
            p = ctx.malloc_raw(h.size)
            ctx.h2d(p, h.ctypes.data, h.size)
            ptrs.append(p)
        copies.append(ptrs)
    ctx.synchronize()
    x = gb.upload(rng.standard_normal((1, n_in)).astype(np.float32))
    r = gb.upload(rng.standard_normal((1, n_in)).astype(np.float32))
    nw = gb.upload(rng.standard_normal(n_in).astype(np.float32))
    s = gb.empty((1, n_in))
    ys = [gb.empty((1, n)) for n in n_outs]
    rows = sum(n_outs) if form in ("mv3", "mv3n") else n_outs[0]
    grid = ((rows + 3) // 4, 1, 1)
    if form == "mv":
        k, name = gb.k("rx_matvec_" + sfx, "pppii"), "rx_matvec_" + sfx
        launch = lambda w: k(grid, 128, w[0], x.ptr, ys[0].ptr, n_outs[0], n_in)  # noqa: E731
    elif form == "mv3":
        k, name = gb.k("rx_matvec3_" + sfx, "pppppppiiii"), "rx_matvec3_" + sfx
        launch = lambda w: k(grid, 128, *w, x.ptr, *(y.ptr for y in ys), *n_outs, n_in)  # noqa: E731
    elif form == "mv3n":
        k, name = gb.k("rx_matvec3n_" + sfx, "ppppppfppppiiii"), "rx_matvec3n_" + sfx
        launch = lambda w: k(grid, 128, *w, x.ptr, r.ptr, nw.ptr, 1e-6, s.ptr,  # noqa: E731
                             *(y.ptr for y in ys), *n_outs, n_in, shmem=4 * n_in)
    elif form == "glu":
        k, name = gb.k("rx_matvec_glu_" + sfx, "ppppiii"), "rx_matvec_glu_" + sfx
        launch = lambda w: k(grid, 128, w[0], w[1], x.ptr, ys[0].ptr, n_outs[0], n_in, 0)  # noqa: E731
    else:
        k, name = gb.k("rx_matvec_glun_" + sfx, "pppppfppiii"), "rx_matvec_glun_" + sfx
        launch = lambda w: k(grid, 128, w[0], w[1], x.ptr, r.ptr, nw.ptr, 1e-6, s.ptr, ys[0].ptr,  # noqa: E731
                             n_outs[0], n_in, 0, shmem=4 * n_in)
    per_graph = min(launches, 250)
    for c in copies[:2]:
        launch(c)   # warm: module function loaded, clocks up
    ctx.begin_capture()
    for i in range(per_graph):
        launch(copies[i % n_copies])
    graph = ctx.end_capture()
    graph.launch()
    ctx.synchronize()
    reps = max(1, launches // per_graph)

    def replay():
        for _ in range(reps):
            graph.launch()
    ms = timer.time_ms(replay)
    us = ms * 1e3 / (reps * per_graph)
    from reflex.backends import cuda_driver as drv
    del graph
    for c in copies:
        for p in c:
            drv.check(drv._fn("cuMemFree_v2")(ctypes.c_uint64(p)), "cuMemFree")
    return {"model": model, "op": op, "type": tname, "kernel": name, "n_in": n_in, "n_out": list(n_outs),
            "weight_bytes": wbytes, "us_per_launch": round(us, 3), "gb_per_s": round(wbytes / us / 1e3, 1),
            "launches": reps * per_graph}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_1")
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = ap.parse_args(argv)
    from reflex.backends import cuda_driver
    if not (os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()):
        print("SKIP: no CUDA GPU or kernels not built (python3 kernels/build.py)")
        return 0
    from reflex.backends.cuda_backend import CudaBackend
    gb = CudaBackend()
    timer = Timer(gb.ctx)
    rng = np.random.default_rng(0)
    res = []
    if not args.json:
        print(f"{'model':13s} {'op':17s} {'type':5s} {'kernel':21s} {'n_in':>5s}    {'n_out':15s} "
              f"{'weights':>8s} {'us/launch':>11s} {'GB/s':>13s}   ({cuda_driver.default_fatbin()})")
    for tname in args.types.split(","):
        for model, op, form, n_in, n_outs in SHAPES:
            row = run_case(gb, timer, tname.strip(), model, op, form, n_in, n_outs, args.launches, rng)
            if row is not None:
                res.append(row)
                if not args.json:
                    print(f"{row['model']:13s} {row['op']:17s} {row['type']:5s} {row['kernel']:21s} "
                          f"{n_in:5d} -> {'+'.join(map(str, n_outs)):15s} {wb(row):>8s} "
                          f"{row['us_per_launch']:8.2f} us {row['gb_per_s']:8.1f} GB/s", flush=True)
    if args.json:
        print(json.dumps({"fatbin": cuda_driver.default_fatbin(), "results": res}, indent=1))
    return 0


def wb(row) -> str:
    return f"{row['weight_bytes'] / 1e6:.2f} MB"


if __name__ == "__main__":
    sys.exit(main())
