"""Shared tokenizer machinery: special tokens, ids, decode, streaming."""
from __future__ import annotations

from typing import Iterable, Mapping

import regex

from .strtable import StrTable

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_EOG_TEXTS = (
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<|return|>", "<|call|>",
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


def fast_strings(arr) -> list:
    """Materialize a GGUF string array as a list of str quickly.

    For reflex.gguf's lazy StringArray whose strings are contiguous ([u64 len][bytes]...), the
    length headers are replaced by NUL separators with numpy and the whole block is decoded and
    split once, which is several times faster than decoding string by string.
    """
    if isinstance(arr, list):
        return arr
    try:
        import numpy as np

        buf, offs, lens = arr._buf, np.asarray(arr._offs, np.int64), np.asarray(arr._lens, np.int64)
        n = len(offs)
        if n < 2:
            raise ValueError
        if not np.array_equal(offs[1:], offs[:-1] + lens[:-1] + 8):
            raise ValueError
        start = int(offs[0])
        end = int(offs[-1] + lens[-1])
        r = np.frombuffer(buf, np.uint8, end - start, start)
        d = np.zeros(r.size + 1, np.int8)
        h = offs[1:] - start
        d[h - 8] = 1
        d[h] = -1
        hdr = np.cumsum(d[:-1], dtype=np.int8).view(np.bool_)
        r2 = r.copy()
        r2[hdr] = 0
        if np.count_nonzero(r2) != r.size - 8 * (n - 1):
            raise ValueError  # a NUL inside some string: cannot use NULs as separators
        parts = r2.tobytes().decode("utf-8").split("\x00" * 8)
        if len(parts) != n:
            raise ValueError
        for i in (0, 1, n // 2, n - 1):  # guard against a change in the reader's internals
            if parts[i] != arr[i]:
                raise ValueError
        return parts
    except Exception:
        if hasattr(arr, "tolist"):
            return list(arr.tolist())
        return list(arr)


class _SpecialMatcher:
    """Leftmost-longest literal matcher for special tokens (cheap to build, unlike a big regex)."""

    def __init__(self, items):
        self.by_first = {}
        for text, i in items:
            d = self.by_first.setdefault(text[0], {})
            d[text] = i
        self.lens = {c: sorted({len(t) for t in d}, reverse=True) for c, d in self.by_first.items()}
        self.pat = regex.compile("[" + "".join(regex.escape(c) for c in self.by_first) + "]")

    def split(self, text):
        """Yields (is_special, str_or_id)."""
        pos = 0
        search = self.pat.search
        m = search(text, pos)
        while m is not None:
            k = m.start()
            c = text[k]
            d = self.by_first[c]
            hit = None
            for L in self.lens[c]:
                t = text[k:k + L]
                if len(t) == L and t in d:
                    hit = t
                    break
            if hit is None:
                m = search(text, k + 1)
                continue
            if k > pos:
                yield False, text[pos:k]
            yield True, d[hit]
            pos = k + len(hit)
            m = search(text, pos)
        if pos < len(text):
            yield False, text[pos:]


class BaseTokenizer:
    kind = "base"

    def __init__(self, md: Mapping):
        self.md = md
        # kept as the file's bytes; str -> id through the table's index until lookups get hot
        self.tokens = StrTable(md["tokenizer.ggml.tokens"])
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

    def prepare(self):
        """Build the lookup index now instead of on first use (not the full str -> id dict: that
        is built only once lookups get hot, see StrTable)."""
        if self.tokens._bytes:
            self.tokens._index()
        self._splitter(True)
        self._prepare_model()
        return self

    def _prepare_model(self):
        pass

    # ---------------------------------------------------------------- vocab
    @property
    def vocab(self) -> dict:
        if self._vocab is None:
            self._vocab = dict(zip(self.tokens.tolist(), range(self.n_vocab)))
        return self._vocab

    def _vget(self):
        """The str -> id lookup to use now: the dict once built (or once the index got hot)."""
        if self._vocab is None and self.tokens.hot:
            self.vocab
        if self._vocab is not None:
            return self._vocab.get
        return self._lazy_get()

    def _lazy_get(self):
        return self.tokens.get

    def id_of(self, text: str):
        return self._vget()(text)

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
            ui, ci = sorted(user), sorted(ctrl)
            names = dict(zip(ui + ci, toks.strings(ui + ci)))  # one bulk decode, not 2-3 per id
            u = [(names[i], i) for i in ui if names[i] and self._matchable_user(i)]
            c = [(names[i], i) for i in ci if names[i] and self._matchable_ctrl(i)]
            self._split_any = _SpecialMatcher(u + c) if (u or c) else False
            self._split_user = _SpecialMatcher(u) if u else False
        return self._split_any if parse_special else self._split_user

    def _matchable_ctrl(self, i: int) -> bool:
        return True

    @property
    def eog_ids(self) -> set:
        if self._eog is None:
            s = {i for i in (self.eos_id, self.eot_id) if i is not None}
            get = self._vget()
            for t in _EOG_TEXTS:
                i = get(t)
                if i is not None:
                    s.add(i)
            self._eog = s
        return self._eog

    # ---------------------------------------------------------------- encode
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list:
        out = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        sp = self._splitter(parse_special)
        if sp:
            first = True
            for is_sp, part in sp.split(text):
                if is_sp:
                    out.append(part)
                else:
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
