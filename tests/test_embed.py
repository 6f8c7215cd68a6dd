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
    seqs = ref["ids"][:12]
    packed = hidden_states(engine.model, seqs, pack_tokens=100)  # several packs of several sequences
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


# ---------------------------------------------------------------- classifier heads
def _script():
    import importlib.util

    p = Path(__file__).parent.parent / "scripts" / "make_embedding_refs.py"
    spec = importlib.util.spec_from_file_location("make_embedding_refs", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cls_ref():
    return json.load(open(DATA / "bert_cls_ref.json"))


@pytest.fixture(scope="module")
def cls_engine(tmp_path_factory):
    """The tiny BertForSequenceClassification rebuilt bit-identically (numpy, seeded) and converted
    by reflex convert, which keeps the pooler as cls; probabilities recorded from transformers."""
    from reflex.convert import convert_bert
    from reflex.engine import Engine

    try:
        vocab_src = store.resolve("minilm")
    except Exception:
        pytest.skip("minilm not fetched (its vocab builds the fixture)")
    mer = _script()
    tmp = tmp_path_factory.mktemp("cls")
    d = mer.tiny_bert_classifier(tmp / "hf", mer.minilm_vocab(vocab_src))
    r = convert_bert(d, tmp / "cls.gguf")
    assert r["pooling_type"] == 4 and r["labels"] == ["negative", "neutral", "positive"]
    with Engine(str(tmp / "cls.gguf")) as e:
        yield e


def test_classify_head_matches_transformers(cls_engine, cls_ref):
    from reflex.embed import classify_head

    assert [cls_engine.tokenizer.encode(t) for t in cls_ref["texts"]] == cls_ref["ids"]
    got = [classify_head(cls_engine, t) for t in cls_ref["texts"]]
    assert all(list(g) == cls_ref["labels"] for g in got)
    p = np.array([list(g.values()) for g in got])
    assert np.abs(p - np.array(cls_ref["probs"])).max() < 1e-4
    assert np.allclose(p.sum(1), 1.0)
    assert p.max(1).min() < 0.9  # a fixture whose answers differ, so the check can fail
    with pytest.raises(InvalidRequest, match="classifier head"):
        cls_engine.embed("text")
    with pytest.raises(InvalidRequest):
        classify_head(cls_engine, "")


def test_head_in_llama_cpp_converted_layout(cls_ref):
    """The same model converted by llama.cpp's convert_hf_to_gguf.py (committed, F16): it drops
    the pooler and writes only cls.output, so the head is classifier([CLS] state); recorded from
    transformers as such."""
    from reflex.embed import head_scores
    from reflex.engine import Engine

    with Engine(str(DATA / "bert_cls_tiny_lcpp.gguf")) as e:
        assert e.model.hp.pooling_type == 4 and e.model.cls is None and e.model.labels == cls_ref["labels"]
        s = head_scores(e.model, e.tokenizer, cls_ref["texts"])
    assert np.abs(s - np.array(cls_ref["logits_no_pooler"])).max() < 2e-2


def test_llama_cpp_rank_pooling_on_our_gguf(cls_engine):
    """llama.cpp's RANK pooling applies our cls (dense + tanh) and cls.output: same scores.
    Skipped without llama-cpp-python (whose embed() returns n_embd floats; the first n_labels
    are the scores)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    from reflex.embed import head_scores

    texts = ["a first sentence to classify", "and another, rather different one"]
    m = llama_cpp.Llama(str(cls_engine.path), embedding=True, pooling_type=4, n_ctx=128, verbose=False)
    s = np.asarray(m.embed(texts), np.float32)[:, :3]
    assert np.abs(s - head_scores(cls_engine.model, cls_engine.tokenizer, texts)).max() < 1e-2


def test_no_head_is_invalid_request(engine):
    from reflex.embed import classify_head, has_head

    assert not has_head(engine.model)
    with pytest.raises(InvalidRequest, match="no classifier head"):
        classify_head(engine, "text")


# ---------------------------------------------------------------- decoder embedders
@pytest.fixture(scope="module")
def dec_ref():
    return json.load(open(DATA / "decoder_embed_ref.json"))


@pytest.mark.parametrize("name,path", [("qwen3", "qwen3_embed_tiny.gguf"), ("llama_embed", "llama_embed_tiny.gguf")])
def test_decoder_embedders_match_transformers(name, path, dec_ref):
    """Random 2-layer models converted by llama.cpp's converter (F16, committed): qwen3 with LAST
    pooling (causal, Qwen3-Embedding style) and llama-embed with MEAN pooling (bidirectional,
    Nemotron-embed style); references from transformers' Qwen3Model / LlamaModel (the latter with
    an all-visible mask), recorded by scripts/make_embedding_refs.py."""
    from reflex.engine import Engine

    r = dec_ref[name]
    with Engine(str(DATA / path)) as e:
        assert [e.tokenizer.encode(t) for t in dec_ref["texts"]] == r["ids"]
        v, info = embed(e.model, e.tokenizer, dec_ref["texts"], metadata=e.gguf.metadata)
        assert info["pooling"] == (3 if r["pooling"] == "last" else 1)
        ref = np.array(r["embeddings"])
        assert (v * ref).sum(1).min() >= 0.9999
        assert np.allclose(e.embed(dec_ref["texts"][:2]), v[:2], atol=1e-6)
        # the other pooling, or causal attention for the bidirectional model, is measurably off
        other = "mean" if r["pooling"] == "last" else "last"
        w, _ = embed(e.model, e.tokenizer, dec_ref["texts"], pooling=other)
        assert (w * ref).sum(1).min() < 0.999
        if name == "llama_embed":
            ids = r["ids"][0]
            causal = np.tril(np.ones((len(ids), len(ids)), bool))
            h = e.model.forward(ids, e.model.new_cache(len(ids)), attn_mask=causal, output="hidden").mean(0)
            assert float(h @ ref[0]) / np.linalg.norm(h) < 0.9999
