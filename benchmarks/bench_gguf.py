"""Fresh-process timing of GGUF open + metadata + tensor table (median of N runs).

Each run is a new Python process. Reported: `open` = GGUFFile(path) after imports (what the
≤20 ms / ≤60 ms targets refer to), `import+open` = including `import reflex.gguf` (numpy), and
the same for gguf.GGUFReader (reference) where installed.

    python benchmarks/bench_gguf.py [--runs 5] [MODEL ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = Path(os.environ.get("REFLEX_MODELS") or Path.home() / ".cache" / "reflex" / "models")
DEFAULT = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]

REFLEX = r"""
import sys, time, json
t0 = time.perf_counter()
import numpy
t1 = time.perf_counter()
from reflex.gguf import GGUFFile
t2 = time.perf_counter()
f = GGUFFile(sys.argv[1])
n = len(f.metadata) + len(f.tensors)
tok = f.metadata.get("tokenizer.ggml.tokens")
t3 = time.perf_counter()
print(json.dumps({"open": t3 - t2, "import_open": t3 - t0, "numpy": t1 - t0}))
"""

REF = r"""
import sys, time, json
import numpy
t0 = time.perf_counter()
import gguf
t1 = time.perf_counter()
r = gguf.GGUFReader(sys.argv[1])
n = len(r.fields) + len(r.tensors)
t2 = time.perf_counter()
print(json.dumps({"open": t2 - t1, "import_open": t2 - t0}))
"""


def run(code: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(code, path, runs):
    rs = [run(code, path) for _ in range(runs)]
    return {k: statistics.median(r[k] for r in rs) * 1e3 for k in rs[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-ref", action="store_true", help="skip gguf.GGUFReader")
    a = ap.parse_args()
    for m in a.models:
        p = Path(m) if Path(m).is_file() else MODELS_DIR / m
        if not p.is_file():
            print(f"{m}: not found, skipped")
            continue
        ours = median(REFLEX, p, a.runs)
        line = (f"{p.name:<36} reflex open {ours['open']:7.1f} ms   import+open {ours['import_open']:7.1f} ms"
                f"   (numpy import {ours['numpy']:.1f} ms)")
        if not a.no_ref:
            try:
                ref = median(REF, p, a.runs)
                line += f"   | gguf.GGUFReader open {ref['open']:8.1f} ms"
            except subprocess.CalledProcessError:
                line += "   | gguf.GGUFReader unavailable"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
