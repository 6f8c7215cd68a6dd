"""Tokenizer benchmark: load time after the GGUF header, and encode/decode throughput.

python benchmarks/bench_tokenizer.py [model.gguf ...]
python benchmarks/bench_tokenizer.py --fresh N [model.gguf ...]   # ready time in N fresh processes

"ready" runs from an open GGUFFile (header parsed) to the first short encode() returning. The
first 1 MB pass includes one-time work the tokenizer defers until lookups get hot (the str -> id
dicts, Gemma's segmenter); the second pass over the same text is the steady state.
"""
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))


def english_text(limit=1_000_000):
    parts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")) + [os.path.join(ROOT, "tests", "data", "tokenizer_corpus.txt")]:
        if os.path.isfile(p):
            with open(p, encoding="utf-8", errors="replace") as fh:
                parts.append(fh.read())
    text = "\n".join(parts)
    while len(text) < limit:
        text = text + "\n" + text
    return text[:limit]


def metadata(path):
    try:
        from reflex.gguf import GGUFFile

        t0 = time.perf_counter()
        f = GGUFFile(path)
        return f.metadata, time.perf_counter() - t0, "reflex.gguf"
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from test_tokenizer import _read_kv

        t0 = time.perf_counter()
        md = _read_kv(path)
        return md, time.perf_counter() - t0, "test reader"


def bench(path):
    from reflex.tokenizer import Tokenizer

    md, t_hdr, how = metadata(path)
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(md)
    t_build = time.perf_counter() - t0
    tok.encode("Hello, world! The quick brown fox.")
    t_ready = time.perf_counter() - t0
    text = english_text()
    lines = text.split("\n")
    t0 = time.perf_counter()
    n = 0
    for l in lines:
        n += len(tok.encode(l, add_special=False))
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for l in lines:
        tok.encode(l, add_special=False)
    t_enc2 = time.perf_counter() - t0
    mb = len(text.encode()) / 1e6
    # cold per-word cache: fresh tokenizer, unique-ish text
    tok2 = Tokenizer.from_metadata(md)
    t0 = time.perf_counter()
    small = text[:200_000]
    for l in small.split("\n"):
        tok2.encode(l, add_special=False)
    t_cold = time.perf_counter() - t0
    ids = tok.encode(text[:200_000], add_special=False)
    t0 = time.perf_counter()
    tok.decode(ids)
    t_dec = time.perf_counter() - t0
    print(f"{os.path.basename(path)}: vocab={tok.n_vocab} header({how})={t_hdr*1e3:.1f} ms "
          f"build={t_build*1e3:.1f} ms ready(first encode)={t_ready*1e3:.1f} ms")
    print(f"  encode {mb:.2f} MB -> {n} tokens: {mb/t_enc:.2f} MB/s (first pass), {mb/t_enc2:.2f} MB/s (second); "
          f"first 0.2 MB on fresh tokenizer: {0.2/t_cold:.2f} MB/s; decode {len(ids)/t_dec/1e6:.2f} Mtok/s")


def fresh(path, n):
    import subprocess

    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from reflex.gguf import GGUFFile\nfrom reflex.tokenizer import Tokenizer\n"
            "f = GGUFFile(%r); md = f.metadata; t0 = time.perf_counter()\n"
            "Tokenizer.from_metadata(md).encode('Hello, world! The quick brown fox.')\n"
            "print(time.perf_counter() - t0)" % (ROOT, path))
    ts = sorted(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     check=True).stdout) for _ in range(n))
    print(f"{os.path.basename(path)}: tokenizer ready in a fresh process, {n} runs: "
          f"min {ts[0]*1e3:.1f} ms, median {ts[n // 2]*1e3:.1f} ms, max {ts[-1]*1e3:.1f} ms")


if __name__ == "__main__":
    n_fresh = 0
    if sys.argv[1:2] == ["--fresh"]:
        n_fresh = int(sys.argv[2])
        del sys.argv[1:3]
    paths = sys.argv[1:] or [os.path.join(MODELS, f) for f in
                             ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf")]
    for p in paths:
        if os.path.exists(p):
            fresh(p, n_fresh) if n_fresh else bench(p)
        else:
            print("missing", p)
