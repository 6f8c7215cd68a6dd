"""Tokenizer exactness tests.

CI checks our ids against *recorded outputs of an independent implementation*:
tests/data/tokenizer_ref_*.json.gz were produced by scripts/make_tokenizer_refs.py with
transformers' GGUF tokenizer (AutoTokenizer.from_pretrained(dir, gguf_file=...)) over
tests/data/tokenizer_corpus.txt. We require zero mismatches, and decode(encode(x)) == x.
Tests skip if the models are missing (directory overridable by REFLEX_MODELS).
"""
import gzip
import json
import os
import struct
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


def _read_kv(path):
    """Minimal test-only GGUF metadata reader (used when reflex.gguf is not available)."""
    with open(path, "rb") as fh:
        head = fh.read(24)
        magic, ver, n_t, n_kv = struct.unpack("<4sIQQ", head)
        assert magic == b"GGUF"
        buf = fh.read(64 << 20)
    pos = 0
    md = {}

    def rstr():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        s = buf[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
        return s

    def rval(t):
        nonlocal pos
        if t == 8:
            return rstr()
        if t == 9:
            (et, n) = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if et == 8:
                return [rstr() for _ in range(n)]
            dt = np.dtype(_NP[et])
            a = np.frombuffer(buf, dt, n, pos)
            pos += n * dt.itemsize
            return a
        dt = np.dtype(_NP[t])
        v = np.frombuffer(buf, dt, 1, pos)[0].item()
        pos += dt.itemsize
        return v

    for _ in range(n_kv):
        k = rstr()
        (t,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        md[k] = rval(t)
    return md


def load_metadata(name):
    path = os.path.join(MODELS, FILES[name])
    if not os.path.exists(path):
        pytest.skip(f"model {path} missing")
    try:
        from reflex.gguf import GGUFFile  # noqa

        return GGUFFile(path).metadata
    except Exception:
        return _read_kv(path)


_TOKS = {}


def get_tok(name):
    if name not in _TOKS:
        from reflex.tokenizer import Tokenizer

        _TOKS[name] = Tokenizer.from_metadata(load_metadata(name))
    return _TOKS[name]


def load_ref(name):
    with gzip.open(os.path.join(DATA, f"tokenizer_ref_{name}.json.gz"), "rt", encoding="utf-8") as fh:
        return json.load(fh)


def corpus():
    with open(os.path.join(DATA, "tokenizer_corpus.txt"), encoding="utf-8") as fh:
        lines = fh.read().split("\n")[:-1]
    chunks = ["\n".join(lines[i:i + 8]) + "\n" for i in range(0, len(lines), 37)]
    return lines, chunks


def _mismatches(tok, texts, refs, parse_special):
    bad = []
    for t, r in zip(texts, refs):
        got = tok.encode(t, add_special=False, parse_special=parse_special)
        if got != r:
            bad.append((t, got, r))
    return bad


def test_corpus_size():
    lines, _ = corpus()
    assert len(lines) >= 2000
    assert os.path.getsize(os.path.join(DATA, "tokenizer_corpus.txt")) <= 300_000


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("variant", ["lines_special", "chunks_special", "lines"])
def test_exact_ids(name, variant):
    tok = get_tok(name)
    ref = load_ref(name)
    if ref.get(variant) is None:
        pytest.skip("variant not recorded")
    lines, chunks = corpus()
    texts = chunks if variant.startswith("chunks") else lines
    bad = _mismatches(tok, texts, ref[variant], parse_special=variant.endswith("special"))
    for t, g, r in bad[:5]:
        print(repr(t), "\n got", g, "\n ref", r)
    assert len(bad) == 0, f"{len(bad)} mismatches of {len(texts)}"


@pytest.mark.parametrize("name", list(FILES))
def test_with_bos(name):
    tok = get_tok(name)
    ref = load_ref(name)
    lines, _ = corpus()
    for t, r in zip(lines, ref["lines_with_bos"]):
        assert tok.encode(t, add_special=True, parse_special=True) == r


@pytest.mark.parametrize("name", list(FILES))
def test_roundtrip(name):
    tok = get_tok(name)
    lines, chunks = corpus()
    for t in lines + chunks:
        assert tok.decode(tok.encode(t, add_special=False)) == t
        assert tok.decode(tok.encode(t, add_special=False, parse_special=True)) == t


@pytest.mark.parametrize("name", list(FILES))
def test_stream(name):
    tok = get_tok(name)
    text = "Emoji 😀👨‍👩‍👧 中文 العربية ünï\n" * 3
    ids = tok.encode(text, add_special=False)
    st = tok.stream()
    parts = [st.feed(i) for i in ids] + [st.flush()]
    assert "".join(parts) == text
    for p in parts:
        assert "\ufffd" not in p


@pytest.mark.parametrize("name", list(FILES))
def test_api(name):
    tok = get_tok(name)
    assert tok.n_vocab == {"smollm2": 49152, "gemma3": 262144}[name]
    assert tok.eos_id in tok.eog_ids
    end = {"smollm2": "<|im_end|>", "gemma3": "<end_of_turn>"}[name]
    assert tok.id_of(end) in tok.eog_ids
    assert tok.token_to_piece(tok.id_of(end)) == end
    ids = tok.encode(end, add_special=False, parse_special=True)
    assert ids == [tok.id_of(end)]
    assert tok.decode(ids, skip_special=True) == ""
    if name == "gemma3":
        assert tok.encode("hi")[0] == tok.bos_id


@pytest.mark.parametrize("pre", ["default", "gpt2", "smollm", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-v3"])
def test_pre_tokenizer_splits(pre):
    """Each pre-tokenizer split is lossless; llama-bpe/qwen2/gpt2 match HF tokenizers' Split."""
    from reflex.tokenizer.bpe import BPETokenizer, PRE_SPLITS

    md = {"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": pre}
    tok = BPETokenizer(md)
    lines, _ = corpus()
    ref = None
    if pre in ("llama-bpe", "qwen2", "gpt2"):
        try:
            from tokenizers import Regex, pre_tokenizers

            ref = pre_tokenizers.Split(Regex(PRE_SPLITS[pre][0]), behavior="isolated")
        except ImportError:
            pass
    for l in lines[:1500]:
        parts = tok._split(l)
        assert "".join(parts) == l
        if ref is not None:
            assert parts == [p for p, _ in ref.pre_tokenize_str(l)], l


@pytest.mark.parametrize("name", list(FILES))
def test_stream_matches_decode(name):
    """Streaming over corpus chunks (plus byte-fallback-heavy text) equals decode()."""
    tok = get_tok(name)
    _, chunks = corpus()
    rare = "rare: \U00020b9f\U0002a6b2 \U0001fae8 \u0b95\u0bcd\u0bb7 \U0001d11e\n"
    for text in chunks[:40] + [rare * 2]:
        ids = tok.encode(text, add_special=False)
        st = tok.stream()
        parts = [st.feed(i) for i in ids] + [st.flush()]
        assert "".join(parts) == tok.decode(ids) == text
        assert all("\ufffd" not in p for p in parts)
