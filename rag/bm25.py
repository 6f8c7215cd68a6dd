"""Okapi BM25 over the index's chunks, stored as CSR postings so a query touches only its terms.

score(q, d) = sum_t idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl)),
idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))  (the Lucene form, never negative).
Terms: lower-cased \\w+ runs (so `os.path.join` gives os, path, join), minus a few English stopwords.
"""
from __future__ import annotations

import json
import re

import numpy as np

K1, B = 1.2, 0.75
_TERM = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how i if in into is it its of on or "
    "that the their then there these this to was what when where which who why will with you your".split())


def terms(text: str) -> list:
    return [t for t in _TERM.findall(text.lower()) if t not in STOPWORDS]


class BM25:
    def __init__(self, vocab: dict, indptr, doc_ids, tfs, doc_len):
        self.vocab = vocab              # term -> row
        self.indptr = indptr            # (n_terms + 1,) int64
        self.doc_ids = doc_ids          # (nnz,) int32, sorted within a row
        self.tfs = tfs                  # (nnz,) float32
        self.doc_len = doc_len          # (n_docs,) float32
        self.n_docs = len(doc_len)
        self.avgdl = float(doc_len.mean()) if self.n_docs else 0.0

    @classmethod
    def build(cls, texts) -> "BM25":
        vocab, rows = {}, []
        doc_len = np.zeros(len(texts), np.float32)
        for d, text in enumerate(texts):
            ts = terms(text)
            doc_len[d] = len(ts)
            counts = {}
            for t in ts:
                counts[t] = counts.get(t, 0) + 1
            for t, c in counts.items():
                r = vocab.setdefault(t, len(vocab))
                rows.append((r, d, c))
        if rows:
            arr = np.array(rows, dtype=np.int64)
            order = np.lexsort((arr[:, 1], arr[:, 0]))
            arr = arr[order]
            indptr = np.zeros(len(vocab) + 1, np.int64)
            np.add.at(indptr, arr[:, 0] + 1, 1)
            indptr = np.cumsum(indptr)
            return cls(vocab, indptr, arr[:, 1].astype(np.int32), arr[:, 2].astype(np.float32), doc_len)
        return cls(vocab, np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), doc_len)

    def search(self, query: str, k: int):
        """-> (doc ids, scores), best first; only documents sharing a term with the query."""
        if self.n_docs == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        scores = np.zeros(self.n_docs, np.float32)
        hit = False
        for t in set(terms(query)):
            r = self.vocab.get(t)
            if r is None:
                continue
            a, z = self.indptr[r], self.indptr[r + 1]
            ids, tf = self.doc_ids[a:z], self.tfs[a:z]
            df = z - a
            idf = np.log1p((self.n_docs - df + 0.5) / (df + 0.5))
            norm = K1 * (1 - B + B * self.doc_len[ids] / max(self.avgdl, 1e-9))
            scores[ids] += idf * tf * (K1 + 1) / (tf + norm)
            hit = True
        if not hit:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        nz = np.flatnonzero(scores)
        k = min(k, len(nz))
        top = nz[np.argpartition(-scores[nz], k - 1)[:k]]
        top = top[np.argsort(-scores[top], kind="stable")]
        return top.astype(np.int64), scores[top]

    # ------------------------------------------------------------------ storage
    def save(self, path):
        terms_sorted = sorted(self.vocab, key=self.vocab.get)
        with open(path, "wb") as f:
            np.savez(f, terms=np.frombuffer(json.dumps(terms_sorted).encode(), np.uint8),
                     indptr=self.indptr, doc_ids=self.doc_ids, tfs=self.tfs, doc_len=self.doc_len)

    @classmethod
    def load(cls, path) -> "BM25":
        with np.load(path) as z:
            names = json.loads(z["terms"].tobytes().decode())
            return cls({t: i for i, t in enumerate(names)}, z["indptr"], z["doc_ids"], z["tfs"],
                       z["doc_len"])


def rrf(rankings, k: int = 60) -> list:
    """Reciprocal rank fusion: score(d) = sum over rankings of 1 / (k + rank), rank from 1.
    k=60 is Cormack et al.'s constant; it damps the head so neither list dominates."""
    score = {}
    for ranking in rankings:
        for r, d in enumerate(ranking, 1):
            score[d] = score.get(d, 0.0) + 1.0 / (k + r)
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))
