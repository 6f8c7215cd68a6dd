"""Retrieval for chat: the `rag` package's index search, with query embeddings computed by an
embedding engine over IPC (the adapter never runs the encoder itself)."""
from __future__ import annotations

import base64
import os

import numpy as np


class IPCEmbedder:
    """rag's Embedder contract (embed, identity) over an embedding engine's `embed` op."""

    def __init__(self, slot, call):
        self.slot, self._call = slot, call
        self._identity = None

    @property
    def identity(self) -> dict:
        if self._identity is None:
            from rag.embedder import file_sha256

            path = self.slot.info["model"]
            self._identity = {"name": os.path.basename(path), "sha256": file_sha256(path),
                              "dim": int(self.slot.info["n_embd"])}
        return self._identity

    @property
    def dim(self) -> int:
        return int(self.identity["dim"])

    def embed(self, texts) -> np.ndarray:
        r = self._call(self.slot, "embed", input=list(texts), truncate=True, encoding_format="base64")
        return np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in r["data"]])


class Retriever:
    """Opens indexes by name under `indexes_dir` (kept open: one generation per process lifetime)."""

    def __init__(self, indexes_dir: str, embedder: IPCEmbedder, min_score: float | None = None):
        self.indexes_dir, self.embedder = indexes_dir, embedder
        self._open: dict = {}
        if min_score is None:
            from rag.ask import DEFAULT_MIN_SCORE
            min_score = DEFAULT_MIN_SCORE
        self.min_score = min_score

    def search(self, index: str, question: str, k: int):
        """-> (hits at or above min_score, best score)."""
        from rag.index import Index
        from rag.retrieve import search

        ix = self._open.get(index)
        if ix is None:
            ix = self._open[index] = Index.open(self.indexes_dir, index)
        hits = search(ix, self.embedder, question, k=k)
        best = max((h["score"] for h in hits), default=0.0)
        return [h for h in hits if h["score"] >= self.min_score], best


def messages_for(question: str, hits: list) -> list:
    from rag.ask import build_messages

    return build_messages(question, hits)


def sources_of(hits: list) -> list:
    from rag.retrieve import cite

    return [{"n": n, "citation": cite(h), "source": h["source"], "page": h.get("page"),
             "heading": h.get("heading"), "score": h["score"], "text": h["text"]}
            for n, h in enumerate(hits, 1)]
