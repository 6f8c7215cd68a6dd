"""`reflex-rag` command line: ingest, query, ask, info.

Results on stdout (JSON with --json), progress and timings on stderr; errors carry reflex's
categories and exit codes. Heavy imports (faiss, the engine) happen inside the commands, after the
cheap checks, so a missing index fails fast.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

_T_IMPORT = time.perf_counter()


def _since_launch() -> float | None:
    """Seconds since this process was exec'd (Linux /proc; 10 ms resolution)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_LAUNCH_AT_IMPORT = _since_launch()


def _common(p, model_help="embedding model (default: the one recorded in the index)"):
    from rag.index import default_indexes_dir

    p.add_argument("--index", required=True, help="index name (a directory under --indexes-dir)")
    p.add_argument("--indexes-dir", default=str(default_indexes_dir()),
                   help="volume holding indexes (default $REFLEX_INDEXES or ./indexes)")
    p.add_argument("--embed-model", default=None, help=model_help)
    p.add_argument("--backend", default="numpy", help="engine backend (numpy, cuda)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def build_parser():
    from rag import chunker, index as ix

    ap = argparse.ArgumentParser(prog="reflex-rag", description="Retrieval over local documents")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    p = sub.add_parser("ingest", help="add/update documents in an index")
    p.add_argument("paths", nargs="+", metavar="PATH")
    _common(p, "embedding model (default minilm; must match an existing index)")
    p.add_argument("--include", action="append", default=None, metavar="GLOB",
                   help="file globs to take from directories (default: pdf md html htm txt rst)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB")
    p.add_argument("--chunk-tokens", type=int, default=chunker.DEFAULT_CHUNK_TOKENS)
    p.add_argument("--overlap", type=int, default=chunker.DEFAULT_OVERLAP)
    p.add_argument("--flat-max", type=int, default=ix.FLAT_MAX,
                   help="exact flat index up to this many chunks, HNSW above")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    for name, hlp in (("query", "top-k chunks for a question"), ("ask", "answer from the index")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("question")
        _common(p)
        p.add_argument("--hybrid", action="store_true", help="fuse BM25 with dense ranking (RRF)")
        if name == "query":
            p.add_argument("-k", type=int, default=5)
        else:
            from rag.ask import DEFAULT_CHAT_MODEL, DEFAULT_K, DEFAULT_MIN_SCORE

            p.add_argument("-k", type=int, default=DEFAULT_K)
            p.add_argument("--chat-model", default=DEFAULT_CHAT_MODEL)
            p.add_argument("--max-tokens", type=int, default=160)
            p.add_argument("--min-score", type=float, default=DEFAULT_MIN_SCORE,
                           help="cosine below which a chunk counts as unrelated")
    p = sub.add_parser("info", help="describe an index")
    p.add_argument("--index", required=True)
    p.add_argument("--indexes-dir", default=str(ix.default_indexes_dir()))
    p.add_argument("--json", action="store_true")
    return ap


def _embedder_for(args, index=None):
    from rag import embedder as E
    from reflex.errors import ModelNotFound

    spec = args.embed_model
    if spec is None and index is not None:
        spec = index.identity["name"]
        if spec.startswith("hf:"):
            raise ModelNotFound(f"index was built with reference embedder {spec}; pass --embed-model")
        path = index.manifest.get("embedding_path")
        if path and os.path.isfile(path):   # the file ingest used (identity is checked after loading)
            spec = path
    return E.load_embedder(spec or E.DEFAULT_EMBED_MODEL, backend=args.backend)


def cmd_ingest(args) -> int:
    from rag.ingest import ingest

    emb = _embedder_for(args)
    rep = ingest(args.paths, args.index, args.indexes_dir, emb, include=args.include,
                 exclude=args.exclude, chunk_tokens=args.chunk_tokens, overlap=args.overlap,
                 flat_max=args.flat_max, progress=not args.quiet)
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
    else:
        counts = ", ".join(f"{len(rep[k])} {k}" for k in ("added", "updated", "removed", "unchanged", "skipped"))
        print(f"index {rep['index']}: {counts}; {rep['n_chunks']} chunks in {rep['generation']}"
              + ("" if rep["changed"] else " (no change)"))
    return 0


def cmd_query(args) -> int:
    from rag.index import Index
    from rag.retrieve import cite, search, validate

    validate(args.question, args.k)
    t = {}
    t0 = time.perf_counter()
    with Index.open(args.indexes_dir, args.index) as index:
        t["import_faiss_s"] = index.import_faiss_s   # a stage of its own, often more than the open
        t["open_index_s"] = time.perf_counter() - t0 - index.import_faiss_s
        t0 = time.perf_counter()
        emb = _embedder_for(args, index)
        t["load_embedder_s"] = time.perf_counter() - t0
        hits = search(index, emb, args.question, k=args.k, hybrid=args.hybrid, timings=t)
    if args.json:
        print(json.dumps({"query": args.question, "index": args.index, "hybrid": args.hybrid,
                          "hits": hits, "timings": _round(t)}, ensure_ascii=False))
    else:
        for h in hits:
            snippet = " ".join(h["text"].split())[:200]
            print(f"{h['rank']}. [{h['score']:.3f}] {cite(h)}\n   {snippet}")
        print("timings: " + _fmt(t), file=sys.stderr)
    return 0


def cmd_ask(args) -> int:
    if args.backend in ("cuda", "gpu"):
        # context creation (and cuBLAS, which the ~400-token answer prompt's prefill uses) on a
        # thread, overlapping the imports, the index open and the embedder load
        from reflex.backends import cuda_driver
        cuda_driver.start(blas=True)
    from rag.ask import ask
    from rag.index import Index
    from rag.retrieve import validate

    t = {"launch_to_main_s": _LAUNCH_AT_IMPORT, "import_s": time.perf_counter() - _T_IMPORT}
    validate(args.question, args.k)
    if args.max_tokens < 1:
        from reflex.errors import InvalidRequest

        raise InvalidRequest("--max-tokens must be >= 1")
    t0 = time.perf_counter()
    with Index.open(args.indexes_dir, args.index) as index:
        t["import_faiss_s"] = index.import_faiss_s   # a stage of its own, often more than the open
        t["open_index_s"] = time.perf_counter() - t0 - index.import_faiss_s
        t0 = time.perf_counter()
        emb = _embedder_for(args, index) if len(index) else None
        t["load_embedder_s"] = time.perf_counter() - t0

        def chat_loader():
            from reflex.engine import Engine

            return Engine(args.chat_model, backend=args.backend)

        res = ask(args.question, index, emb, chat_loader, k=args.k, hybrid=args.hybrid,
                  min_score=args.min_score, max_tokens=args.max_tokens, timings=t)
    t["total_s"] = _since_launch()
    res["timings"] = _round(t)
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
    else:
        print(res["answer"])
        if res["sources"]:
            print("\nSources:" if res["citations"] else "\nSources given to the model (none cited):")
            for s in res["sources"]:
                print(f"  [{s['n']}] {s['citation']}" + ("" if s["cited"] or not res["citations"] else " (not cited)"))
        print("timings: " + _fmt(res["timings"]), file=sys.stderr)
    return 0


def cmd_info(args) -> int:
    from rag.index import Index

    with Index.open(args.indexes_dir, args.index) as index:
        m = dict(index.manifest)
        files = m.pop("files")
        m["n_files"] = len(files)
    if args.json:
        print(json.dumps(m, ensure_ascii=False))
    else:
        e = m["embedding"]
        print(f"index {args.index} ({m['generation']}): {m['n_chunks']} chunks from {m['n_files']} files, "
              f"{m['index']['type']}; embedding {e['name']} dim {e['dim']} sha256 {e['sha256'][:12]}; "
              f"chunking {m['chunking']['chunk_tokens']} tokens, overlap {m['chunking']['overlap']}")
    return 0


def _round(t: dict) -> dict:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in t.items()}


def _fmt(t: dict) -> str:
    return " ".join(f"{k}={v * 1000:.1f}ms" if isinstance(v, float) and k.endswith("_s") and not k.endswith("tok_s") else f"{k}={v}"
                    for k, v in t.items() if v is not None)


COMMANDS = {"ingest": cmd_ingest, "query": cmd_query, "ask": cmd_ask, "info": cmd_info}


def main(argv=None) -> int:
    from reflex.errors import ReflexError

    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.print_help(sys.stderr)
        return 2
    try:
        return int(COMMANDS[args.cmd](args) or 0)
    except ReflexError as e:
        if getattr(args, "json", False):
            print(json.dumps(e.to_json()))
        print(f"reflex-rag {args.cmd}: error [{e.category}]: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
