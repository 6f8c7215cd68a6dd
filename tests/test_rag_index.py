"""Ingest / manifest / index mechanics with the hashed bag-of-words test embedder (test_rag_support.py);
FAISS results are checked against exact numpy search. Runs in CI (needs faiss-cpu, pypdf)."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reflex.errors import InvalidRequest, ReflexError
from rag import index as ix
from rag.ingest import collect, ingest
from rag.retrieve import search

from test_rag_support import DOCS, ROOT, HashEmbedder

pytest.importorskip("faiss")


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "docs"
    shutil.copytree(DOCS, d)
    return d


def run(paths, root, emb=None, **kw):
    return ingest([str(p) for p in paths], "t", root, emb or HashEmbedder(), progress=False,
                  log=lambda s: None, **kw)


def test_collect_globs(corpus):
    files, _ = collect([corpus])
    names = sorted(Path(f).name for f in files)
    assert names == ["guide.md", "notes.txt", "page.html", "volcanoes.md"]  # skip.log not included
    files, _ = collect([corpus], include=["*.md"], exclude=["sub/*"])
    assert [Path(f).name for f in files] == ["guide.md"]
    files, _ = collect([corpus / "sub" / "skip.log"])          # explicit file: taken as is
    assert len(files) == 1
    with pytest.raises(InvalidRequest):
        collect([corpus / "nope"])


def test_incremental_manifest(corpus, tmp_path):
    root = tmp_path / "idx"
    emb = HashEmbedder()
    r = run([corpus], root, emb)
    assert len(r["added"]) == 4 and not r["updated"] and not r["removed"]
    n0 = r["n_chunks"]
    with ix.Index.open(root, "t") as index:
        assert len(index) == n0 == index.manifest["n_chunks"]
        m = index.manifest
        assert m["embedding"] == emb.identity and m["chunking"]["chunk_tokens"] == 200
        assert m["index"]["type"] == "flat"
        # every chunk's char span points back into the extracted text of its source
        for i in range(len(index)):
            c = index.chunk(i)
            assert c["char_end"] > c["char_start"] and c["source"] in m["files"]
            if c["source"].endswith((".md", ".txt")):
                raw = Path(c["source"]).read_text()
                assert raw[c["char_start"]:c["char_end"]] == c["text"]
    calls = emb.calls
    r = run([corpus], root, emb)                                   # nothing changed
    assert r["changed"] is False and len(r["unchanged"]) == 4 and emb.calls == calls
    (corpus / "notes.txt").write_text("Bees make honey. Wasps do not.\n")
    (corpus / "sub" / "volcanoes.md").unlink()
    (corpus / "new.txt").write_text("Glaciers carve U-shaped valleys.\n")
    r = run([corpus], root, emb)
    assert [Path(p).name for p in r["updated"]] == ["notes.txt"]
    assert [Path(p).name for p in r["removed"]] == ["volcanoes.md"]
    assert [Path(p).name for p in r["added"]] == ["new.txt"]
    assert len(r["unchanged"]) == 2
    with ix.Index.open(root, "t") as index:
        srcs = [index.chunk(i)["source"] for i in range(len(index))]
        assert not any(s.endswith("volcanoes.md") for s in srcs)
        hits = search(index, emb, "glaciers carve valleys", k=1)
        assert hits[0]["source"].endswith("new.txt")
        # kept files' vectors survive the rebuild exactly
        v = index.vectors(0, len(index))
        texts = []
        for i in range(len(index)):
            c = index.chunk(i)
            ctx = " > ".join(c["heading"]) if c["heading"] else c["title"]
            texts.append(f"{ctx}\n{c['text']}" if ctx and not c["text"].startswith(ctx) else c["text"])
        np.testing.assert_allclose(v, emb.embed(texts), atol=1e-6)
    # only one committed generation remains on disk
    gens = [p.name for p in (root / "t").iterdir() if p.name.startswith("g")]
    assert gens == [(root / "t" / "CURRENT").read_text().strip()]


def test_removal_scoped_to_given_paths(corpus, tmp_path):
    root = tmp_path / "idx"
    other = tmp_path / "other.txt"
    other.write_text("Lighthouses guide ships at night.\n")
    run([corpus, other], root)
    r = run([corpus / "sub"], root)           # a narrower run must not drop files outside it
    assert not r["removed"] and r["changed"] is False


def test_embedding_model_mismatch(corpus, tmp_path):
    root = tmp_path / "idx"
    run([corpus], root)
    other = HashEmbedder(name="other-model")
    with pytest.raises(InvalidRequest, match="embedding model"):
        run([corpus], root, other)
    with ix.Index.open(root, "t") as index:
        with pytest.raises(InvalidRequest, match="built with embedding model hash-bow"):
            search(index, other, "bees", k=3)
        with pytest.raises(InvalidRequest):
            search(index, HashEmbedder(), "   ", k=3)
        with pytest.raises(InvalidRequest):
            search(index, HashEmbedder(), "bees", k=0)


def test_hnsw_above_threshold_matches_exact(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()
    for i in range(60):
        (d / f"f{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(40)) + f" unique{i}\n")
    root = tmp_path / "idx"
    emb = HashEmbedder()
    r = run([d], root, emb, flat_max=10)
    assert r["index_type"] == "hnsw"
    with ix.Index.open(root, "t") as index:
        assert index.manifest["index"]["type"] == "hnsw" and len(index) == 60
        allv = index.vectors(0, len(index))
        agree = 0
        for i in range(20):
            q = emb.embed([f"unique{i} alpha beta"])[0]
            ids, scores = index.search(q, 5)
            exact = np.argsort(-(allv @ q), kind="stable")[:5]
            np.testing.assert_allclose(scores, (allv @ q)[ids], atol=1e-5)
            agree += len(set(ids.tolist()) & set(exact.tolist()))
        assert agree / 100 >= 0.95


def test_errors_missing_empty_and_skipped(tmp_path):
    root = tmp_path / "idx"
    with pytest.raises(InvalidRequest, match="no index named"):
        ix.Index.open(root, "absent")
    with pytest.raises(InvalidRequest):
        ix.Index.open(root, "../escape")
    d = tmp_path / "bad"
    d.mkdir()
    (d / "blob.txt").write_bytes(b"\x00\x01\x02binary")
    locked = d / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    r = run([d], root)
    reasons = sorted(s["reason"] for s in r["skipped"])
    assert "binary" in reasons
    if os.geteuid() != 0:                    # root reads mode-0 files
        assert "unreadable" in reasons
    locked.chmod(0o644)
    locked.unlink()
    run([d], root)                           # the readable file is gone: nothing left
    with ix.Index.open(root, "t") as index:
        assert len(index) == 0
        assert search(index, HashEmbedder(), "anything", k=5) == []
    from rag.ask import ask

    with ix.Index.open(root, "t") as index:
        with pytest.raises(InvalidRequest, match="empty"):
            ask("anything?", index, HashEmbedder(), lambda: None)


def test_ask_nothing_relevant_never_calls_model(corpus, tmp_path):
    from rag.ask import ask, check_citations

    root = tmp_path / "idx"
    run([corpus], root)

    def loader():
        raise AssertionError("chat model must not be loaded without relevant sources")

    with ix.Index.open(root, "t") as index:
        r = ask("zzzz qqqq", index, HashEmbedder(), loader, min_score=0.99)
    assert r["status"] == "no_relevant_sources" and r["citations"] == [] and r["sources"] == []
    text, valid, invalid = check_citations("Teal [1]. Moon [2, 7]. Nothing [9].", 2)
    assert text == "Teal [1]. Moon [2]. Nothing ." and valid == [1, 2] and invalid == [7, 9]


def _cli(args, env=None, **kw):
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "test_rag_support.py"), *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _state(root):
    """(generation, n_chunks, sources) of the committed index, after checking it is fully usable."""
    with ix.Index.open(root, "t") as index:
        n = len(index)
        assert n == index.manifest["n_chunks"]
        srcs = {index.chunk(i)["source"] for i in range(n)}
        assert srcs == set(index.manifest["files"])
        ids, _ = index.search(HashEmbedder().embed(["tide"])[0], 3)
        assert len(ids) == min(3, n)
        return index.generation, n, srcs


def test_kill9_during_ingest_leaves_previous_index(corpus, tmp_path):
    """Real `reflex-rag ingest` subprocesses killed with SIGKILL at random moments: the committed
    index is always either the previous or the new generation, complete and searchable."""
    root = tmp_path / "idx"
    big = tmp_path / "big"
    big.mkdir()
    for i in range(40):
        (big / f"doc{i:02d}.md").write_text(f"# Doc {i}\n\n" + ("tide moon harbour " * 60 + "\n\n") * 6)
    p = _cli(["ingest", str(corpus), "--index", "t", "--indexes-dir", str(root), "--quiet"])
    assert p.wait(120) == 0, p.stderr.read()
    before = _state(root)
    env = dict(os.environ, RAG_TEST_EMBED_DELAY="0.01")
    # how long a full ingest of the bigger tree takes, to spread kills over all of it
    t = time.perf_counter()
    p = _cli(["ingest", str(big), "--index", "t", "--indexes-dir", str(tmp_path / "probe"), "--quiet"], env=env)
    assert p.wait(120) == 0, p.stderr.read()
    full = time.perf_counter() - t
    rng = random.Random(1234)
    outcomes = set()
    for trial in range(8):
        p = _cli(["ingest", str(big), "--index", "t", "--indexes-dir", str(root), "--quiet"], env=env)
        time.sleep(rng.uniform(0.05, full * 1.1))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        state = _state(root)
        assert state[0] == before[0] or state[1] > before[1]
        outcomes.add("old" if state[0] == before[0] else "new")
        if state[0] != before[0]:
            before = state
        # the next ingest cleans what the killed one left behind
    p = _cli(["ingest", str(big), "--index", "t", "--indexes-dir", str(root), "--quiet"], env=env)
    assert p.wait(120) == 0, p.stderr.read()
    assert not [q for q in (root / "t").iterdir() if q.name.startswith((".tmp-", "CURRENT.tmp"))]
    final = _state(root)
    assert any(s.endswith("doc39.md") for s in final[2]) and any(s.endswith("guide.md") for s in final[2])
    assert "old" in outcomes   # at least one kill landed before the switch


def test_cli_errors_json(tmp_path):
    p = _cli(["query", "hello", "--index", "none", "--indexes-dir", str(tmp_path), "--json"])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert json.loads(out)["error"]["category"] == "invalid_request"
    p = _cli(["ingest", str(tmp_path / "missing"), "--index", "x", "--indexes-dir", str(tmp_path)])
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and b"no such file" in err
    assert not (tmp_path / "x" / "CURRENT").exists()


def test_search_threads_restored_and_blas_setter_leaves_faiss_alone(corpus, tmp_path):
    """A single-query search runs FAISS at 1 OpenMP thread and puts the caller's count back; and
    reflex's BLAS-thread setter (called by every embed) must set NumPy's OpenBLAS, not faiss-cpu's
    bundled OpenMP OpenBLAS, whose setter changes FAISS's OpenMP team (the cause of flat search
    going 6 -> 40 ms after an embed). Checked against FAISS's own omp_get_max_threads."""
    import faiss

    from reflex.backends.numpy_backend import set_blas_threads

    run([corpus], tmp_path)
    faiss.omp_set_num_threads(2)
    with ix.Index.open(tmp_path, "t") as index:
        q = index.vectors(0, 1)[0]
        ids, _ = index.search(q, 3)
        assert ids[0] == 0
    assert faiss.omp_get_max_threads() == 2
    set_blas_threads(1)
    assert faiss.omp_get_max_threads() == 2
    set_blas_threads(os.cpu_count() or 1)


def test_mapped_index_is_prefetched(corpus, tmp_path, monkeypatch):
    """Opening a generation starts the sequential prefetch of its chunk records and, when mapped,
    of index.faiss (cold-cache HNSW searches otherwise fault pages in randomly); a missing file
    only ends that file's prefetch."""
    seen = []
    monkeypatch.setattr(ix, "_prefetch", lambda paths: seen.append([Path(p).name for p in paths]))
    run([corpus], tmp_path)
    ix.Index.open(tmp_path, "t").close()
    assert seen[-1] == ["chunks.offsets.npy", "chunks.jsonl", "index.faiss"]
    ix.Index.open(tmp_path, "t", mmap=False).close()
    assert seen[-1] == ["chunks.offsets.npy", "chunks.jsonl"]
    # the real prefetch thread on a real generation: it finishes and leaves the index usable
    monkeypatch.undo()
    g = tmp_path / "t" / ix.read_current(tmp_path / "t")
    import threading
    ix._prefetch([str(g / "chunks.jsonl"), str(g / "missing")])
    for t in threading.enumerate():
        if t.name == "reflex-index-prefetch":
            t.join(10)
    assert not any(t.name == "reflex-index-prefetch" for t in threading.enumerate())
