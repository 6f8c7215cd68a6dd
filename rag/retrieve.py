"""Query an index: dense (FAISS inner product = cosine on unit vectors), optionally fused with BM25
by reciprocal rank fusion."""
from __future__ import annotations

import time

import numpy as np

from reflex.errors import InvalidRequest
from rag.bm25 import rrf

N_CANDIDATES = 50   # per ranking before fusion


def check_identity(index, embedder):
    a, b = index.identity, embedder.identity
    if (a.get("sha256"), int(a.get("dim", -1))) != (b.get("sha256"), int(b.get("dim", -2))):
        raise InvalidRequest(
            f"index {index.dir.name!r} was built with embedding model {a.get('name')} "
            f"(sha256 {str(a.get('sha256'))[:12]}, dim {a.get('dim')}); the query uses "
            f"{b.get('name')} (sha256 {str(b.get('sha256'))[:12]}, dim {b.get('dim')}). "
            f"Query with the index's model (the default) or re-ingest.")


def validate(query, k):
    if not isinstance(query, str) or not query.strip():
        raise InvalidRequest("query is empty")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1000:
        raise InvalidRequest(f"k must be an integer in [1, 1000], got {k!r}")


def search(index, embedder, query: str, k: int = 5, hybrid: bool = False, timings: dict | None = None):
    """-> list of hits {rank, id, score (cosine), [bm25, rrf], chunk fields...}, best first."""
    validate(query, k)
    check_identity(index, embedder)
    t = timings if timings is not None else {}
    t0 = time.perf_counter()
    q = embedder.embed([query])[0]                                   # (dim,)
    t1 = time.perf_counter()
    n_cand = max(N_CANDIDATES, 4 * k) if hybrid else k
    ids, scores = index.search(q, n_cand)
    t2 = time.perf_counter()
    t["embed_s"], t["search_s"] = t1 - t0, t2 - t1
    dense = {int(i): float(s) for i, s in zip(ids, scores)}
    if not hybrid:
        order = [(int(i), None) for i in ids[:k]]
        extra = {}
    else:
        bm = index.bm25()
        t3 = time.perf_counter()
        bids, bscores = bm.search(query, n_cand)
        fused = rrf([[int(i) for i in ids], [int(i) for i in bids]])[:k]
        t["bm25_load_s"], t["bm25_s"] = t3 - t2, time.perf_counter() - t3
        order = fused
        extra = {int(i): float(s) for i, s in zip(bids, bscores)}
        missing = [i for i, _ in fused if i not in dense]
        if missing:   # BM25-only hits still get their cosine, so thresholds mean the same thing
            v = np.stack([index.faiss.reconstruct(i) for i in missing])
            for i, s in zip(missing, v @ q):
                dense[i] = float(s)
    hits = []
    for r, (i, fscore) in enumerate(order, 1):
        c = index.chunk(i)
        h = {"rank": r, "id": i, "score": round(dense[i], 6)}
        if hybrid:
            h["rrf"] = round(fscore, 6)
            h["bm25"] = round(extra[i], 4) if i in extra else None
        h.update(c)
        hits.append(h)
    t["retrieve_s"] = time.perf_counter() - t0
    return hits


def cite(hit) -> str:
    """Human citation: source + page or heading path."""
    where = f"page {hit['page']}" if hit.get("page") else " > ".join(hit.get("heading") or [])
    return f"{hit['source']}" + (f" ({where})" if where else "")
