"""GGUFFile against gguf.GGUFReader (the independent reference) on real models and written files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reflex.errors import ModelNotFound
from reflex.gguf import GGUFFile, StringArray
from reflex.gguf.constants import GGML_QUANT_SIZES

gguf = pytest.importorskip("gguf")

MODELS_DIR = Path(os.environ.get("REFLEX_MODELS", Path.home() / ".cache" / "reflex" / "models"))
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    path = MODELS_DIR / request.param
    if not path.exists():
        pytest.skip(f"model {path} not present")
    ref = gguf.GGUFReader(str(path))
    f = GGUFFile(path)
    yield f, ref
    f.close()


def _same(ours, theirs):
    if isinstance(ours, np.ndarray):
        return np.array_equal(ours, np.asarray(theirs, dtype=ours.dtype))
    if isinstance(ours, StringArray):
        return list(ours) == list(theirs)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(_same(a, b) for a, b in zip(ours, theirs))
    if isinstance(ours, float):
        return np.float32(ours) == np.float32(theirs) or ours == theirs
    return ours == theirs and type(ours) is type(theirs) or (isinstance(ours, int) and ours == theirs)


def test_metadata_matches_reference(pair):
    f, ref = pair
    ref_keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert sorted(ref_keys) == sorted(f.metadata)
    for k in ref_keys:
        assert _same(f.metadata[k], ref.fields[k].contents()), k
    assert f.version == int(ref.fields["GGUF.version"].contents())
    assert f.arch == ref.fields["general.architecture"].contents()
    assert f.get("no.such.key", 7) == 7


def test_tensors_match_reference(pair):
    f, ref = pair
    assert len(f.tensors) == len(ref.tensors)
    assert f.data_offset == ref.data_offset
    for t in ref.tensors:
        ti = f.tensors[t.name]
        assert ti.ne == tuple(int(x) for x in t.shape), t.name
        assert ti.shape == tuple(reversed(ti.ne))
        assert ti.ggml_type == int(t.tensor_type)
        assert ti.offset == t.data_offset
        assert ti.nbytes == t.n_bytes
        raw = f.tensor_bytes(t.name)
        assert raw.dtype == np.uint8 and raw.nbytes == ti.nbytes
        ref_raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert np.array_equal(raw[:4096], ref_raw[:4096]) and np.array_equal(raw[-4096:], ref_raw[-4096:])


def test_tensor_bytes_zero_copy(pair):
    f, _ = pair
    name = next(iter(f.tensors))
    v = f.tensor_bytes(name)
    assert not v.flags.owndata and not v.flags.writeable


def _write(path, build, tensors=()):
    w = gguf.GGUFWriter(str(path), "llama")
    build(w)
    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _all_types(w):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 3.141592653589793)
    w.add_bool("t.bool", True)
    w.add_bool("t.bool0", False)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 1.25])
    w.add_array("t.arr_str", ["a", "", "ünï", "x" * 300])
    w.add_array("t.arr_str_many", [f"tok{i}" for i in range(3000)])
    w.add_array("t.arr_nested", [[1, 2], [3, 4, 5]])
    w.add_array("t.arr_nested_str", [["a", "b"], ["c"]])


def _small(tmp_path, name="small.gguf"):
    tensors = [
        ("a", np.arange(12, dtype=np.float32).reshape(3, 4)),
        ("b", np.ones((2, 3, 5), dtype=np.float16)),
        ("c", np.arange(7, dtype=np.int32)),
    ]
    return _write(tmp_path / name, _all_types, tensors)


def test_written_file_all_value_types(tmp_path):
    p = _small(tmp_path)
    ref = gguf.GGUFReader(str(p))
    with GGUFFile(p) as f:
        m = f.metadata
        assert m["t.u8"] == 200 and m["t.i8"] == -100 and m["t.u16"] == 60000
        assert m["t.i16"] == -30000 and m["t.u32"] == 4_000_000_000 and m["t.i32"] == -2_000_000_000
        assert m["t.f32"] == 1.5 and m["t.u64"] == 2**63 + 5 and m["t.i64"] == -(2**62)
        assert m["t.f64"] == 3.141592653589793
        assert m["t.bool"] is True and m["t.bool0"] is False
        assert m["t.str"] == "héllo ✓"
        assert list(m["t.arr_i32"]) == [1, -2, 3]
        assert list(m["t.arr_f32"]) == [0.5, 1.25]
        assert list(m["t.arr_str"]) == ["a", "", "ünï", "x" * 300]
        assert m["t.arr_str"][-1] == "x" * 300 and m["t.arr_str"][1:3] == ["", "ünï"]
        assert list(m["t.arr_str_many"]) == [f"tok{i}" for i in range(3000)]
        assert [list(x) for x in m["t.arr_nested"]] == [[1, 2], [3, 4, 5]]
        assert [list(x) for x in m["t.arr_nested_str"]] == [["a", "b"], ["c"]]
        for k, fld in ref.fields.items():
            # the reference flattens nested arrays; those are checked explicitly above
            if not k.startswith("GGUF.") and "nested" not in k:
                assert _same(m[k], fld.contents()), k
        assert f.alignment == 32 and f.version == 3
        a = f.tensors["a"]
        assert a.ne == (4, 3) and a.shape == (3, 4) and a.ggml_type == 0 and a.nbytes == 48
        assert np.array_equal(f.tensor_bytes("a").view(np.float32).reshape(a.shape),
                              np.arange(12, dtype=np.float32).reshape(3, 4))
        b = f.tensors["b"]
        assert b.ne == (5, 3, 2) and b.ggml_type == 1 and b.nbytes == 60
        assert f.tensors["c"].ggml_type == 26
        for t in ref.tensors:
            assert f.tensors[t.name].offset == t.data_offset
            assert f.tensors[t.name].offset % 32 == 0


def test_v2_file(tmp_path):
    p = _small(tmp_path)
    data = bytearray(p.read_bytes())
    data[4:8] = (2).to_bytes(4, "little")
    q = tmp_path / "v2.gguf"
    q.write_bytes(bytes(data))
    with GGUFFile(q) as f:
        assert f.version == 2 and f.metadata["t.str"] == "héllo ✓" and len(f.tensors) == 3


def test_custom_alignment(tmp_path):
    def build(w):
        w.add_uint32("general.alignment", 64)
    p = tmp_path / "al.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.data_alignment = 64
    build(w)
    w.add_tensor("x", np.ones(10, dtype=np.float32))
    w.add_tensor("y", np.ones(3, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    ref = gguf.GGUFReader(str(p))
    with GGUFFile(p) as f:
        assert f.alignment == 64 and f.data_offset % 64 == 0
        for t in ref.tensors:
            assert f.tensors[t.name].offset == t.data_offset


def test_missing_file(tmp_path):
    with pytest.raises(ModelNotFound):
        GGUFFile(tmp_path / "nope.gguf")


def test_quant_sizes_match_reference():
    for t, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        if int(t) in GGML_QUANT_SIZES:
            assert GGML_QUANT_SIZES[int(t)] == (blck, size), t


def test_info_cli_json():
    path = MODELS_DIR / MODELS[0]
    if not path.exists():
        pytest.skip("SmolLM2 not present")
    env = dict(os.environ, REFLEX_MODELS=str(MODELS_DIR), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "reflex", "info", MODELS[0], "--json"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["architecture"] == "llama"
    assert d["vocab_size"] == 49152
    assert d["context_length"] > 0
    assert d["chat_template"] is True
    assert 100e6 < d["parameter_count"] < 200e6
    assert sum(v["tensors"] for v in d["quant_mix"].values()) == d["tensor_count"]
    assert d["special_tokens"]["eos"]["id"] is not None


def test_info_cli_missing_model(tmp_path):
    env = dict(os.environ, REFLEX_MODELS=str(tmp_path), PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "reflex", "info", "nothing.gguf", "--json"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 3
    assert "reflex fetch" in out.stdout + out.stderr


@pytest.mark.parametrize("variant", ["plain", "long", "empty", "zeros", "mixed"])
def test_string_array_scan_paths(tmp_path, variant):
    """The vectorized offset scan and its sequential fallback must agree exactly."""
    rng = np.random.default_rng(7)
    items = [f"t{i}_" + "ab" * int(rng.integers(0, 6)) for i in range(2000)]
    if variant in ("long", "mixed"):
        items[700] = "L" * 300
        items[1999] = "M" * 70000
    if variant in ("empty", "mixed"):
        for i in range(0, 2000, 7):
            items[i] = ""
    if variant in ("zeros", "mixed"):
        for i in range(3, 2000, 11):
            items[i] = "\x00" * int(rng.integers(1, 12))
    p = _write(tmp_path / "s.gguf", lambda w: (w.add_array("x.strs", items), w.add_uint32("x.after", 99)))
    with GGUFFile(p) as f:
        got = f.metadata["x.strs"]
        assert len(got) == len(items)
        assert list(got) == items
        assert got.tolist() == items
        assert f.metadata["x.after"] == 99
