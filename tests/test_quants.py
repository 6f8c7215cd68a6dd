"""reflex.quants: bit-exact dequantization vs gguf.quants, quantize round trips."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from reflex.quants import QUANTS, dequantize, quantize

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as ref_dequantize  # noqa: E402

ALL_TYPES = [0, 1, 30, 8, 2, 3, 6, 7, 10, 11, 12, 13, 14]
# byte offsets of fp16 scale fields inside a block (made finite in random data)
F16_FIELDS = {8: [0], 2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 10: [80, 82], 11: [108],
              12: [0, 2], 13: [0, 2], 14: [208], 1: [0]}

MODELS_DIR = Path(os.environ.get("REFLEX_MODELS", "~/.cache/reflex/models")).expanduser()
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def _ref(raw, t, n_el):
    return np.asarray(ref_dequantize(raw, gguf.GGMLQuantizationType(t)), dtype=np.float32).reshape(-1)[:n_el]


def _bits_equal(a, b):
    a = np.ascontiguousarray(a, np.float32).reshape(-1)
    b = np.ascontiguousarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _random_blocks(t, nb, seed):
    q = QUANTS[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (nb, q.type_size), dtype=np.uint8)
    for off in F16_FIELDS.get(t, []):
        raw[:, off + 1] &= 0x3B          # exponent < 31: finite fp16
    if t == 0:
        raw[:, 3] &= 0x3F                 # finite f32
    if t == 30:
        raw[:, 1] &= 0x3F                 # finite bf16
    return raw


def test_registry():
    for t in ALL_TYPES:
        q = QUANTS[t]
        assert q.type_id == t and q.block_size > 0 and q.type_size > 0 and q.name
    assert QUANTS[12].type_size == 2 + 2 + 12 + 128
    assert QUANTS[14].type_size == 210 and QUANTS[8].type_size == 34
    for t in ALL_TYPES:
        bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)]
        assert (QUANTS[t].block_size, QUANTS[t].type_size) == (bs, ts)


@pytest.mark.parametrize("t", ALL_TYPES, ids=[QUANTS[t].name for t in ALL_TYPES])
def test_random_blocks_bit_exact(t):
    q = QUANTS[t]
    nb = 3000 if q.block_size > 1 else 50000
    raw = _random_blocks(t, nb, seed=t)
    n_el = nb * q.block_size
    ours = dequantize(raw.reshape(-1), t, (n_el // q.block_size, q.block_size) if q.block_size > 1 else (n_el,))
    assert ours.dtype == np.float32
    assert _bits_equal(ours, _ref(raw, t, n_el))


def test_shape_and_errors():
    raw = _random_blocks(8, 6, 1).reshape(-1)
    assert dequantize(raw, 8, (2, 3, 32)).shape == (2, 3, 32)
    with pytest.raises(ValueError):
        dequantize(raw, 8, (7, 32))
    with pytest.raises(NotImplementedError):
        dequantize(raw, 99, (6, 32))
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 33), np.float32), 8)


# RMS(dequant(quant(x)) - x) / RMS(x) upper bounds on N(0, 1) data
QUANTIZE_BOUNDS = {0: 0.0, 1: 1e-3, 30: 5e-3, 8: 0.007, 2: 0.11, 3: 0.10, 6: 0.055, 7: 0.05,
                   12: 0.10, 13: 0.05, 14: 0.025}


@pytest.mark.parametrize("t", list(QUANTIZE_BOUNDS), ids=[QUANTS[t].name for t in QUANTIZE_BOUNDS])
def test_quantize_roundtrip(t):
    rng = np.random.default_rng(100 + t)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    x[3] = 0.0                                   # all-zero rows must not produce NaN
    x[5] *= 1e-3
    raw = quantize(x, t)
    q = QUANTS[t]
    assert raw.dtype == np.uint8 and raw.size == x.size // q.block_size * q.type_size
    ours = dequantize(raw, t, x.shape)
    assert np.isfinite(ours).all()
    if t not in (0, 1, 30):
        assert _bits_equal(ours, _ref(raw.reshape(-1, q.type_size), t, x.size))
    assert np.all(ours[3] == 0)
    rel = np.sqrt(np.mean((ours - x) ** 2)) / np.sqrt(np.mean(x ** 2))
    assert rel <= QUANTIZE_BOUNDS[t], f"{q.name}: relative RMS error {rel:.4f}"


def _load_tensors(path):
    """[(name, ggml_type, numpy shape, raw uint8)] via reflex.gguf if usable, else gguf.GGUFReader."""
    try:
        from reflex.gguf import GGUFFile
        f = GGUFFile(str(path))
        return [(n, int(ti.ggml_type), tuple(int(s) for s in ti.shape),
                 np.asarray(f.tensor_bytes(n)).view(np.uint8).reshape(-1)) for n, ti in f.tensors.items()]
    except Exception:
        r = gguf.GGUFReader(str(path))
        return [(t.name, int(t.tensor_type), tuple(int(s) for s in reversed(t.shape.tolist())),
                 np.asarray(t.data).view(np.uint8).reshape(-1)) for t in r.tensors]


@pytest.mark.parametrize("model", MODELS)
def test_model_tensors_bit_exact(model):
    path = MODELS_DIR / model
    if not path.exists():
        pytest.skip(f"{path} missing")
    tensors = _load_tensors(path)
    assert tensors
    max_ref_rows = 64                          # the reference is slow: check a row subset of big tensors
    for name, t, shape, raw in tensors:
        q = QUANTS[t]
        ours = dequantize(raw, t, shape)       # full tensor through our path
        assert ours.shape == shape and ours.dtype == np.float32
        row = shape[-1]
        n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        row_bytes = row // q.block_size * q.type_size
        rows = np.arange(n_rows)
        if n_rows > max_ref_rows:
            rows = np.unique(np.concatenate([rows[:8], rows[-8:],
                                             np.random.default_rng(0).choice(n_rows, max_ref_rows - 16, replace=False)]))
        sub = raw[: n_rows * row_bytes].reshape(n_rows, row_bytes)[rows]
        ref = _ref(sub.reshape(-1, q.type_size), t, rows.size * row)
        assert _bits_equal(ours.reshape(n_rows, row)[rows], ref), name


# ---- reflex quantize command --------------------------------------------------------------

def _write_small_gguf(path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    tensors = {"blk.0.attn_q.weight": rng.standard_normal((64, 256)).astype(np.float32),
               "blk.0.attn_norm.weight": rng.standard_normal(256).astype(np.float32)}
    for n, a in tensors.items():
        w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


@pytest.mark.parametrize("tname,bound", [("Q8_0", 0.007), ("Q4_K", 0.10), ("Q6_K", 0.025)])
def test_quantize_command(tmp_path, tname, bound):
    pytest.importorskip("reflex.gguf")
    from reflex.cli import main
    from reflex.gguf import GGUFFile
    src = tmp_path / "in.gguf"
    dst = tmp_path / "out.gguf"
    tensors = _write_small_gguf(src)
    assert main(["quantize", str(src), str(dst), tname]) == 0
    a, b = GGUFFile(str(src)), GGUFFile(str(dst))
    try:
        assert set(a.metadata) <= set(b.metadata)
        for k, v in a.metadata.items():
            v2 = b.metadata[k]
            if hasattr(v, "tolist"):
                v, v2 = v.tolist(), v2.tolist()
            assert v == v2, k
        t = b.tensors["blk.0.attn_q.weight"]
        assert QUANTS[t.ggml_type].name == tname and t.shape == (64, 256)
        assert b.tensors["blk.0.attn_norm.weight"].ggml_type == 0
        for n, x in tensors.items():
            ti = b.tensors[n]
            y = dequantize(b.tensor_bytes(n), ti.ggml_type, ti.shape)
            rel = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2))
            assert rel <= (bound if x.ndim == 2 else 0.0), n
    finally:
        a.close()
        b.close()


def test_quantize_command_bad_type(tmp_path):
    from reflex.cli import main
    src = tmp_path / "in.gguf"
    _write_small_gguf(src)
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "Q2_K"]) == 2
