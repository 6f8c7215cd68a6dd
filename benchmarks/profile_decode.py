"""Eager decode steps of a model, for a kernel profiler (ncu) to time kernel by kernel.

    ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip N --launch-count M \
        python3 benchmarks/profile_decode.py MODEL.gguf [steps] [prompt_len]
    python3 benchmarks/profile_decode.py MODEL.gguf [steps] [prompt_len] --count
Eager launches run exactly the kernels a captured decode graph replays (same fusions). --count
prints (stderr) how many kernels the prefill and each step launch, so --launch-skip can land on
the first decode step: skip = prefill launches (+ whole steps)."""
import sys

from reflex.backends import cuda_driver
from reflex.backends.cuda_backend import CudaBackend, GreedyDecoder
from reflex.gguf import GGUFFile
from reflex.models import load_model

args = [a for a in sys.argv[1:] if not a.startswith("--")]
count = "--count" in sys.argv
n = [0]
if count:
    call = cuda_driver.Kernel.__call__

    def counted(self, *a, **kw):
        n[0] += 1
        return call(self, *a, **kw)
    cuda_driver.Kernel.__call__ = counted
b = CudaBackend()
m = load_model(GGUFFile(args[0]), b)
steps = int(args[1]) if len(args) > 1 else 4
prompt = int(args[2]) if len(args) > 2 else 16
cache = m.new_cache(prompt + steps + 8)
dec = GreedyDecoder(b, m, cache, use_graph=False)
tok = dec.prefill([100 + i % 1000 for i in range(prompt)])
b.synchronize()
marks = [n[0]]
for _ in range(steps):
    tok = dec.step(tok)
    b.synchronize()
    marks.append(n[0])
if count:
    print(f"launches: prefill {marks[0]}, steps {[marks[i + 1] - marks[i] for i in range(steps)]}", file=sys.stderr)
