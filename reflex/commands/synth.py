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
    parser.add_argument("--preset", default=None,
                        help="shapes of a known model (smollm2-135m, qwen3-0.6b, qwen2-0.5b, gemma3-270m, "
                             "qwen3moe-30b-a3b-small, minilm-l6) instead of INPUT's tensors; INPUT then only "
                             "gives metadata and tokenizer (a vocab-only file)")
    parser.add_argument("--workers", type=int, default=None,
                        help="--preset: processes making tensors (default: one per CPU above 200M params)")


def run(args) -> int:
    from reflex.synth import synthesize, type_by_name

    if args.type:
        try:
            type_by_name(args.type)
        except ValueError as e:
            raise InvalidRequest(str(e))
    if args.layers is not None and args.layers < 1:
        raise InvalidRequest("--layers must be >= 1")
    if args.workers is not None and args.workers < 1:
        raise InvalidRequest("--workers must be >= 1")
    t0 = time.perf_counter()
    if args.preset:
        from reflex.synth import PRESETS, synthesize_preset

        if args.preset not in PRESETS:
            raise InvalidRequest(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
        res = synthesize_preset(args.input, args.output, args.preset, seed=args.seed, layers=args.layers,
                                type_name=args.type, workers=args.workers)
    else:
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
