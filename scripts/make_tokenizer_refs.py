"""Record reference token ids from transformers' GGUF tokenizer (independent implementation).

Usage: python scripts/make_tokenizer_refs.py [--corpus] [--refs]
  --corpus  rebuild tests/data/tokenizer_corpus.txt from real text on this machine
  --refs    record tests/data/tokenizer_ref_{smollm2,gemma3}.json.gz
"""
import glob
import gzip
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "tokenizer_corpus.txt")
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
TARGETS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

HANDWRITTEN = r"""
Hello, world! How are you today?
The quick brown fox jumps over the lazy dog.
  leading two spaces
    four spaces then text
trailing spaces   
tabs	between	words		and double
mixed 	 spaces	 and tabs
12345678901234567890
3.14159 2.71828 1,000,000 -42 +7 1e-10 0x1F 0b1010
Call 555-0123 or +1 (800) 555-0199 before 12:30pm on 2024-01-15.
I'm you're he's we'll they'd can't won't it's ISN'T I'D
Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ 🔥🔥🔥
中文测试：你好，世界！这是一个分词器测试。
日本語のテキスト：東京は日本の首都です。カタカナ、ひらがな。
한국어 텍스트: 안녕하세요 세계
العربية: مرحبا بالعالم، كيف حالك؟
Русский текст: Привет, мир! Как дела?
Ελληνικά: Γειά σου Κόσμε
हिन्दी: नमस्ते दुनिया
Ünïcödé àccénts: café naïve résumé Zürich Ångström
Math: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ α β γ δ π ∂ ∇
Symbols: © ® ™ § ¶ † ‡ • … ‰ € £ ¥ ¢
<|im_start|>user
Hello!<|im_end|>
<|im_start|>assistant
Hi there, how can I help?<|im_end|>
<|endoftext|>
<start_of_turn>user
What is 2+2?<end_of_turn>
<start_of_turn>model
4<end_of_turn>
<bos>text after bos<eos>
def foo(x):    return x**2  # comment
    if (a && b) || !c { return; }
    for (int i = 0; i < n; ++i) { sum += a[i]; }
SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';
https://example.com/path?query=1&other=two#frag
user@example.com, first.last+tag@sub.domain.org
<html><body><div class="x">Text</div></body></html>
{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}
!!!???...,,,;;;:::---___===+++***
aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
     
	
 a
a 
                                        
""".strip("\n").split("\n")


def build_corpus():
    rng = random.Random(1234)
    lines = []
    pyfiles = sorted(glob.glob("/root/.pyenv/versions/3.11.7/lib/python3.11/*.py"))
    rng.shuffle(pyfiles)
    for p in pyfiles[:40]:
        with open(p, encoding="utf-8", errors="replace") as fh:
            src = fh.read().split("\n")
        start = rng.randrange(max(1, len(src) - 60))
        lines.extend(l for l in src[start:start + 50] if len(l) < 200)
    lic = sorted(glob.glob("/usr/share/common-licenses/*"))
    for p in lic:
        if os.path.isdir(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as fh:
            src = fh.read().split("\n")
        lines.extend(l for l in src[:60] if len(l) < 200)
    docs = sorted(glob.glob("/usr/share/doc/*/copyright"))
    rng.shuffle(docs)
    for p in docs[:30]:
        with open(p, encoding="utf-8", errors="replace") as fh:
            src = fh.read().split("\n")
        lines.extend(l for l in src[:20] if len(l) < 200)
    lines.extend(HANDWRITTEN * 3)
    lines = [l.replace("\r", "") for l in lines]
    text = "\n".join(lines) + "\n"
    while len(text.encode()) > 290_000:
        lines = lines[: int(len(lines) * 0.9)] + HANDWRITTEN
        text = "\n".join(lines) + "\n"
    with open(CORPUS, "w", encoding="utf-8") as fh:
        fh.write(text)
    print("corpus lines", len(lines), "bytes", len(text.encode()))


def corpus_samples():
    with open(CORPUS, encoding="utf-8") as fh:
        lines = fh.read().split("\n")[:-1]
    chunks = ["\n".join(lines[i:i + 8]) + "\n" for i in range(0, len(lines), 37)]
    return lines, chunks


def record(name):
    from transformers import AutoTokenizer

    fn = TARGETS[name]
    tok = AutoTokenizer.from_pretrained(MODELS, gguf_file=fn)
    lines, chunks = corpus_samples()
    out = {"model": fn, "transformers_class": type(tok).__name__}
    if name == "smollm2":
        # transformers' GGUF loader has no split for pre="smollm" and falls back to plain GPT-2
        # ByteLevel, which differs from llama.cpp and from SmolLM2's own tokenizer.json on
        # whitespace before digits ("   256" -> "  "," 2","5","6" instead of "   ","2","5","6").
        # Keep the raw loader's ids for the record, then install SmolLM2's real pre-tokenizer
        # (tokenizer.json: Digits(individual) then ByteLevel) and record those as the reference.
        out["lines_special_raw_gguf_loader"] = [tok.encode(l, add_special_tokens=False) for l in lines]
        from tokenizers import pre_tokenizers

        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        out["pre_tokenizer_patch"] = "Digits(individual_digits=True)+ByteLevel(use_regex=True)"
    # parse_special=True variant: transformers matches added/special tokens in text by default.
    out["lines_special"] = [tok.encode(l, add_special_tokens=False) for l in lines]
    out["chunks_special"] = [tok.encode(c, add_special_tokens=False) for c in chunks]
    # parse_special=False variant: special tokens in text are tokenized as plain text.
    try:
        out["lines"] = [tok.encode(l, add_special_tokens=False, split_special_tokens=True) for l in lines]
    except TypeError:
        out["lines"] = None
    out["lines_with_bos"] = [tok.encode(l) for l in lines[:50]]
    path = os.path.join(ROOT, "tests", "data", f"tokenizer_ref_{name}.json.gz")
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(out, fh, separators=(",", ":"))
    print(name, "written", path, os.path.getsize(path))


if __name__ == "__main__":
    if "--corpus" in sys.argv:
        build_corpus()
    if "--refs" in sys.argv:
        for n in (sys.argv[sys.argv.index("--refs") + 1:] or list(TARGETS)):
            record(n)
