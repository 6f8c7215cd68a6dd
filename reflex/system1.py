"""system1: score N candidate continuations of one context in a single forward pass.

    r = score(model, tokenizer, "The capital of France is", [" Paris", " Lyon", " a city"])
    r.best, r.best_text, r.candidates[0].logprobs, r.candidates[0].total

One forward runs over the context followed by the candidates' tokens packed as a prefix tree
(candidates that start with the same tokens share those nodes). A tree attention mask lets each
node see the whole context and its own ancestors only, and its RoPE position is len(context) +
its depth, so every candidate is computed exactly as if it had been appended to the context alone.
A candidate's last token is never fed: nothing is predicted after it.

    slots:     c0 c1 c2 | a0 a1 | b1        candidates A = (a0 a1 a2), B = (a0 b1)
    position:   0  1  2 |  3  4 |  4        a0 is shared; a2 is only predicted, never fed
    a1 sees:    c0 c1 c2   a0 a1            b1 sees c0 c1 c2 a0 b1

log p(candidate token k) reads the logits of the context's last slot (k = 0) or of the node of
the candidate's first k tokens. Logits are computed only for those rows (the model's forward
returns the final-normed hidden states; the LM head runs on the rows we read).

Tokenization (the boundary rule): the context is encoded with the tokenizer's special tokens (BOS
where the model adds one). A candidate is tokenized as a continuation: its ids are
encode(context + candidate)[len(encode(context)):] when encode(context) is a prefix of
encode(context + candidate) and the candidate adds at least one token; otherwise (a BPE merge
across the boundary changed the context's last tokens) encode(candidate) without special tokens.
Token-id inputs (lists of ints) are used as given.

Sliding-window models: models whose KV cache records each slot's RoPE position
(reflex/models/_common.KVCache: gemma3, qwen2, qwen3) apply the window on positions under the
tree mask themselves. For the others a mask overrides the backend's window (on slots), so where
the window is narrower than the context plus candidates, scoring falls back to one cached context
prefill followed by one causal forward per candidate (same numbers, N+1 forwards).

Recurrent models (`model.tree_mask = False`: an SSM / DeltaNet state has no per-slot attention a
mask could restrict) are NOT scored in one forward: the context runs once, its cache is snapshot,
and each candidate runs after `cache.restore(snap)` (N+1 forwards; exact, same numbers as
separate forwards; the LM head still runs once over all scored rows).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from reflex.errors import ContextOverflow, InvalidRequest


@dataclasses.dataclass
class CandidateScore:
    text: str | None        # None when the candidate was given as token ids
    token_ids: list         # the candidate's ids after the boundary rule
    logprobs: list          # log p(token k | context, tokens < k), natural log
    total: float            # sum of logprobs
    mean: float             # total / len(token_ids) (length-normalized)
    boundary: str           # "continuation" | "separate" | "ids": how token_ids were obtained

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ScoreResult:
    candidates: list        # CandidateScore, in input order
    best: int               # index of the best candidate (by total, or by mean when normalize)
    context_ids: list
    normalize: bool = False
    n_forward_tokens: int = 0   # tokens the forward ran over (context + tree nodes)
    timings: dict = dataclasses.field(default_factory=dict)

    @property
    def best_text(self):
        return self.candidates[self.best].text

    def to_dict(self) -> dict:
        return {
            "candidates": [c.to_dict() for c in self.candidates],
            "best": self.best,
            "best_text": self.best_text,
            "normalize": self.normalize,
            "usage": {"context_tokens": len(self.context_ids),
                      "candidate_tokens": sum(len(c.token_ids) for c in self.candidates),
                      "forward_tokens": self.n_forward_tokens},
            "timings": self.timings,
        }


# ---------------------------------------------------------------- tokenization
def _is_ids(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                                                for i in x)


def context_ids(tokenizer, context, parse_special: bool = False) -> list:
    if isinstance(context, str):
        ids = tokenizer.encode(context, add_special=True, parse_special=parse_special)
    elif _is_ids(context):
        ids = [int(i) for i in context]
    else:
        raise InvalidRequest("context must be a string or a list of token ids")
    if not ids:
        raise InvalidRequest("context is empty (it must give at least one token to predict from)")
    return ids


def candidate_ids(tokenizer, context, ctx_ids: list, candidate, parse_special: bool = False):
    """(ids, boundary) for one candidate under the boundary rule in the module docstring."""
    if _is_ids(candidate):
        ids, how = [int(i) for i in candidate], "ids"
    elif isinstance(candidate, str):
        if candidate == "":
            raise InvalidRequest("empty candidate")
        ids, how = None, "separate"
        if isinstance(context, str):
            full = tokenizer.encode(context + candidate, add_special=True, parse_special=parse_special)
            n = len(ctx_ids)
            if len(full) > n and full[:n] == ctx_ids:
                ids, how = full[n:], "continuation"
        if ids is None:
            ids = tokenizer.encode(candidate, add_special=False, parse_special=parse_special)
    else:
        raise InvalidRequest("each candidate must be a string or a list of token ids")
    if not ids:
        raise InvalidRequest(f"candidate {candidate!r} gives no tokens")
    return ids, how


# ---------------------------------------------------------------- the tree
@dataclasses.dataclass
class Tree:
    """Candidates packed after a context of n_ctx_tokens tokens.

    tokens[j], parent[j] (-1 = the context), depth[j] for node j (slot n_ctx_tokens + j);
    rows[i][k] = the slot whose logits predict token k of candidate i."""
    n_ctx_tokens: int
    tokens: list
    parent: list
    depth: list
    rows: list

    @property
    def n_nodes(self) -> int:
        return len(self.tokens)

    def positions(self) -> np.ndarray:
        C = self.n_ctx_tokens
        return np.concatenate([np.arange(C), C + np.asarray(self.depth, dtype=np.int64)]).astype(np.int64)

    def mask(self) -> np.ndarray:
        """bool (T, T), True = visible: causal over the context, context + ancestors + self for nodes."""
        C, N = self.n_ctx_tokens, self.n_nodes
        T = C + N
        m = np.zeros((T, T), dtype=bool)
        m[:C, :C] = np.tril(np.ones((C, C), dtype=bool))
        m[C:, :C] = True
        for j in range(N):  # parents precede children, so the parent's row is complete
            p = self.parent[j]
            if p >= 0:
                m[C + j, C:C + j] = m[C + p, C:C + j]
            m[C + j, C + j] = True
        return m


def build_tree(n_ctx_tokens: int, cands: list) -> Tree:
    """Prefix tree of the candidates' ids, without each candidate's last token (never an input)."""
    tokens, parent, depth, rows = [], [], [], []
    children: dict = {}  # (parent node, token) -> node
    last = n_ctx_tokens - 1
    for ids in cands:
        r = [last]
        node = -1
        for k, t in enumerate(ids[:-1]):
            key = (node, int(t))
            j = children.get(key)
            if j is None:
                j = len(tokens)
                children[key] = j
                tokens.append(int(t))
                parent.append(node)
                depth.append(k)
            node = j
            r.append(n_ctx_tokens + j)
        rows.append(r)
    return Tree(n_ctx_tokens, tokens, parent, depth, rows)


# ---------------------------------------------------------------- scoring
def _log_normalizer(logits: np.ndarray) -> np.ndarray:
    """logsumexp of each row (R, n_vocab) -> (R,) float64. exp runs in float32 in place (a
    262k-token vocab makes a float64 copy the slowest step); the sums accumulate in float64."""
    x = np.array(logits, dtype=np.float32)                     # (R, n_vocab), owned
    mx = x.max(axis=-1, keepdims=True)
    np.subtract(x, mx, out=x)
    np.exp(x, out=x)
    return mx[:, 0].astype(np.float64) + np.log(x.sum(axis=-1, dtype=np.float64))


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits[r])[targets[r]] per row, in float64."""
    picked = np.asarray(logits)[np.arange(len(targets)), targets].astype(np.float64)
    return picked - _log_normalizer(logits)


