"""The RAG eval question sets (scripts/rag_eval_questions.json, tests/data/rag/eval_hard.json) are
well formed: enough questions, no duplicates across sets, every answer page inside the indexed page
set, and every evidence phrase really on its page. The page check reads Debian's python3-doc HTML
through rag.loaders and skips cleanly when /usr/share/doc/python3/html is absent (setup.sh installs
it where apt-get is usable); the rest needs nothing."""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST = ROOT / "scripts" / "rag_eval_questions.json"
HARD = ROOT / "tests" / "data" / "rag" / "eval_hard.json"
PYDOC = Path("/usr/share/doc/python3/html")


def _load(p):
    return json.loads(p.read_text())


def test_hard_set_is_well_formed():
    first, hard = _load(FIRST), _load(HARD)
    assert hard["include"] == first["include"]   # same pages, so bench_rag.py uses one index
    qs = [q["q"] for q in hard["questions"]]
    assert len(qs) >= 40 and len(set(qs)) == len(qs)
    assert not set(qs) & {q["q"] for q in first["questions"]}
    for q in hard["questions"]:
        assert q["q"].strip() and q["evidence"].strip() and q["pages"], q
        for page in q["pages"]:
            assert any(fnmatch.fnmatch(page, g) for g in hard["include"]), (q["q"], page)


@pytest.mark.skipif(not PYDOC.is_dir(), reason="python3-doc not installed (/usr/share/doc/python3/html)")
def test_evidence_is_on_the_answer_page():
    from rag.loaders import load

    texts = {}
    for spec in (_load(FIRST), _load(HARD)):
        for q in spec["questions"]:
            page = q["pages"][0]
            if page not in texts:
                d = load(str(PYDOC / page))
                texts[page] = " ".join(" ".join(b.text for b in d.blocks).split())
            assert " ".join(q["evidence"].split()) in texts[page], (q["q"], page)
