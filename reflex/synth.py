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

import os
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
    if len(shape) == 1 and "norm" in name and not name.endswith(".bias"):  # LayerNorm biases stay ~0
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


# ---- presets: a real model's shapes without the real file (device benchmarks, GPU tests) -------
# Each preset gives the {arch}.* hyperparameters, a function (layer, tensor) -> ggml type name
# mirroring the real file's quant mix, and that mix's general.file_type (llama_ftype: ALL_F32 0,
# MOSTLY_Q4_1 3, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15; dropped under a forced --type).
# The tokenizer (and vocab size) come from a vocab-only GGUF.

def _smollm2_type(i, t):
    return "Q8_0" if t == "token_embd" else "Q4_1"


def _gemma3_type(i, t):
    return {"token_embd": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K"}.get(t, "Q5_0")


def _qwen3_q4_k_m_type(n_layer):
    # llama.cpp's Q4_K_M: Q6_K for attn_v / ffn_down in the first and last eighth of the layers and
    # every third one between; Q6_K for the (tied) embedding/output; Q4_K elsewhere
    def f(i, t):
        if t == "token_embd":
            return "Q6_K"
        if t in ("attn_v", "ffn_down") and (i < n_layer // 8 or i >= 7 * n_layer // 8
                                            or (i - n_layer // 8) % 3 == 2):
            return "Q6_K"
        return "Q4_K"
    return f


def _qwen3moe_q4_k_m_type(n_layer):
    # llama.cpp's Q4_K_M on an untied MoE: output Q6_K, token_embd Q4_K, the router ffn_gate_inp F32
    # (llama-quantize never quantizes it); ffn_down_exps follows ffn_down's Q6_K rule
    dense = _qwen3_q4_k_m_type(n_layer)

    def f(i, t):
        if t in ("token_embd", "output", "ffn_gate_inp"):
            return {"token_embd": "Q4_K", "output": "Q6_K", "ffn_gate_inp": "F32"}[t]
        return dense(i, t[:-len("_exps")] if t.endswith("_exps") else t)
    return f


PRESETS = {
    # SmolLM2-135M (llama): 30 layers, Q4_1 with a Q8_0 embedding, tied output
    "smollm2-135m": dict(arch="llama", hp=dict(embedding_length=576, block_count=30, feed_forward_length=1536,
                         **{"attention.head_count": 9, "attention.head_count_kv": 3, "rope.freq_base": 100000.0,
                            "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": 64},
                         context_length=8192), types=_smollm2_type, file_type=3),
    # Qwen3-0.6B (qwen3): head_dim 128 (q is 2048 wide), q/k norms, Q4_K_M-like mix
    "qwen3-0.6b": dict(arch="qwen3", hp=dict(embedding_length=1024, block_count=28, feed_forward_length=3072,
                       **{"attention.head_count": 16, "attention.head_count_kv": 8, "rope.freq_base": 1000000.0,
                          "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length": 128,
                          "attention.value_length": 128}, context_length=40960),
                       types=_qwen3_q4_k_m_type(28), file_type=15),
    # Qwen2.5-0.5B (qwen2): q/k/v biases, NEOX rope, tied output; a Q8_0 file (896 is no multiple of 256)
    "qwen2-0.5b": dict(arch="qwen2", hp=dict(embedding_length=896, block_count=24, feed_forward_length=4864,
                       **{"attention.head_count": 14, "attention.head_count_kv": 2, "rope.freq_base": 1000000.0,
                          "attention.layer_norm_rms_epsilon": 1e-6}, context_length=32768),
                       types=lambda i, t: "Q8_0", file_type=7),
    # Gemma-3-270M (gemma3): 18 layers, head_dim 256, 1 kv head, sliding window 512, real file's mix
    "gemma3-270m": dict(arch="gemma3", hp=dict(embedding_length=640, block_count=18, feed_forward_length=2048,
                        **{"attention.head_count": 4, "attention.head_count_kv": 1, "rope.freq_base": 1000000.0,
                           "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length": 256,
                           "attention.value_length": 256, "attention.sliding_window": 512},
                        context_length=32768), types=_gemma3_type, file_type=15),
    # Qwen3-30B-A3B (qwen3moe) per layer: n_embd 2048, 32 q heads / 4 kv heads of 128, 128 experts of 768,
    # top-8 renormalized (norm_topk_prob; llama.cpp always renormalizes qwen3moe, so the converter writes
    # no expert_weights_norm key), untied output. 4 of the real 48 layers (~623M params each): ~1.6 GB
    # in the Q4_K_M-like mix with a 49,152-token vocab
    "qwen3moe-30b-a3b-small": dict(arch="qwen3moe", file_type=15, hp=dict(
        embedding_length=2048, block_count=4, feed_forward_length=6144, expert_feed_forward_length=768,
        expert_count=128, expert_used_count=8,
        **{"attention.head_count": 32, "attention.head_count_kv": 4, "rope.freq_base": 1000000.0,
           "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length": 128, "attention.value_length": 128},
        context_length=40960), types=_qwen3moe_q4_k_m_type(4)),
    # all-MiniLM-L6-v2 (bert) as `reflex convert` writes it: F32, position_embd / token_types kept F32
    # under a forced type (as convert.tensor_type), MEAN pooling, 2 token types (from the vocab file)
    "minilm-l6": dict(arch="bert", file_type=0, hp=dict(
                      embedding_length=384, block_count=6, feed_forward_length=1536,
                      **{"attention.head_count": 12, "attention.layer_norm_epsilon": 1e-12,
                         "attention.causal": False, "pooling_type": 1}, context_length=512),
                      types=lambda i, t: "F32"),
}


# 2-D tensors a forced --type leaves F32: the MoE router (llama-quantize never quantizes it) and
# BERT's position / token-type tables (reflex.convert.tensor_type keeps them F32)
KEEP_F32 = ("ffn_gate_inp.weight", "position_embd.weight", "token_types.weight")


def preset_tensors(arch: str, hp: dict, n_vocab: int, types, n_token_types: int = 2) -> list:
    """[(name, shape in numpy order, type name)] of a model with these hyperparameters.
    Tensors named in KEEP_F32 stay F32 even under a forced type."""
    if arch == "bert":
        return _bert_tensors(hp, n_vocab, types, n_token_types)
    E, F, L = hp["embedding_length"], hp["feed_forward_length"], hp["block_count"]
    H, Hkv = hp["attention.head_count"], hp["attention.head_count_kv"]
    d = hp.get("attention.key_length", E // H)
    out = [("token_embd.weight", (n_vocab, E), types(-1, "token_embd"))]
    if arch == "qwen3moe":  # untied, as the real family
        out.append(("output.weight", (n_vocab, E), types(-1, "output")))
    for i in range(L):
        p = f"blk.{i}."
        ts = [("attn_norm", (E,)), ("attn_q", (H * d, E)), ("attn_k", (Hkv * d, E)), ("attn_v", (Hkv * d, E)),
              ("attn_output", (E, H * d)), ("ffn_norm", (E,))]
        if arch == "qwen3moe":
            X, Fe = hp["expert_count"], hp["expert_feed_forward_length"]
            ts += [("ffn_gate_inp", (X, E)), ("ffn_gate_exps", (X, Fe, E)), ("ffn_up_exps", (X, Fe, E)),
                   ("ffn_down_exps", (X, E, Fe))]  # (n_expert, n_out, n_in)
        else:
            ts += [("ffn_gate", (F, E)), ("ffn_up", (F, E)), ("ffn_down", (E, F))]
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            ts += [("attn_q_norm", (d,)), ("attn_k_norm", (d,))]
        if arch == "gemma3":
            ts += [("post_attention_norm", (E,)), ("post_ffw_norm", (E,))]
        for t, shape in ts:
            out.append((p + t + ".weight", shape, "F32" if len(shape) == 1 else types(i, t)))
        if arch == "qwen2":
            out += [(p + "attn_q.bias", (H * d,), "F32"), (p + "attn_k.bias", (Hkv * d,), "F32"),
                    (p + "attn_v.bias", (Hkv * d,), "F32")]
    out.append(("output_norm.weight", (E,), "F32"))
    return out


def _bert_tensors(hp, n_vocab, types, n_tt) -> list:
    # the names reflex.convert.gguf_name gives a BertModel (no pooler: sentence-transformers drops it)
    E, F, L = hp["embedding_length"], hp["feed_forward_length"], hp["block_count"]
    n_ctx = hp["context_length"]
    out = [("token_embd_norm.bias", (E,), "F32"), ("token_embd_norm.weight", (E,), "F32"),
           ("position_embd.weight", (n_ctx, E), "F32"), ("token_types.weight", (n_tt, E), "F32"),
           ("token_embd.weight", (n_vocab, E), types(-1, "token_embd"))]
    for i in range(L):
        p = f"blk.{i}."
        for t, shape in (("attn_q", (E, E)), ("attn_k", (E, E)), ("attn_v", (E, E)), ("attn_output", (E, E)),
                         ("ffn_up", (F, E)), ("ffn_down", (E, F))):
            out += [(p + t + ".weight", shape, types(i, t)), (p + t + ".bias", shape[:1], "F32")]
        for t in ("attn_output_norm", "layer_output_norm"):
            out += [(p + t + ".weight", (E,), "F32"), (p + t + ".bias", (E,), "F32")]
    return out


def _make_tensor(job) -> np.ndarray:
    """(name, shape, type name, seed) -> the tensor's bytes as rows (process-pool worker)."""
    name, shape, tname, seed = job
    x = random_tensor(name, shape, seed)
    return quantize(x, type_by_name(tname)).reshape(*shape[:-1], -1)


def synthesize_preset(vocab_path, out_path, preset: str, seed: int = 0, layers: int | None = None,
                      type_name: str | None = None, overrides: dict | None = None, log=None,
                      workers: int | None = None) -> dict:
    """Write a random-weight model of a PRESETS shape; metadata and tokenizer from VOCAB_PATH (any
    GGUF, e.g. one written with --vocab-only). `overrides` replace hyperparameters (tiny test
    models); `type_name` forces one type for every 2-D weight the preset does not keep F32.
    `workers`: processes generating + quantizing tensors (default: one per CPU for models over 200M
    parameters, else 1); the bytes don't depend on it (each tensor is seeded by its name)."""
    import gguf
    from reflex.commands.quantize import _copy_metadata
    from reflex.gguf import GGUFFile

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    pr = PRESETS[preset]
    arch, hp = pr["arch"], dict(pr["hp"])
    hp.update(overrides or {})
    if layers is not None:
        if layers < 1:
            raise ValueError("--layers must be >= 1")
        hp["block_count"] = min(layers, hp["block_count"])
    with GGUFFile(vocab_path) as src:
        toks = src.get("tokenizer.ggml.tokens", None)
        if toks is None:
            raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
        n_vocab = len(toks)
        n_tt = int(src.get("tokenizer.ggml.token_type_count", 2))
        meta = {k: v for k, v in src.metadata.items() if not k.startswith(src.arch + ".")}
        mtypes = dict(src.metadata_types)
        meta["general.architecture"] = arch
        # the vocab file's name / file type describe another model (llama.cpp and llama-bench print them)
        meta["general.name"] = preset
        mtypes["general.name"] = 8  # STRING
        meta.pop("general.file_type", None)
        if "file_type" in pr and not type_name:
            meta["general.file_type"], mtypes["general.file_type"] = pr["file_type"], 4
        for k, v in hp.items():
            meta[f"{arch}.{k}"] = v
        meta[f"{arch}.vocab_size"] = n_vocab
        for k, v in list(meta.items()):
            if k.startswith(arch + ".") and k not in mtypes:
                # GGUFValueType BOOL / FLOAT32 / UINT32
                mtypes[k] = 7 if isinstance(v, bool) else 6 if isinstance(v, float) else 4
        view = types.SimpleNamespace(metadata=meta, metadata_types=mtypes)
        writer = gguf.GGUFWriter(str(out_path), arch)
        _copy_metadata(view, writer, gguf)
    counts: dict[str, int] = {}
    jobs = []
    for name, shape, tname in preset_tensors(arch, hp, n_vocab, pr["types"], n_tt):
        if len(shape) > 1 and type_name and not name.endswith(KEEP_F32):
            tname = type_name
        jobs.append((name, tuple(shape), tname, seed))
    n_params = sum(int(np.prod(j[1])) for j in jobs)
    if workers is None:
        workers = (os.cpu_count() or 1) if n_params > 200_000_000 else 1
    workers = max(1, min(int(workers), len(jobs)))
    pool = None
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=workers)
        made = pool.map(_make_tensor, jobs)  # in order; the writer keeps every tensor until it writes
    else:
        made = map(_make_tensor, jobs)
    try:
        for (name, shape, tname, _), raw in zip(jobs, made):
            writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType(type_by_name(tname)))
            counts[tname] = counts.get(tname, 0) + 1
            if log:
                log(f"{name}: {tname} {shape}")
    finally:
        if pool is not None:
            pool.shutdown()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"tensors": counts, "fallbacks": 0, "block_count": hp["block_count"], "arch": arch,
            "n_params": n_params, "workers": workers}
