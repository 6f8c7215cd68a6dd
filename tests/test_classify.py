"""classify: softmax over system1 log-probs of the labels' verbalizations, or the model's GGUF head.

References, none of them our own code:
  - SmolLM2 (real file fetched by setup.sh): each label's total log-prob after the default prompt,
    from transformers fp32 (recorded by scripts/make_system1_refs.py in
    tests/data/system1_ref_smollm2.json; CI has no torch). Probabilities are compared within 1e-4.
  - the tiny BertForSequenceClassification fixture (tests/data/bert_cls_tiny_lcpp.gguf, F16 from
    llama.cpp's converter, which drops the pooler) routes to reflex.embed.classify_head; its
    probabilities are the softmax of transformers' classifier([CLS]) logits recorded in
    tests/data/bert_cls_ref.json by scripts/make_embedding_refs.py (within 1e-2: F16 weights).
Tests needing a model file skip when it is missing.
"""
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from reflex.classify import DEFAULT_TEMPLATE, classify, render_prompt
from reflex.errors import ContextOverflow, InvalidRequest

HERE = os.path.dirname(__file__)
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(HERE, "data", "system1_ref_smollm2.json")
BERT_CLS = os.path.join(HERE, "data", "bert_cls_tiny_lcpp.gguf")
BERT_REF = os.path.join(HERE, "data", "bert_cls_ref.json")

needs_smollm2 = pytest.mark.skipif(not os.path.exists(SMOLLM2), reason=f"model not found: {SMOLLM2}")


@pytest.fixture(scope="module")
def eng():
    from reflex.engine import Engine

    e = Engine(SMOLLM2)
    yield e
    e.close()


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    p = np.exp(x - x.max())
    return p / p.sum()


def _cases():
    with open(REF) as fh:
        return json.load(fh)["classify"]


# ---------------------------------------------------------------- prompt rendering (no model)
def test_render_default_and_user_templates():
    assert render_prompt("hi", ["a", "b"]) == DEFAULT_TEMPLATE.replace("{labels}", "a, b").replace("{text}", "hi")
    # plain replacement: other braces survive, and a {labels} inside the text is not expanded
    assert render_prompt("x {labels} {0}", ["a"], "T={text} {json} [{labels}]") == "T=x {labels} {0} {json} [a]"


@pytest.mark.parametrize("tpl", ["no placeholder", 3, "{txt}"])
def test_template_needs_text_placeholder(tpl):
    with pytest.raises(InvalidRequest):
        render_prompt("hi", ["a"], tpl)


# ---------------------------------------------------------------- against transformers
@needs_smollm2
@pytest.mark.parametrize("i", range(len(_cases())))
@pytest.mark.parametrize("normalize", [False, True])
def test_matches_transformers(eng, i, normalize):
    case = _cases()[i]
    r = eng.classify(case["text"], case["labels"], normalize=normalize)
    assert r.source == "system1" and r.prompt == case["prompt"]
    s = [case["totals"][lab] / (case["n_tokens"][lab] if normalize else 1) for lab in case["labels"]]
    want = _softmax(s)
    got = np.array([r.probs[lab] for lab in case["labels"]])
    assert np.abs(got - want).max() <= 1e-4
    assert sum(r.probs.values()) == pytest.approx(1.0)
    assert r.label == case["labels"][int(np.argmax(want))]
    assert [len(c.token_ids) for c in r.scores.candidates] == [case["n_tokens"][lab] for lab in case["labels"]]


def test_references_differ_with_length_normalization():
    """The recorded case with 1-, 2- and 3-token labels picks differently when normalized, so the
    normalize test above cannot pass by accident."""
    case = _cases()[-1]
    tot = [case["totals"][lab] for lab in case["labels"]]
    mean = [case["totals"][lab] / case["n_tokens"][lab] for lab in case["labels"]]
    assert np.argmax(tot) != np.argmax(mean)


