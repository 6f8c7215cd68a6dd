"""qwen3moe (reflex/models/qwen3moe.py) on the NumPy backend, against transformers: what the shared
runner does not cover.

The fixture tests/data/fixtures/qwen3moe.gguf is a tiny random Qwen3MoeForCausalLM (8 experts, top-2,
untied output) made by scripts/make_fixtures.py and converted by llama.cpp's convert_hf_to_gguf.py.
tests/test_models_parity.py runs it (case "qwen3moe": transformers parity with norm_topk_prob true,
prefill == decode, tree mask). Here: parity with norm_topk_prob false (expert_weights_norm off)
against outputs recorded from transformers fp32 by scripts/make_model_refs.py qwen3moe_nonorm (CI
reads the recording, it does not run transformers): prompt logits within 1e-3 relative (max |ours -
ref| over the recorded entries / max |ref|) and 32 identical greedy tokens; that the flag changes the
result; that routing reaches most experts; the expert_matmul op; hyperparameter errors.
"""
import json
import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
GGUF = os.path.join(DATA, "fixtures", "qwen3moe.gguf")
REFS = {"norm": "qwen3moe_ref_models.json", "nonorm": "qwen3moe_nonorm_ref_models.json"}


def _ref(which):
    with open(os.path.join(DATA, REFS[which])) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def model():
    from reflex.models import load_model

    return load_model(GGUF, "numpy")


def _greedy(model, ids, n_new):
    cache = model.new_cache(len(ids) + n_new)
    lg = model.forward(ids, cache, last_only=True)
    out = []
    for _ in range(n_new):
        out.append(int(np.argmax(lg[-1])))
        lg = model.forward([out[-1]], cache)
    return out


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("which,i", [("nonorm", i) for i in range(len(_ref("nonorm")["cases"]))])
def test_reference_parity(model, which, i):
    ref = _ref(which)
    case = ref["cases"][i]
    d = case["logits"]
    model.hp.expert_weights_norm = which == "norm"
    try:
        assert model.hp.n_expert == 8 and model.hp.n_expert_used == 2 and model.n_vocab == d["n_vocab"]
        ours = model.forward(case["prompt_ids"], model.new_cache(len(case["prompt_ids"])))[d["rows"]]
        probe = np.array(ref["probe_ids"])
        err = 0.0
        for r in range(len(d["rows"])):
            err = max(err, np.max(np.abs(ours[r, d["top_ids"][r]] - np.array(d["top_values"][r]))),
                      np.max(np.abs(ours[r, probe] - np.array(d["probe_values"][r]))),
                      abs(np.abs(ours[r]).max() - d["max_abs"][r]))
        rel = err / max(d["max_abs"])
        assert rel < 1e-3, f"prompt logits rel err {rel:.2e}"
        assert _greedy(model, case["prompt_ids"], len(case["greedy_ids"])) == case["greedy_ids"]
    finally:
        model.hp.expert_weights_norm = True


def test_norm_flag_matters(model):
    """The two references differ, and so do our logits with the flag flipped (not a no-op)."""
    ids = _ref("norm")["cases"][0]["prompt_ids"]
    a = model.forward(ids, model.new_cache(len(ids)))
    model.hp.expert_weights_norm = False
    try:
        b = model.forward(ids, model.new_cache(len(ids)))
    finally:
        model.hp.expert_weights_norm = True
    assert _rel(a, b) > 1e-3


def test_routing_uses_many_experts(model):
    """The prompts route to most experts, so the parity above covers more than one expert's weights."""
    from reflex.models.qwen3moe import FFN

    seen = set()
    orig = FFN.route

    def spy(self, b, x):
        ids, wt = orig(self, b, x)
        seen.update(ids.reshape(-1).tolist())
        assert np.allclose(wt.sum(axis=-1), 1.0, atol=1e-6)  # renormalized top-k weights
        return ids, wt

    FFN.route = spy
    try:
        for c in _ref("norm")["cases"]:
            model.forward(c["prompt_ids"], model.new_cache(len(c["prompt_ids"])), output="hidden")
    finally:
        FFN.route = orig
    assert len(seen) >= 6


