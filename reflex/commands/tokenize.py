"""`reflex tokenize -m MODEL "text"`: token ids (and pieces) from the model's own tokenizer; no weights."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("text", help="text to tokenize ('-' reads stdin)")
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--no-special", action="store_true", help="do not add BOS/EOS")
    p.add_argument("--parse-special", action="store_true", help="match special tokens written in the text")


def run(args) -> int:
    from reflex.gguf import GGUFFile
    from reflex.store import resolve
    from reflex.tokenizer import Tokenizer

    text = sys.stdin.read() if args.text == "-" else args.text
    with GGUFFile(resolve(args.model)) as f:
        tok = Tokenizer.from_gguf(f)
        ids = tok.encode(text, add_special=not args.no_special, parse_special=args.parse_special)
        pieces = [tok.token_to_piece(i) for i in ids]
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces, "n_tokens": len(ids)}, ensure_ascii=False))
    else:
        for i, p in zip(ids, pieces):
            print(f"{i:>8} {p!r}")
        print(f"{len(ids)} tokens", file=sys.stderr)
    return 0
