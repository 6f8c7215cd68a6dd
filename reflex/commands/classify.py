"""`reflex classify -m MODEL "text" --label a --label b`: probability per label (reflex/classify.py)."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("text", help="text to classify ('-' reads stdin)")
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--pair", default=None, metavar="DOCUMENT",
                   help="score (text, DOCUMENT) as a sentence pair (cross-encoder / reranker heads)")
    p.add_argument("--label", "-l", action="append", default=[], help="label (repeatable)")
    p.add_argument("--template", default=None, help="prompt template with {text} (and optionally {labels})")
    p.add_argument("--normalize", action="store_true", help="softmax over mean per-token log-probs")
    p.add_argument("--chat", action="store_true", help="render the prompt with the model's chat template")
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(model, 4096))")


def run(args) -> int:
    from reflex.engine import Engine

    text = sys.stdin.read() if args.text == "-" else args.text
    eng = Engine(args.model, n_ctx=args.ctx)
    r = eng.classify([text, args.pair] if args.pair is not None else text, args.label or None, template=args.template, normalize=args.normalize,
                     chat=args.chat)
    if args.json:
        d = r.to_dict()
        d["model"] = str(eng.path)
        print(json.dumps(d, ensure_ascii=False))
        return 0
    for name, p in sorted(r.probs.items(), key=lambda kv: -kv[1]):
        print(f"{p:8.4f}  {name}")
    print(f"source {r.source} | load {eng.load_s:.2f} s", file=sys.stderr)
    return 0
