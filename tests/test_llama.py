"""llama on the real SmolLM2-135M-Instruct Q4_1, NumPy backend.

CI checks against outputs recorded by scripts/make_llama_refs.py from transformers (which
dequantizes the GGUF to float32 and runs its own implementation): identical greedy tokens, last
prompt-position logits within 1e-3 relative, and incremental decode == one full prefill.
"""
import json
import os

import numpy as np
import pytest

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(os.path.dirname(__file__), "data", "llama_ref_smollm2.json")

needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"model not found: {MODEL}")


def _cases():
    with open(REF) as fh:
        return json.load(fh)["cases"]


@pytest.fixture(scope="module")
def model():
    from reflex.models import load_model

    return load_model(MODEL, "numpy")


_GREEDY = {}


def _greedy(model, prompt_ids, n_new):
    key = (tuple(prompt_ids), n_new)
    if key not in _GREEDY:
        _GREEDY[key] = _greedy_run(model, prompt_ids, n_new)
    return _GREEDY[key]


def _greedy_run(model, prompt_ids, n_new):
    cache = model.new_cache(len(prompt_ids) + n_new + 1)
    logits = model.forward(prompt_ids, cache)  # (T, n_vocab)
    first = logits[-1].copy()
    out, steps = [], []
    nxt = int(np.argmax(logits[-1]))
    for _ in range(n_new):
        out.append(nxt)
        lg = model.forward([nxt], cache)        # (1, n_vocab)
        steps.append(lg[0])
        nxt = int(np.argmax(lg[0]))
    return first, out, steps


@needs_model
@pytest.mark.parametrize("i", range(len(_cases())))
def test_matches_transformers(model, i):
    case = _cases()[i]
    ref = case["last_logits"]
    first, out, _ = _greedy(model, case["prompt_ids"], len(case["greedy_ids"]))
    assert first.shape == (ref["n_vocab"],)
    # last prompt-position logits
    top_ids = np.array(ref["top_ids"])
    top_vals = np.array(ref["top_values"])
    err = np.max(np.abs(first[top_ids] - top_vals)) / ref["max_abs"]
    assert err < 1e-3, f"top-50 logits rel err {err:.2e}"
    assert abs(np.abs(first).max() - ref["max_abs"]) / ref["max_abs"] < 1e-3
    assert abs(first.mean() - ref["mean"]) < 1e-3 * ref["max_abs"]
    assert abs(first.std() - ref["std"]) < 1e-3 * ref["max_abs"]
    assert int(np.argmax(first)) == ref["top_ids"][0]
    # greedy continuation
    assert out == case["greedy_ids"], (
        f"first divergence at {next(j for j, (a, b) in enumerate(zip(out, case['greedy_ids'])) if a != b)}")


@needs_model
def test_incremental_equals_prefill(model):
    case = _cases()[0]
    prompt = case["prompt_ids"]
    first, out, steps = _greedy(model, prompt, len(case["greedy_ids"]))  # reuses the run above
    out, steps = out[:12], steps[:12]
    seq = prompt + out
    full = model.forward(seq, model.new_cache(len(seq)))  # (T, n_vocab)
    inc = np.stack([first] + steps)                       # logits at positions len(prompt)-1 ..
    ref = full[len(prompt) - 1:]
    err = np.max(np.abs(inc - ref)) / np.max(np.abs(ref))
    assert err < 1e-4, err
    assert (inc.argmax(-1) == ref.argmax(-1)).all()
    # last_only returns the last row of a full forward
    lo = model.forward(seq, model.new_cache(len(seq) + 4), last_only=True)
    assert np.allclose(lo[0], full[-1], atol=1e-4 * np.abs(full).max())


@needs_model
def test_cache_overflow(model):
    from reflex.errors import ContextOverflow

    cache = model.new_cache(4)
    model.forward([1, 2, 3], cache)
    with pytest.raises(ContextOverflow):
        model.forward([4, 5], cache)


