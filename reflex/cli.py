"""`reflex` command line. Subcommands live in reflex/commands/<name>.py and are imported only when
used, so `reflex info` does not pay for what `reflex quantize` needs.

Each command module defines `add_arguments(parser)` and `run(args) -> int`.
Results go to stdout (JSON with --json); progress and timings to stderr.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from reflex.errors import ReflexError

# name -> (module, one-line help)
COMMANDS = {
    "fetch": ("reflex.commands.fetch", "download and verify the default models"),
    "info": ("reflex.commands.info", "describe a GGUF model"),
    "tokenize": ("reflex.commands.tokenize", "tokenize text with a model's tokenizer"),
    "quantize": ("reflex.commands.quantize", "re-quantize a GGUF file"),
    "synth": ("reflex.commands.synth", "write a random-weight model with a real model's shapes"),
    "generate": ("reflex.commands.generate", "generate text from a prompt"),
    "smoke": ("reflex.commands.smoke", "end-to-end check: one greedy chat answer with timings"),
    "chat": ("reflex.commands.chat", "interactive multi-turn chat"),
    "stdio": ("reflex.commands.stdio", "serve the IPC protocol (JSON lines) on stdin/stdout"),
    "uds": ("reflex.commands.uds", "serve the IPC protocol on a Unix socket (mode 0600)"),
    "system1": ("reflex.commands.system1", "score candidate continuations of a context in one forward"),
    "classify": ("reflex.commands.classify", "probability per label for a text"),
    "convert": ("reflex.commands.convert", "convert a BERT safetensors checkpoint to GGUF"),
    "embed": ("reflex.commands.embed", "embed texts with an embedding model"),
    "bench": ("reflex.commands.bench", "cold TTFT, prefill/decode tok/s, memory, energy (vs llama.cpp)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="reflex", description="Reflex inference engine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    # Parse only the command name first; then let that command's module build its own parser.
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help(sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    name = argv[0]
    mod = importlib.import_module(COMMANDS[name][0])
    p = argparse.ArgumentParser(prog=f"reflex {name}", description=COMMANDS[name][1])
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    mod.add_arguments(p)
    args = p.parse_args(argv[1:])
    try:
        return int(mod.run(args) or 0)
    except ReflexError as e:
        if getattr(args, "json", False):
            print(json.dumps(e.to_json()))
        print(f"reflex {name}: error [{e.category}]: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
