"""GPT-2 style byte-level BPE (tokenizer.ggml.model == "gpt2")."""
from __future__ import annotations

from typing import Mapping

import regex

from .base import BaseTokenizer, _get
from .strtable import StrTable

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_LLM = [
    r"[\r\n]",
    # letters except CJK/Hangul (the published class is a hand-listed approximation of this)
    r"\s?(?:(?![\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff])\p{L})+",
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
]
_DEEPSEEK_V3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# tokenizer.ggml.pre -> list of regexes applied in sequence (each splits the pieces of the previous,
# keeping matches and the gaps between them).
PRE_SPLITS = {
    "default": [_GPT2],
    "gpt2": [_GPT2],
    "gpt-2": [_GPT2],
    # llama.cpp (and SmolLM2's own tokenizer.json) isolate single digits first.
    "smollm": [r"\p{N}", _GPT2],
    "llama3": [_LLAMA3],
    "llama-v3": [_LLAMA3],
    "llama-bpe": [_LLAMA3],
    "dbrx": [_LLAMA3],
    "smaug-bpe": [_LLAMA3],
    "falcon3": [_LLAMA3],
    "qwen2": [_QWEN2],
    "deepseek-r1-qwen": [_QWEN2],
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-v3": _DEEPSEEK_V3,
}


def bytes_to_unicode() -> dict:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_TRANS = {b: c for b, c in _B2U.items()}  # bytes.translate needs bytes; we map via str


class BPETokenizer(BaseTokenizer):
    kind = "bpe"

    def __init__(self, md: Mapping, pre: str | None = None):
        super().__init__(md)
        self.merges = StrTable(md["tokenizer.ggml.merges"] if "tokenizer.ggml.merges" in md else [])
        self.pre = pre or _get(md, "tokenizer.ggml.pre", "default") or "default"
        self._ranks = None  # "a b" -> rank dict, built once merge lookups get hot (StrTable)
        self._pats = None
        self._cache = {}
        self._piece_cache = {}
        self._byte_table = [_B2U[b] for b in range(256)]

    def _matchable_ctrl(self, i: int) -> bool:
        # transformers skips "control" tokens that are not spelled in the byte alphabet
        return set(self.tokens[i]) <= _U2B.keys()

    # ---------------------------------------------------------------- encode
    def _pretok(self):
        if self._pats is None:
            pats = PRE_SPLITS.get(self.pre)
            if pats is None:
                pats = [_GPT2]
            self._pats = [regex.compile(p) for p in pats]
        return self._pats

    def _split(self, text: str) -> list:
        pieces = [text]
        for pat in self._pretok():
            if len(self._pats) == 1:
                return pat.findall(text)
            out = []
            for p in pieces:
                pos = 0
                for m in pat.finditer(p):
                    s, e = m.span()
                    if s > pos:
                        out.append(p[pos:s])
                    out.append(p[s:e])
                    pos = e
                if pos < len(p):
                    out.append(p[pos:])
            pieces = out
        return pieces

    def _prepare_model(self):
        if self.merges._bytes:
            self.merges._index()
        self._pretok()

    def _rget(self):
        """rank of the merge "a b": the merges' dict once built, their index until then."""
        if self._ranks is None and self.merges.hot:
            self._ranks = self.merges.as_dict()
        return self._ranks.get if self._ranks is not None else self.merges.get

    def _encode_text(self, text: str, at_start: bool) -> list:
        cache = self._cache
        out = []
        tbl = self._byte_table
        for w in self._split(text):
            ids = cache.get(w)
            if ids is None:
                word = [tbl[b] for b in w.encode("utf-8")]
                ids = self._bpe(word)
                if len(cache) < 200_000:
                    cache[w] = ids
            out.extend(ids)
        return out

    def _bpe(self, word: list) -> list:
        rget = self._rget()
        vget = self._vget()
        if len(word) > 1:
            while True:
                best = None
                br = 1 << 60
                for i in range(len(word) - 1):
                    r = rget(word[i] + " " + word[i + 1])
                    if r is not None and r < br:
                        br = r
                        best = i
                if best is None:
                    break
                a, b = word[best], word[best + 1]
                merged = a + b
                nw = []
                i = 0
                n = len(word)
                while i < n:
                    if i < n - 1 and word[i] == a and word[i + 1] == b:
                        nw.append(merged)
                        i += 2
                    else:
                        nw.append(word[i])
                        i += 1
                word = nw
                if len(word) == 1:
                    break
        out = []
        for s in word:
            i = vget(s)
            if i is None:
                for ch in s:
                    j = vget(ch)
                    if j is not None:
                        out.append(j)
                    elif self.unk_id is not None:
                        out.append(self.unk_id)
            else:
                out.append(i)
        return out

    # ---------------------------------------------------------------- decode
    def piece_bytes(self, i: int) -> bytes:
        b = self._piece_cache.get(i)
        if b is None:
            t = self.tokens[i]
            try:
                b = bytes(_U2B[c] for c in t)
            except KeyError:
                b = t.encode("utf-8")
            self._piece_cache[i] = b
        return b
