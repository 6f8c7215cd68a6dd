"""Test double for rag's index mechanics (no tests here): a deterministic hashed bag-of-words
embedder, so ingest/index/manifest/atomicity tests run in CI without a model. Retrieval quality is
tested with the real model in test_rag_e2e.py.

Also usable as a subprocess entry point: `python tests/test_rag_support.py ingest ...` runs the real
`reflex-rag` CLI with this embedder swapped in (the kill -9 test)."""
from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOCS = Path(__file__).resolve().parent / "data" / "rag" / "docs"


class HashEmbedder:
    def __init__(self, dim: int = 64, name: str = "hash-bow", delay: float = 0.0):
        self.identity = {"name": name, "sha256": hashlib.sha256(name.encode()).hexdigest(), "dim": dim}
        self.max_tokens = 510
        self.delay = delay
        self.calls = 0

    @property
    def dim(self):
        return self.identity["dim"]

    def embed(self, texts):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                h = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else np.eye(self.dim, dtype=np.float32)[0]
        return out

    def count_tokens(self, text):
        return len(re.findall(r"\w+|[^\w\s]", text))

    def close(self):
        pass


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import rag.embedder

    delay = float(__import__("os").environ.get("RAG_TEST_EMBED_DELAY", "0"))
    rag.embedder.load_embedder = lambda spec="", backend="numpy": HashEmbedder(delay=delay)
    from rag.cli import main

    sys.exit(main(sys.argv[1:]))
