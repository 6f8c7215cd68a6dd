"""Memory-mapped GGUF (v2/v3, little-endian) reader.

Everything malformed raises `ModelFormatError(kind=..., offset=...)`. Every count read from the
file is checked against the bytes that remain before anything is allocated, so a hostile file
costs bounded time and memory. Tensor data is never copied: `tensor_bytes` is a numpy view of
the mmap. String arrays (e.g. a 262k-entry vocabulary) are scanned for offsets only; each
string is decoded when it is accessed.
"""
from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from reflex.errors import ModelFormatError, ModelNotFound
from reflex.gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_MAX_DIMS,
    GGUF_SUPPORTED_VERSIONS,
    VALUE_DTYPES,
    VALUE_STRUCT,
    GGUFValueType,
)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALAR = {int(k): struct.Struct(v) for k, v in VALUE_STRUCT.items()}
_DTYPES = {int(k): np.dtype(v) for k, v in VALUE_DTYPES.items()}
_STRING = int(GGUFValueType.STRING)
_ARRAY = int(GGUFValueType.ARRAY)
_BOOL = int(GGUFValueType.BOOL)
_FLOATS = (int(GGUFValueType.FLOAT32), int(GGUFValueType.FLOAT64))
_MAX_NESTING = 8
_MAX_KEY_LEN = 1 << 16
_MAX_SCAN_WINDOW = 128 << 20  # bytes; bounds the vectorized string scan's temporaries


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple  # GGUF order, ne[0] varies fastest
    shape: tuple  # numpy order (reversed ne)
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class StringArray(Sequence):
    """A GGUF array of strings, decoded lazily. Behaves like a read-only list of str."""

    __slots__ = ("_buf", "_offs", "_lens", "_cache", "_base")

    def __init__(self, buf, offs: np.ndarray, lens: np.ndarray):
        self._buf = buf
        self._offs = offs  # int64 offsets of string bytes
        self._lens = lens
        self._cache = None

    def __len__(self) -> int:
        return len(self._offs)

    def _decode(self, i: int) -> str:
        o = int(self._offs[i])
        raw = bytes(self._buf[o : o + int(self._lens[i])])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError("string is not valid UTF-8", kind="bad_utf8", offset=o + e.start) from None

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._decode(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("string array index out of range")
        if self._cache is not None:
            return self._cache[i]
        return self._decode(i)

    def tolist(self) -> list:
        """Decode everything once (cached); faster than indexing every entry."""
        if self._cache is None:
            self._cache = [self._decode(i) for i in range(len(self))]
        return list(self._cache)

    def __iter__(self):
        if self._cache is not None:
            return iter(self._cache)
        return (self._decode(i) for i in range(len(self)))

    def raw(self, i: int) -> bytes:
        o = int(self._offs[i])
        return bytes(self._buf[o : o + int(self._lens[i])])

    def __eq__(self, other):
        if isinstance(other, (list, tuple, StringArray)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], len={len(self)})"


def _err(msg, kind, offset):
    return ModelFormatError(msg, kind=kind, offset=offset)


class _Parser:
    __slots__ = ("buf", "size", "pos")

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str):
        if n < 0 or self.pos + n > self.size:
            raise _err(f"truncated file: need {n} bytes for {what}, {self.size - self.pos} left",
                       "truncated", self.pos)

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > self.size - self.pos:
            raise _err(f"{what} length {n} exceeds the {self.size - self.pos} bytes left", "truncated", start)
        raw = self.buf[self.pos : self.pos + n]
        try:
            s = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise _err(f"{what} is not valid UTF-8", "bad_utf8", self.pos + e.start) from None
        self.pos += n
        return s

    def value(self, vtype: int, depth: int = 0):
        if vtype == _STRING:
            return self.string("string value")
        s = _SCALAR.get(vtype)
        if s is not None:
            self.need(s.size, "scalar value")
            v = s.unpack_from(self.buf, self.pos)[0]
            self.pos += s.size
            return bool(v) if vtype == _BOOL else v
        if vtype == _ARRAY:
            return self.array(depth)
        raise _err(f"unknown metadata value type {vtype}", "bad_value_type", self.pos - 4)

    def array(self, depth: int):
        start = self.pos
        if depth >= _MAX_NESTING:
            raise _err("arrays nested too deeply", "nesting_too_deep", start)
        etype = self.u32("array element type")
        count = self.u64("array length")
        left = self.size - self.pos
        dt = _DTYPES.get(etype)
        if dt is not None:
            nb = count * dt.itemsize
            if nb > left:
                raise _err(f"array of {count} items needs {nb} bytes, {left} left", "absurd_count", start)
            arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
            if etype == _BOOL:
                arr = arr.view(np.bool_)
            self.pos += nb
            return arr
        if etype == _STRING:
            if count * 8 > left:
                raise _err(f"string array of {count} items cannot fit in {left} bytes", "absurd_count", start)
            return self.string_array(count)
        if etype == _ARRAY:
            if count * 12 > left:
                raise _err(f"nested array of {count} items cannot fit in {left} bytes", "absurd_count", start)
            return [self.array(depth + 1) for _ in range(count)]
        raise _err(f"unknown array element type {etype}", "bad_value_type", start)

    def string_array(self, count: int) -> StringArray:
        start = self.pos
        offs, pos = _scan_strings(self.buf, self.size, start, count)
        lens = np.empty(count, dtype=np.int64)
        if count:
            lens[:-1] = offs[1:] - offs[:-1] - 8
            lens[-1] = pos - offs[-1]
        self.pos = pos
        return StringArray(self.buf, offs, lens)


