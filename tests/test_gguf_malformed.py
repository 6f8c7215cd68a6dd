"""Malformed GGUF input must raise ModelFormatError (with kind/offset) quickly, never anything else."""
from __future__ import annotations

import os
import random
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reflex.errors import ModelFormatError
from reflex.gguf import GGUFFile, StringArray

MODELS_DIR = Path(os.environ.get("REFLEX_MODELS", Path.home() / ".cache" / "reflex" / "models"))
SMOL = MODELS_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---- a tiny independent GGUF builder ---------------------------------------------------------
def s(x: bytes | str) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, ne, ttype=0, off=0, n_dims=None) -> bytes:
    n = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack("<I", n) + b"".join(struct.pack("<q", d) for d in ne) + struct.pack("<IQ", ttype, off)


def build(kvs=(), tensors=(), data=b"", version=3, n_kv=None, n_t=None, magic=b"GGUF", align=32):
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_t is None else n_t,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    pad = (-len(body)) % align
    return body + b"\0" * pad + data


ARCH = kv("general.architecture", 8, s("llama"))


def good_file() -> bytes:
    kvs = [ARCH,
           kv("a.u32", 4, struct.pack("<I", 7)),
           kv("a.strs", 9, struct.pack("<IQ", 8, 3) + s("x") + s("yy") + s("")),
           kv("a.f32s", 9, struct.pack("<IQ", 6, 2) + struct.pack("<2f", 1.0, 2.0)),
           kv("a.nest", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 5, 2) + struct.pack("<2i", 1, 2))]
    tensors = [tinfo("w", (4, 2), 0, 0), tinfo("q", (32,), 8, 32)]
    data = np.arange(8, dtype=np.float32).tobytes() + b"\0" * 0 + b"\1" * 34
    return build(kvs, tensors, data)


def write(tmp, data: bytes, name="m.gguf") -> Path:
    p = Path(tmp) / name
    p.write_bytes(data)
    return p


def open_all(path):
    """Open and touch everything; return None on success or the ModelFormatError."""
    try:
        with GGUFFile(path) as f:
            for v in f.metadata.values():
                if isinstance(v, StringArray):
                    list(v)
                elif isinstance(v, list):
                    for x in v:
                        if isinstance(x, StringArray):
                            list(x)
            for n in f.tensors:
                f.tensor_bytes(n).sum()
        return None
    except ModelFormatError as e:
        assert e.kind and isinstance(e.kind, str)
        assert e.offset is None or 0 <= e.offset <= os.path.getsize(path) + 2**20
        return e


def expect(tmp_path, data, kind):
    p = write(tmp_path, data)
    with pytest.raises(ModelFormatError) as ei:
        with GGUFFile(p) as f:
            for v in f.metadata.values():
                if isinstance(v, StringArray):
                    list(v)
    assert ei.value.kind == kind, str(ei.value)
    return ei.value


def test_good_file_opens(tmp_path):
    p = write(tmp_path, good_file())
    with GGUFFile(p) as f:
        assert list(f.metadata["a.strs"]) == ["x", "yy", ""]
        assert f.tensors["w"].shape == (2, 4) and f.tensors["q"].nbytes == 34
        assert list(f.metadata["a.nest"][0]) == [1, 2]


# ---- crafted cases ---------------------------------------------------------------------------
def test_bad_magic(tmp_path):
    assert expect(tmp_path, build([ARCH], magic=b"GGUX"), "bad_magic").offset == 0


def test_empty_and_tiny(tmp_path):
    for d in (b"", b"GG", b"GGUF", b"GGUF\3\0"):
        assert open_all(write(tmp_path, d)) is not None


def test_unsupported_version(tmp_path):
    for v in (0, 1, 4, 2**31):
        assert expect(tmp_path, build([ARCH], version=v), "unsupported_version").offset == 4
    be = bytearray(build([ARCH]))
    be[4:8] = (3).to_bytes(4, "big")
    expect(tmp_path, bytes(be), "unsupported_endianness")


