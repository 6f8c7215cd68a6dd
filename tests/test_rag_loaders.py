"""Loaders, chunker and BM25. Ground truth: the documents written here (a PDF is built byte by byte
with known page texts; pypdf writes the encrypted one), and the `bm25s` package as the independent
BM25 (live when installed, else against scores it produced, recorded by scripts/make_rag_bm25_refs.py
into tests/data/rag/bm25_ref.json)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rag import chunker, loaders
from rag.bm25 import BM25, rrf, terms

from test_rag_support import DOCS, HashEmbedder

DATA = Path(__file__).resolve().parent / "data" / "rag"


def make_pdf(pages) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page (offsets in the xref computed)."""
    objs = ["<< /Type /Catalog /Pages 2 0 R >>", None,
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objs.append(f"<< /Length {len(content)} >>\nstream\n".encode() + content + b"\nendstream")
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objs)} 0 R "
                    f"/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(len(objs))
    objs[1] = f"<< /Type /Pages /Kids [{' '.join(f'{k} 0 R' for k in kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offs = []
    for i, o in enumerate(objs, 1):
        offs.append(len(out))
        body = o if isinstance(o, bytes) else o.encode()
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    x = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offs)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{x}\n%%EOF\n".encode()
    return bytes(out)


def test_pdf_pages_and_encrypted(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    p = tmp_path / "manual.pdf"
    p.write_bytes(make_pdf(["First page about anchors", "Second page about sails", "Third page on knots"]))
    d = loaders.load(str(p))
    assert d.kind == "pdf" and [b.page for b in d.blocks] == [1, 2, 3]
    assert "sails" in d.blocks[1].text and "anchors" not in d.blocks[1].text
    w = pypdf.PdfWriter(clone_from=str(p))
    try:
        w.encrypt("secret", algorithm="RC4-128")
    except Exception as e:  # pragma: no cover - depends on pypdf's crypto providers
        pytest.skip(f"pypdf cannot encrypt here: {e}")
    enc = tmp_path / "locked.pdf"
    with open(enc, "wb") as f:
        w.write(f)
    with pytest.raises(loaders.LoadError) as ei:
        loaders.load(str(enc))
    assert ei.value.reason == "encrypted"
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.4\nthis is not a pdf")
    with pytest.raises(loaders.LoadError):
        loaders.load(str(bad))


def test_markdown_heading_paths():
    d = loaders.load(str(DOCS / "guide.md"))
    raw = (DOCS / "guide.md").read_text()
    assert d.title == "Widget Guide"
    heads = [b.heading for b in d.blocks]
    assert heads == [("Widget Guide",), ("Widget Guide", "Installation"), ("Widget Guide", "Configuration"),
                     ("Widget Guide", "Configuration", "Colours"), ("Widget Guide", "Configuration", "Sizes"),
                     ("Widget Guide", "Troubleshooting")]
    inst = d.blocks[1]
    assert "# this line is a shell comment" in inst.text      # fenced code is not a heading
    for b in d.blocks:
        assert raw[b.start:b.start + len(b.text)] == b.text


def test_html_visible_text_title_and_sections():
    d = loaders.load(str(DOCS / "page.html"))
    assert d.title == "Harbour Tides — Field Notes"
    text = "".join(b.text for b in d.blocks)
    for bad in ("SCRIPT_TEXT", "NAV_TEXT", "SIDEBAR_TEXT", "NOSCRIPT_TEXT", "FOOTER_TEXT",
                "ALSO_NOT_VISIBLE", "color: red", "¶"):
        assert bad not in text
    assert [b.heading for b in d.blocks] == [("Harbour Tides",), ("Harbour Tides", "Measuring"),
                                              ("Harbour Tides", "Safety")]
    assert "a graduated post called a tide staff" in d.blocks[1].text
    assert "height = staff_reading - datum\nprint(height)" in d.blocks[1].text   # <pre> kept as is


def test_text_and_binary(tmp_path):
    d = loaders.load(str(DOCS / "notes.txt"))
    assert d.blocks[0].text == (DOCS / "notes.txt").read_text()
    (tmp_path / "x.txt").write_bytes(b"\x00\x00abc")
    with pytest.raises(loaders.LoadError) as ei:
        loaders.load(str(tmp_path / "x.txt"))
    assert ei.value.reason == "binary"
    (tmp_path / "l1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert loaders.load(str(tmp_path / "l1.txt")).blocks[0].text == "café"


_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzé.,!?()-'", min_size=1, max_size=12)
_sep = st.sampled_from([" ", " ", " ", "\n", "\n\n", "  \t"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_word, _sep), min_size=1, max_size=300),
       st.integers(16, 80), st.integers(0, 7))
def test_chunker_properties(pieces, budget, ov):
    text = "".join(w + s for w, s in pieces)
    overlap = min(ov, budget // 2 - 1)
    emb = HashEmbedder()
    count = chunker.TokenCounter(emb.count_tokens)
    doc = loaders.Document("t.txt", "text", "", [loaders.Block(text, 0)])
    chunks = chunker.chunk_document(doc, count, budget, overlap)
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    starts, ends = {a for a, _ in words}, {z for _, z in words}
    covered = set()
    for c in chunks:
        assert c.char_start in starts and c.char_end in ends        # never inside a word
        assert text[c.char_start:c.char_end] == c.text
        toks = sum(count(w) for w in c.text.split())
        assert toks == c.n_tokens
        assert toks <= budget or len(c.text.split()) == 1            # a lone giant word may exceed
        covered.update(i for i, (a, z) in enumerate(words) if a >= c.char_start and z <= c.char_end)
    assert covered == set(range(len(words)))                         # nothing lost
    for a, b in zip(chunks, chunks[1:]):
        assert b.char_start > a.char_start and b.char_start <= a.char_end + len(text)


def test_chunker_overlap_and_paragraphs():
    emb = HashEmbedder()
    count = chunker.TokenCounter(emb.count_tokens)
    sent = "The quick brown fox jumps over the lazy dog"
    text = " ".join(f"{sent} {i}." for i in range(40))              # one paragraph, ~440 tokens
    doc = loaders.Document("t.txt", "text", "", [loaders.Block(text, 0)])
    cs = chunker.chunk_document(doc, count, 100, 20)
    assert len(cs) >= 5
    for a, b in zip(cs, cs[1:]):
        assert b.char_start < a.char_end                             # overlapping
        assert a.text.endswith(".")                                  # cut at a sentence end
    paras = "\n\n".join(" ".join(["word"] * 30) for _ in range(6))   # 30-token paragraphs
    doc = loaders.Document("t.txt", "text", "", [loaders.Block(paras, 0)])
    cs = chunker.chunk_document(doc, count, 100, 20)
    for c in cs:                                                     # whole paragraphs, no overlap
        assert len(c.text.split()) % 30 == 0
    with pytest.raises(Exception):
        chunker.validate_params(100, 60)
    with pytest.raises(Exception):
        chunker.validate_params(600, 10, max_tokens=510)


def _ref_corpus():
    texts = []
    for p in sorted(DOCS.rglob("*")):
        if p.suffix in (".md", ".txt", ".html"):
            for b in loaders.load(str(p)).blocks:
                texts.append(b.text)
    return texts


REF_QUERIES = ["tide height staff", "colour key teal", "bees honey frame wax", "lava basalt shield",
               "grid unit pixels", "moon spring tides", "unknownword"]


def test_bm25_against_bm25s():
    texts = _ref_corpus()
    bm = BM25.build(texts)
    ref_path = DATA / "bm25_ref.json"
    try:
        import bm25s

        r = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
        r.index([terms(t) for t in texts], show_progress=False)
        ref = {q: r.get_scores(terms(q)).tolist() for q in REF_QUERIES}
    except ImportError:
        ref = json.loads(ref_path.read_text())["scores"]
    for q in REF_QUERIES:
        ours = np.zeros(len(texts))
        ids, sc = bm.search(q, len(texts))
        ours[ids] = sc
        # bm25s's lucene variant drops the constant (k1 + 1) factor of the numerator
        np.testing.assert_allclose(ours / (1.2 + 1), np.asarray(ref[q]), rtol=1e-5, atol=1e-6)
    assert len(bm.search("unknownword", 5)[0]) == 0


def test_bm25_roundtrip_and_rrf(tmp_path):
    bm = BM25.build(_ref_corpus())
    bm.save(tmp_path / "b.npz")
    bm2 = BM25.load(tmp_path / "b.npz")
    for q in REF_QUERIES:
        a, b = bm.search(q, 5), bm2.search(q, 5)
        assert a[0].tolist() == b[0].tolist()
    fused = rrf([[1, 2, 3], [3, 1, 4]])
    assert [d for d, _ in fused] == [1, 3, 2, 4]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