def _scan_slow(buf, size: int, pos: int, count: int, out: list) -> int:
    unpack = _U64.unpack_from
    a = out.append
    try:
        for _ in range(count):
            n = unpack(buf, pos)[0]
            pos += 8
            a(pos)
            pos += n
            if pos > size:
                raise _err("string in a string array runs past end of file", "truncated", pos - n - 8)
    except struct.error:
        raise _err("truncated string array", "truncated", pos) from None
    return pos


def _scan_fast(buf, start: int, count: int, W: int):
    if W <= 16:
        return None
    b = np.frombuffer(buf, dtype=np.uint8, count=W, offset=start)
    # Candidate prefixes: positions p whose u64 is < 256, i.e. bytes p+1..p+7 are zero.
    z = b[1:] == 0
    a2 = z[:-1] & z[1:]
    a4 = a2[:-2] & a2[2:]
    a7 = a4[:-3] & a4[3:]  # a7[p] = b[p+1..p+7] all zero
    C = np.flatnonzero(a7)
    if not len(C) or C[0] != 0:
        return None
    nx = C + 8 + b[C]
    # Prune candidates nobody points at (true prefixes always have their predecessor), until
    # the first `count` survivors form one exact chain from `start`.
    for _ in range(24):
        if len(C) < count:
            return None
        if count == 1 or np.array_equal(nx[: count - 1], C[1:count]):
            return C[:count] + (start + 8), start + int(nx[count - 1])
        hit = np.zeros(W + 1, dtype=bool)
        hit[np.minimum(nx, W)] = True
        keep = hit[C]
        keep[0] = True
        if keep.all():
            return None
        C = C[keep]
        nx = nx[keep]
    return None


def _scan_strings(buf, size: int, start: int, count: int):
    """Offsets of the `count` length-prefixed strings starting at `start`, and the end position.

    Fast path: every position whose u64 would be < 256 is a candidate length prefix; the chain
    from `start` is followed through candidates (exact, since each step uses a true prefix).
    Where the chain leaves the candidates, the plain sequential walk takes over.
    """
    out: list = []
    pos = start
    if count >= 256:
        for mult in (20, 40, 80):
            W = min(size - start, count * mult + 64, _MAX_SCAN_WINDOW)
            r = _scan_fast(buf, start, count, W)
            if r is not None:
                offs, end = r
                if end > size:
                    raise _err("string array runs past end of file", "truncated", start)
                return offs, end
            if W == size - start or W == _MAX_SCAN_WINDOW:
                break
    pos = _scan_slow(buf, size, pos, count - len(out), out)
    return np.array(out, dtype=np.int64), pos


