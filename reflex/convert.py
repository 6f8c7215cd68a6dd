"""Convert a BERT sentence-transformers / transformers checkpoint (safetensors) to GGUF.

    convert_bert(HF_DIR, OUT_GGUF, out_type="f32"|"f16"|"q8_0") -> summary dict

Writes what llama.cpp's convert_hf_to_gguf.py writes for `bert` (same metadata keys, tensor names,
phantom-space vocab, per-tensor type rules), so llama.cpp loads our file:
  * vocab: a word-initial piece `foo` -> `▁foo`, a continuation `##oo` -> `oo`, CONTROL tokens
    (special added tokens: [CLS], [SEP], ...) unchanged;
  * 1-D tensors, norms, position_embd and token_types stay F32; other 2-D weights get out_type
    (a row not divisible by the Q8_0 block of 32 falls back to F16);
  * pooling from modules.json + <pooling dir>/config.json (MEAN 1, CLS 2, LAST 3);
  * BertForSequenceClassification: `classifier` -> cls.output and id2label ->
    bert.classifier.output_labels, as llama.cpp does; unlike llama.cpp we also keep the pooler
    (dense + tanh, which the HF model applies before the classifier) as `cls`, which llama.cpp's
    RANK pooling applies when present, and write pooling_type RANK.

The safetensors container is read here with json + numpy: u64 little-endian header length, a JSON
header {name: {dtype, shape, data_offsets: [begin, end]}}, then the raw little-endian data.
Writing uses gguf.GGUFWriter (the `gguf` package, imported lazily).
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np

from reflex.errors import InvalidRequest, ModelFormatError, ModelNotFound

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}  # general.file_type (llama_ftype)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED = 1, 2, 3, 4, 5
POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}


# ---------------------------------------------------------------- safetensors
def read_safetensors(path) -> dict:
    """name -> numpy array (memory-mapped; BF16 widened to float32)."""
    path = Path(path)
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot map: {e}", kind="truncated") from None
    if raw.size < 8:
        raise ModelFormatError(f"{path}: too short for a safetensors file", kind="truncated")
    (n,) = struct.unpack("<Q", raw[:8].tobytes())
    if n > raw.size - 8:
        raise ModelFormatError(f"{path}: header length {n} beyond the file", kind="truncated")
    try:
        header = json.loads(raw[8:8 + n].tobytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: bad safetensors header: {e}", kind="malformed") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        if base + e > raw.size or b > e:
            raise ModelFormatError(f"{path}: tensor {name!r} data beyond the file", kind="truncated")
        buf = raw[base + b:base + e]
        if dt == "BF16":
            a = (buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt in _ST_DTYPES:
            a = buf.view(_ST_DTYPES[dt])
        else:
            raise ModelFormatError(f"{path}: tensor {name!r} has unsupported dtype {dt}", kind="tensor_type")
        if a.size != int(np.prod(shape)):
            raise ModelFormatError(f"{path}: tensor {name!r} size does not match its shape", kind="tensor_shape")
        out[name] = a.reshape(shape)
    return out


# ---------------------------------------------------------------- tensor names
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_GLOBAL = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def gguf_name(hf_name: str, classifier: bool):
    """HF BERT tensor name -> GGUF name, or None for tensors llama.cpp drops."""
    n = hf_name[5:] if hf_name.startswith("bert.") else hf_name
    if n.endswith(".gamma"):
        n = n[:-6] + ".weight"
    elif n.endswith(".beta"):
        n = n[:-5] + ".bias"
    if n == "embeddings.position_ids" or n.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    if n.startswith("pooler.dense."):
        return ("cls." + n.rsplit(".", 1)[1]) if classifier else None
    if classifier and n.startswith("classifier."):
        return "cls.output." + n.rsplit(".", 1)[1]
    m = _LAYER_RE.match(n)
    if m:
        sub = _LAYER.get(m.group(2))
        if sub is None:
            raise ModelFormatError(f"unknown BERT tensor {hf_name!r}", kind="unknown_tensor")
        return f"blk.{m.group(1)}.{sub}.{m.group(3)}"
    stem, _, kind = n.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    raise ModelFormatError(f"unknown BERT tensor {hf_name!r}", kind="unknown_tensor")


def tensor_type(name: str, ndim: int, out_type: str, ncols: int) -> str:
    """llama.cpp's converter rules: which tensors stay F32."""
    if ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return "f32"
    if name.startswith(("position_embd.", "token_types.")):
        return "f32"
    if out_type == "q8_0" and ncols % 32:
        return "f16"
    return out_type


