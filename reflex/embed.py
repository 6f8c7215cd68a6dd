"""Text embeddings and GGUF classifier heads on any model with hidden-state output.

    vecs, info = embed(model, tokenizer, ["first text", "second"], normalize=True, truncate=False)
    probs = classify_head(engine, "some text")          # {label: probability}

Pooling follows `{arch}.pooling_type` (NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4):
  MEAN -- average of every token's final hidden state ([CLS]/[SEP] or BOS/EOS included, as
          sentence-transformers and llama.cpp do); CLS -- the first token; LAST -- the last token
          (decoder embedders such as Qwen3-Embedding, whose tokenizer appends an EOS);
  NONE -- per-token vectors (a list of (T_i, n_embd) arrays); RANK -- the classifier head, see
          classify_head().
Vectors are L2-normalized unless normalize=False.

Throughput: a bidirectional encoder (bert) gets several sequences packed into one forward (sorted
by length, up to PACK_TOKENS tokens): one big matmul per weight instead of one per text, with
attention kept inside each sequence (the block-diagonal mask, computed block by block); on the
NumPy backend the packs run on one thread per core (see hidden_states). Causal decoders run one
sequence per forward.

Inputs longer than the model's context raise ContextOverflow unless truncate=True, which keeps the
first tokens and the closing special token (as HF tokenizers truncate). Empty input is an
InvalidRequest; nothing is computed for a request that fails validation.
"""
from __future__ import annotations

import os

import numpy as np

from reflex.errors import ContextOverflow, InvalidRequest

POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 0, 1, 2, 3, 4
POOLING_NAMES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
PACK_TOKENS = 4096  # tokens per packed forward: big enough for BLAS, small enough for the cache
GPU_PACK_TOKENS = 2048  # device backends: one (T, T) masked attention per pack
SMALL_TOKENS = 1024  # below this a single pack runs with 1 BLAS thread


def pooling_of(model, pooling=None, metadata=None) -> int:
    """The pooling to use: an explicit name/number, else the model's `{arch}.pooling_type`
    (from its hparams, or from the GGUF metadata for decoders whose hparams do not keep it)."""
    if pooling is None:
        p = getattr(model.hp, "pooling_type", None)
        if p is None:
            p = getattr(model, "pooling_type", None)
        if p is None and metadata is not None:
            p = metadata.get(f"{model.arch}.pooling_type", None)
        if p is None:
            raise InvalidRequest(f"model ({model.arch}) declares no {model.arch}.pooling_type; "
                                 f"it is not an embedding model (pass pooling= to force one)")
        return int(p)
    if isinstance(pooling, str):
        if pooling.lower() not in POOLING_NAMES:
            raise InvalidRequest(f"unknown pooling {pooling!r} (none, mean, cls, last, rank)")
        return POOLING_NAMES[pooling.lower()]
    if isinstance(pooling, bool) or pooling not in POOLING_NAMES.values():
        raise InvalidRequest(f"unknown pooling {pooling!r}")
    return int(pooling)


def is_pair(x) -> bool:
    """A sentence pair (query, document): a list or tuple of exactly two strings."""
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(s, str) for s in x)


def _texts(texts) -> list:
    """Inputs: a string, a pair, or a non-empty list of strings and pairs (a pair inside a list is
    itself a list/tuple of two strings, so ["a", "b"] is two texts and [["a", "b"]] one pair)."""
    if isinstance(texts, str) or (isinstance(texts, tuple) and is_pair(texts)):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise InvalidRequest("input must be a non-empty string or a non-empty list of strings "
                             "or [query, document] pairs")
    for i, t in enumerate(texts):
        if is_pair(t):
            if t[0] == "" or t[1] == "":
                raise InvalidRequest(f"input[{i}]: both texts of a pair must be non-empty")
            continue
        if not isinstance(t, str):
            raise InvalidRequest(f"input[{i}] is {type(t).__name__}, expected a string or a "
                                 f"[query, document] pair of strings")
        if t == "":
            raise InvalidRequest(f"input[{i}] is empty")
    return [tuple(t) if is_pair(t) else t for t in texts]


def encode_pair(tokenizer, a: str, b: str):
    """BERT's pair encoding: ids [CLS] a [SEP] b [SEP], token types 0 .. 0 1 .. 1 (the second
    segment and its [SEP] are type 1), as HF's BertTokenizer(a, b) encodes it. Needs a tokenizer
    that adds [CLS] (BOS) and [SEP] (EOS)."""
    if not (getattr(tokenizer, "add_bos", False) and getattr(tokenizer, "add_eos", False)
            and tokenizer.bos_id is not None and tokenizer.eos_id is not None):
        raise InvalidRequest("sentence-pair input needs an encoder tokenizer that adds [CLS] and "
                             "[SEP] (a bert-style model)")
    ia = tokenizer.encode(a, add_special=True)                       # [CLS] a [SEP]
    ib = tokenizer.encode(b, add_special=False) + [tokenizer.eos_id]  # b [SEP]
    return ia + ib, [0] * len(ia) + [1] * len(ib)


