"""Record bm25s (method="lucene", k1=1.2, b=0.75) scores over tests/data/rag/docs for
tests/test_rag_loaders.py, so CI without bm25s still checks rag.bm25 against it.

    pip install bm25s && python scripts/make_rag_bm25_refs.py
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import bm25s  # noqa: E402

from rag.bm25 import terms  # noqa: E402
from test_rag_loaders import REF_QUERIES, _ref_corpus  # noqa: E402

texts = _ref_corpus()
r = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
r.index([terms(t) for t in texts], show_progress=False)
out = {"bm25s": bm25s.__version__, "n_docs": len(texts),
       "scores": {q: [round(float(x), 7) for x in r.get_scores(terms(q))] for q in REF_QUERIES}}
(ROOT / "tests" / "data" / "rag" / "bm25_ref.json").write_text(json.dumps(out, indent=0))
print("wrote", len(texts), "docs")
