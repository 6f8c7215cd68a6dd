"""Synthetic GGUF models: a real model's shapes and metadata, random weights.

`synthesize(real, out, ...)` copies every metadata key of REAL (tokenizer arrays included, so the real
tokenizer comes along), and writes each tensor with seeded random values quantized to its type (the
real file's type, or a forced one). 2-D+ weights ~ N(0, 0.02); 1-D tensors are kept F32: norm weights
~ 1.0 (+ N(0, 0.02)), other 1-D tensors (biases) ~ N(0, 0.02). Each tensor's generator is seeded by
(seed, crc32(name)), so a tensor's values don't depend on which other tensors are kept.

Reading uses reflex.gguf; writing uses gguf.GGUFWriter (imported lazily). Metadata copying is shared
with `reflex quantize` (reflex.commands.quantize._copy_metadata).
"""
from __future__ import annotations

import re
import sys
import types
import zlib

import numpy as np

from reflex.quants import QUANTS, quantize

STD = 0.02
_FALLBACK = "Q4_K"
_BLK = re.compile(r"^blk\.(\d+)\.")


def type_by_name(name: str) -> int:
    for t, q in QUANTS.items():
        if q.name.upper() == name.upper():
            return t
    raise ValueError(f"unknown ggml type {name!r}; known: {', '.join(q.name for q in QUANTS.values())}")


def _writable(t: int) -> bool:
    return t in QUANTS and bool(getattr(QUANTS[t], "can_quantize", False))


def _pick_type(name: str, want: int, ncols: int, warn) -> int:
    """`want` if it can be written for rows of `ncols`, else a fallback (said on stderr via warn)."""
    t = want
    if not _writable(t):
        fb = type_by_name(_FALLBACK)
        warn(f"{name}: cannot write {QUANTS[t].name if t in QUANTS else t}; using {_FALLBACK}")
        t = fb
    if ncols % QUANTS[t].block_size:
        for alt in ("Q8_0", "F16", "F32"):
            a = type_by_name(alt)
            if _writable(a) and ncols % QUANTS[a].block_size == 0:
                warn(f"{name}: row of {ncols} not a multiple of {QUANTS[t].name} block "
                     f"{QUANTS[t].block_size}; using {alt}")
                return a
    return t


def random_tensor(name: str, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])
    x = rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(STD)
    if len(shape) == 1 and "norm" in name:
        x += np.float32(1.0)
    return x


def synthesize(real_path, out_path, type_name: str | None = None, seed: int = 0, layers: int | None = None,
               vocab_only: bool = False, log=None) -> dict:
    """Write OUT_PATH; returns a summary {"tensors": {type: count}, "fallbacks": n, "block_count": n}."""
    import gguf
    from reflex.commands.quantize import _copy_metadata
    from reflex.gguf import GGUFFile

    warn = (lambda m: print(f"synth: {m}", file=sys.stderr))
    forced = type_by_name(type_name) if type_name else None
    counts: dict[str, int] = {}
    fallbacks = [0]

    def _warn(m):
        fallbacks[0] += 1
        warn(m)

    with GGUFFile(real_path) as src:
        arch = src.arch
        meta = dict(src.metadata)
        bc_key = f"{arch}.block_count"
        block_count = int(meta[bc_key]) if bc_key in meta else None
        if layers is not None and not vocab_only:
            if layers < 1:
                raise ValueError("--layers must be >= 1")
            if block_count is not None:
                layers = min(layers, block_count)
                meta[bc_key] = layers
                block_count = layers
        view = types.SimpleNamespace(metadata=meta, metadata_types=src.metadata_types)

        writer = gguf.GGUFWriter(str(out_path), arch)
        if "general.alignment" in src.metadata:
            writer.add_custom_alignment(int(src.metadata["general.alignment"]))
        _copy_metadata(view, writer, gguf)

        if not vocab_only:
            for name, ti in src.tensors.items():
                m = _BLK.match(name)
                if layers is not None and m and int(m.group(1)) >= layers:
                    continue
                shape = tuple(int(s) for s in ti.shape)
                x = random_tensor(name, shape, seed)
                if len(shape) == 1:
                    t = type_by_name("F32")
                else:
                    t = _pick_type(name, forced if forced is not None else int(ti.ggml_type), shape[-1], _warn)
                raw = quantize(x, t).reshape(*shape[:-1], -1)  # byte rows; the writer infers ne
                writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(t))
                counts[QUANTS[t].name] = counts.get(QUANTS[t].name, 0) + 1
                if log:
                    log(f"{name}: {QUANTS[t].name} {shape}")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return {"tensors": counts, "fallbacks": fallbacks[0], "block_count": block_count}
