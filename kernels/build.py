"""Compile kernels/*.cu ahead of time into one fatbin inside the package.

    python kernels/build.py [--out reflex/_kernels/reflex.fatbin] [--arch 75,80,86,89,90] [--quiet]

SASS for every listed architecture plus PTX for the newest only; the driver JIT-compiles that PTX
solely on GPUs newer than the newest SASS (the backend reports this as `jit`). No NVRTC at run time.
Exits 0 without building when nvcc is absent (CPU-only installs), unless --require is given.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(ROOT, "reflex", "_kernels", "reflex.fatbin")
DEFAULT_ARCH = "75,80,86,89,90"


def nvcc_path() -> str | None:
    p = shutil.which("nvcc")
    if p:
        return p
    for cand in ("/usr/local/cuda/bin/nvcc",):
        if os.path.exists(cand):
            return cand
    return None


def command(nvcc: str, out: str, archs: list[int]) -> list[str]:
    cmd = [nvcc, "-fatbin", "-O3", "-std=c++17", "--threads", "0", "-o", out,
           os.path.join(HERE, "reflex.cu")]
    for a in archs:
        cmd += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    newest = max(archs)
    cmd += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
    return cmd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--arch", default=os.environ.get("REFLEX_CUDA_ARCH", DEFAULT_ARCH))
    ap.add_argument("--require", action="store_true", help="fail when nvcc is missing")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    nvcc = nvcc_path()
    if nvcc is None:
        print("kernels/build.py: nvcc not found; CUDA backend unavailable", file=sys.stderr)
        return 1 if args.require else 0
    archs = sorted(int(a) for a in args.arch.split(",") if a.strip())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    cmd = command(nvcc, tmp, archs)
    t0 = time.perf_counter()
    r = subprocess.run(cmd)
    if r.returncode != 0:
        print("kernels/build.py: nvcc failed: " + " ".join(cmd), file=sys.stderr)
        return r.returncode
    os.replace(tmp, args.out)  # atomic: a concurrent reader never sees half a fatbin
    if not args.quiet:
        print(f"kernels/build.py: {args.out} ({os.path.getsize(args.out)} B, sm_{','.join(map(str, archs))}"
              f" + compute_{max(archs)} PTX) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
