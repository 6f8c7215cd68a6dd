"""granitehybrid (reflex/models/granitehybrid.py, Granite 4.0-H) on the NumPy backend: what the shared
runner does not cover.

The fixture tests/data/fixtures/granitehybrid.gguf is a tiny random GraniteMoeHybridForCausalLM (2
Mamba-2 + 2 NoPE attention layers, MoE 4 experts top-2 + shared expert, every Granite multiplier != 1)
made by scripts/make_fixtures.py and converted by llama.cpp's convert_hf_to_gguf.py;
tests/test_models_parity.py checks it against outputs recorded from transformers fp32 by
scripts/make_model_refs.py granitehybrid (CI reads the recording, it runs no transformers). Here: that
each multiplier and the Mamba-2 D skip change the result (so parity could not pass without them),
the hyperparameter and forward() errors, the recurrent cache's truncate/snapshot rules, and the
NumPy ssm ops' own state carrying (one call over T tokens == T calls of one token).
"""
import json
import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
GGUF = os.path.join(DATA, "fixtures", "granitehybrid.gguf")


@pytest.fixture(scope="module")
def model():
    from reflex.models import load_model

    return load_model(GGUF, "numpy")


@pytest.fixture(scope="module")
def case():
    with open(os.path.join(DATA, "granitehybrid_ref_models.json")) as fh:
        return json.load(fh)["cases"][0]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_layout(model):
    hp = model.hp
    assert hp.n_head_kv == [0, 1, 0, 1]
    assert [blk.recurrent for blk in model.blocks] == [True, False, True, False]
    assert hp.n_expert == 4 and hp.n_expert_used == 2 and hp.n_ff_shexp == 24
    assert (hp.embedding_scale, hp.logit_scale) == (4.0, 4.0)
    assert abs(hp.attention_scale - 0.2) < 1e-6 and abs(hp.residual_scale - 0.6) < 1e-6
    assert (hp.d_inner, hp.n_ssm_head, hp.n_group, hp.d_state, hp.d_conv) == (32, 4, 2, 8, 4)


def _logits(model, ids):
    return model.forward(ids, model.new_cache(len(ids)))


@pytest.mark.parametrize("attr,value", [("embedding_scale", 1.0), ("residual_scale", 1.0),
                                        ("attention_scale", 0.0)])
def test_multipliers_matter(model, case, attr, value):
    ids = case["prompt_ids"]
    base = _logits(model, ids)
    old = getattr(model.hp, attr)
    setattr(model.hp, attr, value)
    try:
        if attr == "attention_scale":
            for blk in model.blocks:
                if not blk.recurrent:
                    blk.mixer.scale = 1.0 / np.sqrt(model.hp.head_dim)
        assert _rel(_logits(model, ids), base) > 1e-2
    finally:
        setattr(model.hp, attr, old)
        for blk in model.blocks:
            if not blk.recurrent:
                blk.mixer.scale = model.hp.attention_scale
    assert _rel(_logits(model, ids), base) == 0.0


def test_ssm_d_and_group_norm_matter(model, case):
    ids = case["prompt_ids"]
    base = _logits(model, ids)
    m = model.blocks[0].mixer
    for attr in ("D", "norm"):
        old = getattr(m, attr)
        setattr(m, attr, np.ones_like(old) if attr == "norm" else np.zeros_like(old))
        try:
            assert _rel(_logits(model, ids), base) > 1e-3, attr
        finally:
            setattr(m, attr, old)
    # logit_scale is folded into output_norm: hidden @ token_embd^T gives the logits themselves
    h = model.forward(ids, model.new_cache(len(ids)), output="hidden")
    assert _rel(h @ model.tok_embd.T, base) < 1e-5


def test_bad_forward_args_and_cache_rules(model):
    from reflex.errors import ContextOverflow, InvalidRequest

    cache = model.new_cache(6)
    ref = model.forward([1, 2, 3], model.new_cache(6))
    model.forward([1, 2], cache)
    snap = cache.snapshot()
    for kw in (dict(token_ids=[]), dict(token_ids=[10 ** 9]), dict(token_ids=[3], positions=[2]),
               dict(token_ids=[3], attn_mask=np.ones((1, 3), dtype=bool))):
        with pytest.raises(InvalidRequest):
            model.forward(cache=cache, **kw)
    with pytest.raises(ContextOverflow):
        model.forward([1] * 5, cache)
    with pytest.raises(InvalidRequest):
        cache.truncate(1)          # a recurrent state cannot rewind to the middle
    assert cache.n == 2
    # nothing above changed the state: the next token gives the 3-token prefill's last row
    assert _rel(model.forward([3], cache), ref[2:]) < 1e-4
    cache.restore(snap)
    assert cache.n == 2 and _rel(model.forward([3], cache), ref[2:]) < 1e-4
    cache.truncate(0)              # back to the start: states zeroed
    assert _rel(model.forward([1, 2, 3], cache), ref) < 1e-6


