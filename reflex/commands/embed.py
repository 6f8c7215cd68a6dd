"""`reflex embed -m MODEL "text" ["text" ...]`: one embedding per text (one text per line with '-')."""
from __future__ import annotations

import json
import sys
import time


def add_arguments(p):
    p.add_argument("texts", nargs="+", help="texts to embed ('-' reads one text per line from stdin)")
    p.add_argument("-m", "--model", default="minilm", help="GGUF path, file name, or alias (default minilm)")
    p.add_argument("--no-normalize", action="store_true", help="return raw pooled vectors (no L2 norm)")
    p.add_argument("--truncate", action="store_true", help="cut inputs longer than the context "
                   "(default: a context_overflow error)")
    p.add_argument("--backend", default="numpy", help="compute backend (default numpy)")


def run(args) -> int:
    if args.backend in ("cuda", "gpu"):
        # before numpy and the engine are imported: context creation overlaps all of that
        from reflex.backends import cuda_driver
        cuda_driver.start()
    from reflex.embed import embed
    from reflex.engine import Engine

    texts = []
    for t in args.texts:
        texts.extend([ln for ln in sys.stdin.read().splitlines() if ln] if t == "-" else [t])
    t0 = time.perf_counter()
    with Engine(args.model, backend=args.backend) as eng:
        t1 = time.perf_counter()
        vecs, info = embed(eng.model, eng.tokenizer, texts, normalize=not args.no_normalize,
                           truncate=args.truncate, n_ctx=eng.n_ctx, metadata=eng.gguf.metadata)
        t2 = time.perf_counter()
    timings = {"load_s": round(t1 - t0, 6), "embed_s": round(t2 - t1, 6)}
    rows = [v.tolist() for v in vecs]
    if args.json:
        print(json.dumps({"embeddings": rows, "dim": len(rows[0]) if rows and not isinstance(rows[0][0], list) else None,
                          "n_tokens": info["n_tokens"], "pooling": info["pooling"], "timings": timings}))
    else:
        for r in rows:
            print(" ".join(f"{x:.6f}" for x in r) if not isinstance(r[0], list) else json.dumps(r))
        print(f"{len(rows)} embeddings, {sum(info['n_tokens'])} tokens, load {timings['load_s']:.3f}s, "
              f"embed {timings['embed_s']:.3f}s", file=sys.stderr)
    return 0