def test_truncated_header(tmp_path):
    for n in range(0, 24):
        e = open_all(write(tmp_path, build([ARCH])[:n]))
        assert e is not None and e.kind in ("truncated", "bad_magic")


def test_absurd_counts(tmp_path):
    expect(tmp_path, build([ARCH], n_kv=2**62), "absurd_count")
    expect(tmp_path, build([ARCH], n_t=2**62), "absurd_count")
    for et in (0, 4, 8, 9, 12):
        expect(tmp_path, build([ARCH, kv("x", 9, struct.pack("<IQ", et, 2**62))]), "absurd_count")
    expect(tmp_path, build([ARCH, kv("x", 9, struct.pack("<IQ", 4, 2**64 - 1))]), "absurd_count")


def test_huge_string_lengths(tmp_path):
    e = expect(tmp_path, build([ARCH, struct.pack("<Q", 2**63) + b"k"]), "truncated")
    assert e.offset is not None
    expect(tmp_path, build([ARCH, kv("x", 8, struct.pack("<Q", 2**40) + b"abc")]), "truncated")
    # a string array whose 300th element claims a huge length (exercises the fast scan path)
    items = b"".join(s(f"t{i}") for i in range(299)) + struct.pack("<Q", 2**50) + b"zz"
    expect(tmp_path, build([ARCH, kv("x", 9, struct.pack("<IQ", 8, 300) + items)]), "truncated")


def test_unknown_value_types(tmp_path):
    expect(tmp_path, build([ARCH, kv("x", 13, b"\0" * 8)]), "bad_value_type")
    expect(tmp_path, build([ARCH, kv("x", 9, struct.pack("<IQ", 77, 1) + b"\0" * 8)]), "bad_value_type")


def test_duplicate_key_and_tensor(tmp_path):
    expect(tmp_path, build([ARCH, ARCH]), "duplicate_key")
    t = [tinfo("w", (8,), 0, 0), tinfo("w", (8,), 0, 32)]
    expect(tmp_path, build([ARCH], t, b"\0" * 64), "duplicate_tensor")


def test_bad_utf8(tmp_path):
    expect(tmp_path, build([ARCH, kv("x", 8, s(b"\xff\xfe"))]), "bad_utf8")
    expect(tmp_path, build([ARCH, s(b"k\xc3") + struct.pack("<I", 4) + b"\0" * 4]), "bad_utf8")
    expect(tmp_path, build([ARCH], [tinfo(b"\x80", (8,))], b"\0" * 32), "bad_utf8")
    expect(tmp_path, build([ARCH, kv("x", 9, struct.pack("<IQ", 8, 2) + s("ok") + s(b"\xc0\xaf"))]), "bad_utf8")


def test_bad_dims(tmp_path):
    expect(tmp_path, build([ARCH], [tinfo("w", (2, 2, 2, 2, 2))], b"\0" * 128), "bad_dims")
    expect(tmp_path, build([ARCH], [tinfo("w", ())], b"\0" * 32), "bad_dims")
    expect(tmp_path, build([ARCH], [tinfo("w", (4, 0))], b"\0" * 32), "bad_dims")
    expect(tmp_path, build([ARCH], [tinfo("w", (4, -3))], b"\0" * 32), "bad_dims")
    expect(tmp_path, build([ARCH], [tinfo("w", (33,), 8)], b"\0" * 128), "bad_dims")  # not block multiple
    expect(tmp_path, build([ARCH], [tinfo("w", (4,), 0, 0, n_dims=2**31)], b"\0" * 32), "bad_dims")


def test_unknown_tensor_type(tmp_path):
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 4)], b"\0" * 32), "bad_tensor_type")
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 9999)], b"\0" * 32), "bad_tensor_type")


