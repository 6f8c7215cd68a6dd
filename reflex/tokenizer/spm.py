"""SentencePiece-style BPE (tokenizer.ggml.model == "llama"): merges by score, byte fallback.

Text is escaped (" " -> "\u2581"), optionally given a leading "\u2581" (add_space_prefix), then
split into characters and the adjacent pair whose concatenation is the best-ranked vocabulary
token is merged repeatedly. Characters that no token covers become <0xNN> byte tokens.

Gemma: the file stores whitespace-run tokens with real spaces ("  "); like transformers'
GGUF loader we look them up as "\u2581\u2581". Gemma's scores do not follow its merge order
exactly, so for gemma* architectures the rank is the token's position in the file (as in
transformers); otherwise the rank is the score (as in llama.cpp).
"""
from __future__ import annotations

import heapq
from typing import Mapping

from .base import BaseTokenizer, _get, TOKEN_BYTE

SPACE = "\u2581"


class SPMTokenizer(BaseTokenizer):
    kind = "spm"

    def __init__(self, md: Mapping):
        super().__init__(md)
        arch = _get(md, "general.architecture", "") or ""
        self.gemma = arch.startswith("gemma")
        self.add_space_prefix = bool(_get(md, "tokenizer.ggml.add_space_prefix", not self.gemma))
        self._scores = md.get("tokenizer.ggml.scores") if hasattr(md, "get") else None
        self._rank = None
        self._bytes_ids = None
        self._piece_cache = {}
        self._resp = None  # gemma's whitespace respelling for the lazy lookup: (extra, gone)

    def _matchable_user(self, i: int) -> bool:
        t = self.tokens[i]
        return not (self.gemma and " " in t and not t.strip())

    @property
    def vocab(self) -> dict:
        if self._vocab is None:
            toks = self.tokens
            v = dict(zip(toks.tolist(), range(self.n_vocab)))
            if self.gemma:
                # whitespace-run tokens are user-defined (type 4); respell "  " as "▁▁"
                ctrl, user = self._special_sets()
                for i in user:
                    t = toks[i]
                    if " " in t and not t.strip():
                        if v.get(t) == i:
                            del v[t]
                        v[SPACE * len(t)] = i
            self._vocab = v
        return self._vocab

    def _respelling(self):
        """The changes `vocab` makes to dict(zip(tokens, ids)), for lookups before it exists:
        extra {"▁▁": id} and the deleted keys ("  ")."""
        if self._resp is None:
            extra, gone = {}, set()
            if self.gemma:
                ctrl, user = self._special_sets()
                toks = self.tokens
                for i in sorted(user):
                    t = toks[i]
                    if " " in t and not t.strip():
                        if toks.get(t) == i:
                            gone.add(t)
                        extra[SPACE * len(t)] = i
            self._resp = (extra, gone)
        return self._resp

    def _lazy_get(self):
        extra, gone = self._respelling()
        base = self.tokens.get
        if not extra and not gone:
            return base

        def get(s, default=None):
            i = extra.get(s)
            if i is not None:
                return i
            return default if s in gone else base(s, default)
        return get

    def id_of(self, text: str):
        get = self._vget()
        i = get(text)
        if i is None and self.gemma and text and not text.strip(" "):
            i = get(SPACE * len(text))
        return i

    def _ranks(self):
        if self._rank is None:
            if self.gemma or self._scores is None:
                self._rank = None  # rank == id
            else:
                import numpy as np

                s = -np.asarray(self._scores, dtype=np.float64)
                self._rank = s.tolist()
            self._rank_ready = True
        return self._rank

    def _prepare_model(self):
        self._ranks()
        self._byte_ids()
        # the segmenter (one scan of the vocabulary, ~30 ms on Gemma) is built on the first
        # encode of a long text, so short prompts right after load do not pay for it.

    def _segmenter(self):
        """Per-word caching is exact when no token spans "x▁" (x not ▁): then no merge can
        cross the start of a ▁-run, and each run+word segment merges independently. The few
        tokens that do span it (Gemma: ">▁</") make us fall back to whole-text BPE."""
        if not hasattr(self, "_seg"):
            import regex

            big = "\x00".join(self.tokens.tolist())
            crossing = []
            for m in regex.finditer("[^\x00▁]▁", big):
                if len(crossing) > 64:
                    break
                a = big.rfind("\x00", 0, m.start()) + 1
                b = big.find("\x00", m.end())
                crossing.append(big[a:b if b >= 0 else len(big)])
            crossing = list(dict.fromkeys(crossing))
            if len(crossing) <= 64:
                self._crossing = [c.replace(SPACE, " ") for c in crossing]
                self._seg = regex.compile("(?<=[^▁])(?=▁)")
            else:
                self._seg = None
            self._cache = {}
        return self._seg

    def _byte_ids(self):
        if self._bytes_ids is None:
            get = self._vget()
            self._bytes_ids = [get("<0x%02X>" % b, self.unk_id) for b in range(256)]
        return self._bytes_ids

    def _encode_text(self, text: str, at_start: bool) -> list:
        # the segmenter (and its per-word cache) pays off once a long text or ~4 KB of short ones
        # has gone through: many short lines (documents, batches) would otherwise never get it
        self._seen = getattr(self, "_seen", 0) + len(text)
        seg = self._segmenter() if len(text) > 256 or self._seen > 4096 or hasattr(self, "_seg") else None
        if seg is not None and len(text) > 16 and not any(c in text for c in self._crossing):
            text = text.replace(" ", SPACE)
            if self.add_space_prefix and at_start:
                text = SPACE + text
            out = []
            cache = self._cache
            for w in seg.split(text):
                ids = cache.get(w)
                if ids is None:
                    ids = self._bpe(w)
                    if len(cache) < 200_000:
                        cache[w] = ids
                out.extend(ids)
            return out
        text = text.replace(" ", SPACE)
        if self.add_space_prefix and at_start:
            text = SPACE + text
        return self._bpe(text)

    def _bpe(self, text: str) -> list:
        if not text:
            return []
        if not hasattr(self, "_rank_ready"):
            self._ranks()
        rank = self._rank
        sym = list(text)
        n = len(sym)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        heap = []
        get = self._vget()
        for i in range(n - 1):
            t = get(sym[i] + sym[i + 1])
            if t is not None:
                heap.append((t if rank is None else rank[t], i, sym[i], sym[i + 1]))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, i, a, b = pop(heap)
            j = nxt[i]
            if j >= n or sym[i] != a or sym[j] != b:
                continue
            m = a + b
            sym[i] = m
            sym[j] = ""
            k = nxt[j]
            nxt[i] = k
            if k < n:
                prv[k] = i
                t = get(m + sym[k])
                if t is not None:
                    push(heap, (t if rank is None else rank[t], i, m, sym[k]))
            p = prv[i]
            if p >= 0:
                t = get(sym[p] + m)
                if t is not None:
                    push(heap, (t if rank is None else rank[t], p, sym[p], m))
        out = []
        i = 0
        bids = None
        while i < n:
            s = sym[i]
            t = get(s)
            if t is not None:
                out.append(t)
            else:
                if bids is None:
                    bids = self._byte_ids()
                out.extend(bids[b] for b in s.encode("utf-8"))
            i = nxt[i]
        return out

    def piece_bytes(self, i: int) -> bytes:
        b = self._piece_cache.get(i)
        if b is None:
            t = self.tokens[i]
            tt = self.token_types
            if tt is not None and int(tt[i]) == TOKEN_BYTE and len(t) == 6 and t.startswith("<0x"):
                b = bytes([int(t[3:5], 16)])
            else:
                b = t.replace(SPACE, " ").encode("utf-8")
            self._piece_cache[i] = b
        return b

    def decode(self, ids, skip_special: bool = False) -> str:
        s = super().decode(ids, skip_special)
        if self.add_space_prefix and s.startswith(" "):
            s = s[1:]
        return s
