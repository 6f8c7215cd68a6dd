"""`reflex chat -m MODEL`: interactive multi-turn chat. One line of input is one user message; the
answer streams to stdout. `/reset` forgets the conversation, `/exit` (or EOF) ends it. With --json
each answer is one JSON line instead. A failed turn (e.g. context_overflow) is reported on stderr and
leaves the history as it was."""
from __future__ import annotations

import json
import sys

HELP = "commands: /reset (forget the conversation), /exit (quit); EOF also quits"


def add_arguments(p):
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--max-tokens", "-n", type=int, default=256)
    p.add_argument("--temperature", "--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(model, 4096))")
    p.add_argument("--timings", action="store_true", help="print timings on stderr after each answer")


def run(args) -> int:
    from reflex.commands.generate import format_timings
    from reflex.engine import Engine
    from reflex.errors import InvalidRequest, ReflexError

    eng = Engine(args.model, n_ctx=args.ctx)
    if eng.template is None:
        raise InvalidRequest(f"{eng.path} has no chat template; use `reflex generate`")
    kw = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
              repeat_last_n=args.repeat_last_n, seed=args.seed)
    base = [{"role": "system", "content": args.system}] if args.system else []
    history = list(base)
    tty = sys.stdin.isatty()
    print(f"reflex chat: {eng.path.name} (n_ctx {eng.n_ctx}). {HELP}", file=sys.stderr)
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\r\n")
        cmd = text.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            break
        if cmd == "/reset":
            history = list(base)
            print("(conversation reset)", file=sys.stderr)
            continue
        if cmd.startswith("/") and " " not in cmd:
            print(f"unknown command {cmd}; {HELP}", file=sys.stderr)
            continue
        msgs = history + [{"role": "user", "content": text}]
        try:
            it = eng.chat(msgs, stream=True, **kw)
            for piece in it:
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        except ReflexError as e:
            if not args.json:
                sys.stdout.write("\n")
            print(f"reflex chat: error [{e.category}]: {e}"
                  + (" (try /reset)" if e.category == "context_overflow" else ""), file=sys.stderr)
            if args.json:
                print(json.dumps(e.to_json()), flush=True)
            continue
        res = it.result
        history = msgs + [{"role": "assistant", "content": res.text}]
        if args.json:
            d = res.to_dict()
            d["turn"] = sum(1 for m in history if m["role"] == "user")
            print(json.dumps(d, ensure_ascii=False), flush=True)
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
        if args.timings:
            print(f"[{res.finish_reason}] " + format_timings(res.timings, res.usage), file=sys.stderr)
    return 0
