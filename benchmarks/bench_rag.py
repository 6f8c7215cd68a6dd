"""RAG numbers: recall@5 on python3-doc (real embedding model), query latency and index open time on
100k synthetic chunks, flat vs HNSW search time by size.

  python benchmarks/bench_rag.py recall  [--indexes-dir D] [--hybrid-too]   # ingests once (cached)
  python benchmarks/bench_rag.py latency [--n 100000]
  python benchmarks/bench_rag.py scores                                    # ask threshold evidence

recall: the index is built by `reflex-rag ingest` over the pages listed in
scripts/rag_eval_questions.json; a question counts when any of its pages is among the sources of the
top 5 chunks. latency: random unit vectors stand in for chunk embeddings (FAISS cost depends on
n and dim, not on the text); the query embedding is the real model's, measured in the same process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = Path("/usr/share/doc/python3/html")
QUESTIONS = ROOT / "scripts" / "rag_eval_questions.json"
OFF_TOPIC = ["What is a good recipe for banana bread?", "Who won the football world cup in 1966?",
             "How many moons does Jupiter have?", "What is the best fertilizer for tomatoes?",
             "How do I change a flat bicycle tyre?", "What is the capital of Mongolia?",
             "When was the Eiffel Tower built?", "How long should I boil an egg?",
             "What causes the northern lights?", "Which whales sing the longest songs?"]


def ensure_index(idir: str, name: str = "pydoc") -> None:
    from rag.index import Index

    spec = json.loads(QUESTIONS.read_text())
    cmd = [sys.executable, "-m", "rag.cli", "ingest", str(CORPUS), "--index", name,
           "--indexes-dir", idir, "--json"]
    for g in spec["include"]:
        cmd += ["--include", g]
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    rep = json.loads(out.stdout)
    print(f"ingest: {rep['n_chunks']} chunks, {len(rep['added']) + len(rep['unchanged'])} files, "
          f"{time.perf_counter() - t:.1f} s (embedded {rep.get('embedded_chunks', 0)} chunks)")
    Index.open(idir, name).close()


def recall(args):
    from rag.embedder import load_embedder
    from rag.index import Index
    from rag.retrieve import search

    ensure_index(args.indexes_dir)
    spec = json.loads(QUESTIONS.read_text())
    qs = spec["questions"]
    for q in qs:   # the expected page must really hold the evidence phrase
        from rag.loaders import load

        d = load(str(CORPUS / q["pages"][0]))
        text = " ".join(" ".join(b.text for b in d.blocks).split())
        assert " ".join(q["evidence"].split()) in text, (q["q"], q["pages"][0])
    emb = load_embedder("minilm")
    res = {}
    with Index.open(args.indexes_dir, "pydoc") as index:
        for mode in ("dense", "hybrid"):
            hit, misses = 0, []
            for q in qs:
                hits = search(index, emb, q["q"], k=5, hybrid=(mode == "hybrid"))
                got = {os.path.relpath(h["source"], CORPUS.resolve()) for h in hits}
                if got & set(q["pages"]):
                    hit += 1
                else:
                    misses.append((q["q"], q["pages"][0], sorted(got)[:3]))
            res[mode] = hit / len(qs)
            print(f"recall@5 {mode}: {hit}/{len(qs)} = {hit / len(qs):.3f}")
            for m in misses:
                print(f"   miss: {m[0]!r} want {m[1]} got {m[2]}")
    return res


def scores(args):
    """Top-1 cosine for the eval questions vs off-topic questions: where to put ask's threshold."""
    from rag.embedder import load_embedder
    from rag.index import Index

    ensure_index(args.indexes_dir)
    qs = [q["q"] for q in json.loads(QUESTIONS.read_text())["questions"]]
    emb = load_embedder("minilm")
    with Index.open(args.indexes_dir, "pydoc") as index:
        on = [float(index.search(emb.embed([q])[0], 1)[1][0]) for q in qs]
        off = [float(index.search(emb.embed([q])[0], 1)[1][0]) for q in OFF_TOPIC]
    print(f"on-topic top-1 cosine: min {min(on):.3f} p10 {np.percentile(on, 10):.3f} "
          f"median {np.median(on):.3f}")
    print(f"off-topic top-1 cosine: max {max(off):.3f} median {np.median(off):.3f} "
          f"({', '.join(f'{x:.2f}' for x in off)})")


