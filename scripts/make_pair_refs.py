"""Record transformers' sentence-pair references for the tiny classifier fixture.

    python3 scripts/make_pair_refs.py      # needs torch, transformers, the fetched minilm GGUF

Rebuilds the seeded tiny BertForSequenceClassification checkpoint that
tests/data/bert_cls_tiny_lcpp.gguf was converted from (scripts/make_embedding_refs.py,
tiny_bert_classifier: same seed, same bytes), encodes (query, document) pairs with HF's
BertTokenizerFast pair encoding (and, for the long pairs, max_length + longest_first truncation)
and writes tests/data/bert_pair_ref.json: input_ids, token_type_ids and classifier([CLS]) logits
(llama.cpp's converter drops the pooler, so the GGUF computes these logits, not the pooled ones).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
DATA = ROOT / "tests" / "data"

PAIRS = [
    ("What is a poll selector?", "Base class shared between poll, epoll and devpoll selectors."),
    ("when was the FD closed", "This can happen if the FD was closed since it was registered."),
    ("Café prices?", "Prices at the café rose by 3% in 2024; the owners blamed the weather."),
    ("a", "b"),
]
# (query, document, max_length): longest-first truncation cases (documents longer, then a tie)
LONG = [
    ("short query here", "a much longer document " * 12, 24),
    ("the query is long as well, with a number of words in it", "and so is the document, also many words", 16),
    ("one two three four", "five six seven eight", 9),
]


def main():
    import torch
    from transformers import BertForSequenceClassification, BertTokenizerFast

    from make_embedding_refs import minilm_vocab, tiny_bert_classifier
    from reflex.store import resolve

    out = {"reference": "transformers BertForSequenceClassification + BertTokenizerFast pair encoding",
           "pairs": [], "truncated": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = tiny_bert_classifier(Path(tmp) / "hf", minilm_vocab(resolve("minilm")))
        m = BertForSequenceClassification.from_pretrained(str(d)).eval()
        tok = BertTokenizerFast.from_pretrained(str(d))
        with torch.no_grad():
            for q, doc in PAIRS:
                enc = tok(q, doc, return_tensors="pt")
                o = m(**enc, output_hidden_states=True)
                out["pairs"].append({"query": q, "document": doc,
                                     "input_ids": enc["input_ids"][0].tolist(),
                                     "token_type_ids": enc["token_type_ids"][0].tolist(),
                                     "logits_no_pooler": m.classifier(o.hidden_states[-1][0, 0]).tolist()})
            for q, doc, n in LONG:
                enc = tok(q, doc, truncation="longest_first", max_length=n)
                out["truncated"].append({"query": q, "document": doc, "max_length": n,
                                         "input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"]})
    json.dump(out, open(DATA / "bert_pair_ref.json", "w"), indent=0, ensure_ascii=False)
    print(f"wrote {DATA / 'bert_pair_ref.json'}")


if __name__ == "__main__":
    main()
