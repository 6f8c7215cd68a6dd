"""`reflex fetch [NAME...]`: download and sha256-verify the default models into the models dir."""
from __future__ import annotations

import json
import sys


def add_arguments(p):
    p.add_argument("names", nargs="*", help="models to fetch (default: all known)")
    p.add_argument("--force", action="store_true", help="download even if present and valid")


def run(args) -> int:
    from reflex import store

    names = args.names or list(store.KNOWN)
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    paths = {n: str(store.fetch(n, force=args.force, log=log)) for n in names}
    if args.json:
        print(json.dumps({"models": paths}))
    else:
        for n, p in paths.items():
            print(f"{n}\t{p}")
    return 0