def latency(args):
    import faiss

    from rag import index as ix
    from rag.bm25 import BM25
    from rag.embedder import load_embedder

    faiss.omp_set_num_threads(1)
    emb = load_embedder("minilm")
    dim = emb.dim
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench_rag_"))
    print(f"flat search p50 by size (dim {dim}, 1 thread, synthetic unit vectors):")
    for n in (10_000, 25_000, 50_000, 100_000):
        x = rng.standard_normal((n, dim), dtype=np.float32)
        faiss.normalize_L2(x)
        fi, _ = ix.build_faiss(x, dim, flat_max=10**9)
        qv = x[rng.integers(0, n, 50)]
        ts = []
        for q in qv:
            t = time.perf_counter()
            fi.search(q[None], 5)
            ts.append(time.perf_counter() - t)
        print(f"  n={n:>7}: {1000 * statistics.median(ts):.2f} ms")
    n = args.n
    x = rng.standard_normal((n, dim), dtype=np.float32)
    faiss.normalize_L2(x)
    for kind, flat_max in (("flat", 10**9), ("hnsw", 0)):
        t = time.perf_counter()
        fi, k = ix.build_faiss(x, dim, flat_max=flat_max)
        build = time.perf_counter() - t
        chunks = [{"text": f"chunk {i}", "source": "synthetic", "title": "", "page": None,
                   "heading": [], "char_start": 0, "char_end": 0, "n_tokens": 2} for i in range(n)]
        manifest = {"format": ix.FORMAT, "embedding": emb.identity, "chunking": {}, "n_chunks": n,
                    "index": {"type": k, "ef_search": ix.HNSW_EF_SEARCH}, "files": {}, "skipped": []}
        ix.write_generation(tmp / kind, manifest, fi, chunks, BM25.build(["x"] * 0 + ["chunk"] * n))
        # open in fresh processes (cold start as `reflex-rag query` sees it; file cache warm)
        code = (f"import time,sys; sys.path.insert(0,{str(ROOT)!r}); t0=time.perf_counter(); import faiss; "
                f"t1=time.perf_counter(); from rag.index import Index; "
                f"t2=time.perf_counter(); i=Index.open({str(tmp)!r},{kind!r}); t3=time.perf_counter(); "
                f"print(t1-t0, t3-t2)")
        opens, imps = [], []
        for _ in range(5):
            o = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            a, b = map(float, o.stdout.split())
            imps.append(a)
            opens.append(b)
        with ix.Index.open(tmp, kind) as index:
            idx = rng.integers(0, n, 100)
            # exact neighbours of perturbed stored vectors, to report HNSW recall@5
            qs = x[idx] + 0.05 * rng.standard_normal((100, dim), dtype=np.float32)
            faiss.normalize_L2(qs)
            texts = [f"how do I use feature number {i} of the library" for i in range(100)]
            emb.embed(texts[:2])  # warm-up (first BLAS call)
            ts_e, ts_s, rec = [], [], 0
            for q, text in zip(qs, texts):
                t = time.perf_counter()
                emb.embed([text])
                t1 = time.perf_counter()
                ids, _ = index.search(q, 5)
                [index.chunk(int(i)) for i in ids]
                t2 = time.perf_counter()
                ts_e.append(t1 - t)
                ts_s.append(t2 - t1)
                exact = np.argsort(-(x @ q))[:5]
                rec += len(set(ids.tolist()) & set(exact.tolist()))
        tot = [a + b for a, b in zip(ts_e, ts_s)]
        print(f"{kind} n={n}: build {build:.1f} s; open p50 {1000 * statistics.median(opens):.1f} ms "
              f"(+ import faiss {1000 * statistics.median(imps):.0f} ms); query p50 embed "
              f"{1000 * statistics.median(ts_e):.1f} ms + search {1000 * statistics.median(ts_s):.2f} ms "
              f"= {1000 * statistics.median(tot):.1f} ms; recall@5 vs exact {rec / 500:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["recall", "latency", "scores"])
    ap.add_argument("--indexes-dir", default=os.path.join(tempfile.gettempdir(), "reflex_bench_indexes"))
    ap.add_argument("--n", type=int, default=100_000)
    args = ap.parse_args()
    if args.what != "latency" and not CORPUS.is_dir():
        sys.exit(f"{CORPUS} missing: apt-get install python3-doc")
    {"recall": recall, "latency": latency, "scores": scores}[args.what](args)


if __name__ == "__main__":
    main()
