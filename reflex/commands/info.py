"""`reflex info MODEL [--json]`: describe a GGUF model without loading its weights."""
from __future__ import annotations

import json
from pathlib import Path



def resolve_model(model: str) -> Path:
    # One resolver for the whole CLI: paths, file names in the models dir, and aliases.
    from reflex.store import resolve

    return resolve(model)


def add_arguments(parser):
    parser.add_argument("model", help="GGUF path, or a file name in the models dir")


def describe(path) -> dict:
    from reflex.gguf import GGUFFile
    from reflex.gguf.constants import GGML_QUANT_SIZES, type_name

    with GGUFFile(path) as f:
        md = f.metadata
        arch = f.arch
        n_params = 0
        mix: dict = {}
        total = 0
        for t in f.tensors.values():
            n_params += t.n_elements
            total += t.nbytes
            e = mix.setdefault(type_name(t.ggml_type), {"tensors": 0, "bytes": 0})
            e["tensors"] += 1
            e["bytes"] += t.nbytes
        tokens = md.get("tokenizer.ggml.tokens")
        vocab = md.get(f"{arch}.vocab_size")
        if vocab is None and tokens is not None:
            vocab = len(tokens)
        special = {}
        for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
                          ("pad", "padding_token_id"), ("unk", "unknown_token_id")):
            tid = md.get(f"tokenizer.ggml.{key}")
            text = None
            if isinstance(tid, int) and tokens is not None and 0 <= tid < len(tokens):
                text = tokens[tid]
            special[name] = {"id": tid if isinstance(tid, int) else None, "text": text}
        return {
            "path": str(path),
            "name": md.get("general.name"),
            "architecture": arch,
            "gguf_version": f.version,
            "parameter_count": int(n_params),
            "tensor_count": len(f.tensors),
            "tensor_bytes": int(total),
            "file_bytes": f.size,
            "quant_mix": dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"])),
            "vocab_size": int(vocab) if vocab is not None else None,
            "context_length": md.get(f"{arch}.context_length"),
            "embedding_length": md.get(f"{arch}.embedding_length"),
            "block_count": md.get(f"{arch}.block_count"),
            "tokenizer_model": md.get("tokenizer.ggml.model"),
            "special_tokens": special,
            "chat_template": isinstance(md.get("tokenizer.chat_template"), str),
        }


def run(args) -> int:
    d = describe(resolve_model(args.model))
    if args.json:
        print(json.dumps(d))
        return 0
    print(f"{d['path']}")
    print(f"  architecture    {d['architecture']}  (GGUF v{d['gguf_version']}, name={d['name']!r})")
    print(f"  parameters      {d['parameter_count']:,}")
    print(f"  tensors         {d['tensor_count']}  ({d['tensor_bytes'] / 2**20:.1f} MiB of tensor data)")
    print("  quant mix")
    for t, e in d["quant_mix"].items():
        print(f"    {t:<8} {e['tensors']:>4} tensors  {e['bytes'] / 2**20:9.2f} MiB")
    print(f"  vocab size      {d['vocab_size']}")
    print(f"  context length  {d['context_length']}")
    for k, v in d["special_tokens"].items():
        if v["id"] is not None:
            print(f"  {k + ' token':<15} {v['id']} {v['text']!r}")
    print(f"  chat template   {'yes' if d['chat_template'] else 'no'}")
    return 0
