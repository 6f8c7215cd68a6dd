"""StrTable (reflex/tokenizer/strtable.py): the byte-backed vocabulary behind tokenizer start-up.

Its lookups must answer exactly what dict(zip(strings, range(n))).get answers (the last index of
a duplicated string, None for anything else): checked on both real vocabularies and merge lists
(skipped when the model files are missing) and on a hand-built array with duplicates, non-ASCII
strings, an empty string and strings whose 64-bit keys collide (same length, first and last 8
bytes).
"""
import os
import struct

import numpy as np
import pytest

from reflex.errors import ModelFormatError
from reflex.gguf.reader import StringArray
from reflex.tokenizer.strtable import StrTable, _pykey

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
REAL = [os.path.join(MODELS, n) for n in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf")]


def _array(strs):
    """A reflex.gguf StringArray over [u64 len][bytes]... exactly as in a GGUF file."""
    buf, offs, lens = bytearray(b"junk"), [], []
    for s in strs:
        b = s if isinstance(s, bytes) else s.encode("utf-8")
        buf += struct.pack("<Q", len(b))
        offs.append(len(buf))
        lens.append(len(b))
        buf += b
    return StringArray(bytes(buf), np.array(offs, np.int64), np.array(lens, np.int64))


def _check(strs, probes=()):
    t = StrTable(_array(strs))
    want = dict(zip(strs, range(len(strs))))
    for s in list(strs) + list(probes):
        assert t.get(s) == want.get(s), s
    assert t.tolist() == list(strs)
    assert [t[i] for i in range(len(strs))] == list(strs)
    return t


def test_duplicates_collisions_and_unicode():
    a = "x" * 8 + "MIDDLE-A" + "y" * 8
    b = "x" * 8 + "MIDDLE-B" + "y" * 8
    assert _pykey(a.encode()) == _pykey(b.encode())  # colliding keys: resolved by the bytes
    strs = ["", "a", "ab", "héllo", "▁▁", "  ", "日本語のトークン", a, b, "a", "\x00z", "ab" * 40, a]
    _check(strs, probes=["abc", "x" * 24, "MIDDLE", "b", "hé", "▁"])


def test_list_input_behaves_the_same():
    strs = ["a", "b", "a"]
    t = StrTable(strs)
    assert (t.get("a"), t.get("b"), t.get("c"), t[2], len(t)) == (2, 1, None, "a", 3)


def test_bad_utf8_raises_on_decode():
    t = StrTable(_array([b"ok", b"\xc0\xaf", b"fine"]))
    assert t[0] == "ok" and t.get("fine") == 2
    with pytest.raises(ModelFormatError) as e:
        t[1]
    assert e.value.kind == "bad_utf8"


@pytest.mark.parametrize("path", [p for p in REAL if os.path.exists(p)], ids=os.path.basename)
def test_real_vocabularies(path):
    from reflex.gguf import GGUFFile

    with GGUFFile(path) as f:
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in f.metadata:
                continue
            strs = f.metadata[key].tolist()
            t = StrTable(f.metadata[key])
            assert t._bytes  # the fast path, not the list fallback
            want = dict(zip(strs, range(len(strs))))
            assert all(t.get(s) == i for s, i in want.items())
            assert t.get(strs[0] + "\x01never") is None
            assert t.tolist() == strs


@pytest.mark.parametrize("path", [p for p in REAL if os.path.exists(p)], ids=os.path.basename)
def test_tokenizer_same_ids_before_and_after_dict_switch(path):
    from reflex.gguf import GGUFFile
    from reflex.tokenizer import Tokenizer

    text = "Hello, world! The quick brown fox jumps over   the lazy dog.\n\tdef f(x): return x**2  # ü ☃"
    with GGUFFile(path) as f:
        tok = Tokenizer.from_gguf(f)
        lazy = tok.encode(text)
        assert tok._vocab is None  # a short encode never builds the full dict
        tok.tokens.n_get = 10 ** 9
        if hasattr(tok, "merges"):
            tok.merges.n_get = 10 ** 9
        tok._cache = {}
        assert tok.encode(text) == lazy and tok._vocab is not None
