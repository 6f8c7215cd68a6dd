"""GPU benchmark, kept for old invocations: a thin wrapper over `reflex bench --backend cuda`
(reflex/bench.py has the method: cold TTFT over fresh processes with the in-process stage stamps,
prefill 512, decode 128 graph and eager, memory, NVML energy, llama.cpp side by side).

    python benchmarks/bench_cuda.py MODEL.gguf [MODEL2.gguf ...] [--runs 7] [--drop-caches]
                                    [--no-cold] [--llama-cpp DIR] [--json OUT.json] [--backend numpy]

Same as `python -m reflex bench MODEL... --backend cuda --probe-variants --json > OUT.json`: the
report goes to OUT.json (and, indented, to stderr), the table to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--llama-cpp", default=None)
    ap.add_argument("--json", default=None, help="write the report to this file")
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args()
    from reflex.bench import bench, table

    res = bench(args.models, backend=args.backend, runs=args.runs, drop_caches=args.drop_caches,
                llama_cpp_dir=args.llama_cpp, do_cold=not args.no_cold, probe_variants=not args.no_cold,
                log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(res, indent=1), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    print(table(res))


if __name__ == "__main__":
    main()
