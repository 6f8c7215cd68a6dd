"""Model architectures, dispatched by the GGUF `general.architecture` string.

`load_model(gguf_file, backend)` accepts a path or an open `GGUFFile` and a backend instance or
name, and returns a model with `new_cache(n_ctx)` and `forward(token_ids, cache)`.
"""
from __future__ import annotations

import importlib
import os

from reflex.errors import ModelFormatError, UnsupportedArchitecture

# architecture string -> module under reflex.models
ARCHITECTURES = {
    "llama": "llama",
    "bert": "bert",
    "gemma3": "gemma3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "qwen35": "qwen35",
    "gemma4": "gemma4",
    "deepseek2": "deepseek2",
    "granitehybrid": "granitehybrid",
    "llama-embed": "llama_embed",
}
# other spellings of the same architecture
ALIASES = {
    "llama2": "llama",
    "llama3": "llama",
    "smollm": "llama",
    "smollm2": "llama",
    "gemma3_text": "gemma3",
}


def resolve_arch(arch: str) -> str:
    name = ALIASES.get(arch, arch)
    if name not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedArchitecture(f"unsupported architecture {arch!r} (supported: {known})")
    return name


def load_model(gguf_file, backend="numpy"):
    from reflex.backends import Backend, get_backend

    if isinstance(gguf_file, (str, os.PathLike)):
        from reflex.gguf import GGUFFile

        gguf_file = GGUFFile(gguf_file)
    if not isinstance(backend, Backend):
        backend = get_backend(backend)
    arch = gguf_file.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFormatError("missing metadata key 'general.architecture'", kind="missing_key")
    name = resolve_arch(arch)
    mod = importlib.import_module(f"reflex.models.{ARCHITECTURES[name]}")
    return mod.load(gguf_file, backend, arch=arch)