def _truncate_pair(ids: list, types: list, limit: int):
    """Longest-first truncation (HF's default for pairs): drop the last body token of the longer
    segment (the second on a tie) until the pair fits; the special tokens stay."""
    n1 = types.count(0)                             # [CLS] a [SEP]
    a, b = ids[1:n1 - 1], ids[n1:-1]                # bodies without [CLS] / [SEP]
    while 3 + len(a) + len(b) > limit and (a or b):
        if len(a) > len(b):
            a = a[:-1]
        else:
            b = b[:-1]
    out = [ids[0]] + a + [ids[n1 - 1]] + b + [ids[-1]]
    return out, [0] * (len(a) + 2) + [1] * (len(b) + 1)


def tokenize_inputs(tokenizer, texts, limit: int, truncate: bool, n_types: int = 2):
    """(ids per input, token types per input or None when every input is a plain text)."""
    if not any(isinstance(t, tuple) for t in texts):
        return tokenize(tokenizer, texts, limit, truncate), None
    seqs, types = [], []
    for i, t in enumerate(texts):
        if isinstance(t, tuple):
            ids, tt = encode_pair(tokenizer, t[0], t[1])
            if limit and len(ids) > limit:
                if not truncate:
                    raise ContextOverflow(f"input[{i}] (a pair) is {len(ids)} tokens; the model takes "
                                          f"{limit} (pass truncate=True to cut it)")
                ids, tt = _truncate_pair(ids, tt, limit)
            if n_types < 2:  # a model with one token type sees the pair's ids only
                tt = [0] * len(ids)
        else:
            ids = tokenize(tokenizer, [t], limit, truncate)[0]
            tt = [0] * len(ids)
        seqs.append(ids)
        types.append(tt)
    return seqs, types


def _n_types(model) -> int:
    return int(getattr(model.hp, "n_token_types", 1) or 1)


def context_limit(model, n_ctx=None) -> int:
    lim = int(getattr(model.hp, "n_ctx_train", 0) or 0)
    if n_ctx:
        lim = min(lim, int(n_ctx)) if lim else int(n_ctx)
    return lim


def tokenize(tokenizer, texts, limit: int, truncate: bool) -> list:
    """Token ids per text, checked (or truncated) against `limit` before any compute."""
    out = []
    for i, t in enumerate(texts):
        ids = tokenizer.encode(t, add_special=True)
        if not ids:
            raise InvalidRequest(f"input[{i}] has no tokens")
        if limit and len(ids) > limit:
            if not truncate:
                raise ContextOverflow(f"input[{i}] is {len(ids)} tokens; the model takes {limit} "
                                      f"(pass truncate=True to cut it)")
            eos = tokenizer.eos_id if getattr(tokenizer, "add_eos", False) else None
            ids = ids[:limit - 1] + [ids[-1]] if eos is not None and ids[-1] == eos else ids[:limit]
        out.append(ids)
    return out


def _n_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    env = os.environ.get("REFLEX_NUM_THREADS")
    return max(1, int(env) if env and env.isdigit() else n)


