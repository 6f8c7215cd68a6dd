"""llama.cpp (via llama-cpp-python) on the same GGUF and machine as bench_cpu_generate.py, so the two
engines' CPU numbers sit side by side: load, prefill tok/s, decode tok/s, and process launch -> first
generated token for both engines in fresh processes.

Usage: python benchmarks/bench_llamacpp_cpu.py [--model PATH] [--prompt-len 128] [--decode 64] [--cold 5]
Needs `pip install llama-cpp-python==0.3.36` (not a project dependency; built from source, ~5 min).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))

# the child prints the time from its own start (interpreter start measured by the parent) to the
# first generated token; both engines get the same prompt and greedy decoding
_LLAMA_CHILD = r"""
import sys, time
from llama_cpp import Llama
m = Llama(sys.argv[1], n_ctx=512, n_threads=int(sys.argv[2]), verbose=False)
out = m.create_completion("The capital of France is", max_tokens=1, temperature=0.0)
print(repr(out["choices"][0]["text"]))
"""
_REFLEX_CHILD = r"""
import sys
from reflex.engine import Engine
e = Engine(sys.argv[1], n_ctx=512)
r = e.generate("The capital of France is", max_tokens=1, temperature=0.0)
print(repr(r.text))
"""


def cold(code: str, model: str, threads: int, n: int) -> list:
    walls = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, model, str(threads)], check=True,
                       capture_output=True, text=True)
        if i:  # the first run only warms the page cache
            walls.append(time.perf_counter() - t0)
    return walls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cold", type=int, default=5, help="fresh processes per engine (0 = skip)")
    a = ap.parse_args()

    import numpy as np
    from llama_cpp import Llama

    t0 = time.perf_counter()
    m = Llama(a.model, n_ctx=a.prompt_len + a.decode + 8, n_threads=a.threads, verbose=False)
    t_load = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, m.n_vocab() - 100, a.prompt_len).tolist()
    best_pf = best_dec = 0.0
    for _ in range(a.repeat):
        m.reset()
        t0 = time.perf_counter()
        m.eval(prompt)
        best_pf = max(best_pf, a.prompt_len / (time.perf_counter() - t0))
        nxt = int(np.argmax(m.scores[m.n_tokens - 1]))
        t0 = time.perf_counter()
        for _ in range(a.decode):
            m.eval([nxt])
            nxt = int(np.argmax(m.scores[m.n_tokens - 1]))
        best_dec = max(best_dec, a.decode / (time.perf_counter() - t0))
    print(f"llama.cpp    {os.path.basename(a.model)}  n_threads={a.threads}")
    print(f"load         {t_load:.3f} s")
    print(f"prefill      {best_pf:.1f} tok/s  ({a.prompt_len}-token prompt, best of {a.repeat})")
    print(f"decode       {best_dec:.1f} tok/s  ({a.decode} tokens, best of {a.repeat}; logits to numpy each step)")
    if a.cold:
        for name, code in (("llama.cpp", _LLAMA_CHILD), ("reflex", _REFLEX_CHILD)):
            w = cold(code, a.model, a.threads, a.cold)
            print(f"cold {name:<10} launch -> 1 token -> exit: median {statistics.median(w):.3f} s "
                  f"(min {min(w):.3f}, max {max(w):.3f}, {len(w)} fresh processes)")


if __name__ == "__main__":
    main()
