"""MoE expert products (Backend.expert_matmul): one sparse FFN layer, gate + up + SwiGLU + down.

Times the layer at T = 1 (decode) and T = --prefill rows, against the same products with a dense
(n_expert * n_ff_exp, n_embd) gate weight, which reads every expert (what the op avoids).
Defaults are Qwen3-30B-A3B's layer shape (n_embd 2048, n_ff_exp 768, 128 experts, top-8, Q4_K);
on the NumPy backend use fewer experts (--n-expert 16): its weights are float32 in memory.

Usage: python benchmarks/bench_moe.py [--backend numpy|cuda] [--type 12] [--n-expert 128] [--top-k 8]
                                      [--n-embd 2048] [--n-ff 768] [--prefill 64] [--repeat 20]
"""
import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--type", type=int, default=12, help="GGML type id of the expert weights (12 = Q4_K)")
    ap.add_argument("--n-expert", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=2048)
    ap.add_argument("--n-ff", type=int, default=768)
    ap.add_argument("--prefill", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()

    from reflex.backends import get_backend
    from reflex.quants import quantize

    b = get_backend(a.backend)
    rng = np.random.default_rng(0)
    X, E, F, K = a.n_expert, a.n_embd, a.n_ff, a.top_k

    def weight(n_out, n_in):
        raw = np.asarray(quantize(rng.standard_normal((X * n_out, n_in)).astype(np.float32) * 0.02, a.type))
        return b.prepare_weight(raw.view(np.uint8).reshape(-1), a.type, (X, n_out, n_in)), raw

    t0 = time.perf_counter()
    (wg, raw_g), (wu, _), (wd, _) = weight(F, E), weight(F, E), weight(E, F)
    dense = b.prepare_weight(raw_g.view(np.uint8).reshape(-1), a.type, (X * F, E))
    print(f"backend {a.backend}: type {a.type}, {X} experts, top-{K}, n_embd {E}, n_ff_exp {F}; "
          f"weights prepared in {time.perf_counter() - t0:.2f} s")

    def sync():
        if hasattr(b, "synchronize"):
            b.synchronize()

    for T in (1, a.prefill):
        x = rng.standard_normal((T, E)).astype(np.float32)
        xd = b.upload(x) if hasattr(b, "upload") else x
        ids = np.stack([rng.choice(X, K, replace=False) for _ in range(T)])
        wt = rng.random((T, K)).astype(np.float32)

        def layer():
            g = b.expert_matmul(xd, wg, ids)
            u = b.expert_matmul(xd, wu, ids)
            return b.expert_matmul(b.swiglu(g, u), wd, ids, wt)

        def all_experts():
            return b.matmul(xd, dense)

        for name, fn in (("moe layer (gate+up+down, top-k)", layer),
                         ("dense gate over all experts", all_experts)):
            fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(a.repeat):
                y = fn()
            b.to_numpy(y)
            sync()
            dt = (time.perf_counter() - t0) / a.repeat
            print(f"T={T:4d}  {name:34s} {dt * 1e3:9.3f} ms")


if __name__ == "__main__":
    main()
