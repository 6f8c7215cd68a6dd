"""`reflex generate -m MODEL "prompt" [...]`: generate text; streamed to stdout, timings to stderr."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("prompt", help="prompt text (the user message with --chat)")
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--temperature", "--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(model, 4096))")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--backend", default="numpy", help="compute backend: numpy (default) or cuda")


def format_timings(t: dict, usage: dict) -> str:
    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)
    return (f"load {f(t.get('load_s'), '.2f')} s | prompt {usage.get('prompt_tokens')} tok, "
            f"prefill {f(t.get('prefill_s'), '.2f')} s ({f(t.get('prefill_tok_s'), '.1f')} tok/s) | "
            f"first token {f(t.get('first_token_s'), '.2f')} s | "
            f"{usage.get('completion_tokens')} tok, decode {f(t.get('decode_s'), '.2f')} s "
            f"({f(t.get('decode_tok_s'), '.1f')} tok/s)")


def run(args) -> int:
    if args.backend in ("cuda", "gpu"):
        # before numpy and the engine are imported: context creation overlaps all of that
        from reflex.backends import cuda_driver
        cuda_driver.start()
    from reflex.engine import Engine

    eng = Engine(args.model, n_ctx=args.ctx, backend=args.backend)
    kw = dict(max_tokens=args.max_tokens, stop=args.stop, temperature=args.temperature,
              top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
              repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed)
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        msgs.append({"role": "user", "content": args.prompt})
        it = eng.chat(msgs, stream=True, **kw)
    else:
        it = eng.generate(args.prompt, stream=True, **kw)
    for piece in it:
        if not args.json:
            sys.stdout.write(piece)
            sys.stdout.flush()
    res = it.result
    if args.json:
        d = res.to_dict()
        d["model"] = str(eng.path)
        d["timings"]["load"] = eng.load_timings
        print(json.dumps(d, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
    print(f"[{res.finish_reason}] " + format_timings(res.timings, res.usage), file=sys.stderr)
    return 0