def test_tensor_data_problems(tmp_path):
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 0, 0)], b"\0" * 31), "truncated_tensor_data")
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 0, 2**40)], b"\0" * 32), "offset_past_end")
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 0, 2**64 - 32)], b"\0" * 32), "offset_past_end")
    expect(tmp_path, build([ARCH], [tinfo("w", (2**40, 2**40), 0, 0)], b"\0" * 32), "truncated_tensor_data")
    expect(tmp_path, build([ARCH], [tinfo("w", (8,), 0, 4)], b"\0" * 64), "misaligned_tensor")
    t = [tinfo("a", (16,), 0, 0), tinfo("b", (8,), 0, 32)]
    expect(tmp_path, build([ARCH], t, b"\0" * 128), "overlapping_tensors")


def test_bad_alignment(tmp_path):
    for v in (0, 3, 48):
        expect(tmp_path, build([ARCH, kv("general.alignment", 4, struct.pack("<I", v))]), "bad_alignment")
    expect(tmp_path, build([ARCH, kv("general.alignment", 8, s("32"))]), "bad_alignment")


def test_deep_nesting(tmp_path):
    payload = struct.pack("<IQ", 5, 0)
    for _ in range(50):
        payload = struct.pack("<IQ", 9, 1) + payload
    expect(tmp_path, build([ARCH, s("x") + struct.pack("<I", 9) + payload]), "nesting_too_deep")


# ---- corpus: truncation and byte flips -------------------------------------------------------
def _small_written(tmp_path) -> bytes:
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint32("a.u32", 5)
    w.add_string("a.s", "hello")
    w.add_array("a.toks", [f"tok{i}" for i in range(400)])
    w.add_array("a.f", [1.0, 2.0, 3.0])
    w.add_array("a.nest", [[1, 2], [3]])
    w.add_tensor("x", np.ones((4, 8), dtype=np.float32))
    w.add_tensor("y", np.ones(16, dtype=np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return p.read_bytes()


def test_truncate_small_at_every_offset(tmp_path):
    data = _small_written(tmp_path)
    assert open_all(write(tmp_path, data)) is None
    for n in range(len(data)):
        e = open_all(write(tmp_path, data[:n], "t.gguf"))
        assert e is not None, n


def test_truncate_real_model(tmp_path):
    if not SMOL.exists():
        pytest.skip("SmolLM2 not present")
    with GGUFFile(SMOL) as f:
        hdr_end = f.data_offset
        first = min(t.offset for t in f.tensors.values())
    with open(SMOL, "rb") as fh:
        prefix = fh.read(first + 4096)
    rng = random.Random(1234)
    cuts = sorted(set([0, 3, 4, 8, 16, 23, 24, hdr_end - 1, hdr_end, first + 100]
                      + [rng.randrange(24, hdr_end) for _ in range(60)]))
    for n in cuts:
        e = open_all(write(tmp_path, prefix[:n], "t.gguf"))
        assert e is not None, n


def test_flip_header_bytes(tmp_path):
    data = bytearray(_small_written(tmp_path))
    rng = random.Random(42)
    results = {"ok": 0, "err": 0}
    for i in range(400):
        d = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4))):
            pos = rng.randrange(0, min(len(d), 6000))
            d[pos] = rng.randrange(256)
        e = open_all(write(tmp_path, bytes(d), "f.gguf"))
        results["err" if e else "ok"] += 1
    assert results["err"] > 0


_FUZZ_BASE: bytes | None = None


def _fuzz_base() -> bytes:
    global _FUZZ_BASE
    if _FUZZ_BASE is None:
        with tempfile.TemporaryDirectory() as d:
            _FUZZ_BASE = _small_written(Path(d))
    return _FUZZ_BASE


@settings(max_examples=300, deadline=2000, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(0, 10**6)))
def test_fuzz_mutations(muts, cut):
    base = bytearray(_fuzz_base())
    for pos, val in muts:
        base[pos % len(base)] = val
    if cut is not None:
        base = base[: cut % (len(base) + 1)]
    with tempfile.TemporaryDirectory() as d:
        open_all(write(d, bytes(base)))


@settings(max_examples=150, deadline=2000, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=0, max_size=200))
def test_fuzz_random_after_magic(blob):
    with tempfile.TemporaryDirectory() as d:
        open_all(write(d, b"GGUF\3\0\0\0" + blob))
