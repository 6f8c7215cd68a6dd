"""The one place rag meets the engine's embeddings.

An embedder has `embed(texts) -> (n, dim) float32 unit rows`, `count_tokens(text) -> int` (for the
chunker), `max_tokens` and `identity = {"name", "sha256", "dim"}` (recorded in the index manifest;
querying an index with another identity is refused).

  load_embedder("minilm", backend="numpy")   # reflex.Engine(...).embed: the real path
  load_embedder("hf:DIR")                    # transformers + mean pooling: reference only, needs torch
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

DEFAULT_EMBED_MODEL = "minilm"


class Embedder:
    identity: dict
    max_tokens: int | None = None

    def embed(self, texts) -> np.ndarray:  # (n, dim) float32, unit rows
        raise NotImplementedError

    def count_tokens(self, text: str) -> int:
        raise NotImplementedError

    @property
    def dim(self) -> int:
        return int(self.identity["dim"])

    def close(self):
        pass


def file_sha256(path) -> str:
    """sha256 of a model file, cached beside our indexes by (path, size, mtime): hashing 90 MB on
    every cold `ask` would cost ~60 ms."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "reflex" / "rag"
    cache = cache_dir / "sha256.json"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    digest = h.hexdigest()
    known[key] = digest
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the next process a re-hash
    return digest


class EngineEmbedder(Embedder):
    """reflex.Engine(model).embed — the engine's own BERT forward, on the chosen backend."""

    def __init__(self, model: str = DEFAULT_EMBED_MODEL, backend: str = "numpy"):
        from reflex.engine import Engine

        self.engine = Engine(model, backend=backend)
        self.tokenizer = self.engine.tokenizer
        self.max_tokens = int(self.engine.n_ctx) - 2  # [CLS] ... [SEP]
        self.identity = {"name": Path(self.engine.path).name, "sha256": file_sha256(self.engine.path),
                         "dim": int(self.engine.model.hp.n_embd)}
        self.load_timings = dict(getattr(self.engine, "load_timings", {}))

    def embed(self, texts) -> np.ndarray:
        v = self.engine.embed(list(texts), normalize=True, truncate=True)
        return np.ascontiguousarray(v, dtype=np.float32)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special=False))

    def close(self):
        self.engine.close()


class HFEmbedder(Embedder):
    """sentence-transformers' recipe (mean pooling over the attention mask, L2 norm) in transformers:
    an independent reference, not a runtime path (it imports torch)."""

    def __init__(self, path: str, batch: int = 32):
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_grad_enabled(False)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch = batch
        self.max_tokens = 254
        st = Path(path) / "model.safetensors"
        self.identity = {"name": "hf:" + Path(path).name,
                         "sha256": file_sha256(st) if st.is_file() else "",
                         "dim": int(self.model.config.hidden_size)}

    def embed(self, texts) -> np.ndarray:
        texts = list(texts)
        out = []
        for i in range(0, len(texts), self.batch):
            enc = self.tok(texts[i:i + self.batch], padding=True, truncation=True,
                           max_length=self.max_tokens + 2, return_tensors="pt")
            h = self.model(**enc).last_hidden_state                     # (B, T, dim)
            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            v = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            v = self.torch.nn.functional.normalize(v, dim=-1)
            out.append(v.numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


def load_embedder(spec: str = DEFAULT_EMBED_MODEL, backend: str = "numpy") -> Embedder:
    if spec.startswith("hf:"):
        return HFEmbedder(spec[3:])
    return EngineEmbedder(spec, backend=backend)
