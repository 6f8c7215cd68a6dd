"""WordPiece (tokenizer.ggml.model = bert).

Parity: ids recorded from HF `tokenizers` (tokenizer.json of all-MiniLM-L6-v2) by
scripts/make_embedding_refs.py into tests/data/wordpiece_ref_minilm.json.gz, checked here without
the library; needs the fetched model (`reflex fetch minilm`, done by setup.sh), else skipped.
The unit tests build a small phantom-space vocab by hand.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from reflex import store
from reflex.tokenizer import Tokenizer

DATA = Path(__file__).parent / "data"


def _minilm():
    try:
        return store.resolve("minilm")
    except Exception:
        pytest.skip("minilm not fetched (reflex fetch minilm)")


@pytest.fixture(scope="module")
def tok():
    from reflex.gguf import GGUFFile

    with GGUFFile(_minilm()) as f:
        yield Tokenizer.from_gguf(f)


def test_ids_match_hf_tokenizers(tok):
    """Every corpus line and the edge cases (accents, CJK, control chars, 120-char word, final
    sigma, full-width forms, emoji) give HF's ids. HF matches special tokens in raw text, which is
    our parse_special=True."""
    ref = json.load(gzip.open(DATA / "wordpiece_ref_minilm.json.gz", "rt", encoding="utf-8"))
    assert len(ref["texts"]) > 3700
    bad = [t for t, ids in zip(ref["texts"], ref["ids"]) if tok.encode(t, parse_special=True) != ids]
    assert bad == []


def test_special_text_is_literal_by_default(tok):
    ids = tok.encode("[SEP]")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert 102 not in ids[1:-1]  # the literal text, not the control token
    assert tok.encode("[SEP]", parse_special=True) == [101, 102, 102]


def _md(tokens, types=None, **kw):
    md = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types or [3 if t.startswith("[") else 1 for t in tokens],
          "tokenizer.ggml.bos_token_id": tokens.index("[CLS]"), "tokenizer.ggml.eos_token_id": tokens.index("[SEP]"),
          "tokenizer.ggml.unknown_token_id": tokens.index("[UNK]"),
          "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    md.update(kw)
    return md


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581un", "\u2581unaff", "aff", "able", "\u2581able",
         "\u2581.", "\u2581hello", "\u2581Hello", "\u2581cafe", "\u2581café", "\u2581,"]


def test_greedy_longest_match_and_unk():
    t = Tokenizer.from_metadata(_md(VOCAB, **{"tokenizer.ggml.normalizer.lowercase": True}))
    v = {s: i for i, s in enumerate(VOCAB)}
    # longest first piece "unaff", then continuation "able"
    assert t.encode("unaffable", add_special=False) == [v["\u2581unaff"], v["able"]]
    # a word with an uncoverable tail is one [UNK]; punctuation is its own word
    assert t.encode("unaffx, able.", add_special=False) == [v["[UNK]"], v["\u2581,"], v["\u2581able"], v["\u2581."]]
    assert t.encode("able", add_special=True) == [v["[CLS]"], v["\u2581able"], v["[SEP]"]]
    # over 100 characters: [UNK] without trying
    assert t.encode("able" * 26, add_special=False) == [v["[UNK]"]]
    # lowercase + strip accents (strip follows lowercase by default)
    assert t.encode("HELLO Café", add_special=False) == [v["\u2581hello"], v["\u2581cafe"]]
    assert t.decode(t.encode("unaffable able", add_special=False)) == "unaffable able"


def test_case_and_accents_follow_metadata():
    cased = Tokenizer.from_metadata(_md(VOCAB))  # llama.cpp default: no lowercase, no stripping
    v = {s: i for i, s in enumerate(VOCAB)}
    assert cased.encode("Hello café", add_special=False) == [v["\u2581Hello"], v["\u2581café"]]
    keep = Tokenizer.from_metadata(_md(VOCAB, **{"tokenizer.ggml.normalizer.lowercase": True,
                                                 "tokenizer.ggml.normalizer.strip_accents": False}))
    assert keep.encode("CAFÉ", add_special=False) == [v["\u2581café"]]


def test_no_unknown_token_is_an_error():
    toks = [t for t in VOCAB if t != "[UNK]"]
    md = _md(VOCAB)
    md["tokenizer.ggml.tokens"] = toks
    md["tokenizer.ggml.token_type"] = [1] * len(toks)
    md.pop("tokenizer.ggml.unknown_token_id")
    with pytest.raises(ValueError, match="unknown token"):
        Tokenizer.from_metadata(md)
