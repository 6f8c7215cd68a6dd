"""The AOT kernels build for every target (CPU-only: runs wherever nvcc exists, no GPU needed).

setup.sh runs kernels/build.py when nvcc is on the PATH; this test reads the fatbin it wrote and
checks its table of contents: SASS for sm_75/80/86/89/90 and PTX for compute_90 only, and every
kernel the CUDA backend launches present in each SASS image. Skipped where nvcc is absent."""
import os
import shutil
import struct

import pytest

from reflex.backends import cuda_backend, cuda_driver

FATBIN = cuda_driver.default_fatbin()
NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") or None)

pytestmark = pytest.mark.skipif(not NVCC, reason="nvcc not installed: kernels are not built here")


def _entries(data: bytes):
    """(kind, arch, payload) of each fatbin entry; kind 1 = PTX, 2 = ELF (SASS)."""
    magic, _ver, hs, fs = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50, "not a fatbin"
    off, out = hs, []
    while off < hs + fs:
        kind, _u, ehs, size = struct.unpack_from("<HHIQ", data, off)
        arch = struct.unpack_from("<IIHHI", data, off + 16)[4]
        out.append((kind, arch, data[off + ehs: off + ehs + size]))
        off += ehs + size
    return out


def test_fatbin_has_every_target():
    assert os.path.exists(FATBIN), f"{FATBIN} missing: `python kernels/build.py` failed or was not run"
    ents = _entries(open(FATBIN, "rb").read())
    sass = sorted(a for k, a, _ in ents if k == 2)
    ptx = sorted(a for k, a, _ in ents if k == 1)
    assert sass == [75, 80, 86, 89, 90]
    assert ptx == [90]


def test_every_launched_kernel_is_in_each_sass_image():
    ents = _entries(open(FATBIN, "rb").read())
    names = [f"rx_{fam}_{suffix}" for fam in ("matvec", "matvec3", "matvec_glu", "get_rows", "dequant")
             for suffix, _, _ in cuda_backend.TYPES.values()]
    names += ["rx_sgemm_nt", "rx_rms_norm", "rx_add_rms_norm", "rx_layer_norm", "rx_rope", "rx_kv_write",
              "rx_attention", "rx_attn_combine", "rx_binary", "rx_unary", "rx_glu", "rx_argmax"]
    for kind, arch, payload in ents:
        if kind == 2:
            missing = [n for n in names if n.encode() + b"\0" not in payload]
            assert not missing, f"sm_{arch} lacks {missing}"
