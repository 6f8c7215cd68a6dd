"""`reflex synth REAL OUT`: a random-weight model with a real model's shapes and metadata."""
from __future__ import annotations

import sys
import time

from reflex.errors import InvalidRequest


def add_arguments(parser) -> None:
    parser.add_argument("input", help="real GGUF file (shapes, metadata and tokenizer source)")
    parser.add_argument("output", help="destination GGUF file")
    parser.add_argument("--type", default=None,
                        help="ggml type for every 2-D+ weight, e.g. Q4_K, Q4_1, Q8_0, F16 "
                             "(default: each tensor's type in the real file)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--layers", type=int, default=None, help="keep only blk.0..N-1")
    parser.add_argument("--vocab-only", action="store_true", help="metadata only, no tensors")


def run(args) -> int:
    from reflex.synth import synthesize, type_by_name

    if args.type:
        try:
            type_by_name(args.type)
        except ValueError as e:
            raise InvalidRequest(str(e))
    if args.layers is not None and args.layers < 1:
        raise InvalidRequest("--layers must be >= 1")
    t0 = time.perf_counter()
    res = synthesize(args.input, args.output, type_name=args.type, seed=args.seed, layers=args.layers,
                     vocab_only=args.vocab_only)
    dt = time.perf_counter() - t0
    if getattr(args, "json", False):
        import json
        print(json.dumps({"output": args.output, "seconds": dt, **res}))
    else:
        summary = ", ".join(f"{k}: {v}" for k, v in res["tensors"].items()) or "no tensors"
        print(f"wrote {args.output} ({summary})")
    print(f"synth: {dt:.2f} s", file=sys.stderr)
    return 0
