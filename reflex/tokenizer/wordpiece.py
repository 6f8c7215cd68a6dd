"""WordPiece (tokenizer.ggml.model == "bert"), as HF's BertNormalizer + BertPreTokenizer + WordPiece.

llama.cpp's converter stores the vocab in "phantom space" form: a word-initial piece `foo` becomes
`▁foo`, a continuation `##oo` becomes `oo`, CONTROL tokens ([CLS], [SEP], ...) stay as they are.
So the first piece of a word is looked up with a leading `▁`, later pieces without.

Normalization (what HF's BertNormalizer does, in its order):
  clean text   -- drop NUL, U+FFFD and control chars (Cc/Cf/Cn/Co/Cs but not \\t \\n \\r);
                  every Unicode White_Space char becomes a word break
  CJK chars    -- each is its own word
  strip accents -- NFD, then drop Mn marks (tokenizer.ggml.normalizer.strip_accents,
                  default = lowercase, as in HF and llama.cpp)
  lowercase    -- per character (tokenizer.ggml.normalizer.lowercase, default false as in llama.cpp);
                  per character because str.lower() would turn a word-final Σ into ς, HF does not
Pre-tokenization: split at whitespace; every punctuation char (Unicode P*, or ASCII symbol) alone.
WordPiece: greedy longest match from the left; a word with no full cover, or longer than 100
chars, is one [UNK].
"""
from __future__ import annotations

import unicodedata
from typing import Mapping

import regex

from .base import BaseTokenizer, _get

PHANTOM = "\u2581"
MAX_WORD_CHARS = 100  # HF WordPiece max_input_chars_per_word

# Unicode White_Space (Rust char::is_whitespace), not Python's isspace (which adds \x1c-\x1f)
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CJK = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
        "\U0002b740-\U0002b81f\U0002b920-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f")
_ASCII_PUNCT = regex.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# one pattern does clean-text removal, whitespace breaks and single-char words at once:
#   group 1: removed chars; whitespace: breaks; punctuation / CJK: single-char words; rest: word runs
_DROP = r"[\x00\ufffd\p{Cc}\p{Cf}\p{Cn}\p{Co}\p{Cs}--[\t\n\r]]"
_SINGLE = rf"[\p{{P}}{_ASCII_PUNCT}{_CJK}]"
_WORD = regex.compile(rf"{_SINGLE}|(?:(?!{_SINGLE})[^{_WS}])+", regex.V1)
_DROP_RE = regex.compile(_DROP, regex.V1)
_MN_RE = regex.compile(r"\p{Mn}+")


def _lower(s: str) -> str:
    if "\u03a3" in s:  # only Σ lowers differently in context; go per character then
        return "".join(c.lower() for c in s)
    return s.lower()


class WordPieceTokenizer(BaseTokenizer):
    kind = "wpm"

    def __init__(self, md: Mapping):
        super().__init__(md)
        self.lowercase = bool(_get(md, "tokenizer.ggml.normalizer.lowercase", False))
        self.strip_accents = bool(_get(md, "tokenizer.ggml.normalizer.strip_accents", self.lowercase))
        if self.unk_id is None:
            self.unk_id = self.vocab.get("[UNK]")
        if self.unk_id is None:
            raise ValueError("bert tokenizer has no unknown token (tokenizer.ggml.unknown_token_id)")
        self._cache: dict = {}

    # ---------------------------------------------------------------- encode
    def normalize(self, text: str) -> str:
        """BertNormalizer (clean text, accents, case); word splitting happens in words()."""
        if not text.isascii():
            text = _DROP_RE.sub("", text)
            if self.strip_accents:
                text = _MN_RE.sub("", unicodedata.normalize("NFD", text))
        else:
            text = _DROP_RE.sub("", text) if not text.isprintable() else text
        return _lower(text) if self.lowercase else text

    def words(self, text: str) -> list:
        return _WORD.findall(self.normalize(text))

    def _word_ids(self, word: str) -> list:
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        v = self.vocab
        n = len(word)
        if n > MAX_WORD_CHARS:
            ids = [self.unk_id]
        else:
            ids = []
            start = 0
            while start < n:
                end = n
                hit = None
                while end > start:
                    sub = word[start:end]
                    hit = v.get(PHANTOM + sub if start == 0 else sub)
                    if hit is not None:
                        break
                    end -= 1
                if hit is None:
                    ids = [self.unk_id]
                    break
                ids.append(hit)
                start = end
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def _encode_text(self, text: str, at_start: bool) -> list:
        out = []
        wid = self._word_ids
        for w in self.words(text):
            out.extend(wid(w))
        return out

    def _matchable_user(self, i: int) -> bool:
        return True

    # ---------------------------------------------------------------- decode
    def piece_bytes(self, i: int) -> bytes:
        t = self.tokens[i]
        if t.startswith(PHANTOM):
            t = " " + t[1:]
        return t.encode("utf-8")

    def _post_decode(self, s: str) -> str:
        return s[1:] if s.startswith(" ") else s