class _FakeGGUF:
    def __init__(self, meta):
        self.metadata = meta
        self.tensors = {}

    def get(self, k, default=None):
        return self.metadata.get(k, default)

    @property
    def arch(self):
        return self.metadata.get("general.architecture")


_GOOD = {
    "general.architecture": "llama",
    "llama.vocab_size": 32,
    "llama.embedding_length": 16,
    "llama.block_count": 2,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.feed_forward_length": 32,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.rope.freq_base": 10000.0,
    "llama.context_length": 64,
}


def test_hparams_errors():
    from reflex.errors import ModelFormatError
    from reflex.models.llama import HParams

    hp = HParams.from_gguf(_FakeGGUF(dict(_GOOD)))
    assert (hp.head_dim, hp.n_rot, hp.n_head_kv) == (4, 4, 2)
    for key in ("llama.block_count", "llama.embedding_length", "llama.attention.layer_norm_rms_epsilon"):
        meta = dict(_GOOD)
        del meta[key]
        with pytest.raises(ModelFormatError, match=key.replace(".", r"\.")):
            HParams.from_gguf(_FakeGGUF(meta))
    for key, val in (("llama.attention.head_count_kv", 3), ("llama.block_count", 0),
                     ("llama.rope.freq_base", -1.0), ("llama.embedding_length", "x")):
        meta = dict(_GOOD, **{key: val})
        with pytest.raises(ModelFormatError, match=key.replace(".", r"\.")):
            HParams.from_gguf(_FakeGGUF(meta))


def test_unknown_architecture():
    from reflex.errors import UnsupportedArchitecture
    from reflex.models import load_model

    with pytest.raises(UnsupportedArchitecture, match="mamba9"):
        load_model(_FakeGGUF({"general.architecture": "mamba9"}), "numpy")


def test_backend_ops():
    """Small hand-checked properties of the NumPy ops."""
    from reflex.backends import ROPE_NEOX, ROPE_NORM, get_backend

    b = get_backend("numpy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    # rope at position 0 is the identity; rotation preserves norms of each rotated pair
    for mode in (ROPE_NORM, ROPE_NEOX):
        assert np.allclose(b.rope(x, np.zeros(3), 8, 10000.0, mode), x)
        y = b.rope(x, np.array([1, 5, 9]), 8, 10000.0, mode)
        assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), atol=1e-5)
    # NORM rotates pair (0, 1) by angle pos * 1 for the first frequency
    y = b.rope(x, np.array([1.0, 1.0, 1.0]), 8, 10000.0, ROPE_NORM)
    c, s = np.cos(1.0), np.sin(1.0)
    assert np.allclose(y[..., 0], x[..., 0] * c - x[..., 1] * s, atol=1e-6)
    # attention == naive loop with causal mask and GQA
    T, n_head, n_kv, d, n_past = 3, 4, 2, 8, 2
    q = rng.standard_normal((T, n_head, d)).astype(np.float32)
    kc = rng.standard_normal((8, n_kv, d)).astype(np.float32)
    vc = rng.standard_normal((8, n_kv, d)).astype(np.float32)
    o = b.attention(q, kc, vc, n_past)
    for t in range(T):
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            S = n_past + t + 1
            s = kc[:S, kv] @ q[t, h] / np.sqrt(d)
            p = np.exp(s - s.max())
            p /= p.sum()
            assert np.allclose(o[t, h], p @ vc[:S, kv], atol=1e-5)
    # rms_norm, silu, gelu
    a = rng.standard_normal((2, 16)).astype(np.float32)
    r = b.rms_norm(a, None, 1e-6)
    assert np.allclose(np.mean(r * r, -1), 1.0, atol=1e-4)
    assert np.allclose(b.silu(a), a / (1 + np.exp(-a)), atol=1e-6)
    assert np.allclose(b.gelu_tanh(np.array([0.0, 100.0], np.float32)), [0.0, 100.0])
