"""An index on a volume: generations swapped atomically behind a pointer file.

    indexes/NAME/
      CURRENT              "g000007\\n": the committed generation (replaced by rename)
      g000007/
        manifest.json      embedding identity, chunking params, index type, per-file hashes + chunk ranges
        index.faiss        FAISS inner product over unit vectors: IndexFlatIP, or IndexHNSWFlat above flat_max
        chunks.jsonl       one JSON object per chunk, in vector order
        chunks.offsets.npy (n + 1,) uint64 byte offsets into chunks.jsonl (a query reads only its k lines)
        bm25.npz           BM25 postings over the same chunks (loaded only for --hybrid)
      .tmp-*/              a generation being written (a stale one is removed by the next ingest)
      .lock                flock held by the one ingest allowed at a time

A writer fills .tmp-X/, fsyncs every file and the directory, renames it to gN, fsyncs NAME/, then
writes CURRENT.tmp, fsyncs it and renames it over CURRENT. A kill -9 before that last rename leaves
the previous CURRENT and its generation untouched; after it, the new one is complete. Old generations
are deleted only after the switch; a reader that already opened one keeps its open/mmapped files.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np

from reflex.errors import InvalidRequest, ModelFormatError

FORMAT = 1
FLAT_MAX = 50_000          # measured: flat search at 50k x 384 is ~4.4 ms p50 here (benchmarks/bench_rag.py)
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 128


def default_indexes_dir() -> Path:
    return Path(os.environ.get("REFLEX_INDEXES", "indexes"))


def _check_name(name: str):
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise InvalidRequest(f"invalid index name {name!r} (a plain directory name is needed)")


def index_dir(root, name: str) -> Path:
    _check_name(name)
    return Path(root) / name


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def build_faiss(vectors: np.ndarray, dim: int, flat_max: int = FLAT_MAX):
    import faiss

    n = len(vectors)
    if n > flat_max:
        idx = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        idx.hnsw.efSearch = HNSW_EF_SEARCH
        kind = "hnsw"
    else:
        idx = faiss.IndexFlatIP(dim)
        kind = "flat"
    if n:
        idx.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return idx, kind


def write_generation(idir: Path, manifest: dict, faiss_index, chunks: list, bm25) -> str:
    """Write a complete generation and switch CURRENT to it. Returns the generation name."""
    import faiss

    idir.mkdir(parents=True, exist_ok=True)
    tmp = idir / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    offsets = np.zeros(len(chunks) + 1, np.uint64)
    with open(tmp / "chunks.jsonl", "wb") as f:
        pos = 0
        for i, c in enumerate(chunks):
            line = (json.dumps(c, ensure_ascii=False) + "\n").encode()
            f.write(line)
            pos += len(line)
            offsets[i + 1] = pos
    with open(tmp / "chunks.offsets.npy", "wb") as f:
        np.save(f, offsets)
    faiss.write_index(faiss_index, str(tmp / "index.faiss"))
    bm25.save(tmp / "bm25.npz")
    gen_no = _next_generation(idir)
    gen = f"g{gen_no:06d}"
    manifest = dict(manifest, generation=gen_no, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with open(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f, ensure_ascii=False, indent=1)
    for p in tmp.iterdir():
        _fsync_file(p)
    _fsync_dir(tmp)
    os.rename(tmp, idir / gen)
    _fsync_dir(idir)
    ptr_tmp = idir / f"CURRENT.tmp-{os.getpid()}"
    with open(ptr_tmp, "w") as f:
        f.write(gen + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(ptr_tmp, idir / "CURRENT")
    _fsync_dir(idir)
    # only now is the old generation garbage
    for p in idir.iterdir():
        if p.is_dir() and p.name.startswith("g") and p.name != gen:
            shutil.rmtree(p, ignore_errors=True)
    return gen


def _next_generation(idir: Path) -> int:
    nums = [int(p.name[1:]) for p in idir.iterdir() if p.name.startswith("g") and p.name[1:].isdigit()]
    return max(nums, default=0) + 1


def remove_stale(idir: Path):
    """Partial generations of killed writers (call with the ingest lock held)."""
    if not idir.is_dir():
        return
    cur = read_current(idir)
    for p in idir.iterdir():
        if p.name.startswith(".tmp-") or p.name.startswith("CURRENT.tmp"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        elif p.is_dir() and p.name.startswith("g") and cur and p.name != cur:
            shutil.rmtree(p, ignore_errors=True)   # renamed but never made CURRENT


def read_current(idir: Path) -> str | None:
    try:
        gen = (idir / "CURRENT").read_text().strip()
    except FileNotFoundError:
        return None
    if not gen.startswith("g") or not gen[1:].isdigit():
        raise ModelFormatError(f"index {idir.name!r}: CURRENT holds {gen[:40]!r}, not a generation",
                               kind="index_corrupt")
    return gen


class IngestLock:
    def __init__(self, idir: Path):
        self.idir = idir

    def __enter__(self):
        import fcntl

        self.idir.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.idir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise InvalidRequest(f"another ingest is writing index {self.idir.name!r}") from None
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _prefetch(paths: list, chunk: int = 8 << 20):
    """Read a generation's files once, sequentially, on a daemon thread (the read releases the
    GIL), so the page cache is warm by the time the first query arrives (a `reflex-rag query`
    loads its embedder in between). With a cold page cache the first searches of a mapped HNSW
    otherwise fault its vectors in one 4 KiB page at a time in random order (measured at
    100k x 384: 37,500 major faults, first queries 200-700 ms each), and each hit's chunk record
    costs a major fault or two (9-18 ms p50 for 5 records); posix_fadvise(WILLNEED) made no
    difference here."""
    import threading

    def run():
        buf = bytearray(chunk)
        for path in paths:
            try:
                with open(path, "rb", buffering=0) as f:
                    while f.readinto(buf):
                        pass
            except OSError:
                pass   # only a prefetch: reads still work without it

    threading.Thread(target=run, name="reflex-index-prefetch", daemon=True).start()


class Index:
    """A committed generation opened for reading (faiss index memory-mapped where FAISS allows)."""

    def __init__(self, idir: Path, gen: str, manifest: dict, faiss_index, offsets, chunks_fd):
        self.dir, self.generation, self.manifest = idir, gen, manifest
        self.faiss = faiss_index
        self.offsets = offsets
        self._fd = chunks_fd
        self._bm25 = None
        self.import_faiss_s = 0.0

    @classmethod
    def open(cls, root, name: str, mmap: bool = True) -> "Index":
        idir = index_dir(root, name)
        for attempt in range(3):   # a concurrent ingest may delete the generation we just read
            gen = read_current(idir) if idir.is_dir() else None
            if gen is None:
                if idir.is_dir() and any(p.name.startswith(".tmp-") for p in idir.iterdir()):
                    raise InvalidRequest(f"index {name!r} in {root} has no committed generation yet "
                                         f"(an ingest is running or was killed before finishing)")
                raise InvalidRequest(f"no index named {name!r} in {root} "
                                     f"(create it with `reflex-rag ingest PATH --index {name}`)")
            try:
                return cls._open_gen(idir, gen, mmap)
            except FileNotFoundError:
                if attempt == 2:
                    raise ModelFormatError(f"index {name!r}: generation {gen} is missing files",
                                           kind="index_corrupt") from None

    @classmethod
    def _open_gen(cls, idir: Path, gen: str, mmap: bool) -> "Index":
        t0 = time.perf_counter()
        import faiss

        import_s = time.perf_counter() - t0   # ~0 once imported; reported apart from the open itself

        g = idir / gen
        try:
            manifest = json.loads((g / "manifest.json").read_text())
        except ValueError as e:
            raise ModelFormatError(f"index {idir.name!r}: bad manifest.json: {e}", kind="index_corrupt")
        if manifest.get("format") != FORMAT:
            raise ModelFormatError(f"index {idir.name!r}: manifest format {manifest.get('format')!r}, "
                                   f"this reflex-rag reads {FORMAT}", kind="index_version")
        fd = os.open(g / "chunks.jsonl", os.O_RDONLY)
        try:
            offsets = np.load(g / "chunks.offsets.npy", mmap_mode="r")
            path = str(g / "index.faiss")
            fi = None
            if mmap:
                try:   # zero-copy view of the stored vectors (IndexFlat; HNSW storage where supported)
                    fi = faiss.read_index(path, faiss.IO_FLAG_MMAP_IFC)
                except RuntimeError:
                    fi = None
            if fi is None:
                fi = faiss.read_index(path)
            # chunk records first (each hit reads one line), then the mapped vectors
            _prefetch([str(g / "chunks.offsets.npy"), str(g / "chunks.jsonl")]
                      + ([path] if mmap else []))
        except BaseException:
            os.close(fd)
            raise
        if fi.ntotal != len(offsets) - 1 or fi.ntotal != manifest.get("n_chunks"):
            os.close(fd)
            raise ModelFormatError(f"index {idir.name!r}: {fi.ntotal} vectors but "
                                   f"{len(offsets) - 1} chunks", kind="index_corrupt")
        if manifest.get("index", {}).get("type") == "hnsw":
            fi.hnsw.efSearch = int(manifest["index"].get("ef_search", HNSW_EF_SEARCH))
        index = cls(idir, gen, manifest, fi, offsets, fd)
        index.import_faiss_s = import_s
        return index

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self) -> int:
        return int(self.faiss.ntotal)

    @property
    def identity(self) -> dict:
        return self.manifest["embedding"]

    def chunk(self, i: int) -> dict:
        a, z = int(self.offsets[i]), int(self.offsets[i + 1])
        return json.loads(os.pread(self._fd, z - a, a))

    def search(self, qvec: np.ndarray, k: int):
        """qvec (dim,) unit -> (ids, cosine scores), best first."""
        k = min(k, len(self))
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        import faiss

        # one query: FAISS's OpenMP team only adds wake-up and contention (measured on 2 cores,
        # flat 100k: 6 ms at 1 thread, 15 ms at 2); the caller's thread count is put back
        nt = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            D, I = self.faiss.search(np.ascontiguousarray(qvec.reshape(1, -1), dtype=np.float32), k)
        finally:
            faiss.omp_set_num_threads(nt)
        keep = I[0] >= 0
        return I[0][keep].astype(np.int64), D[0][keep]

    def vectors(self, a: int, z: int) -> np.ndarray:
        if z <= a:
            return np.zeros((0, self.faiss.d), np.float32)
        return self.faiss.reconstruct_n(a, z - a)

    def bm25(self):
        if self._bm25 is None:
            from rag.bm25 import BM25

            self._bm25 = BM25.load(self.dir / self.generation / "bm25.npz")
        return self._bm25
