"""Time dequantizing every tensor of the test models: reflex.quants vs gguf.quants.

    python benchmarks/bench_dequant.py [--no-ref]
Models dir: $REFLEX_MODELS or ~/.cache/reflex/models.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reflex.quants import QUANTS, dequantize  # noqa: E402

MODELS = ["gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"]


def load_tensors(path):
    """[(name, ggml_type, numpy shape, raw uint8)] using reflex.gguf if present, else gguf.GGUFReader."""
    try:
        from reflex.gguf import GGUFFile
        f = GGUFFile(str(path))
        return [(n, int(t.ggml_type), tuple(t.shape), np.asarray(f.tensor_bytes(n)).view(np.uint8).reshape(-1))
                for n, t in f.tensors.items()]
    except Exception:
        import gguf
        r = gguf.GGUFReader(str(path))
        out = []
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed(t.shape.tolist()))
            out.append((t.name, int(t.tensor_type), shape, np.asarray(t.data).view(np.uint8).reshape(-1)))
        return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    do_ref = "--no-ref" not in argv
    mdir = Path(os.environ.get("REFLEX_MODELS", "~/.cache/reflex/models")).expanduser()
    for m in MODELS:
        p = mdir / m
        if not p.exists():
            print(f"{m}: missing, skipped")
            continue
        tensors = load_tensors(p)
        n_el = sum(int(np.prod(s)) for _, _, s, _ in tensors)
        # Two passes each, best reported: the first pass in a fresh VM also pays
        # for first-touch page faults of the output buffers (OS, not numpy, cost).
        ours = float("inf")
        passes = []
        for _ in range(2):
            per_type: dict[str, float] = {}
            t0 = time.perf_counter()
            for name, t, shape, raw in tensors:
                a = time.perf_counter()
                dequantize(raw, t, shape)
                per_type[QUANTS[t].name] = per_type.get(QUANTS[t].name, 0) + time.perf_counter() - a
            passes.append(time.perf_counter() - t0)
            if passes[-1] <= ours:
                ours, best_types = passes[-1], per_type
        line = f"{m}: {len(tensors)} tensors, {n_el / 1e6:.1f} M elements: reflex {ours:.3f} s (first pass {passes[0]:.3f} s)"
        if do_ref:
            import gguf
            from gguf.quants import dequantize as gdq
            ref = float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                for name, t, shape, raw in tensors:
                    gdq(raw, gguf.GGMLQuantizationType(t))
                ref = min(ref, time.perf_counter() - t0)
            line += f", gguf.quants {ref:.3f} s ({ref / ours:.1f}x)"
        print(line)
        print("   per type (reflex): " + ", ".join(f"{k} {v:.3f}s" for k, v in sorted(best_types.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