def test_hparams_errors():
    from reflex.errors import ModelFormatError, UnsupportedArchitecture
    from reflex.gguf import GGUFFile
    from reflex.models import granitehybrid

    class Fake:
        def __init__(self, f, drop=(), **over):
            over = {"granitehybrid." + k.replace("__", "."): v for k, v in over.items()}
            self.metadata = {k: v for k, v in dict(f.metadata, **over).items() if k not in drop}
            self.tensors = f.tensors

        def get(self, k, default=None):
            return self.metadata.get(k, default)

    with GGUFFile(GGUF) as f:
        granitehybrid.HParams.from_gguf(Fake(f), "granitehybrid")  # the fixture itself is fine
        with pytest.raises(UnsupportedArchitecture):
            granitehybrid.HParams.from_gguf(Fake(f, rope__scaling__finetuned=True), "granitehybrid")
        bad = [dict(attention__head_count_kv=np.array([0, 1, 0])),       # not one per layer
               dict(attention__head_count_kv=np.array([0, 3, 0, 1])),    # does not divide n_head
               dict(ssm__group_count=3), dict(ssm__time_step_rank=5), dict(logit_scale=0.0),
               dict(residual_scale=float("nan")), dict(expert_used_count=5)]
        for over in bad:
            with pytest.raises(ModelFormatError) as e:
                granitehybrid.HParams.from_gguf(Fake(f, **over), "granitehybrid")
            assert e.value.kind == "invalid_key", over
        with pytest.raises(ModelFormatError) as e:
            granitehybrid.HParams.from_gguf(Fake(f, drop=("granitehybrid.ssm.state_size",)), "granitehybrid")
        assert e.value.kind == "missing_key"


def test_ssm_ops_carry_state():
    """One call over T tokens equals T one-token calls (conv window and scan state carried)."""
    from reflex.backends.numpy_backend import NumpyBackend

    b = NumpyBackend()
    rng = np.random.default_rng(0)
    T, C, K = 9, 40, 4
    w, bias = rng.standard_normal((C, K)).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    x = rng.standard_normal((T, C)).astype(np.float32)
    s1, s2 = b.ssm_state((K - 1, C)), b.ssm_state((K - 1, C))
    full = b.ssm_conv(x, s1, w, bias)
    steps = np.concatenate([b.ssm_conv(x[t:t + 1], s2, w, bias) for t in range(T)])
    assert np.allclose(full, steps, atol=1e-6) and np.allclose(s1, s2)
    assert np.allclose(full[0], w[:, K - 1] * x[0] + bias, atol=1e-6)   # zeros before the first token
    H, P, N, G = 4, 8, 6, 2
    xbc = rng.standard_normal((T, H * P + 2 * G * N)).astype(np.float32)
    dt = rng.standard_normal((T, H)).astype(np.float32)
    A, D, dtb = -np.exp(rng.standard_normal(H)).astype(np.float32), rng.standard_normal(H).astype(np.float32), \
        rng.standard_normal(H).astype(np.float32)
    s1, s2 = b.ssm_state((H, P, N)), b.ssm_state((H, P, N))
    full = b.ssm_scan(xbc, dt, s1, A, D, dtb, G)
    steps = np.concatenate([b.ssm_scan(xbc[t:t + 1], dt[t:t + 1], s2, A, D, dtb, G) for t in range(T)])
    assert np.allclose(full, steps, atol=1e-5) and np.allclose(s1, s2, atol=1e-5)
    # the first token from a zero state: y = softplus(dt + bias) * (x . B) * C-sum over the group, + D x
    d0 = np.log1p(np.exp(dt[0] + dtb))
    x0 = xbc[0, :H * P].reshape(H, P)
    B0 = xbc[0, H * P:H * P + G * N].reshape(G, N)[np.arange(H) // (H // G)]
    C0 = xbc[0, H * P + G * N:].reshape(G, N)[np.arange(H) // (H // G)]
    y0 = d0[:, None] * x0 * (B0 * C0).sum(-1)[:, None] + D[:, None] * x0
    assert np.allclose(full[0], y0.reshape(-1), atol=1e-5)