def _packs(seqs: list, budget: int) -> list:
    """Index lists, sequences sorted by length, each pack <= budget tokens (or one sequence)."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    packs, cur, n = [], [], 0
    for i in order:
        L = len(seqs[i])
        if cur and n + L > budget:
            packs.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += L
    if cur:
        packs.append(cur)
    return packs


def hidden_states(model, seqs: list, pack_tokens: int = PACK_TOKENS, types: list | None = None) -> list:
    """Final hidden states (T_i, n_embd) for each id list, packed where the model allows it.
    types: token types (segment ids) per sequence, for sentence pairs (None: all 0).

    On the NumPy backend with several cores, packs run on one Python thread per core with BLAS
    at 1 thread (NumPy's elementwise ops are single-threaded and release the GIL): all ops use
    every core, and a shared machine does not stall OpenBLAS's spinning thread team."""
    out = [None] * len(seqs)
    if types is not None and not any(any(t) for t in types):
        types = None
    if not getattr(model, "supports_packing", False):
        if types is not None:
            raise InvalidRequest(f"{model.hp.arch}: this model takes no token types (sentence pairs)")
        for i, ids in enumerate(seqs):
            cache = model.new_cache(len(ids))
            out[i] = model.forward(ids, cache, output="hidden")                   # (T_i, n_embd)
        return out
    on_numpy = getattr(model.backend, "name", "") == "numpy"
    workers = _n_workers() if on_numpy else 1
    total = sum(len(s) for s in seqs)
    budget = pack_tokens if workers == 1 else min(pack_tokens, max(512, -(-total // workers)))
    if not on_numpy:
        # a device backend packs under one block-diagonal attention mask (reflex/models/bert.py):
        # its attention costs T^2 per pack, so packs stay at GPU_PACK_TOKENS
        budget = min(pack_tokens, GPU_PACK_TOKENS)
    packs = _packs(seqs, budget)

    def run(pack):
        ids = [t for i in pack for t in seqs[i]]
        lens = [len(seqs[i]) for i in pack]
        tt = None if types is None else [t for i in pack for t in types[i]]
        h = model.forward(ids, None, output="hidden", seq_lens=lens, token_types=tt)  # (sum T_i, n_embd)
        s = 0
        for i, L in zip(pack, lens):
            out[i] = h[s:s + L]
            s += L

    # short inputs too: a few-token matmul gains nothing from a 2-thread BLAS team and, on a
    # shared machine, waits for it (measured: ~1 s for one 4-token sentence under load)
    if workers > 1 and (len(packs) > 1 or total < SMALL_TOKENS):
        from concurrent.futures import ThreadPoolExecutor

        from reflex.backends.numpy_backend import set_blas_threads

        set_blas_threads(1)
        try:
            if len(packs) == 1:
                run(packs[0])
            else:
                with ThreadPoolExecutor(min(workers, len(packs))) as ex:
                    list(ex.map(run, packs))
        finally:
            env = os.environ.get("REFLEX_NUM_THREADS") or os.environ.get("OPENBLAS_NUM_THREADS")
            set_blas_threads(int(env) if env and env.isdigit() else (os.cpu_count() or 1))
    else:
        for pack in packs:
            run(pack)
    return out


def pool(h: np.ndarray, pooling: int) -> np.ndarray:
    if pooling == POOLING_MEAN:
        return h.mean(axis=0, dtype=np.float64).astype(np.float32)
    if pooling in (POOLING_CLS, POOLING_RANK):
        return h[0]
    if pooling == POOLING_LAST:
        return h[-1]
    raise InvalidRequest(f"pooling {pooling} does not give one vector per text")


def l2_normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(n, np.float32(1e-12))).astype(np.float32)


def embed(model, tokenizer, texts, normalize: bool = True, truncate: bool = False, pooling=None,
          n_ctx: int | None = None, metadata=None):
    """Embed texts -> (vectors, info).

    vectors: (N, n_embd) float32 (a list of (T_i, n_embd) arrays for NONE pooling);
    info: {"n_tokens": [T_i], "pooling": int}."""
    texts = _texts(texts)
    p = pooling_of(model, pooling, metadata)
    if p == POOLING_RANK:
        raise InvalidRequest("this model has a classifier head (RANK pooling): use classify_head()")
    if not isinstance(normalize, bool) or not isinstance(truncate, bool):
        raise InvalidRequest("normalize and truncate must be booleans")
    seqs, types = tokenize_inputs(tokenizer, texts, context_limit(model, n_ctx), truncate, _n_types(model))
    hs = hidden_states(model, seqs, types=types)
    info = {"n_tokens": [len(s) for s in seqs], "pooling": p}
    if p == POOLING_NONE:
        return [l2_normalize(h) if normalize else h for h in hs], info
    v = np.stack([pool(h, p) for h in hs])                                     # (N, n_embd)
    return (l2_normalize(v) if normalize else v), info


# ---------------------------------------------------------------- classifier heads
def has_head(model) -> bool:
    return bool(getattr(model, "has_head", False))


def head_labels(model) -> list:
    labels = getattr(model, "labels", None)
    n = model.cls_out.shape[0] if getattr(model, "cls_out", None) is not None else model.hp.n_embd
    if labels and len(labels) == n:
        return list(labels)
    return [f"LABEL_{i}" for i in range(n)]


def head_scores(model, tokenizer, texts, truncate: bool = False, n_ctx: int | None = None):
    """Raw classifier-head outputs (N, n_labels) for each text (the [CLS] row through cls/cls.output)."""
    if not has_head(model):
        raise InvalidRequest(f"model ({model.arch}) has no classifier head (cls.* tensors)")
    texts = _texts(texts)
    seqs, types = tokenize_inputs(tokenizer, texts, context_limit(model, n_ctx), truncate, _n_types(model))
    rows = np.stack([h[0] for h in hidden_states(model, seqs, types=types)])  # (N, n_embd)
    return model.head(rows)                                                    # (N, n_labels)


def classify_head(engine, text, truncate: bool = False) -> dict:
    """{label: probability} from the model's GGUF classifier head: softmax over the labels
    (a single-output head, as rerankers have, gives sigmoid(score) under its one label).
    text: a string, or a (query, document) pair for cross-encoders / rerankers."""
    model, tok = engine.model, engine.tokenizer
    s = head_scores(model, tok, [text], truncate=truncate, n_ctx=getattr(engine, "n_ctx", None))[0]
    s = s.astype(np.float64)
    if s.shape[0] == 1:
        p = 1.0 / (1.0 + np.exp(-s))
    else:
        e = np.exp(s - s.max())
        p = e / e.sum()
    return {lab: float(x) for lab, x in zip(head_labels(model), p)}
