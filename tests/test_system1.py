"""system1: candidate scoring in one forward pass with a prefix-tree attention mask.

Checked two ways, both against implementations that are not the tree path:
  (a) every architecture in reflex.models that has a model here (the real SmolLM2 / Gemma-3 files
      fetched by setup.sh, and any *.gguf fixture under tests/data/fixtures): equal within 1e-4 to
      scoring each candidate alone with one plain causal forward over context + candidate;
  (b) SmolLM2: token ids and per-token log-probs equal to transformers' (fp32 GGUF loader, its own
      tokenizer), recorded by scripts/make_system1_refs.py into tests/data/system1_ref_smollm2.json
      (CI has no torch; the recorded file is the reference). Tolerance 2e-4 per token (measured
      differences are <= 2e-5).
Tests needing a model file skip when it is missing.
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex import system1
from reflex.errors import ContextOverflow, InvalidRequest

HERE = os.path.dirname(__file__)
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")
REF = os.path.join(HERE, "data", "system1_ref_smollm2.json")
TOL_SEPARATE = 1e-4
TOL_TRANSFORMERS = 2e-4

needs_smollm2 = pytest.mark.skipif(not os.path.exists(SMOLLM2), reason=f"model not found: {SMOLLM2}")


def _supported(path):
    from reflex.gguf import GGUFFile
    from reflex.models import ALIASES, ARCHITECTURES

    with GGUFFile(path) as f:
        arch = f.get("general.architecture")
        pooling = f.get(f"{arch}.pooling_type", 0)
        causal = f.get(f"{arch}.attention.causal", True)
    return ALIASES.get(arch, arch) in ARCHITECTURES and not pooling and causal is not False


def _model_files():
    files = [p for p in (SMOLLM2, GEMMA3) if os.path.exists(p)]
    files += sorted(glob.glob(os.path.join(HERE, "data", "fixtures", "*.gguf")))
    return [p for p in files if _supported(p)]


_LOADED = {}


def _load(path):
    if path not in _LOADED:
        from reflex.gguf import GGUFFile
        from reflex.models import load_model
        from reflex.tokenizer import Tokenizer

        f = GGUFFile(path)
        _LOADED[path] = (load_model(f, "numpy"), Tokenizer.from_gguf(f))
    return _LOADED[path]


def _separate(model, ctx, cand):
    """Reference: one plain causal forward over context + candidate, fresh cache, no mask."""
    ids = list(ctx) + list(cand)
    logits = model.forward(ids, model.new_cache(len(ids))).astype(np.float64)  # (T, n_vocab)
    rows = logits[len(ctx) - 1:len(ids) - 1]
    mx = rows.max(axis=1, keepdims=True)
    lse = (mx + np.log(np.exp(rows - mx).sum(axis=1, keepdims=True)))[:, 0]
    return rows[np.arange(len(cand)), cand] - lse


# ---------------------------------------------------------------- the tree itself
def test_tree_layout_matches_docstring():
    # A = (a0 a1 a2), B = (a0 b1) after 3 context tokens; a0 = 10, a1 = 11, a2 = 12, b1 = 21
    t = system1.build_tree(3, [[10, 11, 12], [10, 21]])
    assert t.tokens == [10, 11]           # a0 shared, a2 and b1 never fed
    assert t.parent == [-1, 0]
    assert t.positions().tolist() == [0, 1, 2, 3, 4]
    assert t.rows == [[2, 3, 4], [2, 3]]
    m = t.mask()
    want = np.array([[1, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0],
                     [1, 1, 1, 0, 0],
                     [1, 1, 1, 1, 0],
                     [1, 1, 1, 1, 1]], dtype=bool)
    assert (m == want).all()


def test_tree_mask_is_ancestors_only():
    cands = [[1, 2, 3, 4], [1, 2, 5], [1, 6], [7, 8, 9], [7, 8, 9, 10], [11]]
    C = 4
    t = system1.build_tree(C, cands)
    m = t.mask()
    T = C + t.n_nodes
    assert m.shape == (T, T)
    for j in range(t.n_nodes):
        anc, a = set(), j
        while a >= 0:
            anc.add(C + a)
            a = t.parent[a]
        for s in range(T):
            assert m[C + j, s] == (s < C or s in anc), (j, s)
        assert t.positions()[C + j] == C + t.depth[j]
    # every node is the prefix of some candidate, fed once
    prefixes = {tuple(c[:k + 1]) for c in cands for k in range(len(c) - 1)}
    assert t.n_nodes == len(prefixes)


def test_single_token_candidates_need_no_nodes():
    t = system1.build_tree(5, [[1], [2], [3]])
    assert t.n_nodes == 0 and t.rows == [[4], [4], [4]]


# ---------------------------------------------------------------- (a) one pass == separate passes
CASES = [
    ("The capital of France is", [" Paris", " Lyon", " a city in Europe", " a city of lights",
                                  " Paris, of course.", " Paris"]),
    ("Water boils at", [" 100 degrees", " 100 degrees Celsius", "!"]),
]


@pytest.mark.parametrize("path", _model_files(), ids=os.path.basename)
def test_one_pass_equals_separate_forwards(path):
    model, tok = _load(path)
    # the second case (a candidate that extends another) only on the first model: CI time
    for context, cands in (CASES if path == _model_files()[0] else CASES[:1]):
        r = system1.score(model, tok, context, cands)
        assert r.n_forward_tokens < len(r.context_ids) + sum(len(c.token_ids) for c in r.candidates)
        for c in r.candidates:
            ref = _separate(model, r.context_ids, c.token_ids)
            assert np.abs(np.array(c.logprobs) - ref).max() <= TOL_SEPARATE, (path, c.text)
            assert c.total == pytest.approx(float(np.sum(c.logprobs)))
            assert c.mean == pytest.approx(c.total / len(c.token_ids))
        assert r.best == int(np.argmax([c.total for c in r.candidates]))


@pytest.mark.parametrize("path", [p for p in (SMOLLM2, GEMMA3) if os.path.exists(p)], ids=os.path.basename)
def test_sliding_window_matches_separate(monkeypatch, path):
    """A sliding window of 4, narrower than context + candidates, set on the hparams: the result
    still equals plain causal forwards. SmolLM2 (llama: the backend's window on slots) takes the
    sequential fallback; Gemma-3 (5 of 6 layers local, window on positions) the tree path."""
    model, tok = _load(path)
    context, cands = "The capital of France is", [" Paris", " a city in Europe"]
    full = system1.score(model, tok, context, cands)
    monkeypatch.setattr(model.hp, "n_swa", 4)
    r = system1.score(model, tok, context, cands)
    assert abs(r.candidates[1].total - full.candidates[1].total) > 1e-3  # the window does matter
    for c in r.candidates:
        ref = _separate(model, r.context_ids, c.token_ids)
        assert np.abs(np.array(c.logprobs) - ref).max() <= TOL_SEPARATE


@needs_smollm2
def test_sequential_path_equals_separate():
    model, tok = _load(SMOLLM2)
    ctx = tok.encode("She opened the door and")
    cands = [tok.encode(" smiled at him", add_special=False), tok.encode(" ran", add_special=False)]
    for lp, c in zip(system1._score_sequential(model, ctx, cands), cands):
        assert np.abs(lp - _separate(model, ctx, c)).max() <= TOL_SEPARATE


# ---------------------------------------------------------------- (b) against transformers
def _ref():
    with open(REF) as fh:
        return json.load(fh)


@needs_smollm2
@pytest.mark.parametrize("i", range(len(_ref()["cases"])))
def test_matches_transformers(i):
    case = _ref()["cases"][i]
    model, tok = _load(SMOLLM2)
    r = system1.score(model, tok, case["context"], [c["text"] for c in case["candidates"]])
    assert r.context_ids == case["context_ids"]
    for got, want in zip(r.candidates, case["candidates"]):
        assert got.token_ids == want["token_ids"], got.text
        assert got.boundary == want["boundary"], got.text
        assert np.abs(np.array(got.logprobs) - want["logprobs"]).max() <= TOL_TRANSFORMERS, got.text
    totals = [sum(c["logprobs"]) for c in case["candidates"]]
    assert r.best == int(np.argmax(totals))


def test_reference_covers_both_boundary_rules():
    hows = {c["boundary"] for case in _ref()["cases"] for c in case["candidates"]}
    assert hows == {"continuation", "separate"}


# ---------------------------------------------------------------- tokenization boundary rule
@needs_smollm2
def test_boundary_rule():
    _, tok = _load(SMOLLM2)
    ctx_text = "The answer is: "
    ctx = tok.encode(ctx_text)
    ids, how = system1.candidate_ids(tok, ctx_text, ctx, "yes")
    full = tok.encode(ctx_text + "yes")
    if full[:len(ctx)] == ctx:
        assert how == "continuation" and ids == full[len(ctx):]
    else:  # the trailing space merged into " yes": fall back to the candidate alone, no BOS
        assert how == "separate" and ids == tok.encode("yes", add_special=False)
    ids, how = system1.candidate_ids(tok, "The capital of France is", tok.encode("The capital of France is"),
                                     " Paris")
    assert how == "continuation" and tok.decode(ids) == " Paris"
    ids, how = system1.candidate_ids(tok, "x", tok.encode("x"), [5, 6])
    assert (ids, how) == ([5, 6], "ids")


# ---------------------------------------------------------------- bad input
@needs_smollm2
@pytest.mark.parametrize("context,cands,err", [
    ("Hello", [], InvalidRequest),
    ("Hello", "just a string", InvalidRequest),
    ("Hello", [" a", ""], InvalidRequest),
    ("Hello", [" a", 3], InvalidRequest),
    ("Hello", [" a", [10**9]], InvalidRequest),
    ("", [" a"], InvalidRequest),           # SmolLM2 adds no BOS: nothing to predict from
    ([], [" a"], InvalidRequest),
    (None, [" a"], InvalidRequest),
])
def test_bad_input(context, cands, err):
    model, tok = _load(SMOLLM2)
    with pytest.raises(err):
        system1.score(model, tok, context, cands)


@needs_smollm2
def test_too_long_is_context_overflow():
    model, tok = _load(SMOLLM2)
    with pytest.raises(ContextOverflow):
        system1.score(model, tok, "one two three four five", [" six seven eight"], n_ctx=6)
    r = system1.score(model, tok, "one two three four five", [" six"], n_ctx=6)  # exactly fits
    assert len(r.context_ids) + len(r.candidates[0].token_ids) == 6


@needs_smollm2
def test_normalize_picks_by_mean():
    model, tok = _load(SMOLLM2)
    r = system1.score(model, tok, "The capital of France is", [" Paris", " Paris, the city of lights"],
                      normalize=True)
    assert r.best == int(np.argmax([c.mean for c in r.candidates]))
    d = r.to_dict()
    assert d["best_text"] == r.candidates[r.best].text and len(d["candidates"]) == 2
    json.dumps(d)


# ---------------------------------------------------------------- Engine and CLI
@needs_smollm2
def test_engine_score():
    from reflex.engine import Engine

    with Engine(SMOLLM2) as eng:
        r = eng.score("The capital of France is", [" Paris", " Berlin"])
    assert r.best_text == " Paris"


def test_embedding_model_is_invalid_request():
    from reflex.engine import Engine

    path = os.path.join(HERE, "data", "bert_cls_tiny_lcpp.gguf")
    if not os.path.exists(path):
        pytest.skip("classifier fixture missing")
    with Engine(path) as eng:
        with pytest.raises(InvalidRequest, match="causal"):
            eng.score("some text", [" a"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "reflex", *args], capture_output=True, text=True, timeout=300)


@needs_smollm2
def test_cli_json():
    p = _cli("system1", "-m", SMOLLM2, "--context", "The capital of France is", "-c", " Paris", "-c", " Rome",
             "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["best_text"] == " Paris" and d["candidates"][0]["logprobs"][0] < 0


def test_cli_no_candidate_is_invalid_request():
    p = _cli("system1", "--context", "x", "--json")
    assert p.returncode == 2
    assert json.loads(p.stdout)["error"]["category"] == "invalid_request"


# ---------------------------------------------------------------- recurrent models (tree_mask False)
class _FakeRecurrent:
    """The qwen3 fixture dressed as a recurrent model: tree_mask False, a cache with snapshot() /
    restore(snap), and a forward that refuses masks and custom positions (as a state-space model
    must), so only the context-once + restore-per-candidate path can score it."""
    tree_mask = False

    def __init__(self, model):
        self.m = model
        self.hp = model.hp
        self.backend = model.backend
        self.output = model.output
        self.forwards = 0

    def new_cache(self, n):
        c = self.m.new_cache(n)
        c.snapshot = lambda: c.n
        c.restore = lambda snap: c.truncate(snap)
        return c

    def forward(self, ids, cache, last_only=False, positions=None, attn_mask=None, output="logits"):
        assert attn_mask is None and positions is None, "a recurrent model cannot take a tree mask"
        self.forwards += 1
        return self.m.forward(ids, cache, last_only=last_only, output=output)


QWEN3_FIXTURE = os.path.join(HERE, "data", "fixtures", "qwen3.gguf")


@pytest.mark.skipif(not os.path.exists(QWEN3_FIXTURE), reason="qwen3 fixture missing")
def test_recurrent_path_equals_separate():
    """Reference: plain causal forwards of the real (non-fake) qwen3 fixture per candidate."""
    model, tok = _load(QWEN3_FIXTURE)
    fake = _FakeRecurrent(model)
    ctx = [1, 5, 9, 2, 7]
    cands = [[3, 4, 8], [3, 4], [11], [6, 2, 2, 9]]   # shared prefixes, a 1-token candidate
    r = system1.score(fake, tok, ctx, cands)
    assert fake.forwards == 1 + sum(len(c) > 1 for c in cands)   # context once, then one per candidate
    assert r.n_forward_tokens == len(ctx) + sum(len(c) - 1 for c in cands)
    for c, ids in zip(r.candidates, cands):
        ref = _separate(model, ctx, ids)
        assert np.abs(np.array(c.logprobs) - ref).max() <= TOL_SEPARATE
    # the restore matters: equal to the tree path on the (attention) model itself
    tree = system1.score(model, tok, ctx, cands)
    for a, b in zip(r.candidates, tree.candidates):
        assert np.abs(np.array(a.logprobs) - np.array(b.logprobs)).max() <= TOL_SEPARATE
