"""`ingest`: walk paths -> hash -> (re)load and chunk changed files -> embed -> new generation.

Incremental by content: a file whose sha256 matches the manifest keeps its chunks and vectors (read
back from the current index). Removal is scoped to what this run looked at: a file recorded under one
of the given paths that is no longer there (or is now excluded or unreadable) is dropped; files
ingested earlier from other paths stay. Changing the chunking parameters re-chunks everything; the
embedding model cannot change (use a new index).
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from reflex.errors import InvalidRequest
from rag import chunker, index as ix, loaders
from rag.bm25 import BM25

DEFAULT_INCLUDE = ("*.pdf", "*.md", "*.markdown", "*.html", "*.htm", "*.txt", "*.text", "*.rst")
EMBED_BATCH = 32


class Progress:
    """A bar on a terminal, a line every ~10% otherwise (logs stay readable)."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label, self.enabled = total, label, enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.done = 0
        self.last_decile = -1

    def update(self, n: int):
        self.done += n
        if not self.enabled:
            return
        el = time.perf_counter() - self.t0
        rate = self.done / el if el > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        if self.tty:
            w = 30
            f = int(w * self.done / self.total)
            self.stream.write(f"\r{self.label} [{'#' * f}{'.' * (w - f)}] {self.done}/{self.total} "
                              f"{rate:.1f}/s eta {eta:.0f}s ")
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            d = 10 * self.done // self.total
            if d != self.last_decile:
                self.last_decile = d
                self.stream.write(f"{self.label}: {self.done}/{self.total} ({rate:.1f}/s)\n")
        self.stream.flush()


def _match(rel: str, patterns) -> bool:
    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(base, p) for p in patterns)


def collect(paths, include=None, exclude=()):
    """-> (files [(abs path, root)], roots). Explicit files are taken whatever their extension."""
    include = tuple(include) if include else DEFAULT_INCLUDE
    files, roots = [], []
    for p in paths:
        path = Path(p).expanduser()
        if not path.exists():
            raise InvalidRequest(f"no such file or directory: {p}")
        ap = str(path.resolve())
        roots.append(ap)
        if path.is_file():
            files.append(ap)
            continue
        for dirpath, dirnames, filenames in os.walk(ap):
            reld = os.path.relpath(dirpath, ap).replace(os.sep, "/")
            reld = "" if reld == "." else reld + "/"
            dirnames[:] = sorted(d for d in dirnames if not _match(reld + d, exclude) and not d.startswith("."))
            for fn in sorted(filenames):
                rel = reld + fn
                if _match(rel, include) and not _match(rel, exclude):
                    files.append(os.path.join(dirpath, fn))
    seen, out = set(), []
    for f in files:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out, roots


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def ingest(paths, name: str, root, embedder, include=None, exclude=(),
           chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS, overlap: int = chunker.DEFAULT_OVERLAP,
           flat_max: int = ix.FLAT_MAX, progress: bool = True, log=None) -> dict:
    log = log or (lambda s: print(s, file=sys.stderr))
    chunker.validate_params(chunk_tokens, overlap, embedder.max_tokens)
    if not paths:
        raise InvalidRequest("nothing to ingest: give at least one file or directory")
    t0 = time.perf_counter()
    files, roots = collect(paths, include, exclude)
    idir = ix.index_dir(root, name)
    with ix.IngestLock(idir):
        ix.remove_stale(idir)
        old = ix.Index.open(root, name) if ix.read_current(idir) else None
        try:
            return _ingest_locked(files, roots, idir, old, embedder, chunk_tokens, overlap, flat_max,
                                  progress, log, t0)
        finally:
            if old is not None:
                old.close()