# ---------------------------------------------------------------- vocab
def _read_json(p: Path):
    try:
        with open(p, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise ModelFormatError(f"{p}: invalid JSON: {e}", kind="malformed") from None


def load_vocab(d: Path, n_vocab: int) -> dict:
    """tokens (phantom form), token types, special ids and normalizer flags."""
    tj = d / "tokenizer.json"
    tc = _read_json(d / "tokenizer_config.json") if (d / "tokenizer_config.json").is_file() else {}
    special = set()
    lowercase = tc.get("do_lower_case")
    strip = tc.get("strip_accents")
    if tj.is_file():
        t = _read_json(tj)
        model = t.get("model") or {}
        if model.get("type") != "WordPiece":
            raise ModelFormatError(f"{tj}: tokenizer model {model.get('type')!r}, expected WordPiece",
                                   kind="tokenizer")
        vocab = model["vocab"]
        for a in t.get("added_tokens") or []:
            vocab.setdefault(a["content"], a["id"])
            if a.get("special"):
                special.add(a["content"])
        norm = t.get("normalizer") or {}
        norms = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
        for nm in norms:
            if nm.get("type") == "BertNormalizer":
                lowercase = nm.get("lowercase", lowercase)
                strip = nm.get("strip_accents", strip)
            elif nm.get("type") == "Lowercase":
                lowercase = True
            elif nm.get("type") == "StripAccents":
                strip = True
    elif (d / "vocab.txt").is_file():
        with open(d / "vocab.txt", encoding="utf-8") as fh:
            vocab = {line.rstrip("\n"): i for i, line in enumerate(fh)}
        for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
            if isinstance(tc.get(k), str):
                special.add(tc[k])
        if not special:
            special = {"[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"} & set(vocab)
    else:
        raise ModelNotFound(f"{d}: no tokenizer.json or vocab.txt")
    size = max(n_vocab, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [TOKEN_UNUSED] * size
    for tok, i in vocab.items():
        if tok in special:
            tokens[i], types[i] = tok, TOKEN_CONTROL
        else:
            tokens[i] = tok[2:] if tok.startswith("##") else "\u2581" + tok
            types[i] = TOKEN_NORMAL
    ids = {k: vocab.get(tc.get(k + "_token") or default) for k, default in
           (("cls", "[CLS]"), ("sep", "[SEP]"), ("unk", "[UNK]"), ("pad", "[PAD]"), ("mask", "[MASK]"))}
    return {"tokens": tokens, "types": types, "ids": ids,
            "lowercase": None if lowercase is None else bool(lowercase),
            "strip_accents": None if strip is None else bool(strip)}


def pooling_type(d: Path):
    mp = d / "modules.json"
    if not mp.is_file():
        return None
    for mod in _read_json(mp):
        if str(mod.get("type", "")).endswith("Pooling"):
            cfg = _read_json(d / mod["path"] / "config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                return POOLING["mean"]
            if cfg.get("pooling_mode_cls_token"):
                return POOLING["cls"]
            if cfg.get("pooling_mode_lasttoken"):
                return POOLING["lasttoken"]
            if cfg.get("pooling_mode") in POOLING:
                return POOLING[cfg["pooling_mode"]]
            raise ModelFormatError(f"{d}: only MEAN, CLS and LAST pooling are supported", kind="pooling")
    return None


# ---------------------------------------------------------------- convert
def convert_bert(hf_dir, out_path, out_type: str = "f32", log=None) -> dict:
    import gguf

    from reflex.quants import quantize

    d = Path(hf_dir)
    out_type = str(out_type).lower()
    if out_type not in FILE_TYPES:
        raise InvalidRequest(f"--type must be one of {', '.join(FILE_TYPES)}, got {out_type!r}")
    if not (d / "config.json").is_file():
        raise ModelNotFound(f"{d}: no config.json (expected a transformers model directory)")
    cfg = _read_json(d / "config.json")
    archs = cfg.get("architectures") or ["BertModel"]
    if cfg.get("model_type", "bert") != "bert" or not any(a.startswith("Bert") for a in archs):
        raise InvalidRequest(f"{d}: only BERT models convert (model_type {cfg.get('model_type')!r}, "
                             f"architectures {archs})")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise InvalidRequest(f"{d}: position_embedding_type {cfg['position_embedding_type']!r} "
                             f"is not supported")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise InvalidRequest(f"{d}: hidden_act {cfg['hidden_act']!r} is not supported (gelu only)")
    labels = None
    classifier = "BertForSequenceClassification" in archs
    if classifier:
        id2label = cfg.get("id2label") or {}
        labels = [id2label[k] for k in sorted(id2label, key=lambda k: int(k))]
    sts = sorted(d.glob("*.safetensors"))
    if not sts:
        raise ModelNotFound(f"{d}: no *.safetensors file")
    tensors = {}
    for p in sts:
        tensors.update(read_safetensors(p))

    arch = "bert"
    out_path = Path(out_path)
    part = out_path.with_name(out_path.name + ".partial")  # renamed into place only when complete
    w = gguf.GGUFWriter(str(part), arch)
    w.add_type("model")
    w.add_name(str(cfg.get("_name_or_path") or d.name).rstrip("/").rsplit("/", 1)[-1])
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg.get("layer_norm_eps", 1e-12)))
    w.add_file_type(FILE_TYPES[out_type])
    w.add_causal_attention(False)
    pool = pooling_type(d)
    if classifier:
        pool = 4  # RANK: [CLS] row -> cls (dense + tanh) -> cls.output
    if pool is not None:
        w.add_pooling_type(gguf.PoolingType(pool))
    if labels:
        w.add_classifier_output_labels(labels)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    voc = load_vocab(d, int(cfg.get("vocab_size", 0)))
    w.add_token_type_count(int(cfg.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(voc["tokens"])
    w.add_token_types(voc["types"])
    ids = voc["ids"]
    # BERT wraps every sequence as [CLS] ... [SEP]; llama.cpp's converter stores that as bos/eos
    for key, i in (("bos", ids["cls"]), ("eos", ids["sep"]), ("unk", ids["unk"]),
                   ("sep", ids["sep"]), ("pad", ids["pad"]), ("mask", ids["mask"])):
        if i is not None:
            getattr(w, f"add_{key}_token_id")(int(i))
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bool("tokenizer.ggml.add_sep_token", False)
    if voc["lowercase"] is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", voc["lowercase"])
    if voc["strip_accents"] is not None:
        w.add_bool("tokenizer.ggml.normalizer.strip_accents", voc["strip_accents"])

    counts: dict = {}
    n_vocab = len(voc["tokens"])
    for hf_name, a in tensors.items():
        name = gguf_name(hf_name, classifier)
        if name is None:
            continue
        x = np.asarray(a, dtype=np.float32)
        if name == "token_embd.weight" and x.shape[0] < n_vocab:  # vocab padded with [PADi]
            x = np.concatenate([x, np.zeros((n_vocab - x.shape[0], x.shape[1]), np.float32)])
        t = tensor_type(name, x.ndim, out_type, x.shape[-1])
        if t == "f32":
            w.add_tensor(name, np.ascontiguousarray(x))
        elif t == "f16":
            w.add_tensor(name, np.ascontiguousarray(x.astype(np.float16)))
        else:
            raw = quantize(x, gguf.GGMLQuantizationType.Q8_0).reshape(*x.shape[:-1], -1)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        counts[t] = counts.get(t, 0) + 1
        if log:
            log(f"{hf_name} -> {name} {t} {tuple(x.shape)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(part, out_path)
    return {"out": str(out_path), "type": out_type, "tensors": counts, "n_vocab": n_vocab,
            "pooling_type": pool, "labels": labels}