def _head(model, hidden: np.ndarray) -> np.ndarray:
    """LM head on final-normed hidden rows (R, n_embd) -> logits (R, n_vocab) float32."""
    b = model.backend
    head = getattr(model, "lm_head", None)
    if callable(head):
        return b.to_numpy(head(hidden))
    return b.to_numpy(b.matmul(hidden, model.output))


def _window(model) -> int:
    hp = model.hp
    return int(getattr(hp, "n_swa", 0) or getattr(hp, "sliding_window", 0) or 0)


def score_ids(model, ctx: list, cands: list) -> list:
    """Per-token log-probs (list of float64 arrays) of each candidate id list after ctx, one forward."""
    if getattr(model, "tree_mask", True) is False:
        return _score_recurrent(model, ctx, cands)
    C = len(ctx)
    tree = build_tree(C, cands)
    ids = np.asarray(list(ctx) + tree.tokens, dtype=np.int64)     # (T,)
    T = ids.shape[0]
    cache = model.new_cache(T)
    W = _window(model)
    if W and C + max(len(c) for c in cands) - 1 > W and not hasattr(cache, "pos"):
        # this model's window is the backend's (on slots), which a mask overrides
        return _score_sequential(model, ctx, cands)
    has_head = callable(getattr(model, "lm_head", None)) or hasattr(model, "output")
    out = model.forward(ids, cache, positions=tree.positions(), attn_mask=tree.mask(),
                        output="hidden" if has_head else "logits")
    # rows to read, and the token each predicts
    row_list, tgt_list = [], []
    for r, c in zip(tree.rows, cands):
        row_list.extend(r)
        tgt_list.extend(c)
    uniq, inv = np.unique(np.asarray(row_list), return_inverse=True)
    logits = _head(model, out[uniq]) if has_head else out[uniq]   # (R, n_vocab), R distinct rows
    tgt = np.asarray(tgt_list, dtype=np.int64)
    lp = logits[inv, tgt].astype(np.float64) - _log_normalizer(logits)[inv]
    res, o = [], 0
    for c in cands:
        res.append(lp[o:o + len(c)])
        o += len(c)
    return res