# ---------------------------------------------------------------- options
@needs_smollm2
def test_dict_labels_use_verbalizations(eng):
    r = eng.classify("The striker scored twice.", {"SPORT": "sports", "POL": "politics"})
    assert set(r.probs) == {"SPORT", "POL"}
    direct = eng.score(r.prompt, [" sports", " politics"])
    want = _softmax([c.total for c in direct.candidates])
    assert np.abs(np.array([r.probs["SPORT"], r.probs["POL"]]) - want).max() <= 1e-6


@needs_smollm2
def test_chat_template_prompt(eng):
    r = eng.classify("I loved it.", ["positive", "negative"], chat=True)
    assert r.prompt.startswith("<|im_start|>") and r.prompt.endswith("assistant\n")
    im_start = eng.tokenizer.encode("<|im_start|>", add_special=False, parse_special=True)
    assert im_start[0] in r.scores.context_ids  # special tokens parsed, not spelled out
    assert [c.text for c in r.scores.candidates] == ["positive", "negative"]  # no space after "\n"


def test_chat_without_template_is_invalid_request():
    eng = types.SimpleNamespace(gguf=types.SimpleNamespace(tensors={}), template=None)
    with pytest.raises(InvalidRequest, match="chat template"):
        classify(eng, "hi", ["a", "b"], chat=True)


@needs_smollm2
@pytest.mark.parametrize("text,labels", [
    ("", ["a", "b"]),
    ("   ", ["a", "b"]),
    (None, ["a", "b"]),
    ("hi", []),
    ("hi", None),
    ("hi", ["a", "a"]),
    ("hi", ["a", ""]),
    ("hi", ["a", 3]),
    ("hi", "a"),
    ("hi", {"a": " "}),
])
def test_bad_input(eng, text, labels):
    with pytest.raises(InvalidRequest):
        eng.classify(text, labels)


# ---------------------------------------------------------------- classifier heads
@pytest.mark.skipif(not os.path.exists(BERT_CLS), reason="classifier fixture missing")
def test_head_model_routes_to_classify_head():
    from reflex.engine import Engine

    with open(BERT_REF) as fh:
        ref = json.load(fh)
    with Engine(BERT_CLS) as e:
        for text, logits in list(zip(ref["texts"], ref["logits_no_pooler"]))[:3]:
            want = _softmax(logits)
            r = e.classify(text)
            assert r.source == "head"
            assert list(r.probs) == ref["labels"]
            assert np.abs(np.array(list(r.probs.values())) - want).max() <= 1e-2
            assert r.label == ref["labels"][int(np.argmax(want))]


def test_head_routing_needs_cls_tensors(monkeypatch):
    """Only files with cls.* tensors go to the head; the head's dict becomes the result."""
    fake_embed = types.SimpleNamespace(classify_head=lambda engine, text: {"x": 0.25, "y": 0.75})
    monkeypatch.setitem(sys.modules, "reflex.embed", fake_embed)
    import reflex

    monkeypatch.setattr(reflex, "embed", fake_embed, raising=False)
    eng = types.SimpleNamespace(gguf=types.SimpleNamespace(tensors={"cls.output.weight": None}))
    r = classify(eng, "anything")
    assert (r.source, r.label, r.probs) == ("head", "y", {"x": 0.25, "y": 0.75})
    eng.gguf.tensors = {"output.weight": None}
    with pytest.raises(InvalidRequest):  # no head -> system1, which needs labels
        classify(eng, "anything")