def _ingest_locked(files, roots, idir, old, embedder, chunk_tokens, overlap, flat_max, progress, log, t0):
    params = {"chunk_tokens": chunk_tokens, "overlap": overlap, "unit": "embedding-model tokens",
              "splitter": "words; paragraph/sentence boundaries; never across headings or pages"}
    old_files = {}
    if old is not None:
        if old.identity != embedder.identity:
            raise InvalidRequest(
                f"index {idir.name!r} was built with embedding model {old.identity['name']} "
                f"(sha256 {old.identity['sha256'][:12]}, dim {old.identity['dim']}); this run uses "
                f"{embedder.identity['name']} (sha256 {embedder.identity['sha256'][:12]}, dim "
                f"{embedder.identity['dim']}). Use that model or a new --index.")
        old_files = old.manifest["files"]
        if old.manifest["chunking"] != params:
            log(f"chunking parameters changed ({old.manifest['chunking']} -> {params}): re-chunking all")
            old_files = {k: dict(v, sha256=None) for k, v in old_files.items()}
    report = {"added": [], "updated": [], "removed": [], "unchanged": [], "skipped": []}
    counter = chunker.TokenCounter(embedder.count_tokens)
    new_docs = {}            # source -> (file record, [Chunk])
    kept = {}                # source -> old file record
    seen = set()
    pr = Progress(len(files), "reading", progress and len(files) > 20)
    for f in files:
        pr.update(1)
        seen.add(f)
        try:
            with open(f, "rb") as fh:
                data = fh.read()
        except OSError as e:
            report["skipped"].append({"source": f, "reason": "unreadable", "message": str(e)})
            continue
        digest = hashlib.sha256(data).hexdigest()
        prev = old_files.get(f)
        if prev is not None and prev.get("sha256") == digest:
            kept[f] = prev
            report["unchanged"].append(f)
            continue
        try:
            doc = loaders.load(f, data=data)
        except loaders.LoadError as e:
            report["skipped"].append({"source": f, "reason": e.reason, "message": str(e)})
            continue
        chunks = chunker.chunk_document(doc, counter, chunk_tokens, overlap)
        rec = {"sha256": digest, "size": len(data), "kind": doc.kind, "title": doc.title}
        new_docs[f] = (rec, chunks)
        report["updated" if prev is not None else "added"].append(f)
    for f, rec in old_files.items():
        if f in kept or f in new_docs:
            continue
        if _under(f, roots):                 # looked at this run and gone / excluded / unreadable
            report["removed"].append(f)
        else:
            kept[f] = rec                    # from another ingest root: untouched
            if rec.get("sha256") is None:    # ... but its chunking changed: cannot keep it
                report["removed"].append(f)
                del kept[f]
    for s in report["skipped"]:
        log(f"skipped {s['source']}: {s['reason']}: {s['message']}")
    changed = report["added"] or report["updated"] or report["removed"]
    out = {k: v for k, v in report.items()}
    out["index"] = idir.name
    if not changed and old is not None:
        out.update(generation=old.generation, n_chunks=len(old), changed=False,
                   seconds=round(time.perf_counter() - t0, 3))
        return out
    # embed new chunks
    pending = [c for _, (_, cs) in sorted(new_docs.items()) for c in cs]
    pr = Progress(len(pending), "embedding", progress)
    vecs_new = []
    te = time.perf_counter()
    for i in range(0, len(pending), EMBED_BATCH):
        batch = pending[i:i + EMBED_BATCH]
        v = embedder.embed([c.embed_text() for c in batch])
        if v.shape != (len(batch), embedder.dim):
            raise InvalidRequest(f"embedder returned shape {v.shape}, expected {(len(batch), embedder.dim)}")
        vecs_new.append(v)
        pr.update(len(batch))
    embed_s = time.perf_counter() - te
    vecs_new = np.concatenate(vecs_new) if vecs_new else np.zeros((0, embedder.dim), np.float32)
    # assemble all files in source order: kept ones from the old index, new ones from vecs_new
    all_vecs, all_chunks, manifest_files = [], [], {}
    j = 0
    new_pos = {}
    for f, (_, cs) in sorted(new_docs.items()):
        new_pos[f] = (j, j + len(cs))
        j += len(cs)
    for f in sorted(set(kept) | set(new_docs)):
        a = len(all_chunks)
        if f in new_docs:
            rec, cs = new_docs[f]
            p, q = new_pos[f]
            all_vecs.append(vecs_new[p:q])
            all_chunks.extend(c.to_json() for c in cs)
        else:
            rec = {k: v for k, v in kept[f].items() if k != "chunks"}
            oa, oz = kept[f]["chunks"]
            all_vecs.append(old.vectors(oa, oz))
            all_chunks.extend(old.chunk(i) for i in range(oa, oz))
        manifest_files[f] = dict(rec, chunks=[a, len(all_chunks)])
    vectors = np.concatenate(all_vecs) if all_vecs else np.zeros((0, embedder.dim), np.float32)
    tb = time.perf_counter()
    fi, kind = ix.build_faiss(vectors, embedder.dim, flat_max)
    bm = BM25.build([c["text"] if not c["heading"] else " ".join(c["heading"]) + "\n" + c["text"]
                     for c in all_chunks])
    manifest = {
        "format": ix.FORMAT,
        "embedding": embedder.identity,
        # where the embedding GGUF was: ask/query reuse it when the name is not in the model store
        # (its sha256 is still checked against "embedding")
        "embedding_path": (str(Path(embedder.engine.path).resolve()) if getattr(embedder, "engine", None)
                           is not None else None),
        "chunking": params,
        "index": {"type": kind, "metric": "inner_product", "normalized": True, "flat_max": flat_max,
                  **({"m": ix.HNSW_M, "ef_construction": ix.HNSW_EF_CONSTRUCTION,
                      "ef_search": ix.HNSW_EF_SEARCH} if kind == "hnsw" else {})},
        "n_chunks": len(all_chunks),
        "files": manifest_files,
        "skipped": report["skipped"],
    }
    gen = ix.write_generation(idir, manifest, fi, all_chunks, bm)
    out.update(generation=gen, n_chunks=len(all_chunks), changed=True, index_type=kind,
               embedded_chunks=len(pending), embed_s=round(embed_s, 3),
               build_s=round(time.perf_counter() - tb, 3), seconds=round(time.perf_counter() - t0, 3))
    return out