def _score_recurrent(model, ctx: list, cands: list) -> list:
    """Recurrent models (tree_mask False): a state cannot be branched by a mask, so the context runs
    once, its cache is snapshot, and each candidate runs causally after a restore (N+1 forwards,
    same numbers as separate forwards). Hidden rows of all candidates go through one LM-head
    matmul and one log-normalizer, as in the tree path."""
    C = len(ctx)
    cache = model.new_cache(C + max(len(c) for c in cands))
    has_head = callable(getattr(model, "lm_head", None)) or hasattr(model, "output")
    out = "hidden" if has_head else "logits"
    first = model.forward(ctx, cache, last_only=True, output=out)  # (1, n_embd | n_vocab)
    snap = cache.snapshot()
    rows = []
    for c in cands:
        rows.append(first)
        if len(c) > 1:
            cache.restore(snap)
            rows.append(model.forward(c[:-1], cache, output=out))   # (len(c) - 1, ...)
    cache.restore(snap)
    x = np.concatenate(rows, axis=0)                               # (sum len(c), ...), host arrays
    logits = _head(model, x) if has_head else x                    # (sum len(c), n_vocab)
    tgt = np.asarray([t for c in cands for t in c], dtype=np.int64)
    lp = _log_softmax_at(logits, tgt)
    res, o = [], 0
    for c in cands:
        res.append(lp[o:o + len(c)])
        o += len(c)
    return res


def _score_sequential(model, ctx: list, cands: list) -> list:
    """Context once, then one causal forward per candidate reusing the context's cache."""
    C = len(ctx)
    cache = model.new_cache(C + max(len(c) for c in cands))
    first = model.forward(ctx, cache, last_only=True)              # (1, n_vocab)
    res = []
    for c in cands:
        cache.truncate(C)
        rows = [first] if len(c) == 1 else [first, model.forward(c[:-1], cache)]
        logits = np.concatenate(rows, axis=0)                      # (len(c), n_vocab)
        res.append(_log_softmax_at(logits, np.asarray(c, dtype=np.int64)))
    return res


def score(model, tokenizer, context, candidates, *, normalize: bool = False, n_ctx: int | None = None,
          parse_special: bool = False) -> ScoreResult:
    """Score `candidates` (strings or token-id lists) as continuations of `context`.

    normalize: pick the best by mean per-token log-prob instead of the total.
    n_ctx: the largest context + longest-candidate length allowed (default: the model's training
    context); longer is a ContextOverflow."""
    t0 = time.perf_counter()
    if not hasattr(model, "new_cache") or getattr(model.hp, "causal", True) is False:
        raise InvalidRequest(f"system1 needs a causal language model; {model.hp.arch!r} here is an "
                             f"embedding/classifier model")
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, (list, tuple)):
        raise InvalidRequest("candidates must be a list")
    if not candidates:
        raise InvalidRequest("candidates is empty")
    ctx = context_ids(tokenizer, context, parse_special)
    toks = [candidate_ids(tokenizer, context, ctx, c, parse_special) for c in candidates]
    n_vocab = model.hp.n_vocab
    for ids, _ in toks:
        if min(ids) < 0 or max(ids) >= n_vocab:
            raise InvalidRequest(f"token id out of range [0, {n_vocab})")
    if min(ctx) < 0 or max(ctx) >= n_vocab:
        raise InvalidRequest(f"token id out of range [0, {n_vocab})")
    limit = n_ctx or model.hp.n_ctx_train
    longest = max(len(ids) for ids, _ in toks)
    if len(ctx) + longest > limit:
        raise ContextOverflow(f"context ({len(ctx)} tokens) + longest candidate ({longest} tokens) "
                              f"exceed the context size {limit}")
    cand_ids = [ids for ids, _ in toks]
    t1 = time.perf_counter()
    lps = score_ids(model, ctx, cand_ids)
    t2 = time.perf_counter()
    out = []
    for c, (ids, how), lp in zip(candidates, toks, lps):
        total = float(lp.sum())
        out.append(CandidateScore(text=c if isinstance(c, str) else None, token_ids=list(ids),
                                  logprobs=[float(v) for v in lp], total=total,
                                  mean=total / len(ids), boundary=how))
    key = [(c.mean if normalize else c.total) for c in out]
    best = int(np.argmax(key))
    if getattr(model, "tree_mask", True) is False:
        n_fwd = len(ctx) + sum(len(c) - 1 for c in cand_ids)      # context once + each candidate
    else:
        n_fwd = len(ctx) + build_tree(len(ctx), cand_ids).n_nodes
    return ScoreResult(candidates=out, best=best, context_ids=ctx, normalize=bool(normalize),
                       n_forward_tokens=n_fwd,
                       timings={"tokenize_s": round(t1 - t0, 6), "forward_s": round(t2 - t1, 6)})