# ---------------------------------------------------------------- CLI
@needs_smollm2
def test_cli_json():
    p = subprocess.run([sys.executable, "-m", "reflex", "classify", "-m", SMOLLM2, "The senate passed the bill.",
                        "-l", "sports", "-l", "politics", "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d["probs"]) == {"sports", "politics"} and d["source"] == "system1"
    assert sum(d["probs"].values()) == pytest.approx(1.0)


# ---------------------------------------------------------------- sentence pairs (cross-encoders)
PAIR_REF = os.path.join(HERE, "data", "bert_pair_ref.json")


@pytest.mark.skipif(not os.path.exists(BERT_CLS), reason="classifier fixture missing")
def test_pair_matches_transformers():
    """(query, document) pairs on the classifier fixture: ids and token types equal HF's
    BertTokenizerFast pair encoding (longest-first truncation too), probabilities equal the softmax
    of transformers' classifier([CLS]) logits (within 1e-2: F16 weights), all recorded by
    scripts/make_pair_refs.py in tests/data/bert_pair_ref.json (CI has no torch)."""
    from reflex.embed import head_scores, hidden_states, tokenize_inputs
    from reflex.engine import Engine

    with open(PAIR_REF) as fh:
        ref = json.load(fh)
    with Engine(BERT_CLS) as e:
        for r in ref["pairs"]:
            seqs, types = tokenize_inputs(e.tokenizer, [(r["query"], r["document"])], 512, False)
            assert seqs[0] == r["input_ids"] and types[0] == r["token_type_ids"], r["query"]
            want = _softmax(r["logits_no_pooler"])
            got = e.classify([r["query"], r["document"]])
            assert got.source == "head"
            assert np.abs(np.array(list(got.probs.values())) - want).max() <= 1e-2, r["query"]
            # the token types matter: the same ids with all-zero types give other logits
            s = head_scores(e.model, e.tokenizer, [(r["query"], r["document"])])[0]
            h0 = hidden_states(e.model, seqs)[0][0]
            assert np.abs(e.model.head(h0[None])[0] - s).max() > 1e-3
        for r in ref["truncated"]:
            seqs, types = tokenize_inputs(e.tokenizer, [(r["query"], r["document"])], r["max_length"], True)
            assert seqs[0] == r["input_ids"] and types[0] == r["token_type_ids"], r
            with pytest.raises(ContextOverflow):
                tokenize_inputs(e.tokenizer, [(r["query"], r["document"])], r["max_length"], False)
        with pytest.raises(InvalidRequest):
            e.classify(["query", ""])


@needs_smollm2
def test_pair_needs_a_head_model(eng):
    with pytest.raises(InvalidRequest, match="classifier head"):
        eng.classify(["a query", "a document"], ["yes", "no"])


@pytest.mark.skipif(not os.path.exists(BERT_CLS), reason="classifier fixture missing")
def test_pair_cli_and_ipc():
    """The pair over the CLI (--pair) and over IPC (classify text = [query, document]; embed input
    items as pairs) gives the same probabilities as the API (checked against transformers above)."""
    from reflex.engine import Engine
    from reflex.ipc import VERSION, Server

    with open(PAIR_REF) as fh:
        r = json.load(fh)["pairs"][0]
    p = subprocess.run([sys.executable, "-m", "reflex", "classify", "-m", BERT_CLS, r["query"],
                        "--pair", r["document"], "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    cli = json.loads(p.stdout)["probs"]
    with Engine(BERT_CLS) as e:
        api = e.classify([r["query"], r["document"]]).probs
        out = []
        srv = Server(e)
        srv.handle_line(json.dumps({"v": VERSION, "id": 1, "op": "classify",
                                    "text": [r["query"], r["document"]]}).encode(), out.append)
        srv.handle_line(json.dumps({"v": VERSION, "id": 2, "op": "classify", "text": [r["query"], ""]}).encode(),
                        out.append)
    assert cli == pytest.approx(api, abs=1e-6)
    ok = [o for o in out if o.get("id") == 1 and o.get("event") != "error"]
    assert ok and json.dumps(ok[-1]).count("neutral") and not any(o.get("id") == 1 and o.get("event") == "error" for o in out)
    assert any(o.get("id") == 2 and o.get("event") == "error" and "pair" in json.dumps(o) for o in out)
    res = [o for o in ok if "probs" in json.dumps(o)][-1]
    got = res.get("result", res).get("probs") if isinstance(res.get("result", res), dict) else None
    assert got == pytest.approx(api, abs=1e-6)
