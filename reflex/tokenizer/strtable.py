"""A GGUF string array (vocabulary, merges) kept as the file's bytes, for fast tokenizer start-up.

Creating 49k-262k Python strings and a str -> id dict is most of a tokenizer's start-up. StrTable
instead keeps the mapped bytes plus numpy offsets and answers
  - table[i]      by decoding string i on demand (cached),
  - table.get(s)  (the index of s, the LAST one when s occurs twice, like dict(zip(strs, range)))
    through a 64-bit key of every string (its first 8 bytes, last 8 bytes and length, mixed),
    bucketed by its top 16 bits; a hit is confirmed by comparing the actual bytes, so key
    collisions cost time, never correctness.
After HOT lookups the caller is told (`hot`) to switch to a real dict: long encodes then run at
dict speed, short ones never pay for building it.

Like reflex.gguf's StringArray, a string that is not UTF-8 raises ModelFormatError(kind="bad_utf8")
when it is decoded (lookups compare bytes, so they need no decoding).
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from reflex.errors import ModelFormatError

_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)
_M64 = (1 << 64) - 1
HOT = 2000


def _pykey(b: bytes) -> int:
    n = len(b)
    first = int.from_bytes(b[:8], "little")
    last = int.from_bytes(b[-8:], "little") if n >= 8 else 0
    return ((first * 0x9E3779B97F4A7C15) ^ (last * 0xC2B2AE3D27D4EB4F) ^ n) & _M64


class StrTable(Sequence):
    def __init__(self, arr):
        self._strs = None          # list of str, once materialized
        self._cache = {}
        self.n_get = 0
        self._sorted = None
        self._d = None             # str -> index, only for tables built from a plain list
        self._bytes = self._init_bytes(arr)
        if not self._bytes:
            self._strs = list(arr.tolist() if hasattr(arr, "tolist") else arr)
            self._n = len(self._strs)

    # ------------------------------------------------------------ construction
    def _init_bytes(self, arr) -> bool:
        buf = getattr(arr, "_buf", None)
        if buf is None:
            return False
        offs = np.asarray(arr._offs, dtype=np.int64)
        lens = np.asarray(arr._lens, dtype=np.int64)
        n = len(offs)
        if n < 2 or not np.array_equal(offs[1:], offs[:-1] + lens[:-1] + 8):
            return False  # not one contiguous [u64 len][bytes] run: let the reader decode
        start = int(offs[0])
        end = int(offs[-1] + lens[-1])
        raw = np.frombuffer(buf, np.uint8, end - start, start)
        o = offs - start                                    # (n,) string starts in raw
        self._buf, self._start, self._raw = buf, start, raw
        self._o, self._lens, self._n = o, lens, n
        return True

    def _index(self):
        """Sorted keys (n,) and the string index of each, stable (equal keys in index order)."""
        if self._sorted is None:
            raw, o, L = self._raw, self._o, self._lens
            if len(self._buf) >= self._start + raw.size + 8:   # the file goes on: read past the end
                pad = np.frombuffer(self._buf, np.uint8, raw.size + 8, self._start)
            else:
                pad = np.zeros(raw.size + 8, np.uint8)
                pad[:raw.size] = raw
            win = np.lib.stride_tricks.as_strided(pad, shape=(raw.size + 1, 8), strides=(1, 1))
            first = win[o].view("<u8").reshape(-1)          # 8 bytes from each start
            nb = np.minimum(L, 8).astype(np.uint64) * np.uint64(8)
            keep = np.where(nb >= 64, np.uint64(_M64),
                            (np.uint64(1) << np.minimum(nb, np.uint64(63))) - np.uint64(1))
            first &= keep
            last = win[np.maximum(o + L - 8, 0)].view("<u8").reshape(-1)
            last = np.where(L >= 8, last, np.uint64(0))
            key = (first * _K1) ^ (last * _K2) ^ L.astype(np.uint64)        # (n,)
            # buckets by the key's top 16 bits: a stable 16-bit argsort is a radix sort (~4 ms
            # for 262k strings, a quarter of a full 64-bit argsort); within a bucket the
            # indices stay ascending
            bucket = (key >> np.uint64(48)).astype(np.uint16)
            order = np.argsort(bucket, kind="stable")
            starts = np.zeros(65537, np.int64)
            np.cumsum(np.bincount(bucket, minlength=65536), out=starts[1:])
            # array.array: element reads are plain int loads, several times cheaper than numpy
            # scalar indexing, and converting them is a memcpy (no Python object per string)
            self._sorted = (array("Q", key[order].tobytes()), array("q", order.tobytes()),
                            array("q", starts.tobytes()), array("q", (o + self._start).tobytes()),
                            array("q", L.tobytes()))
        return self._sorted

    # ------------------------------------------------------------ sequence
    def __len__(self) -> int:
        return self._n

    def raw(self, i: int) -> bytes:
        o = int(self._o[i]) + self._start
        return bytes(self._buf[o:o + int(self._lens[i])])

    def __getitem__(self, i):
        if self._strs is not None:
            return self._strs[i]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        s = self._cache.get(i)
        if s is None:
            j = i + self._n if i < 0 else i
            if not 0 <= j < self._n:
                raise IndexError("string table index out of range")
            try:
                s = self._cache[i] = self.raw(j).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModelFormatError("string is not valid UTF-8", kind="bad_utf8",
                                       offset=self._start + int(self._o[j]) + e.start) from None
        return s

    def strings(self, ids) -> list:
        """[self[i] for i in ids], decoded in one loop (and cached for later self[i])."""
        if self._strs is not None:
            return [self._strs[i] for i in ids]
        cache, buf, base = self._cache, self._buf, self._start
        o, L = self._o, self._lens
        out = []
        for i in ids:
            s = cache.get(i)
            if s is None:
                a = base + int(o[i])
                try:
                    s = cache[i] = str(buf[a:a + int(L[i])], "utf-8")
                except UnicodeDecodeError:
                    s = self[i]  # raises the categorized error
            out.append(s)
        return out

    def tolist(self) -> list:
        if self._strs is None:
            from reflex.tokenizer.base import fast_strings

            self._strs = fast_strings(_Raw(self))
        return self._strs

    def __iter__(self):
        return iter(self.tolist())

    def joined(self, sep: str = "\x00") -> str:
        return sep.join(self.tolist())

    # ------------------------------------------------------------ lookup
    @property
    def hot(self) -> bool:
        """True once enough lookups went through the index that a dict is worth building."""
        return self.n_get >= HOT

    def as_dict(self) -> dict:
        return dict(zip(self.tolist(), range(self._n)))

    def get(self, s: str, default=None):
        self.n_get += 1
        if not self._bytes:
            if self._d is None:
                self._d = self.as_dict()
            return self._d.get(s, default)
        b = s.encode("utf-8")
        skey, order, starts, offs, lens = self._sorted or self._index()
        k = _pykey(b)
        h = k >> 48
        lo, hi = starts[h], starts[h + 1]
        n = len(b)
        buf = self._buf
        while hi > lo:                          # ascending indices: the last match wins
            hi -= 1
            if skey[hi] == k:
                i = order[hi]
                o = offs[i]
                if lens[i] == n and buf[o:o + n] == b:
                    return i
        return default


class _Raw:
    """fast_strings' view of a StrTable (its bulk decode path)."""

    def __init__(self, t: StrTable):
        self._buf = t._buf
        self._offs = t._o + t._start
        self._lens = t._lens
        self._t = t

    def __len__(self):
        return self._t._n

    def __getitem__(self, i):
        return self._t.raw(i).decode("utf-8")

    def tolist(self):
        return [self[i] for i in range(len(self))]
