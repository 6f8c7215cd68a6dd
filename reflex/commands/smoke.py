"""`reflex smoke [--json]`: load the default model, ask one chat question greedily, report timings.

Exit 0 only when at least one token of non-empty text came out; 70 otherwise."""
from __future__ import annotations

import json
import sys

QUESTION = "What is the capital of France?"


def add_arguments(p):
    p.add_argument("-m", "--model", default="smollm2", help="model (default smollm2)")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--backend", default="numpy", help="compute backend: numpy (default) or cuda")


def run(args) -> int:
    from reflex.commands.generate import format_timings
    from reflex.engine import Engine
    from reflex.errors import ReflexError

    eng = Engine(args.model, backend=args.backend)
    res = eng.chat([{"role": "user", "content": QUESTION}], max_tokens=args.max_tokens, temperature=0)
    ok = res.usage["completion_tokens"] >= 1 and res.text.strip() != ""
    if args.json:
        d = {"ok": ok, "model": str(eng.path), "question": QUESTION, "answer": res.text,
             "finish_reason": res.finish_reason, "usage": res.usage, "timings": res.timings,
             "memory": eng.memory()}
        if not ok:
            d["error"] = {"category": "internal", "message": "smoke test generated no text"}
        print(json.dumps(d, ensure_ascii=False))
    else:
        print(f"Q: {QUESTION}\nA: {res.text}")
    print(f"[{res.finish_reason}] " + format_timings(res.timings, res.usage), file=sys.stderr)
    m = eng.memory()
    print(f"memory: weights resident {m.get('weight_bytes', 0) / 2**20:.0f} MiB on {args.backend} "
          f"(GGUF tensors {m['gguf_tensor_bytes'] / 2**20:.0f} MiB)"
          + (f", process RSS {m['process_rss_bytes'] / 2**20:.0f} MiB" if m.get("process_rss_bytes") else ""),
          file=sys.stderr)
    if not ok:
        print("reflex smoke: error [internal]: smoke test generated no text", file=sys.stderr)
        return ReflexError("").exit_code
    return 0
