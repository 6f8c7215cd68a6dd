"""`reflex quantize IN OUT TYPE`: re-quantize a GGUF file.

2-D weight tensors whose rows divide into TYPE's blocks are quantized to TYPE (others that don't fit
fall back to F32); 1-D tensors (norms, biases) are stored F32. All metadata is copied. Reading uses
reflex.gguf; writing uses gguf.GGUFWriter (imported lazily).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from reflex.errors import InvalidRequest
from reflex.quants import QUANTS, dequantize, quantize

# GGUF metadata value type ids
_ARRAY = 9
_NP_TO_GGUF = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.uint16): 2, np.dtype(np.int16): 3,
               np.dtype(np.uint32): 4, np.dtype(np.int32): 5, np.dtype(np.float32): 6, np.dtype(np.bool_): 7,
               np.dtype(np.uint64): 10, np.dtype(np.int64): 11, np.dtype(np.float64): 12}
_STRING = 8
_SKIP_KEYS = {"general.architecture", "general.alignment"}  # the writer sets these itself


def _type_by_name(name: str) -> int:
    for t, q in QUANTS.items():
        if q.name.upper() == name.upper() and q.can_quantize:
            return t
    ok = ", ".join(q.name for q in QUANTS.values() if q.can_quantize)
    raise InvalidRequest(f"cannot quantize to {name!r}; choose one of: {ok}")


def add_arguments(parser) -> None:
    parser.add_argument("input", help="source GGUF file")
    parser.add_argument("output", help="destination GGUF file")
    parser.add_argument("type", help="target type for 2-D weights, e.g. Q8_0, Q4_K, Q6_K")


def _copy_metadata(src, writer, gguf) -> None:
    V = gguf.GGUFValueType
    for key, val in src.metadata.items():
        if key in _SKIP_KEYS:
            continue
        vtype = src.metadata_types[key]
        if vtype != _ARRAY:
            writer.add_key_value(key, val, V(vtype))
            continue
        if isinstance(val, np.ndarray):
            sub = _NP_TO_GGUF[val.dtype]
            items = val.tolist()
        elif isinstance(val, list):  # nested arrays
            sub, items = _ARRAY, [v.tolist() for v in val]
        else:  # string array
            sub, items = _STRING, list(val.tolist())
        writer.add_key_value(key, items, V.ARRAY, sub_type=V(sub))


def convert(in_path, out_path, target: int, log=None) -> dict:
    import gguf
    from reflex.gguf import GGUFFile

    q = QUANTS[target]
    counts: dict[str, int] = {}
    with GGUFFile(in_path) as src:
        writer = gguf.GGUFWriter(out_path, src.arch)
        if "general.alignment" in src.metadata:
            writer.add_custom_alignment(int(src.metadata["general.alignment"]))
        _copy_metadata(src, writer, gguf)
        for name, ti in src.tensors.items():
            x = dequantize(src.tensor_bytes(name), ti.ggml_type, ti.shape)
            if x.ndim == 2 and x.shape[-1] % q.block_size == 0 and target != 0:
                raw = quantize(x, target).reshape(x.shape[0], -1)
                writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(target))
                counts[q.name] = counts.get(q.name, 0) + 1
            else:
                writer.add_tensor(name, np.ascontiguousarray(x, np.float32))
                counts["F32"] = counts.get("F32", 0) + 1
            if log:
                log(f"{name}: {QUANTS[ti.ggml_type].name} -> {q.name if x.ndim == 2 else 'F32'} {ti.shape}")
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return counts


def run(args) -> int:
    target = _type_by_name(args.type)
    t0 = time.perf_counter()
    counts = convert(args.input, args.output, target)
    dt = time.perf_counter() - t0
    summary = ", ".join(f"{k}: {v}" for k, v in counts.items())
    if getattr(args, "json", False):
        import json
        print(json.dumps({"output": args.output, "type": QUANTS[target].name, "tensors": counts, "seconds": dt}))
    else:
        print(f"wrote {args.output} ({summary})")
    print(f"quantize: {dt:.2f} s", file=sys.stderr)
    return 0
