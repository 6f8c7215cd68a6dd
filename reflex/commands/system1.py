"""`reflex system1 -m MODEL --context TEXT --candidate A --candidate B`: log-prob of each candidate
continuation, all scored in one forward pass (reflex/system1.py); the best one is marked."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--context", required=True, help="context text ('-' reads stdin)")
    p.add_argument("--candidate", "-c", action="append", default=[], help="candidate continuation (repeatable)")
    p.add_argument("--normalize", action="store_true", help="pick the best by mean per-token log-prob")
    p.add_argument("--parse-special", action="store_true", help="match special tokens written in the text")
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(model, 4096))")


def run(args) -> int:
    from reflex.engine import Engine
    from reflex.errors import InvalidRequest

    if not args.candidate:
        raise InvalidRequest("give at least one --candidate")
    context = sys.stdin.read() if args.context == "-" else args.context
    eng = Engine(args.model, n_ctx=args.ctx)
    r = eng.score(context, args.candidate, normalize=args.normalize, parse_special=args.parse_special)
    if args.json:
        d = r.to_dict()
        d["model"] = str(eng.path)
        d["timings"]["load"] = eng.load_timings
        print(json.dumps(d, ensure_ascii=False))
        return 0
    for i, c in enumerate(r.candidates):
        mark = "*" if i == r.best else " "
        print(f"{mark} {c.total:10.4f} {c.mean:9.4f} {len(c.token_ids):4d}  {c.text!r}")
    print(f"columns: best, total log-prob, mean per token, tokens, candidate | "
          f"load {eng.load_s:.2f} s, forward {r.timings['forward_s']:.2f} s over {r.n_forward_tokens} tokens",
          file=sys.stderr)
    return 0
