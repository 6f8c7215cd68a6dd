"""Incremental detokenizer that never emits half a UTF-8 character."""
from __future__ import annotations


def _incomplete_tail(b: bytes) -> int:
    """Number of trailing bytes that form an unfinished (so far valid-looking) UTF-8 sequence."""
    n = len(b)
    for k in range(1, min(4, n) + 1):
        c = b[n - k]
        if c < 0x80:
            return 0
        if c >= 0xC0:  # lead byte
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return k if need > k else 0
    return 0


class StreamDecoder:
    def __init__(self, tok, skip_special: bool = False):
        self.tok = tok
        self.skip_special = skip_special
        self.buf = b""
        # SentencePiece with add_space_prefix: drop the prefix space of the very first piece.
        self._strip = bool(getattr(tok, "add_space_prefix", False))

    def feed(self, token_id: int) -> str:
        if self.skip_special and self.tok.is_special(token_id):
            return ""
        b = self.buf + self.tok.piece_bytes(token_id)
        if self._strip and b:
            self._strip = False
            if b[:1] == b" ":
                b = b[1:]
        k = _incomplete_tail(b)
        if k:
            self.buf = b[-k:]
            b = b[:-k]
        else:
            self.buf = b""
        return b.decode("utf-8", "replace")

    def flush(self) -> str:
        b, self.buf = self.buf, b""
        return b.decode("utf-8", "replace")
