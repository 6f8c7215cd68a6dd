"""`reflex bench MODEL [MODEL...]`: cold TTFT over fresh processes with a stage breakdown, prefill
and decode tok/s, peak memory, GPU energy per request; with --llama-cpp DIR, llama.cpp on the same
file and the ratios. The table (or JSON with --json) goes to stdout, progress to stderr."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("models", nargs="+", metavar="MODEL", help="GGUF path, file name, or alias")
    p.add_argument("--backend", default="numpy", choices=("numpy", "cuda"), help="compute backend (default numpy)")
    p.add_argument("--runs", type=int, default=5, help="cold runs per model (default 5; median/min/max)")
    p.add_argument("--drop-caches", action="store_true",
                   help="one more cold run after dropping the page cache (needs root, else reported skipped)")
    p.add_argument("--llama-cpp", metavar="DIR", default=None,
                   help="a llama.cpp build dir (llama-simple, llama-bench): measure it on the same file")
    p.add_argument("--no-cold", action="store_true", help="skip the fresh-process cold runs")
    p.add_argument("--prompt-tokens", type=int, default=512, help="prefill prompt length (default 512)")
    p.add_argument("--gen-tokens", type=int, default=128, help="decode length, EOS ignored (default 128)")
    p.add_argument("--probe-variants", action="store_true",
                   help="also probe start-up variants (os._exit, context reset, late context, OpenBLAS threads)")


def run(args) -> int:
    from reflex.bench import bench, table

    res = bench(args.models, backend=args.backend, runs=args.runs, drop_caches=args.drop_caches,
                llama_cpp_dir=args.llama_cpp, do_cold=not args.no_cold, prompt_tokens=args.prompt_tokens,
                gen_tokens=args.gen_tokens, probe_variants=args.probe_variants,
                log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(res) if args.json else table(res))
    return 0
