"""`reflex-adapter`: serve OpenAI-compatible HTTP over Reflex engines.

    reflex-adapter --model smollm2 --model minilm --port 8000
    reflex-adapter --connect smollm2=/run/reflex/engine.sock      # an engine started elsewhere

Each --model NAME[=MODEL] starts one `reflex uds` engine (served as NAME); each --connect
NAME=SOCKET uses an engine that is already running. The API key comes from --api-key or
$REFLEX_API_KEY (none: no authentication)."""
from __future__ import annotations

import argparse
import os
import sys


def _pair(s: str, need_value: bool):
    name, sep, value = s.partition("=")
    if not name or (need_value and not value):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {s!r}")
    return name, (value or name)


def build_parser():
    p = argparse.ArgumentParser(prog="reflex-adapter", description=__doc__.split("\n")[0])
    p.add_argument("--model", "-m", action="append", default=[], type=lambda s: _pair(s, False),
                   metavar="NAME[=MODEL]", help="start an engine for MODEL (alias or path), served as NAME")
    p.add_argument("--connect", action="append", default=[], type=lambda s: _pair(s, True),
                   metavar="NAME=SOCKET", help="use an engine already listening on SOCKET")
    p.add_argument("--rag", action="append", default=[], type=lambda s: _pair(s, True),
                   metavar="ALIAS=INDEX[:CHAT]", help="serve ALIAS as a chat model that answers from "
                   "INDEX (chat engine CHAT, default the first --model)")
    p.add_argument("--rag-embed", default=None, metavar="NAME",
                   help="engine that embeds queries (default: a served model named minilm)")
    p.add_argument("--rag-top-k", type=int, default=4)
    p.add_argument("--indexes-dir", default=None, help="where indexes live (default rag's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ctx", type=int, default=None, help="engine context size")
    p.add_argument("--backend", default="numpy", help="engine backend (numpy, cuda)")
    p.add_argument("--api-key", default=os.environ.get("REFLEX_API_KEY"))
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--max-prompt-chars", type=int, default=200_000)
    p.add_argument("--max-queue", type=int, default=8, help="requests waiting per engine before 429")
    p.add_argument("--queue-timeout", type=float, default=30.0, help="seconds a request waits before 503")
    p.add_argument("--log-level", default="warning")
    return p


def make_config(args):
    from adapter.app import Config
    from adapter.supervisor import EngineSlot

    slots = {}
    kw = dict(ctx=args.ctx, backend=args.backend, max_queue=args.max_queue,
              queue_timeout=args.queue_timeout)
    for name, model in args.model:
        slots[name] = EngineSlot(name, model=model, **kw)
    for name, sock in args.connect:
        slots[name] = EngineSlot(name, socket_path=sock, **kw)
    first = next(iter(slots), None)
    aliases = {}
    for alias, spec in args.rag:
        index, _, chat = spec.partition(":")
        aliases[alias] = (index, chat or first)
    embed = args.rag_embed or ("minilm" if "minilm" in slots else None)
    indexes_dir = args.indexes_dir
    if indexes_dir is None and (aliases or embed):
        try:
            from rag.index import default_indexes_dir
            indexes_dir = str(default_indexes_dir())
        except ImportError:
            indexes_dir = None
    return Config(api_key=args.api_key or None, max_body_bytes=args.max_body_bytes,
                  max_prompt_chars=args.max_prompt_chars, slots=slots, rag_aliases=aliases,
                  rag_embed=embed, indexes_dir=indexes_dir, rag_top_k=args.rag_top_k)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.model and not args.connect:
        args.model = [("smollm2", "smollm2")]
    import uvicorn

    from adapter.app import create_app

    app = create_app(make_config(args))
    print(f"reflex-adapter: http://{args.host}:{args.port} serving "
          f"{', '.join([n for n, _ in args.model + args.connect] + [a for a, _ in args.rag])}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
