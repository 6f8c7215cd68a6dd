"""The embedding API (reflex/embed.py, Engine.embed, `reflex embed`): validation, truncation,
pooling, normalization, packing. Values are checked against the sentence-transformers references
recorded by scripts/make_embedding_refs.py (tests/data/embedding_ref_minilm.json.gz). Needs the
fetched model (`reflex fetch minilm`, done by setup.sh), else skipped.
"""
from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reflex import store
from reflex.embed import embed, hidden_states
from reflex.errors import ContextOverflow, InvalidRequest

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def engine():
    from reflex.engine import Engine

    try:
        path = store.resolve("minilm")
    except Exception:
        pytest.skip("minilm not fetched (reflex fetch minilm)")
    with Engine(str(path)) as e:
        yield e


@pytest.fixture(scope="module")
def ref():
    r = json.load(gzip.open(DATA / "embedding_ref_minilm.json.gz", "rt", encoding="utf-8"))
    r["emb"] = np.frombuffer(base64.b64decode(r["embeddings_f16"]), np.float16).astype(np.float32).reshape(-1, r["dim"])
    return r


def test_bad_input_is_invalid_request(engine):
    for bad in ("", [], [""], ["ok", ""], [1, "x"], None, 3):
        with pytest.raises(InvalidRequest):
            engine.embed(bad)
    with pytest.raises(InvalidRequest):
        embed(engine.model, engine.tokenizer, "x", pooling="max")


def test_single_string_and_list(engine, ref):
    v1 = engine.embed(ref["texts"][0])
    v = engine.embed(ref["texts"][:3])
    assert v1.shape == (384,) and v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(v1, v[0], atol=1e-5)
    assert float(v1 @ ref["emb"][0]) / np.linalg.norm(ref["emb"][0]) >= 0.9999


def test_overflow_and_truncate(engine, ref):
    long = " ".join(ref["texts"]) * 2  # thousands of tokens
    with pytest.raises(ContextOverflow):
        engine.embed([ref["texts"][0], long])
    v = engine.embed(long, truncate=True)
    tok = engine.tokenizer
    ids = tok.encode(long)
    cut = ids[:511] + [tok.eos_id]  # as HF truncation: first tokens, then [SEP]
    h = engine.model.forward(cut, None, output="hidden").mean(0)
    assert np.allclose(v, h / np.linalg.norm(h), atol=1e-5)


def test_normalize_and_pooling(engine, ref):
    m, tok = engine.model, engine.tokenizer
    texts = ref["texts"][:4]
    raw, info = embed(m, tok, texts, normalize=False)
    assert info["pooling"] == 1 and info["n_tokens"] == [len(i) for i in ref["ids"][:4]]
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), engine.embed(texts), atol=1e-6)
    hs = [m.forward(i, None, output="hidden") for i in ref["ids"][:4]]
    cls, _ = embed(m, tok, texts, normalize=False, pooling="cls")
    last, _ = embed(m, tok, texts, normalize=False, pooling="last")
    per_tok, _ = embed(m, tok, texts, normalize=False, pooling="none")
    assert np.allclose(cls, [h[0] for h in hs], atol=1e-4)
    assert np.allclose(last, [h[-1] for h in hs], atol=1e-4)
    assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(per_tok, hs))


def test_packing_matches_one_by_one(engine, ref):
    seqs = ref["ids"][:40]
    packed = hidden_states(engine.model, seqs, pack_tokens=300)  # several packs of several sequences
    for s, h in zip(seqs, packed):
        assert np.allclose(h, engine.model.forward(s, None, output="hidden"), atol=1e-4)


def test_cli_embed_json():
    try:
        store.resolve("minilm")
    except Exception:
        pytest.skip("minilm not fetched")
    r = subprocess.run([sys.executable, "-m", "reflex", "embed", "--json", "hello world", "second text"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    e = np.asarray(out["embeddings"])
    assert e.shape == (2, 384) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert out["n_tokens"] == [4, 4]
    r = subprocess.run([sys.executable, "-m", "reflex", "embed", "--json", ""], capture_output=True, text=True)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["category"] == "invalid_request"
