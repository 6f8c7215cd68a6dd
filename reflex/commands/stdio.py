"""`reflex stdio -m MODEL [--ctx N] [--backend B]`: serve the IPC protocol (JSON lines) on
stdin/stdout until EOF or a shutdown request. Protocol: reflex/ipc.py, docs/reference.md."""
from __future__ import annotations

import sys


def add_server_arguments(p):
    p.add_argument("-m", "--model", default="smollm2", help="GGUF path, file name, or alias (default smollm2)")
    p.add_argument("--ctx", type=int, default=None, help="context size (default min(model, 4096))")
    p.add_argument("--backend", default="numpy", help="compute backend (default numpy)")


def load_engine(args):
    from reflex.engine import Engine

    eng = Engine(args.model, n_ctx=args.ctx, backend=args.backend)
    print(f"reflex: loaded {eng.path} in {eng.load_s:.2f} s (n_ctx {eng.n_ctx})", file=sys.stderr)
    return eng


add_arguments = add_server_arguments


def run(args) -> int:
    import json

    from reflex import ipc
    from reflex.errors import ReflexError

    out = ipc.protocol_stdout()
    try:
        eng = load_engine(args)
    except ReflexError as e:
        # the client reads stdout: tell it why there will be no hello, then exit with the code
        out.write((json.dumps(ipc.error_event(e.category, str(e))) + "\n").encode())
        print(f"reflex stdio: error [{e.category}]: {e}", file=sys.stderr)
        return e.exit_code
    ipc.serve_stdio(ipc.Server(eng, backend=args.backend), out)
    return 0
