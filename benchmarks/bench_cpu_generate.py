"""CPU (NumPy backend) generation benchmark: load time, prefill tok/s, decode tok/s.

Usage: python benchmarks/bench_cpu_generate.py [--model PATH] [--prompt-len 128] [--decode 64]
On a shared/busy machine REFLEX_NUM_THREADS=1 avoids OpenBLAS spin contention.
"""
import argparse
import os
import time

import numpy as np

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    from reflex.models import load_model

    t0 = time.perf_counter()
    model = load_model(a.model, a.backend)
    t_load = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    prompt = rng.integers(100, model.n_vocab - 100, a.prompt_len).tolist()
    n_ctx = a.prompt_len + a.decode + 1
    model.forward(prompt[:8], model.new_cache(n_ctx))  # warm-up

    best_pf, best_dec = 0.0, 0.0
    for _ in range(a.repeat):
        cache = model.new_cache(n_ctx)
        t0 = time.perf_counter()
        logits = model.forward(prompt, cache, last_only=True)
        best_pf = max(best_pf, a.prompt_len / (time.perf_counter() - t0))
        nxt = int(np.argmax(logits[-1]))
        t0 = time.perf_counter()
        for _ in range(a.decode):
            nxt = int(np.argmax(model.forward([nxt], cache)[-1]))
        best_dec = max(best_dec, a.decode / (time.perf_counter() - t0))

    print(f"model        {os.path.basename(a.model)}  backend={a.backend}  "
          f"REFLEX_NUM_THREADS={os.environ.get('REFLEX_NUM_THREADS', '(BLAS default)')}")
    print(f"load         {t_load:.2f} s")
    print(f"prefill      {best_pf:.1f} tok/s  ({a.prompt_len}-token prompt, best of {a.repeat})")
    print(f"decode       {best_dec:.1f} tok/s  ({a.decode} tokens, best of {a.repeat})")


if __name__ == "__main__":
    main()