def test_expert_matmul_numpy():
    """The op against a per-slot product written out directly."""
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.errors import InvalidRequest

    b = NumpyBackend()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 5, 4)).astype(np.float32)     # (n_expert, n_out, n_in)
    ids = rng.integers(0, 6, (7, 3))                          # (T, K)
    wt = rng.random((7, 3)).astype(np.float32)
    x2 = rng.standard_normal((7, 4)).astype(np.float32)       # shared input per row
    x3 = rng.standard_normal((7, 3, 4)).astype(np.float32)    # one input per slot
    ref2 = np.array([[w[ids[t, k]] @ x2[t] for k in range(3)] for t in range(7)])
    ref3 = np.array([[w[ids[t, k]] @ x3[t, k] for k in range(3)] for t in range(7)])
    assert b.expert_matmul(x2, w, ids).shape == (7, 3, 5)
    assert np.allclose(b.expert_matmul(x2, w, ids), ref2, atol=1e-5)
    assert np.allclose(b.expert_matmul(x3, w, ids), ref3, atol=1e-5)
    assert np.allclose(b.expert_matmul(x3, w, ids, wt), (ref3 * wt[..., None]).sum(1), atol=1e-5)
    for bad in (np.full((7, 3), 6), np.full((7, 3), -1)):
        with pytest.raises(InvalidRequest, match="expert id"):
            b.expert_matmul(x2, w, bad)
    with pytest.raises(InvalidRequest):
        b.expert_matmul(x3[:, :2], w, ids)


def test_hparams_errors():
    from reflex.errors import ModelFormatError
    from reflex.gguf import GGUFFile
    from reflex.models import qwen3moe

    class Fake:
        def __init__(self, f, drop=(), **over):
            self.metadata = {k: v for k, v in dict(f.metadata, **over).items() if k not in drop}
            self.tensors = f.tensors

        def get(self, k, default=None):
            return self.metadata.get(k, default)

    with GGUFFile(GGUF) as f:
        hp = qwen3moe.HParams.from_gguf(f, "qwen3moe")
        assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.expert_weights_norm) == (8, 2, 16, True)
        assert qwen3moe.HParams.from_gguf(Fake(f, **{"qwen3moe.expert_weights_norm": False}),
                                          "qwen3moe").expert_weights_norm is False
        # the dense feed_forward_length is optional (every layer is sparse)
        assert qwen3moe.HParams.from_gguf(Fake(f, drop=("qwen3moe.feed_forward_length",)), "qwen3moe").n_ff == 16
        for over, what in (({"qwen3moe.expert_used_count": 9}, r"expert_used_count"),
                           ({"qwen3moe.expert_count": 0}, r"expert_count"),
                           ({"qwen3moe.expert_weights_norm": 3}, r"expert_weights_norm"),
                           ({"qwen3moe.attention.head_count_kv": 3}, r"head_count_kv")):
            with pytest.raises(ModelFormatError, match=what):
                qwen3moe.HParams.from_gguf(Fake(f, **over), "qwen3moe")
        with pytest.raises(ModelFormatError, match=r"missing hyperparameter 'qwen3moe.expert_feed_forward_length'"):
            qwen3moe.HParams.from_gguf(Fake(f, drop=("qwen3moe.expert_feed_forward_length",)), "qwen3moe")


def test_bad_forward_args(model):
    from reflex.errors import ContextOverflow, InvalidRequest

    cache = model.new_cache(4)
    model.forward([1, 2], cache)
    for kw in (dict(token_ids=[]), dict(token_ids=[10 ** 9]), dict(token_ids=[1, 2], positions=[0])):
        with pytest.raises(InvalidRequest):
            model.forward(cache=cache, **kw)
    with pytest.raises(ContextOverflow):
        model.forward([1] * 3, cache)
    assert cache.n == 2
