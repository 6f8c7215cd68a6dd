"""Token-budgeted chunking that never splits inside a word.

A block (page or section) is cut into words (maximal runs of non-space characters), each with its
char span and its token count under the embedding model's tokenizer. For WordPiece (BERT) the token
count of a text is exactly the sum over its whitespace-separated words, because its pre-tokenizer
splits on whitespace first; for byte-level BPE it is within a token or two per chunk.

Chunks never cross a block, so they never straddle a heading or a PDF page. Inside a block, a chunk
grows word by word up to `chunk_tokens`; it is cut at the last paragraph break in its second half if
there is one, else at the last sentence end there, else at the budget. The next chunk starts at the
cut when the cut is a paragraph break, otherwise `overlap` tokens (whole words) earlier, so a
sentence cut in two is whole in one of the chunks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_CHUNK_TOKENS = 200   # all-MiniLM-L6-v2 was trained on <= 128-token inputs and reads <= 256
DEFAULT_OVERLAP = 40

_WORD = re.compile(r"\S+")
_SENT_END = re.compile(r"[.!?:;][\"')\]]*$")


@dataclass
class Chunk:
    text: str
    source: str
    title: str
    page: int | None
    heading: tuple
    char_start: int
    char_end: int
    n_tokens: int

    def embed_text(self) -> str:
        """What is embedded: the heading path (or title) gives a section's context to its text."""
        ctx = " > ".join(self.heading) if self.heading else self.title
        return f"{ctx}\n{self.text}" if ctx and not self.text.startswith(ctx) else self.text

    def to_json(self) -> dict:
        return {"text": self.text, "source": self.source, "title": self.title, "page": self.page,
                "heading": list(self.heading), "char_start": self.char_start,
                "char_end": self.char_end, "n_tokens": self.n_tokens}


class TokenCounter:
    """Per-word token counts with a cache (documentation repeats its vocabulary a lot)."""

    def __init__(self, count_fn):
        self.count_fn = count_fn
        self.cache = {}

    def __call__(self, word: str) -> int:
        n = self.cache.get(word)
        if n is None:
            n = max(1, int(self.count_fn(word)))
            if len(self.cache) < 500_000:
                self.cache[word] = n
        return n


def validate_params(chunk_tokens: int, overlap: int, max_tokens: int | None = None):
    from reflex.errors import InvalidRequest

    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 16:
        raise InvalidRequest(f"chunk size must be an integer >= 16 tokens, got {chunk_tokens!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < chunk_tokens // 2:
        raise InvalidRequest(f"overlap must be an integer in [0, chunk_tokens/2), got {overlap!r}")
    if max_tokens is not None and chunk_tokens > max_tokens:
        raise InvalidRequest(f"chunk size {chunk_tokens} exceeds the embedding model's input limit "
                             f"of {max_tokens} tokens")


def chunk_document(doc, count, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                   overlap: int = DEFAULT_OVERLAP) -> list:
    """doc: loaders.Document; count: word -> token count (a TokenCounter)."""
    out = []
    for b in doc.blocks:
        ctx = " > ".join(b.heading) if b.heading else doc.title
        # the context line is embedded with every chunk, so it takes part of the budget
        budget = max(chunk_tokens // 2, chunk_tokens - sum(count(w) for w in ctx.split()) - 1)
        for a, z, n in _split_block(b.text, count, budget, overlap):
            out.append(Chunk(b.text[a:z], doc.source, doc.title, b.page, tuple(b.heading),
                             b.start + a, b.start + z, n))
    return out


def _split_block(text: str, count, budget: int, overlap: int):
    """Yields (start, end, n_tokens) spans of text (offsets relative to text)."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not words:
        return
    toks = [count(text[a:z]) for a, z in words]
    # para[i]: a paragraph break (blank line) lies between word i-1 and word i
    para = [False] + [text.count("\n", words[i - 1][1], words[i][0]) >= 2 for i in range(1, len(words))]
    sent = [bool(_SENT_END.search(text[a:z])) for a, z in words]
    n = len(words)
    i = 0
    while i < n:
        j, used = i, 0
        while j < n and (used + toks[j] <= budget or j == i):  # a lone over-long word is its own chunk
            used += toks[j]
            j += 1
        cut = j
        at_para = j >= n or para[j]
        if j < n and not at_para:
            half = i + max(1, (j - i) // 2)
            p = next((k for k in range(j - 1, half - 1, -1) if para[k]), None)
            if p is not None and p > i:
                cut, at_para = p, True
            else:
                s = next((k for k in range(j - 1, half - 1, -1) if sent[k]), None)
                if s is not None:
                    cut = s + 1
        ntok = sum(toks[i:cut])
        yield words[i][0], words[cut - 1][1], ntok
        if cut >= n:
            break
        if at_para or overlap == 0:
            i = cut
        else:
            k, back = cut, 0
            while k - 1 > i and back + toks[k - 1] <= overlap:
                k -= 1
                back += toks[k]
            i = k if k > i else cut
