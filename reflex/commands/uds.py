"""`reflex uds --socket PATH -m MODEL [--ctx N] [--backend B]`: serve the IPC protocol on a Unix
socket (mode 0600), one client at a time; others get a `busy` error. The socket is bound before the
model loads (a bad path fails at once; early clients wait in the backlog for the hello) and removed
on exit (shutdown request, SIGTERM, SIGINT)."""
from __future__ import annotations

import sys

from reflex.commands.stdio import add_server_arguments, load_engine


def add_arguments(p):
    p.add_argument("--socket", "-s", required=True, help="Unix socket path to create")
    add_server_arguments(p)


def run(args) -> int:
    import os

    from reflex import ipc

    import signal

    sock, ino = ipc.bind_unix_socket(args.socket)
    # SIGTERM during the model load must still remove the socket (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        eng = load_engine(args)
    except BaseException:
        sock.close()
        if os.stat(args.socket).st_ino == ino:
            os.unlink(args.socket)
        raise
    print(f"reflex: serving on {args.socket}", file=sys.stderr)
    ipc.serve_uds(ipc.Server(eng, backend=args.backend), sock, args.socket, ino)
    return 0
