"""RAG numbers: recall@5 on python3-doc (real embedding model), query latency and index open time on
100k synthetic chunks, flat vs HNSW search time by size.

  python benchmarks/bench_rag.py recall  [--indexes-dir D] [--set first|hard] [--verbose]  # ingests once
  python benchmarks/bench_rag.py ask [--backend cuda] [--runs 2]         # cold `reflex-rag ask` stages
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
QUESTION_SETS = {"first": QUESTIONS, "hard": ROOT / "tests" / "data" / "rag" / "eval_hard.json"}
OFF_TOPIC = ["What is a good recipe for banana bread?", "Who won the football world cup in 1966?",
             "How many moons does Jupiter have?", "What is the best fertilizer for tomatoes?",
             "How do I change a flat bicycle tyre?", "What is the capital of Mongolia?",
             "When was the Eiffel Tower built?", "How long should I boil an egg?",
             "What causes the northern lights?", "Which whales sing the longest songs?"]


def ensure_index(idir: str, name: str = "pydoc", backend: str = "numpy", corpus: Path = CORPUS,
                 embed_model: str | None = None) -> None:
    from rag.index import Index

    spec = json.loads(QUESTIONS.read_text())
    cmd = [sys.executable, "-m", "rag.cli", "ingest", str(corpus), "--index", name,
           "--indexes-dir", idir, "--backend", backend, "--json", "--quiet"]
    if embed_model:
        cmd += ["--embed-model", embed_model]
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


def _check_evidence(qs):
    """the expected page must really hold the evidence phrase (guards against a wrong answer key)"""
    from rag.loaders import load

    texts = {}
    for q in qs:
        pg = q["pages"][0]
        if pg not in texts:
            d = load(str(CORPUS / pg))
            texts[pg] = " ".join(" ".join(b.text for b in d.blocks).split())
        assert " ".join(q["evidence"].split()) in texts[pg], (q["q"], pg)


def recall(args):
    """recall@1, recall@5 and MRR@10 of the right page, dense vs hybrid, per question set.

    The page rank of a question is the rank of the first retrieved chunk whose source is one of its
    pages (chunk ranks, so two chunks of a wrong page push the right page down)."""
    from rag.embedder import load_embedder
    from rag.index import Index
    from rag.retrieve import search

    ensure_index(args.indexes_dir)
    emb = load_embedder("minilm")
    res = {}
    with Index.open(args.indexes_dir, "pydoc") as index:
        for set_name, path in QUESTION_SETS.items():
            if args.set not in ("all", set_name):
                continue
            spec = json.loads(path.read_text())
            qs = spec["questions"]
            if spec["include"] != json.loads(QUESTIONS.read_text())["include"]:
                sys.exit(f"{path}: its pages differ from the index's ({QUESTIONS.name})")
            _check_evidence(qs)
            for mode in ("dense", "hybrid"):
                ranks, misses = [], []
                for q in qs:
                    hits = search(index, emb, q["q"], k=10, hybrid=(mode == "hybrid"))
                    got = [os.path.relpath(h["source"], CORPUS.resolve()) for h in hits]
                    r = next((i + 1 for i, g in enumerate(got) if g in q["pages"]), None)
                    ranks.append(r)
                    if r is None or r > 5:
                        misses.append((q["q"], q["pages"][0], r, got[:3]))
                n = len(qs)
                r1 = sum(1 for r in ranks if r == 1) / n
                r5 = sum(1 for r in ranks if r and r <= 5) / n
                mrr = sum(1 / r for r in ranks if r) / n
                res[(set_name, mode)] = (r1, r5, mrr)
                print(f"{set_name:>8} {mode:>6} (n={n}): recall@1 {r1:.3f}  recall@5 {r5:.3f}  MRR@10 {mrr:.3f}")
                if args.verbose:
                    for m in misses:
                        print(f"   miss@5: {m[0]!r} want {m[1]} (rank {m[2]}) got {m[3]}")
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


def _pct(v, q):
    return 1000 * float(np.percentile(v, q))


def latency(args):
    """flat search by size; then, at --n chunks, flat and HNSW: open in fresh processes and
    query = real embed of a short question + search + reading the k chunk records.

    The 100k generations are kept in --cache (an HNSW build of 100k x 384 takes minutes to tens of
    minutes here), keyed by n and dim, so a re-run measures without rebuilding."""
    import faiss

    from rag import index as ix
    from rag.bm25 import BM25
    from rag.embedder import load_embedder

    faiss.omp_set_num_threads(1)
    emb = load_embedder("minilm")
    dim = emb.dim
    rng = np.random.default_rng(0)
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
    cache = Path(args.cache) / f"n{n}_d{dim}"
    x = np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)   # fresh seed: same x every run
    faiss.normalize_L2(x)
    for kind, flat_max in (("flat", 10**9), ("hnsw", 0)):
        build = None
        if ix.read_current(cache / kind) is None:
            faiss.omp_set_num_threads(os.cpu_count() or 1)
            t = time.perf_counter()
            fi, k = ix.build_faiss(x, dim, flat_max=flat_max)
            build = time.perf_counter() - t
            faiss.omp_set_num_threads(1)
            chunks = [{"text": f"chunk {i}", "source": "synthetic", "title": "", "page": None,
                       "heading": [], "char_start": 0, "char_end": 0, "n_tokens": 2} for i in range(n)]
            manifest = {"format": ix.FORMAT, "embedding": emb.identity, "chunking": {}, "n_chunks": n,
                        "index": {"type": k, "ef_search": ix.HNSW_EF_SEARCH}, "files": {}, "skipped": []}
            ix.write_generation(cache / kind, manifest, fi, chunks, BM25.build(["chunk"] * n))
            del fi
        # open in fresh processes (cold start as `reflex-rag query` sees it; file cache warm)
        code = (f"import time,sys; sys.path.insert(0,{str(ROOT)!r}); t0=time.perf_counter(); import faiss; "
                f"t1=time.perf_counter(); from rag.index import Index; "
                f"t2=time.perf_counter(); i=Index.open({str(cache)!r},{kind!r}); t3=time.perf_counter(); "
                f"print(t1-t0, t3-t2)")
        opens, imps = [], []
        for _ in range(args.open_runs):
            o = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            a, b = map(float, o.stdout.split())
            imps.append(a)
            opens.append(b)
        with ix.Index.open(cache, kind) as index:
            idx = rng.integers(0, n, 100)
            # exact neighbours of perturbed stored vectors, to report HNSW recall@5
            qs = x[idx] + 0.05 * rng.standard_normal((100, dim), dtype=np.float32)
            faiss.normalize_L2(qs)
            texts = [f"how do I use feature number {i} of the library?" for i in range(100)]
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
        print(f"{kind} n={n}: build {'%.1f s' % build if build is not None else '(cached)'}; "
              f"open p50 {_pct(opens, 50):.1f} ms p95 {_pct(opens, 95):.1f} ms "
              f"(+ import faiss p50 {_pct(imps, 50):.0f} ms)")
        print(f"  query p50 embed {_pct(ts_e, 50):.1f} + search {_pct(ts_s, 50):.2f} = "
              f"{_pct(tot, 50):.1f} ms; p95 {_pct(tot, 95):.1f} ms; recall@5 vs exact {rec / 500:.3f}; "
              f"load avg {os.getloadavg()[0]:.1f}")


ASK_QUESTIONS = ["How do I pretty-print JSON output with indentation?",
                 "What does the re.DOTALL flag change?",
                 "Why do I get UnboundLocalError for a variable that has a value?"]
ASK_STAGES = ["launch_to_main_s", "import_s", "import_faiss_s", "open_index_s", "load_embedder_s",
              "embed_s", "search_s", "chat_load_s", "prompt_s", "prefill_s", "first_token_s",
              "decode_s", "total_s"]


def ask(args):
    """`reflex-rag ask --json` in fresh processes (cold start each time; file cache warm after the
    first): p50/p95 per stage over runs x questions, plus the wall time seen from outside."""
    ensure_index(args.indexes_dir, backend=args.backend, corpus=args.corpus, embed_model=args.embed_model)
    rows, walls = [], []
    for rep in range(args.runs):
        for q in ASK_QUESTIONS:
            cmd = [sys.executable, "-m", "rag.cli", "ask", q, "--index", "pydoc", "--indexes-dir",
                   args.indexes_dir, "--backend", args.backend, "-k", str(args.k), "--max-tokens",
                   str(args.max_tokens), "--json"]
            if args.chat_model:
                cmd += ["--chat-model", args.chat_model]
            if args.min_score is not None:
                cmd += ["--min-score", str(args.min_score)]
            t = time.perf_counter()
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            walls.append(time.perf_counter() - t)
            if out.returncode:
                sys.exit(f"ask failed ({out.returncode}): {out.stderr[-2000:]}")
            res = json.loads(out.stdout)
            rows.append(res["timings"])
            u = res.get("usage") or {}
            print(f"run {rep} {q[:40]!r}: {res['status']}, prompt {u.get('prompt_tokens')} tok, "
                  f"{u.get('completion_tokens')} new, total {res['timings'].get('total_s', 0):.2f} s",
                  flush=True)
    print(f"\nask stages, backend {args.backend}, {len(rows)} runs (k {args.k}, max_tokens "
          f"{args.max_tokens}, {os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}):")
    print(f"  {'stage':<18} {'p50':>10} {'p95':>10}")
    for st in ASK_STAGES + ["prefill_tok_s", "decode_tok_s"]:
        v = [r[st] for r in rows if isinstance(r.get(st), (int, float))]
        if not v:
            continue
        unit = " tok/s" if st.endswith("tok_s") else "s"
        print(f"  {st:<18} {np.percentile(v, 50):>9.3f}{unit} {np.percentile(v, 95):>9.3f}{unit}")
    print(f"  {'wall (outside)':<18} {np.percentile(walls, 50):>9.3f}s {np.percentile(walls, 95):>9.3f}s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["recall", "latency", "scores", "ask"])
    ap.add_argument("--indexes-dir", default=os.path.join(tempfile.gettempdir(), "reflex_bench_indexes"))
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "reflex_bench_rag_latency"),
                    help="latency: where the synthetic 100k generations are kept between runs")
    ap.add_argument("--open-runs", type=int, default=10, help="latency: fresh-process opens")
    ap.add_argument("--set", default="all", choices=["all", *QUESTION_SETS], help="recall: question set")
    ap.add_argument("--verbose", action="store_true", help="recall: list the misses")
    ap.add_argument("--backend", default="numpy", help="ask: engine backend (numpy, cuda)")
    ap.add_argument("--runs", type=int, default=2, help="ask: repeats of the 3 questions")
    ap.add_argument("-k", type=int, default=3, help="ask: sources")
    ap.add_argument("--max-tokens", type=int, default=64, help="ask: answer length cap")
    # the device has no python3-doc and the real models do not travel: there `ask` runs over a copy
    # of the eval pages (--corpus) with synthetic models of the real shapes (random weights, real
    # tokenizers): the stage timings are the real ones, the answers are noise (--min-score -1 keeps
    # random-weight retrieval from being refused as unrelated)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="ask: document folder (recall always reads python3-doc)")
    ap.add_argument("--embed-model", help="ask: embedding model for ingest (default minilm)")
    ap.add_argument("--chat-model", help="ask: chat model (default smollm2)")
    ap.add_argument("--min-score", type=float, help="ask: passed to reflex-rag ask")
    args = ap.parse_args()
    if args.what != "latency" and not args.corpus.is_dir():
        sys.exit(f"{args.corpus} missing: apt-get install python3-doc")
    {"recall": recall, "latency": latency, "scores": scores, "ask": ask}[args.what](args)


if __name__ == "__main__":
    main()
