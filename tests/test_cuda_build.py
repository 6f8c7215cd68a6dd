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
    names = [f"rx_{fam}_{suffix}" for fam in ("matvec", "matvec3", "matvec_glu", "matvec3n", "matvec_glun", "get_rows",
                                              "dequant", "dequant_h", "moe_glu", "moe_down")
             for suffix, _, _ in cuda_backend.TYPES.values()]
    names += [f"rx_attention_dec_{v}" for v in ("d64", "d128", "d256", "d512", "g256", "g512")]
    names += ["rx_moe_route", "rx_moe_combine", "rx_repeat_penalty", "rx_ring_push"]
    names += ["rx_sgemm_nt", "rx_hgemm_nt", "rx_x_to_half", "rx_rms_norm", "rx_add_rms_norm", "rx_layer_norm", "rx_rope", "rx_kv_write",
              "rx_attention", "rx_attn_combine", "rx_binary", "rx_unary", "rx_glu", "rx_argmax"]
    for kind, arch, payload in ents:
        if kind == 2:
            missing = [n for n in names if n.encode() + b"\0" not in payload]
            assert not missing, f"sm_{arch} lacks {missing}"


def test_matvec_block_dots_match_elementwise_dequant(tmp_path):
    """CPU check of kernels/matvec.cu's per-type Dot8 (scales decoded once per 8 elements) against
    quant.cuh's per-element dequantization (itself bit-exact with gguf's dequantizers on the GPU,
    test_cuda_kernels.py): the device code is compiled as host C++ with g++, on random blocks.
    Skipped where g++ is absent."""
    import subprocess
    gxx = shutil.which("g++")
    if not gxx:
        pytest.skip("g++ not installed")
    src = _host_harness()
    (tmp_path / "ht.cpp").write_text(src)
    r = subprocess.run([gxx, "-O1", "-std=c++17", "-o", str(tmp_path / "ht"), str(tmp_path / "ht.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "ht")], capture_output=True, text=True, check=True).stdout.split()
    worst = dict(zip(out[0::2], map(float, out[1::2])))
    assert len(worst) == 10 and all(v < 1e-5 for v in worst.values()), worst


def _host_harness() -> str:
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
    q = open(os.path.join(here, "quant.cuh")).read().replace('#pragma once\n#include "common.cuh"\n', "")
    mv = open(os.path.join(here, "matvec.cu")).read()
    d8 = mv[mv.index("template <int T>\nstruct Dot8"):mv.index("template <int T>\n__device__ __forceinline__ float dot_row")]
    pre = r"""#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <vector>
#define __device__
#define __forceinline__ inline
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float h2f(uint16_t h) {
    uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023; float v;
    if (e == 0) v = ldexpf((float)m, -24); else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v; }
static inline float rx_f16(const uint8_t* p) { return h2f((uint16_t)p[0] | ((uint16_t)p[1] << 8)); }
"""
    main = r"""
template <int T> double check(int nblocks, unsigned seed) {
    srand(seed);
    int n = nblocks * Q<T>::QK; std::vector<uint8_t> buf(nblocks * Q<T>::TS);
    for (auto& b : buf) b = rand() & 255;
    for (int k = 0; k < nblocks; k++) {  // finite fp16 scales (d, m, dmin fields)
        uint8_t* b = &buf[k * Q<T>::TS]; int offs[2], no = 0;
        if (T == 8 || T == 2 || T == 6) offs[no++] = 0;
        if (T == 3 || T == 7 || T == 12 || T == 13) { offs[no++] = 0; offs[no++] = 2; }
        if (T == 14) offs[no++] = 208;
        if (T == 10) { offs[no++] = 80; offs[no++] = 82; }
        if (T == 11) offs[no++] = 108;
        for (int o = 0; o < no; o++) { b[offs[o]] = rand() & 255; b[offs[o] + 1] = 0x20 | (rand() & 3); } }
    std::vector<float> x(n); for (auto& v : x) v = rand() / (float)RAND_MAX - 0.5f;
    double worst = 0;
    for (int e = 0; e < n; e += 8) {
        const uint8_t* blk = &buf[(e / Q<T>::QK) * Q<T>::TS]; int j = e % Q<T>::QK;
        double ref = 0, mag = 0;
        for (int i = 0; i < 8; i++) { double v = Q<T>::dq(blk, j + i); ref += v * x[e + i]; mag += fabs(v * x[e + i]); }
        double got = Dot8<T>::f(blk, j, &x[e]);
        double r = fabs(got - ref) / (mag + 1e-30); if (!(r <= worst)) worst = r; }
    return worst; }
int main() {
    printf("q8_0 %g q4_0 %g q4_1 %g q5_0 %g q5_1 %g ", check<8>(64, 1), check<2>(64, 2), check<3>(64, 3),
           check<6>(64, 4), check<7>(64, 5));
    printf("q4_k %g q5_k %g q6_k %g q2_k %g q3_k %g\n", check<12>(16, 6), check<13>(16, 7), check<14>(16, 8),
           check<10>(16, 9), check<11>(16, 10));
    return 0; }
"""
    return pre + q + d8 + main
