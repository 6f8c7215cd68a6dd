"""`reflex convert HF_DIR OUT.gguf [--type f32|f16|q8_0]`: a BERT (sentence-transformers) checkpoint
to GGUF in llama.cpp's bert layout (reflex/convert.py)."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("hf_dir", help="directory with config.json, *.safetensors, tokenizer.json or vocab.txt")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--type", default="f32", choices=["f32", "f16", "q8_0"], help="weight type (default f32)")
    p.add_argument("-v", "--verbose", action="store_true", help="list every tensor on stderr")


def run(args) -> int:
    from reflex.convert import convert_bert

    log = (lambda m: print(m, file=sys.stderr)) if args.verbose else None
    r = convert_bert(args.hf_dir, args.out, args.type, log=log)
    if args.json:
        print(json.dumps(r))
    else:
        print(r["out"])
        print(f"{sum(r['tensors'].values())} tensors {r['tensors']}, vocab {r['n_vocab']}, "
              f"pooling {r['pooling_type']}", file=sys.stderr)
    return 0
