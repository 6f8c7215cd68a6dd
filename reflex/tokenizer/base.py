"""Shared tokenizer machinery: special tokens, ids, decode, streaming."""
from __future__ import annotations

from typing import Iterable, Mapping

import regex

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_EOG_TEXTS = (
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<|return|>", "<|call|>", "<eos>", "</s>",
)


def _get(md: Mapping, key: str, default=None):
    try:
        v = md[key]
    except KeyError:
        return default
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, bytes):
        v = v.decode()
    return v


class BaseTokenizer:
    kind = "base"

    def __init__(self, md: Mapping):
        self.md = md
        self.tokens = md["tokenizer.ggml.tokens"]
        self.n_vocab = len(self.tokens)
        tt = _get(md, "tokenizer.ggml.token_type")
        self.token_types = tt
        self.bos_id = _get(md, "tokenizer.ggml.bos_token_id")
        self.eos_id = _get(md, "tokenizer.ggml.eos_token_id")
        self.unk_id = _get(md, "tokenizer.ggml.unknown_token_id")
        self.pad_id = _get(md, "tokenizer.ggml.padding_token_id")
        self.eot_id = _get(md, "tokenizer.ggml.eot_token_id")
        self.add_bos = bool(_get(md, "tokenizer.ggml.add_bos_token", self.kind == "spm"))
        self.add_eos = bool(_get(md, "tokenizer.ggml.add_eos_token", False))
        self._vocab = None
        self._special = None  # (control ids set, user ids set)
        self._split_any = None
        self._split_user = None
        self._eog = None

    # ---------------------------------------------------------------- vocab
    @property
    def vocab(self) -> dict:
        if self._vocab is None:
            self._vocab = dict(zip(self.tokens, range(self.n_vocab)))
        return self._vocab

    def id_of(self, text: str):
        return self.vocab.get(text)

    def token_to_piece(self, i: int) -> str:
        return self.piece_bytes(i).decode("utf-8", "replace")

    def _types(self):
        import numpy as np

        if self.token_types is None:
            return np.ones(self.n_vocab, dtype=np.int32)
        return np.asarray(self.token_types)

    def _special_sets(self):
        if self._special is None:
            import numpy as np

            t = self._types()
            ctrl = set(np.nonzero(t == TOKEN_CONTROL)[0].tolist())
            user = set(np.nonzero(t == TOKEN_USER)[0].tolist())
            self._special = (ctrl, user)
        return self._special

    def is_special(self, i: int) -> bool:
        ctrl, user = self._special_sets()
        return i in ctrl

    def _matchable_user(self, i: int) -> bool:
        return True

    def _splitter(self, parse_special: bool):
        if self._split_any is None:
            ctrl, user = self._special_sets()
            toks = self.tokens
            u = [toks[i] for i in user if toks[i] and self._matchable_user(i)]
            c = [toks[i] for i in ctrl if toks[i] and self._matchable_ctrl(i)]
            self._sp_ids = {toks[i]: i for i in list(ctrl) + list(user) if toks[i]}

            def mk(words):
                if not words:
                    return None
                words = sorted(set(words), key=len, reverse=True)
                return regex.compile("(" + "|".join(regex.escape(w) for w in words) + ")")

            self._split_any = mk(u + c) or False
            self._split_user = mk(u) or False
        return self._split_any if parse_special else self._split_user

    def _matchable_ctrl(self, i: int) -> bool:
        return True

    @property
    def eog_ids(self) -> set:
        if self._eog is None:
            s = {i for i in (self.eos_id, self.eot_id) if i is not None}
            v = self.vocab
            for t in _EOG_TEXTS:
                if t in v:
                    s.add(v[t])
            self._eog = s
        return self._eog

    # ---------------------------------------------------------------- encode
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list:
        out = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        sp = self._splitter(parse_special)
        if sp:
            parts = sp.split(text)
            first = True
            for k, part in enumerate(parts):
                if k % 2:
                    out.append(self._sp_ids[part])
                elif part:
                    out.extend(self._encode_text(part, first))
                first = False
        elif text:
            out.extend(self._encode_text(text, True))
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _encode_text(self, text: str, at_start: bool) -> list:
        raise NotImplementedError

    # ---------------------------------------------------------------- decode
    def piece_bytes(self, i: int) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        pb = self.piece_bytes
        if skip_special:
            ctrl, _ = self._special_sets()
            b = b"".join(pb(i) for i in ids if i not in ctrl)
        else:
            b = b"".join(pb(i) for i in ids)
        return self._post_decode(b.decode("utf-8", "replace"))

    def _post_decode(self, s: str) -> str:
        return s

    def stream(self, skip_special: bool = False):
        from .stream import StreamDecoder

        return StreamDecoder(self, skip_special=skip_special)
