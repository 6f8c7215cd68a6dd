"""End to end with the real models through the real CLI: ingest -> query -> ask, using the engine's
all-MiniLM-L6-v2 (`minilm`) and SmolLM2 (`smollm2`), fetched by setup.sh. Skips cleanly when a
model is missing; the python3-doc case skips when /usr/share/doc/python3/html is absent
(setup.sh installs it where apt-get is usable). Retrieval is checked against pages known to hold
the answer; ask is checked for citations that name only retrieved chunks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reflex.errors import ModelNotFound
from reflex.store import resolve

ROOT = Path(__file__).resolve().parents[1]
DOCS = Path(__file__).resolve().parent / "data" / "rag" / "docs"
PYDOC = Path("/usr/share/doc/python3/html")

pytest.importorskip("faiss")


def _have(model):
    try:
        resolve(model)
        return True
    except ModelNotFound:
        return False


needs_minilm = pytest.mark.skipif(not _have("minilm"), reason="minilm not fetched (reflex fetch minilm)")


def rag(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "rag.cli", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def test_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    rc, out, err = rag("ingest", str(DOCS), "--index", "docs", "--indexes-dir", str(d), "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert len(rep["added"]) == 4 and rep["n_chunks"] >= 8
    return d


@needs_minilm
def test_query_finds_the_right_document(test_index):
    cases = {"What is the default colour of a widget?": "guide.md",
             "How is tide height measured?": "page.html",
             "How many eggs does the queen lay?": "notes.txt",
             "Which volcanoes have gentle slopes?": "volcanoes.md"}
    for q, want in cases.items():
        for hybrid in ([], ["--hybrid"]):
            rc, out, err = rag("query", q, "--index", "docs", "--indexes-dir", str(test_index), "-k", "2",
                               "--json", *hybrid)
            assert rc == 0, err
            r = json.loads(out)
            assert Path(r["hits"][0]["source"]).name == want, (q, hybrid, r["hits"][0]["source"])
            assert r["hits"][0]["score"] > 0.3
            assert {"embed_s", "search_s", "open_index_s"} <= set(r["timings"])


@needs_minilm
def test_query_uses_the_ingested_embedding_file(tmp_path):
    """An index built from an embedding GGUF outside the model store (a path, e.g. a volume)
    is queried without --embed-model: the manifest's embedding_path is used."""
    import shutil
    gguf = tmp_path / "my-embedder.gguf"
    shutil.copy(resolve("minilm"), gguf)
    d = tmp_path / "idx"
    rc, out, err = rag("ingest", str(DOCS), "--index", "p", "--indexes-dir", str(d), "--embed-model",
                       str(gguf), "--json")
    assert rc == 0, err
    rc, out, err = rag("query", "How is tide height measured?", "--index", "p", "--indexes-dir", str(d),
                       "-k", "1", "--json")
    assert rc == 0, err
    assert Path(json.loads(out)["hits"][0]["source"]).name == "page.html"
    gguf.unlink()   # gone: the recorded name is not in the store either -> a clear model_not_found
    rc, out, err = rag("query", "tide", "--index", "p", "--indexes-dir", str(d), "--json")
    assert rc != 0 and "model_not_found" in out + err


@needs_minilm
def test_query_with_another_model_is_refused(test_index, tmp_path):
    if not _have("smollm2"):
        pytest.skip("smollm2 not fetched")
    rc, out, err = rag("query", "colour", "--index", "docs", "--indexes-dir", str(test_index),
                       "--embed-model", "smollm2", "--json")
    assert rc != 0
    assert "built with embedding model" in err or "pooling" in err   # refused either way


@needs_minilm
@pytest.mark.skipif(not _have("smollm2"), reason="smollm2 not fetched")
def test_ask_cites_only_retrieved_sources(test_index):
    rc, out, err = rag("ask", "What is the default colour of a widget?", "--index", "docs",
                       "--indexes-dir", str(test_index), "-k", "2", "--max-tokens", "24", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["status"] in ("answered", "answered_without_citation") and r["answer"]
    assert r["sources"] and Path(r["sources"][0]["source"]).name == "guide.md"
    assert all(1 <= c["n"] <= len(r["sources"]) for c in r["citations"])
    for stage in ("import_s", "import_faiss_s", "open_index_s", "load_embedder_s", "embed_s", "search_s",
                  "chat_load_s", "prefill_s", "decode_s", "total_s"):
        assert stage in r["timings"], stage
    # off-topic: no citation, no chat model needed
    rc, out, err = rag("ask", "Who won the football world cup in 1966?", "--index", "docs",
                       "--indexes-dir", str(test_index), "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert r["status"] == "no_relevant_sources" and r["citations"] == [] and "chat_load_s" not in r["timings"]


def test_ask_missing_index_is_clear_error(tmp_path):
    rc, out, err = rag("ask", "anything?", "--index", "nope", "--indexes-dir", str(tmp_path), "--json")
    assert rc == 2 and json.loads(out)["error"]["category"] == "invalid_request"
    assert "no index named 'nope'" in err


@needs_minilm
@pytest.mark.skipif(not PYDOC.is_dir(), reason="python3-doc not installed (/usr/share/doc/python3/html)")
def test_python_docs_pages(tmp_path):
    rc, out, err = rag("ingest", str(PYDOC), "--include", "library/json.html", "--include",
                       "library/csv.html", "--index", "py", "--indexes-dir", str(tmp_path), "--quiet")
    assert rc == 0, err
    for q, page in (("How do I pretty-print JSON output with indentation?", "json.html"),
                    ("How do I write dictionaries to a CSV file with a header row?", "csv.html")):
        rc, out, err = rag("query", q, "--index", "py", "--indexes-dir", str(tmp_path), "-k", "3", "--json")
        assert rc == 0, err
        assert Path(json.loads(out)["hits"][0]["source"]).name == page
