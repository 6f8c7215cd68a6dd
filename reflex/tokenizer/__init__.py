"""Tokenizers built from GGUF metadata: byte-level BPE (gpt2), SentencePiece BPE (llama), WordPiece (bert)."""
from __future__ import annotations

from typing import Mapping

from .base import BaseTokenizer
from .stream import StreamDecoder

__all__ = ["Tokenizer", "BaseTokenizer", "StreamDecoder"]


class Tokenizer:
    """Factory: ``Tokenizer.from_metadata(md)`` / ``Tokenizer.from_gguf(f)``."""

    @staticmethod
    def from_metadata(md: Mapping, eager: bool = True) -> BaseTokenizer:
        """Build the tokenizer. With eager=True the lookup tables are built now (with the cyclic
        GC paused: hundreds of thousands of new str objects otherwise trigger repeated full
        collections), so the first encode() pays nothing extra."""
        import gc

        was = gc.isenabled()
        gc.disable()
        try:
            tok = Tokenizer._build(md)
            if eager:
                tok.prepare()
        finally:
            if was:
                gc.enable()
        return tok

    @staticmethod
    def _build(md: Mapping) -> BaseTokenizer:
        model = md.get("tokenizer.ggml.model", "llama")
        if isinstance(model, bytes):
            model = model.decode()
        if model == "gpt2":
            from .bpe import BPETokenizer

            return BPETokenizer(md)
        if model == "llama":
            from .spm import SPMTokenizer

            return SPMTokenizer(md)
        if model == "bert":
            from .wordpiece import WordPieceTokenizer

            return WordPieceTokenizer(md)
        raise ValueError(f"unsupported tokenizer.ggml.model {model!r}")

    @staticmethod
    def from_gguf(f) -> BaseTokenizer:
        return Tokenizer.from_metadata(f.metadata)