class GGUFFile:
    """An open GGUF file. See module docstring."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._mm = None
        self._buf = None
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise ModelNotFound(f"model file not found: {self.path}") from None
        except IsADirectoryError:
            raise ModelNotFound(f"model path is a directory: {self.path}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 4:
                raise _err(f"file is {size} bytes, too small for a GGUF header", "truncated", 0)
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise _err(f"cannot map file: {e}", "io_error", None) from None
        finally:
            os.close(fd)
        self.size = size
        self._buf = memoryview(self._mm)
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing --------------------------------------------------------------------------
    def _parse(self):
        p = _Parser(self._buf, self.size)
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            raise _err(f"bad magic {magic!r}, expected {GGUF_MAGIC!r}", "bad_magic", 0)
        p.pos = 4
        version = p.u32("version")
        if version not in GGUF_SUPPORTED_VERSIONS:
            be = int.from_bytes(self._buf[4:8], "big")
            if be in GGUF_SUPPORTED_VERSIONS:
                raise _err("big-endian GGUF files are not supported", "unsupported_endianness", 4)
            raise _err(f"unsupported GGUF version {version} (supported: 2, 3)", "unsupported_version", 4)
        self.version = version
        n_tensors = p.u64("tensor count")
        n_kv = p.u64("metadata count")
        left = self.size - p.pos
        if n_kv * 12 > left:
            raise _err(f"metadata count {n_kv} cannot fit in {left} bytes", "absurd_count", 16)
        if n_tensors * 32 > left:
            raise _err(f"tensor count {n_tensors} cannot fit in {left} bytes", "absurd_count", 8)

        meta: dict = {}
        self.metadata_types: dict = {}
        for _ in range(n_kv):
            kpos = p.pos
            key = p.string("metadata key")
            if key in meta:
                raise _err(f"duplicate metadata key {key!r}", "duplicate_key", kpos)
            vtype = p.u32("metadata value type")
            meta[key] = p.value(vtype)
            self.metadata_types[key] = vtype
        self.metadata: Mapping = meta

        align = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if (isinstance(align, bool) or not isinstance(align, int) or align <= 0
                or align & (align - 1)):
            raise _err(f"general.alignment {align!r} is not a positive power of two", "bad_alignment", None)
        self.alignment = align

        raw = []
        names = set()
        for _ in range(n_tensors):
            tpos = p.pos
            name = p.string("tensor name")
            if name in names:
                raise _err(f"duplicate tensor name {name!r}", "duplicate_tensor", tpos)
            names.add(name)
            dpos = p.pos
            n_dims = p.u32("tensor n_dims")
            if not 1 <= n_dims <= GGUF_MAX_DIMS:
                raise _err(f"tensor {name!r} has {n_dims} dims (1..{GGUF_MAX_DIMS} allowed)", "bad_dims", dpos)
            p.need(8 * n_dims, "tensor dims")
            ne = struct.unpack_from(f"<{n_dims}q", self._buf, p.pos)
            for d in ne:
                if d <= 0:
                    raise _err(f"tensor {name!r} has non-positive dimension {d}", "bad_dims", p.pos)
            p.pos += 8 * n_dims
            tt_pos = p.pos
            ttype = p.u32("tensor type")
            if ttype not in GGML_QUANT_SIZES:
                raise _err(f"tensor {name!r} has unknown ggml type {ttype}", "bad_tensor_type", tt_pos)
            opos = p.pos
            off = p.u64("tensor offset")
            raw.append((name, ne, ttype, off, opos))
        data_offset = -(-p.pos // align) * align
        self.data_offset = data_offset

        tensors: dict = {}
        for name, ne, ttype, off, tpos in raw:
            blck, tsize = GGML_QUANT_SIZES[ttype]
            if ne[0] % blck:
                raise _err(f"tensor {name!r}: ne[0]={ne[0]} not a multiple of block size {blck}",
                           "bad_dims", tpos)
            n = 1
            for d in ne:
                n *= d
            nbytes = n // blck * tsize
            if off % align:
                raise _err(f"tensor {name!r} offset {off} not aligned to {align}", "misaligned_tensor", tpos)
            start = data_offset + off
            if start + nbytes > self.size:
                past = start >= self.size
                raise _err(f"tensor {name!r} data [{start}, {start + nbytes}) past end of file ({self.size})",
                           "offset_past_end" if past else "truncated_tensor_data", tpos if past else start)
            tensors[name] = TensorInfo(name, tuple(ne), tuple(reversed(ne)), ttype, start, nbytes)
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise _err(f"tensors {n0!r} and {n1!r} overlap", "overlapping_tensors", s1)
        self.tensors: dict = tensors

    # -- API ------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        a = self.metadata.get("general.architecture")
        if not isinstance(a, str):
            raise _err("general.architecture missing or not a string", "missing_key", None)
        return a

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def tensor_bytes(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if self._mm is None:
            raise ValueError(f"GGUF file {self.path} is closed")
        return np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def close(self):
        self._buf = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # numpy views still alive: the mapping is released when they go away.
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"GGUFFile({self.path!r}, v{getattr(self, 'version', '?')}, {len(getattr(self, 'tensors', {}))} tensors)"


def open_gguf(path) -> GGUFFile:
    return GGUFFile(path)
