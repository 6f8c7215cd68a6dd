"""Eager decode steps of a model, for a kernel profiler (ncu) to time kernel by kernel.

    ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip N --launch-count M \
        python3 benchmarks/profile_decode.py MODEL.gguf [steps]
Eager launches run exactly the kernels a captured decode graph replays (same fusions)."""
import sys

from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
from reflex.gguf import GGUFFile
from reflex.models import load_model

b = CudaBackend()
m = load_model(GGUFFile(sys.argv[1]), b)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
cache = m.new_cache(64)
dec = GreedyDecoder(b, m, cache, use_graph=False)
tok = dec.prefill(list(range(100, 116)))
for _ in range(steps):
    tok = dec.step(tok)
b.synchronize()
print("launches per step: see the profile", file=sys.stderr)
